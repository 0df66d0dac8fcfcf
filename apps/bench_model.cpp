// `longctx bench model`: one training step (forward + backward) of a model on
// one rank, with its FLOP rate against a GEMM in the step's dtype (fp32 or
// bf16) measured in the same run.
//
// FLOPs per step (the model FLOPs MFU counts, recomputation excluded):
//   6 * parameters * tokens  +  12 * head_dim * unmasked (q, kv) pairs * q heads
// (attention: 4 D per pair forward, 8 D backward).
#include <omp.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/config.h"
#include "core/memory.h"
#include "core/timer.h"
#include "kernels/cpu/select.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm.h"
#include "model/llama.h"

namespace longctx {

const char* const kBenchModelUsage =
    "usage: longctx bench model [--config configs/model/X.yml] [--seq S] [--batch B]\n"
    "         [--layers L] [--threads T] [--remat none|minimal|save_context|full]\n"
    "         [--mask causal|full|local:W|...] [--dtype fp32|bf16] [--steps N] [--json]\n"
    "         [--d-model N] [--heads N] [--kv-heads N] [--head-dim N] [--mlp N] [--vocab N]\n"
    "         [--offload-layer-inputs host|disk] [--offload-dir DIR]\n"
    "  defaults: configs/model/bench-512.yml's shape, S=16384, B=1, remat none, 2 timed steps\n";

namespace {

struct BenchModelFlags {
  std::string config;
  LlamaConfig model;
  int64_t seq = 16384, batch = 1, steps = 2;
  int threads = 0;
  std::string remat = "none", mask = "causal";
  // Offload the saved layer inputs (remat custom, decoder_layer_input:
  // offload, nothing else saved): "" = no offload (remat as given).
  std::string offload, offload_dir = "bench-offload";
  DType dtype = DType::f32;
  bool json = false;
};

// The issue 4 target shape, used when no --config is given.
LlamaConfig bench_512() {
  LlamaConfig c;
  c.vocab_size = 259;
  c.d_model = 512;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.mlp_dim = 1792;
  c.num_layers = 4;
  return c;
}

// A model file (configs/model/X.yml) read through the config loader, on top
// of the base.yml two directories up.
LlamaConfig load_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path model = fs::absolute(path);
  const fs::path base = model.parent_path().parent_path() / "base.yml";
  if (!fs::exists(model)) throw ConfigError("--config: no file '" + path + "'");
  if (!fs::exists(base))
    throw ConfigError("--config: expected a model file in configs/model/ with configs/base.yml "
                      "beside that directory; no '" + base.string() + "'");
  return load_config(base.string(), {"model_name=" + model.string()}).model;
}

BenchModelFlags parse_flags(const Args& args) {
  BenchModelFlags f;
  f.model = bench_512();
  std::vector<std::pair<std::string, std::string>> shape;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      f.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw ConfigError("bench model: flag " + a + " needs a value");
    const std::string v = args[++i];
    auto integer = [&]() -> int64_t {
      try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used == v.size() && n > 0) return n;
      } catch (...) {
      }
      throw ConfigError("bench model: " + a + " needs a positive integer, got '" + v + "'");
    };
    if (a == "--config") f.config = v;
    else if (a == "--seq") f.seq = integer();
    else if (a == "--batch") f.batch = integer();
    else if (a == "--steps") f.steps = integer();
    else if (a == "--threads") f.threads = static_cast<int>(integer());
    else if (a == "--remat") f.remat = v;
    else if (a == "--mask") f.mask = v;
    else if (a == "--offload-layer-inputs") f.offload = name_of(parse_enum<OffloadTarget>(v));
    else if (a == "--offload-dir") f.offload_dir = v;
    else if (a == "--dtype") f.dtype = parse_enum<DType>(v);
    else if (a == "--layers" || a == "--d-model" || a == "--heads" || a == "--kv-heads" ||
             a == "--head-dim" || a == "--mlp" || a == "--vocab")
      shape.emplace_back(a, std::to_string(integer()));
    else throw ConfigError("bench model: unknown flag '" + a + "'\n" + kBenchModelUsage);
  }
  if (!f.config.empty()) f.model = load_model_file(f.config);
  for (const auto& [flag, value] : shape) {  // shape flags override the file
    const int64_t n = std::stoll(value);
    if (flag == "--layers") f.model.num_layers = n;
    if (flag == "--d-model") f.model.d_model = n;
    if (flag == "--heads") f.model.num_heads = n;
    if (flag == "--kv-heads") f.model.num_kv_heads = n;
    if (flag == "--head-dim") f.model.head_dim = n;
    if (flag == "--mlp") f.model.mlp_dim = n;
    if (flag == "--vocab") f.model.vocab_size = n;
  }
  return f;
}

// Unmasked (q, kv) pairs over batches and q heads: the attention FLOP basis.
int64_t unmasked_pairs(const LlamaConfig& c, const MaskSpec& mask,
                       const std::vector<int64_t>& positions, int64_t B, int64_t S) {
  AttentionArgs a;  // shapes only: the count reads positions, never the data
  a.q = TensorView(nullptr, DType::f32, {B, S, c.num_heads, c.head_dim});
  a.k = a.v = TensorView(nullptr, DType::f32, {B, S, c.num_kv_heads, c.head_dim});
  a.q_pos = a.kv_pos = positions.data();
  a.mask = mask;
  return attention_unmasked_pairs(a);
}

}  // namespace

int run_bench_model(const Args& args) {
  const BenchModelFlags f = parse_flags(args);
  if (f.threads > 0) omp_set_num_threads(f.threads);
  const int threads = omp_get_max_threads();
  const LlamaConfig& c = f.model;
  const MaskSpec mask = MaskSpec::parse(f.mask);
  ModelOptions opt;
  opt.remat = parse_enum<RematPolicy>(f.remat);
  if (!f.offload.empty()) {
    if (opt.remat != RematPolicy::full)
      throw ConfigError("bench model: --offload-layer-inputs needs --remat full (it offloads what full keeps)");
    opt.remat = RematPolicy::custom;  // full, with the layer inputs offloaded
    opt.custom_offload[static_cast<int>(SavePoint::decoder_layer_input)] = true;
    opt.offload_target = parse_enum<OffloadTarget>(f.offload);
    opt.offload_dir = f.offload_dir;
  }
  opt.mask = mask;
  opt.dtype = f.dtype;

  // The GEMM rate is measured before and after the steps and the higher one
  // kept: on a shared machine this keeps MFU conservative.
  double gemm_gflops = measure_gemm_gflops(f.dtype);

  const int64_t B = f.batch, S = f.seq, N = B * S;
  std::mt19937 gen(1);
  std::vector<int32_t> tokens(N), targets(N);
  std::vector<int64_t> positions(N);
  for (int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<int32_t>(gen() % c.vocab_size);
    targets[i] = static_cast<int32_t>(gen() % c.vocab_size);
    positions[i] = i % S;
  }
  const Batch batch{B, S, tokens.data(), targets.data(), positions.data(), nullptr, nullptr};

  LlamaModel model(c, opt, 0);
  model.zero_gradients();
  model.forward_backward(batch, 1.0f / N);  // warm-up: allocates the workspace
  // With offload, the same model without it (remat full) runs in the same
  // process, its steps alternating with the offloaded ones, so that both see
  // the same machine load: the overhead is measured in one run.
  std::unique_ptr<LlamaModel> baseline;
  if (!f.offload.empty()) {
    ModelOptions plain = opt;
    plain.remat = RematPolicy::full;
    plain.custom_offload = {};
    baseline = std::make_unique<LlamaModel>(c, plain, 0);
    baseline->forward_backward(batch, 1.0f / N);
  }
  std::vector<double> step_seconds, baseline_seconds;
  double loss = 0.0, baseline_loss = 0.0;
  for (int64_t s = 0; s < f.steps; ++s) {
    if (baseline) {
      Timer t;
      baseline_loss = baseline->forward_backward(batch, 1.0f / N).loss_sum / N;
      baseline_seconds.push_back(t.seconds());
    }
    Timer t;
    loss = model.forward_backward(batch, 1.0f / N).loss_sum / N;
    step_seconds.push_back(t.seconds());
  }
  const double best = *std::min_element(step_seconds.begin(), step_seconds.end());
  const double baseline_best =
      baseline ? *std::min_element(baseline_seconds.begin(), baseline_seconds.end()) : best;

  gemm_gflops = std::max(gemm_gflops, measure_gemm_gflops(f.dtype));

  const int64_t pairs = unmasked_pairs(c, mask, positions, B, S);
  // The profile of the last timed step (recomputation included).
  const StepProfile prof = model.last_step_profile();
  const double model_flops = 6.0 * c.num_parameters() * N;
  const double attn_flops = 12.0 * c.head_dim * pairs * c.num_layers;
  const double flops = model_flops + attn_flops;
  // Hardware FLOPs of the layer projections: 6 * weights * tokens, plus 2 *
  // weights * tokens for those backward recomputes (all but down_proj when
  // the policy keeps neither q/k/v nor the gate/up output).
  const double d = static_cast<double>(c.d_model);
  const double w_qkv = d * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const double w_o = d * c.num_heads * c.head_dim, w_mlp = 3.0 * d * c.mlp_dim;
  const bool recompute = opt.remat == RematPolicy::full || opt.remat == RematPolicy::save_context;
  const double matmul_flops = (6.0 * (w_qkv + w_o + w_mlp) +
                               (recompute ? 2.0 * (w_qkv + w_o + 2.0 * d * c.mlp_dim) : 0.0)) *
                              c.num_layers * N;
  const double tflops = flops / best / 1e12;
  const double mfu = tflops * 1e3 / gemm_gflops;

  if (f.json) {
    nlohmann::json j = {{"d_model", c.d_model},
                        {"heads", c.num_heads},
                        {"kv_heads", c.num_kv_heads},
                        {"head_dim", c.head_dim},
                        {"mlp_dim", c.mlp_dim},
                        {"layers", c.num_layers},
                        {"vocab", c.vocab_size},
                        {"rope_theta", c.rope_theta},
                        {"parameters", c.num_parameters()},
                        {"seq", S},
                        {"batch", B},
                        {"threads", threads},
                        {"remat", f.remat},
                        {"offload_layer_inputs", f.offload.empty() ? "none" : f.offload},
                        {"no_offload_step_seconds", baseline_seconds},
                        {"offload_overhead", best / baseline_best - 1.0},
                        {"offload_loss_identical", loss == baseline_loss},
                        {"dtype", name_of(f.dtype)},
                        {"gemm_implementation", f.dtype == DType::bf16 ? gemm_bf16_implementation(2048) : "dnnl_sgemm"},
                        {"attention_tile_path", attention_tile_path_name(attention_tile_path(f.dtype))},
                        {"mask", mask.to_string()},
                        {"step_seconds", step_seconds},
                        {"best_step_seconds", best},
                        {"tokens_per_second", N / best},
                        {"model_flops", model_flops},
                        {"attention_flops", attn_flops},
                        {"tflops", tflops},
                        {"gemm_gflops", gemm_gflops},
                        {"mfu", mfu},
                        {"profile_seconds", {{"matmul", prof.matmul},
                                             {"attention", prof.attention},
                                             {"loss", prof.loss},
                                             {"elementwise", prof.elementwise}}},
                        {"peak_activation_bytes", model.peak_activation_bytes()},
                        {"loss", loss}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: d_model %lld, %lld heads (%lld KV) x %lld, mlp %lld, %lld layers, vocab %lld, "
              "%.2fM parameters\n",
              (long long)c.d_model, (long long)c.num_heads, (long long)c.num_kv_heads,
              (long long)c.head_dim, (long long)c.mlp_dim, (long long)c.num_layers,
              (long long)c.vocab_size, c.num_parameters() / 1e6);
  std::printf("step: B=%lld S=%lld, mask %s, remat %s%s, %d threads, %s\n", (long long)B, (long long)S,
              mask.to_string().c_str(), f.remat.c_str(),
              f.offload.empty() ? "" : (", layer inputs offloaded to " + f.offload).c_str(), threads, name_of(f.dtype));
  std::printf("%s GEMM reference (2048^3, same threads, best of before/after): %.1f GFLOP/s (%s)\n",
              name_of(f.dtype), gemm_gflops,
              f.dtype == DType::bf16 ? gemm_bf16_implementation(2048).c_str() : "dnnl_sgemm");
  std::printf("attention tile path: %s\n", attention_tile_path_name(attention_tile_path(f.dtype)).c_str());
  if (f.dtype == DType::bf16) std::printf("automatic bf16 attention path: %s\n", bf16_attention_choice().c_str());
  std::printf("step time: best %.3f s of %lld (first timed %.3f s); loss %.4f\n", best,
              (long long)f.steps, step_seconds[0], loss);
  if (baseline)
    std::printf("offload overhead: best %.3f s vs %.3f s without offload (alternating steps; loss %s): %+.1f%%\n",
                best, baseline_best, loss == baseline_loss ? "bit-identical" : "DIFFERS", 100.0 * (best / baseline_best - 1.0));
  std::printf("tokens/s: %.0f\n", N / best);
  std::printf("FLOPs/step: %.3e (6*N*tokens %.3e + attention 12*D*pairs %.3e)\n", flops,
              model_flops, attn_flops);
  std::printf("achieved: %.1f GFLOP/s = MFU %.1f%% of the measured GEMM rate\n", tflops * 1e3,
              100.0 * mfu);
  const double step = prof.total();
  std::printf("last step by part: matmul %.3f s (%.1f GFLOP/s = %.0f%% of GEMM), attention %.3f s "
              "(%.1f GFLOP/s model FLOPs), loss %.3f s, elementwise %.3f s; %.0f%% of the step "
              "outside these\n",
              prof.matmul, matmul_flops / prof.matmul / 1e9,
              100.0 * matmul_flops / prof.matmul / 1e9 / gemm_gflops, prof.attention,
              attn_flops / prof.attention / 1e9, prof.loss, prof.elementwise,
              100.0 * (1.0 - step / step_seconds.back()));
  std::printf("peak activations: %s\n", format_bytes(model.peak_activation_bytes()).c_str());
  return 0;
}

}  // namespace longctx
