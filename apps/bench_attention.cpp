// `longctx bench attention`: the attention kernel's FLOP rate, forward and
// backward, against a oneDNN GEMM measured in the same run with the same
// thread count. FLOPs count only unmasked (q, kv) pairs: forward 4 D per pair
// per q head, backward 10 D (the README: benchmarks report ratios, not timings).
// --dtype bf16: q, k, v, o, dout in bf16 (dq, dk, dv fp32), against the bf16
// GEMM (gemm_bf16), with the kernel's tile path and oneDNN's bf16
// implementation printed.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <ctime>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/timer.h"
#include "kernels/cpu/select.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm.h"

namespace longctx {

const char* const kBenchAttentionUsage =
    "usage: longctx bench attention [--batch B] [--seq S] [--kv-seq S] [--heads H]\n"
    "         [--kv-heads G] [--head-dim D] [--mask full|causal|local:W|chunked:C|documents:N]\n"
    "         [--dtype fp32|bf16] [--threads T] [--reps N] [--warmup N]\n"
    "         [--clock wall|cpu] [--tile-path auto|gemm|widened|native|fused|dot] [--gemm-size N] [--json]\n"
    "  defaults: B=1 S=8192 kv-seq=S H=8 G=H D=128 causal, all threads, 1 warm-up call, 3 timed\n"
    "  q rows are the last S positions of the kv sequence (end-aligned);\n"
    "  documents:N = N equal packed documents, causal within each;\n"
    "  --clock cpu times by process CPU seconds / threads (steadier on a shared machine);\n"
    "  --gemm-size N: the reference GEMM's N^3 product (default 2048; smaller under emulation);\n"
    "  --tile-path: a tile path instead of the automatic choice (attention.h): fp32 gemm or\n"
    "    fused (f32, f32_fused); bf16 widened, native, fused or dot (bf16_widened, bf16_native, bf16_fused, bf16_dot)\n";

namespace {

struct Flags {
  int64_t batch = 1, seq = 8192, kv_seq = 0, heads = 8, kv_heads = 0, head_dim = 128;
  int64_t reps = 3, warmup = 1, gemm_size = 2048;
  std::string mask = "causal", dtype = "fp32", clock = "wall", tile_path = "auto";
  int threads = 0;
  bool json = false;
};

int64_t positive(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    long long v = std::stoll(value, &used);
    if (used == value.size() && v > 0) return v;
  } catch (...) {
  }
  throw ConfigError(flag + " expects a positive integer, got '" + value + "'");
}

// --tile-path NAME for inputs in `dt`: auto, or a path of that dtype.
AttentionTilePath tile_path_of(const std::string& name, DType dt) {
  if (name == "auto") return AttentionTilePath::automatic;
  if (name == "fused" && !attention_fused_tiles_supported())
    throw ConfigError("bench attention: --tile-path fused needs a CPU with AVX2 and FMA (or AVX-512), and oneDNN's "
                      "ISA not capped below it (ONEDNN_MAX_CPU_ISA)");
  if (dt == DType::f32) {
    if (name == "gemm") return AttentionTilePath::f32;
    if (name == "fused") return AttentionTilePath::f32_fused;
    throw ConfigError("bench attention: --tile-path for fp32 must be auto, gemm or fused, got '" + name + "'");
  }
  if (name == "widened") return AttentionTilePath::bf16_widened;
  if (name == "native") return AttentionTilePath::bf16_native;
  if (name == "fused") return AttentionTilePath::bf16_fused;
  if (name == "dot" && !attention_dot_tiles_supported())
    throw ConfigError("bench attention: --tile-path dot needs a CPU with AVX512-BF16 or AMX-BF16, and oneDNN's ISA not "
                      "capped below it (ONEDNN_MAX_CPU_ISA)");
  if (name == "dot") return AttentionTilePath::bf16_dot;
  throw ConfigError("bench attention: --tile-path for bf16 must be auto, widened, native, fused or dot, got '" + name +
                    "'");
}

Flags parse_flags(const Args& args) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      f.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw ConfigError("bench attention: flag '" + a + "' needs a value");
    const std::string& v = args[++i];
    if (a == "--batch") f.batch = positive(a, v);
    else if (a == "--seq") f.seq = positive(a, v);
    else if (a == "--kv-seq") f.kv_seq = positive(a, v);
    else if (a == "--heads") f.heads = positive(a, v);
    else if (a == "--kv-heads") f.kv_heads = positive(a, v);
    else if (a == "--head-dim") f.head_dim = positive(a, v);
    else if (a == "--threads") f.threads = static_cast<int>(positive(a, v));
    else if (a == "--reps") f.reps = positive(a, v);
    else if (a == "--gemm-size") f.gemm_size = positive(a, v);
    else if (a == "--warmup") f.warmup = v == "0" ? 0 : positive(a, v);
    else if (a == "--mask") f.mask = v;
    else if (a == "--dtype") f.dtype = v;
    else if (a == "--clock") f.clock = v;
    else if (a == "--tile-path") f.tile_path = v;
    else throw ConfigError("bench attention: unknown flag '" + a + "'\n" + kBenchAttentionUsage);
  }
  if (f.kv_seq == 0) f.kv_seq = f.seq;
  if (f.kv_heads == 0) f.kv_heads = f.heads;
  if (f.heads % f.kv_heads != 0)
    throw ConfigError("bench attention: --heads (" + std::to_string(f.heads) +
                      ") must be a multiple of --kv-heads (" + std::to_string(f.kv_heads) + ")");
  if (f.clock != "wall" && f.clock != "cpu")
    throw ConfigError("bench attention: --clock must be wall or cpu, got '" + f.clock + "'");
  parse_enum<DType>(f.dtype);  // fp32, float32, bf16 or bfloat16, else a ConfigError naming them
  tile_path_of(f.tile_path, parse_enum<DType>(f.dtype));  // checks it
  return f;
}

// "documents:N" is causal + same_segment over N equal documents; anything
// else is a MaskSpec. Returns the number of documents (0 without segments).
int64_t parse_bench_mask(const std::string& text, MaskSpec& mask) {
  const std::string prefix = "documents:";
  if (text.rfind(prefix, 0) != 0) {
    mask = MaskSpec::parse(text);
    return mask.same_segment ? 1 : 0;
  }
  mask = MaskSpec::causal();
  mask.same_segment = true;
  return positive("--mask documents:N", text.substr(prefix.size()));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one call: wall clock, or process CPU seconds per thread (other
// jobs on a shared machine then slow the call less).
template <typename F>
double seconds_of(bool cpu_clock, F&& call) {
  if (!cpu_clock) {
    Timer timer;
    call();
    return timer.seconds();
  }
  auto cpu_now = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  };
  const double start = cpu_now();
  call();
  return (cpu_now() - start) / omp_get_max_threads();
}

// Median and fastest seconds of `reps` calls after `warmup` calls (the
// fastest is what a shared machine's noise disturbs least).
struct Timing {
  double median, best;
};
template <typename F>
Timing time_calls(bool cpu_clock, int64_t warmup, int64_t reps, F&& call) {
  for (int64_t w = 0; w < warmup; ++w) call();
  std::vector<double> t;
  for (int64_t r = 0; r < reps; ++r) t.push_back(seconds_of(cpu_clock, call));
  return {median(t), *std::min_element(t.begin(), t.end())};
}

// The GEMM reference in `dtype`: measure_gemm_gflops of an n^3 product on
// the wall clock; on the CPU clock the same product, best of 5 after a warm-up.
double gemm_gflops(bool cpu_clock, DType dtype, int64_t n) {
  if (!cpu_clock) return measure_gemm_gflops(dtype, n);
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<bf16> a16(n * n, bf16(0.5f)), b16(n * n, bf16(0.25f));
  auto once = [&] {
    if (dtype == DType::bf16)
      gemm_bf16(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    else
      gemm_f32(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  once();
  double best = 0.0;
  for (int r = 0; r < 5; ++r) best = std::max(best, 2.0 * n * n * n / seconds_of(true, once) / 1e9);
  return best;
}

void fill_random(const Tensor& t, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = dist(gen);
    if (t.view().dtype == DType::bf16) static_cast<bf16*>(t.view().data)[i] = bf16(x);
    else t.f32()[i] = x;
  }
}

}  // namespace

int run_bench_attention(const Args& args) {
  const Flags f = parse_flags(args);
  MaskSpec mask;
  const int64_t documents = parse_bench_mask(f.mask, mask);
  if (f.threads > 0) omp_set_num_threads(f.threads);
  const int threads = omp_get_max_threads();
  const int64_t B = f.batch, Sq = f.seq, Skv = f.kv_seq, H = f.heads, G = f.kv_heads, D = f.head_dim;

  const auto act = MemCategory::activations;
  const DType dt = parse_enum<DType>(f.dtype);  // q, k, v, o, dout; gradients fp32
  // The kernels this run times: the CPU's, with --tile-path pinned.
  KernelSet kernels = cpu_kernel_set();
  if (const AttentionTilePath pinned = tile_path_of(f.tile_path, dt); pinned != AttentionTilePath::automatic)
    (dt == DType::f32 ? kernels.f32_attention : kernels.bf16_attention) = pinned;
  const std::unique_ptr<Device> device = Device::make_cpu(kernels);
  const DeviceScope on_device(*device);
  Tensor q({B, Sq, H, D}, dt, act, "bench q"), o({B, Sq, H, D}, dt, act, "bench o");
  Tensor dout({B, Sq, H, D}, dt, act, "bench dout");
  Tensor dq({B, Sq, H, D}, DType::f32, act, "bench dq");
  Tensor k({B, Skv, G, D}, dt, act, "bench k"), v({B, Skv, G, D}, dt, act, "bench v");
  Tensor dk({B, Skv, G, D}, DType::f32, act, "bench dk"), dv({B, Skv, G, D}, DType::f32, act, "bench dv");
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3), fill_random(dout, 4);
  std::vector<float> lse(B * Sq * H), delta(B * Sq * H);  // [B, Sq, H]

  // kv at positions 0..Skv-1, q rows end-aligned; documents cut [0, Skv).
  std::vector<int64_t> q_pos(B * Sq), kv_pos(B * Skv);
  std::vector<int32_t> q_seg(B * Sq), kv_seg(B * Skv);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < Skv; ++j) {
      kv_pos[b * Skv + j] = j;
      kv_seg[b * Skv + j] = static_cast<int32_t>(j * std::max<int64_t>(documents, 1) / Skv);
    }
    for (int64_t i = 0; i < Sq; ++i) {
      const int64_t p = Skv - Sq + i;
      q_pos[b * Sq + i] = p;
      q_seg[b * Sq + i] = static_cast<int32_t>(std::max<int64_t>(p, 0) * std::max<int64_t>(documents, 1) / Skv);
    }
  }
  AttentionArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view();
  a.q_pos = q_pos.data(), a.kv_pos = kv_pos.data();
  a.q_seg = q_seg.data(), a.kv_seg = kv_seg.data();
  a.mask = mask;

  const int64_t pairs = attention_unmasked_pairs_blocked(a);
  const double fwd_flops = 4.0 * D * pairs, bwd_flops = 10.0 * D * pairs;
  AttentionStats stats;
  attention_forward(a, o.view(), lse.data(), &stats);  // also the stats of one call

  const bool cpu_clock = f.clock == "cpu";
  const double gemm_before = gemm_gflops(cpu_clock, dt, f.gemm_size);
  const Timing fwd = time_calls(cpu_clock, f.warmup, f.reps,
                                [&] { attention_forward(a, o.view(), lse.data()); });
  attention_delta(o.view(), dout.view(), delta.data());
  const Timing bwd = time_calls(cpu_clock, f.warmup, f.reps, [&] {
    attention_backward(a, dout.view(), lse.data(), delta.data(), dq.view(), dk.view(), dv.view());
  });
  // The GEMM is measured on both sides, best kept: the machine may be shared.
  const double gemm = std::max(gemm_before, gemm_gflops(cpu_clock, dt, f.gemm_size));
  const std::string tile_path = attention_tile_path_name(attention_tile_path(dt));
  const std::string gemm_name = dt == DType::bf16 ? "gemm_bf16: " + gemm_bf16_implementation(f.gemm_size)
                                                  : std::string("oneDNN sgemm");
  const double fwd_gflops = fwd_flops / fwd.median / 1e9, bwd_gflops = bwd_flops / bwd.median / 1e9;
  const double fwd_best = fwd_flops / fwd.best / 1e9, bwd_best = bwd_flops / bwd.best / 1e9;

  if (f.json) {
    nlohmann::json j = {
        {"batch", B}, {"seq", Sq}, {"kv_seq", Skv}, {"heads", H}, {"kv_heads", G},
        {"head_dim", D}, {"mask", f.mask}, {"dtype", f.dtype}, {"threads", threads},
        {"reps", f.reps}, {"warmup", f.warmup}, {"clock", f.clock}, {"pairs", pairs},
        {"fwd_seconds", fwd.median}, {"bwd_seconds", bwd.median},
        {"fwd_best_gflops", fwd_best}, {"bwd_best_gflops", bwd_best},
        {"fwd_gflops", fwd_gflops}, {"bwd_gflops", bwd_gflops}, {"gemm_gflops", gemm},
        {"fwd_ratio", fwd_gflops / gemm}, {"bwd_ratio", bwd_gflops / gemm},
        {"blocks_total", stats.blocks_total}, {"blocks_partial", stats.blocks_partial},
        {"blocks_full", stats.blocks_full}, {"tile_path", tile_path}, {"gemm", gemm_name},
        {"bf16_choice", dt == DType::bf16 ? bf16_attention_choice() : ""}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("attention %s B=%ld Sq=%ld Skv=%ld H=%ld G=%ld D=%ld mask=%s threads=%d\n",
              f.dtype.c_str(), B, Sq, Skv, H, G, D, f.mask.c_str(), threads);
  std::printf("tile path: %s\n", tile_path.c_str());
  if (dt == DType::bf16) std::printf("automatic bf16 path: %s\n", bf16_attention_choice().c_str());
  std::printf("pairs %ld; tiles computed %ld of %ld (%ld with the elementwise mask)\n", pairs,
              stats.blocks_computed(), stats.blocks_total, stats.blocks_partial);
  std::printf("median of %ld after %ld warm-up (fastest in brackets)\n", f.reps, f.warmup);
  std::printf("forward  %9.4f s  %7.1f GFLOP/s  %.2f x GEMM  (%.1f, %.2f)\n", fwd.median, fwd_gflops,
              fwd_gflops / gemm, fwd_best, fwd_best / gemm);
  std::printf("backward %9.4f s  %7.1f GFLOP/s  %.2f x GEMM  (%.1f, %.2f)\n", bwd.median, bwd_gflops,
              bwd_gflops / gemm, bwd_best, bwd_best / gemm);
  std::printf("gemm               %7.1f GFLOP/s  (%s, %lld^3, same threads, %s clock)\n", gemm,
              gemm_name.c_str(), static_cast<long long>(f.gemm_size), f.clock.c_str());
  return 0;
}

}  // namespace longctx
