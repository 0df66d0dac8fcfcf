// Do our checkpoints mean what Hugging Face transformers would read? A model
// with random weights (norm weights away from 1, GQA, H * D != d_model) is
// saved with the real save_checkpoint, and tests/hf_llama_reference.py, an
// independent numpy implementation of transformers' LlamaForCausalLM (it
// shares no code with longctx), reads model.safetensors + config.json and
// computes the next-token loss; it must equal the model's own forward loss to
// 1e-5 relative. Variants: untied and tied embeddings, Llama 3.1 RoPE scaling.
// And the reference must refuse a checkpoint that contradicts its config.json.
//
// Needs python3 with numpy (Debian: python3-numpy, installed by scripts/setup.sh).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "run_command.h"
#include "temp_dir.h"
#include "train/checkpoint.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;

namespace {

const fs::path kReference = fs::path(__FILE__).parent_path().parent_path() / "hf_llama_reference.py";
constexpr int64_t kSeq = 67;  // positions 0..66 predict tokens 1..67; not a multiple of any tile size

using Result = CommandResult;
Result run(const std::string& command) { return run_command(command); }
std::string quote(const std::string& s) { return shell_quote(s); }

const std::string& python() { return numpy_python(); }

Result reference(const fs::path& checkpoint, const fs::path& tokens) {
  return run(python() + " " + quote(kReference.string()) + " " + quote(checkpoint.string()) + " " +
             quote(tokens.string()));
}

double parse_loss(const Result& r) {
  const auto at = r.output.find("hf_reference_loss ");
  if (r.status != 0 || at == std::string::npos) return std::nan("");
  return std::strtod(r.output.c_str() + at + 18, nullptr);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

RunConfig model_config(bool tied, bool rope_scaling, double norm_eps) {
  std::map<std::string, ConfigValue> v = {
      {"vocab_size", int64_t(259)},        {"base_emb_dim", int64_t(48)},
      {"base_num_query_heads", int64_t(6)}, {"base_num_kv_heads", int64_t(2)},  // GQA, 3 heads per KV head
      {"head_dim", int64_t(12)},            // H * D = 72 != d_model: catches mixed-up dimensions
      {"base_mlp_dim", int64_t(80)},        {"base_num_decoder_layers", int64_t(2)},
      {"rope_max_timescale", 10000.0},      {"normalization_layer_epsilon", norm_eps},
      {"logits_via_embedding", tied},       {"dataset_type", std::string("synthetic")},
      {"max_target_length", kSeq}};
  if (rope_scaling) {
    // A short "original" context so that, at positions < 68, the wavelengths
    // 2 pi / inv_freq of head_dim 12 (6.3, 29, 135, 628, ...) fall in all
    // three Llama 3.1 bands: kept (< 8), smoothed (8..32) and divided (> 32).
    v["rope_use_scaling"] = true;
    v["rope_scaling_factor"] = 8.0;
    v["rope_low_freq_factor"] = 1.0;
    v["rope_high_freq_factor"] = 4.0;
    v["rope_original_max_position"] = int64_t(32);
  }
  return config_from_values(v);
}

// Seeded weights large enough that every op matters: linear ~ N(0, 1/in),
// the embedding / LM head x3 so that the loss is far from log(vocab), and
// RMSNorm weights 1 + N(0, 0.3^2) so that a reader ignoring them would differ.
void randomise(LlamaModel& model, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const NamedTensor& p : model.parameters()) {
    float* v = p.local.f32();
    const bool norm = p.local.rank == 1;
    const bool vocab = p.name == "model.embed_tokens.weight" || p.name == "lm_head.weight";
    const float scale = norm ? 0.3f : (vocab ? 3.0f : 1.0f) / std::sqrt(static_cast<float>(p.local.dim(1)));
    for (int64_t i = 0; i < p.local.numel(); ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * dist(gen);
  }
}

struct Saved {
  double model_loss = 0.0;                                   // the model's forward, KernelImpl::fast
  double model_loss_reference_kernel = 0.0;                  // the same with the float64 attention kernel
  fs::path checkpoint, tokens;
};

// Builds the model, computes its loss on kSeq + 1 seeded tokens (positions
// 0..kSeq-1, causal, no packing, every target weighted), saves a checkpoint
// under dir and the tokens as text.
Saved build_and_save(const fs::path& dir, bool tied, bool rope_scaling, uint32_t seed, double norm_eps = 1e-5) {
  RunConfig c = model_config(tied, rope_scaling, norm_eps);
  Saved s;
  std::mt19937 gen(seed + 100);
  std::vector<int32_t> ids(kSeq + 1);
  for (auto& t : ids) t = static_cast<int32_t>(gen() % c.model.vocab_size);
  std::vector<int64_t> positions(kSeq);
  for (int64_t i = 0; i < kSeq; ++i) positions[i] = i;
  Batch b;
  b.batch = 1;
  b.seq_local = kSeq;
  b.tokens = ids.data();
  b.targets = ids.data() + 1;
  b.positions = positions.data();

  for (KernelImpl impl : {KernelImpl::fast, KernelImpl::reference}) {
    ModelOptions o;  // the trainer's defaults: causal mask, one rank
    o.impl = impl;
    LlamaModel model(c.model, o, seed);
    randomise(model, seed);
    const LossStats l = model.forward(b);
    EXPECT_EQ(l.weight_sum, static_cast<double>(kSeq));
    (impl == KernelImpl::fast ? s.model_loss : s.model_loss_reference_kernel) = l.loss_sum / l.weight_sum;
    if (impl == KernelImpl::fast) {
      AdamW opt(model, c, one_rank());
      s.checkpoint = save_checkpoint((dir / "ckpt").string(), model, opt, TrainState{1, 0, 0}, c, one_rank());
    }
  }
  std::ostringstream text;
  for (int32_t t : ids) text << t << "\n";
  s.tokens = dir / "tokens.txt";
  std::ofstream(s.tokens) << text.str();
  return s;
}

void expect_reference_agrees(bool tied, bool rope_scaling, uint32_t seed, double norm_eps = 1e-5) {
  ASSERT_FALSE(python().empty()) << "python3 with numpy not found (Debian: apt-get install python3-numpy)";
  TempDir t;
  const Saved s = build_and_save(t.path, tied, rope_scaling, seed, norm_eps);
  const Result r = reference(s.checkpoint, s.tokens);
  ASSERT_EQ(r.status, 0) << r.output;
  const double hf = parse_loss(r);
  ASSERT_TRUE(std::isfinite(hf)) << r.output;
  EXPECT_NE(r.output.find("hf_reference_tokens " + std::to_string(kSeq)), std::string::npos) << r.output;
  const double rel = std::abs(s.model_loss - hf) / std::abs(hf);
  const double rel_ref = std::abs(s.model_loss_reference_kernel - hf) / std::abs(hf);
  std::printf("tied=%d rope_scaling=%d: longctx %.10f (float64 kernel %.10f), HF reference %.10f, "
              "relative difference %.2e (%.2e); log(vocab) = %.4f\n",
              tied, rope_scaling, s.model_loss, s.model_loss_reference_kernel, hf, rel, rel_ref, std::log(259.0));
  EXPECT_LE(rel, 1e-5) << "longctx loss " << s.model_loss << " vs Hugging Face reference " << hf;
  EXPECT_LE(rel_ref, 1e-5) << "longctx (float64 kernel) loss " << s.model_loss_reference_kernel << " vs " << hf;
}

// Rewrites config.json of a checkpoint after `edit`.
void edit_config(const fs::path& checkpoint, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(read(checkpoint / "config.json"));
  edit(j);
  std::ofstream(checkpoint / "config.json", std::ios::trunc) << j.dump(2);
}

}  // namespace

TEST(HfCheckpoint, ReferenceLossMatchesGqaUntied) { expect_reference_agrees(false, false, 11); }

// A large epsilon here, so that rms_norm_eps reaching config.json is tested too
// (at 1e-5 it moves the loss by less than the tolerance).
TEST(HfCheckpoint, ReferenceLossMatchesTiedEmbeddings) { expect_reference_agrees(true, false, 12, 1e-2); }

TEST(HfCheckpoint, ReferenceLossMatchesLlama31RopeScaling) { expect_reference_agrees(false, true, 13); }

// The comparison has power: the same checkpoint read without its rope_scaling
// gives a clearly different loss (so the agreement above is not a tolerance
// wide enough to hide a convention mismatch).
TEST(HfCheckpoint, ReferenceIsSensitiveToRopeScaling) {
  ASSERT_FALSE(python().empty()) << "python3 with numpy not found (Debian: apt-get install python3-numpy)";
  TempDir t;
  const Saved s = build_and_save(t.path, false, true, 13);
  edit_config(s.checkpoint, [](nlohmann::json& j) { j["rope_scaling"] = nullptr; });
  const Result r = reference(s.checkpoint, s.tokens);
  ASSERT_EQ(r.status, 0) << r.output;
  const double rel = std::abs(s.model_loss - parse_loss(r)) / std::abs(s.model_loss);
  std::printf("without rope_scaling the reference differs by %.2e relative\n", rel);
  EXPECT_GT(rel, 1e-3);
}

TEST(HfCheckpoint, ReferenceRejectsACheckpointThatContradictsItsConfig) {
  ASSERT_FALSE(python().empty()) << "python3 with numpy not found (Debian: apt-get install python3-numpy)";
  TempDir t;
  const Saved s = build_and_save(t.path, false, false, 21);
  const std::string config = read(s.checkpoint / "config.json");
  const std::string weights = read(s.checkpoint / "model.safetensors");
  auto restore = [&] {
    std::ofstream(s.checkpoint / "config.json", std::ios::binary | std::ios::trunc) << config;
    std::ofstream(s.checkpoint / "model.safetensors", std::ios::binary | std::ios::trunc) << weights;
  };
  ASSERT_EQ(reference(s.checkpoint, s.tokens).status, 0);

  // num_key_value_heads 2 -> 3 (still divides 6 heads): k_proj/v_proj shapes disagree.
  edit_config(s.checkpoint, [](nlohmann::json& j) { j["num_key_value_heads"] = 3; });
  Result r = reference(s.checkpoint, s.tokens);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("k_proj"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("hf_reference_loss"), std::string::npos) << r.output;

  // tie_word_embeddings flipped on: lm_head.weight is then unexpected.
  restore();
  edit_config(s.checkpoint, [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  r = reference(s.checkpoint, s.tokens);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("lm_head.weight"), std::string::npos) << r.output;

  // A weight stored transposed ([in, out] instead of Linear's [out, in]).
  restore();
  auto w = read_safetensors((s.checkpoint / "model.safetensors").string());
  HostTensor& o = w.at("model.layers.1.self_attn.o_proj.weight");
  HostTensor tr{{o.shape[1], o.shape[0]}, std::vector<float>(o.data.size())};
  for (int64_t i = 0; i < o.shape[0]; ++i)
    for (int64_t j = 0; j < o.shape[1]; ++j) tr.data[j * o.shape[0] + i] = o.data[i * o.shape[1] + j];
  o = tr;
  std::vector<std::pair<std::string, const HostTensor*>> list;
  for (const auto& [name, tensor] : w) list.emplace_back(name, &tensor);
  write_safetensors((s.checkpoint / "model.safetensors").string(), list);
  r = reference(s.checkpoint, s.tokens);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("o_proj"), std::string::npos) << r.output;

  // A missing tensor.
  restore();
  w = read_safetensors((s.checkpoint / "model.safetensors").string());
  list.clear();
  for (const auto& [name, tensor] : w)
    if (name != "model.layers.0.post_attention_layernorm.weight") list.emplace_back(name, &tensor);
  write_safetensors((s.checkpoint / "model.safetensors").string(), list);
  r = reference(s.checkpoint, s.tokens);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("missing tensor model.layers.0.post_attention_layernorm.weight"), std::string::npos)
      << r.output;

  // A truncated file.
  restore();
  std::ofstream(s.checkpoint / "model.safetensors", std::ios::binary | std::ios::trunc)
      << weights.substr(0, weights.size() - 4);
  r = reference(s.checkpoint, s.tokens);
  EXPECT_NE(r.status, 0) << r.output;

  restore();
  EXPECT_EQ(reference(s.checkpoint, s.tokens).status, 0);
}
