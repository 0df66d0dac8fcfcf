// Pretrained Hugging Face weights (load_parameters_path), `longctx eval` by
// position bucket, and what a checkpoint's config.json claims about its
// attention. The oracles are independent of longctx: the numpy reference
// tests/hf_llama_reference.py (per-token losses), and transformers itself
// (tests/hf_transformers_check.py, in the venv scripts/python_env.sh makes:
// those tests SKIP, saying so, when the venv is missing). 4-rank runs go
// through `mpiexec -n 4 longctx eval` (ring with zigzag, ulysses, tp x ring).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
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
#include "train/data.h"
#include "train/eval.h"
#include "train_run.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace longctx;
using longctx::test::one_rank;

namespace {

const fs::path kSource = LONGCTX_SOURCE_DIR;
constexpr int64_t kSeq = 64, kWindows = 3;  // eval: 3 unpacked sequences of 64 positions

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The run config of these tests: unpacked binary data (positions 0..S-1 per
// sequence), small position buckets (0-8, 8-16, 16-32, 32-64).
std::map<std::string, ConfigValue> base_values(const fs::path& tokens, int64_t vocab) {
  return {{"vocab_size", vocab},
          {"base_emb_dim", int64_t(48)},
          {"base_num_query_heads", int64_t(4)},
          {"base_num_kv_heads", int64_t(2)},  // GQA; ulysses over 4 ranks replicates KV heads
          {"head_dim", int64_t(12)},
          {"base_mlp_dim", int64_t(80)},
          {"base_num_decoder_layers", int64_t(2)},
          {"rope_max_timescale", 10000.0},
          {"dataset_type", std::string("binary")},
          {"dataset_path", tokens.string()},
          {"eval_dataset_path", tokens.string()},
          {"packing", false},
          {"max_target_length", kSeq},
          {"eval_steps", kWindows},
          {"eval_first_bucket", int64_t(8)},
          {"steps", int64_t(1)}};
}

// kWindows * kSeq + 1 seeded ids below vocab: a binary token file and the same as text.
fs::path write_tokens(const fs::path& dir, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> tokens(kWindows * kSeq + 1);
  for (auto& t : tokens) t = static_cast<int32_t>(gen() % vocab);
  const Corpus c(tokens, {0, static_cast<int64_t>(tokens.size())});
  write_token_file((dir / "tokens.bin").string(), c, vocab);
  std::ostringstream text;
  for (int32_t t : tokens) text << t << "\n";
  std::ofstream(dir / "tokens.txt") << text.str();
  return dir / "tokens.bin";
}

// Seeded weights large enough that every op matters (as in test_hf_checkpoint).
void randomise(LlamaModel& model, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const NamedTensor& p : model.parameters()) {
    float* v = p.local.f32();
    const bool norm = p.local.rank == 1;
    const float scale = norm ? 0.3f : (p.name.find("embed") != std::string::npos || p.name == "lm_head.weight" ? 3.0f : 1.0f) /
                                          std::sqrt(static_cast<float>(p.local.dim(1)));
    for (int64_t i = 0; i < p.local.numel(); ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * dist(gen);
  }
}

// A random model of config c saved as a longctx checkpoint; returns its directory.
fs::path save_random(const RunConfig& c, const fs::path& dir, uint32_t seed) {
  ModelOptions o;
  o.mask = c.mask();
  LlamaModel model(c.model, o, seed);
  randomise(model, seed);
  AdamW opt(model, c, one_rank());
  return save_checkpoint(dir.string(), model, opt, TrainState{1, 0, 0}, c, one_rank());
}

// model.safetensors of a checkpoint split into two shards with an index
// (a Hugging Face sharded directory), config.json copied.
fs::path shard(const fs::path& checkpoint, const fs::path& out) {
  fs::create_directories(out);
  const auto tensors = read_safetensors((checkpoint / "model.safetensors").string());
  std::vector<std::pair<std::string, const HostTensor*>> a, b;
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (const auto& [name, t] : tensors) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b).emplace_back(name, &t);
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors((out / "model-00001-of-00002.safetensors").string(), a);
  write_safetensors((out / "model-00002-of-00002.safetensors").string(), b);
  std::ofstream(out / "model.safetensors.index.json") << index.dump(2);
  fs::copy_file(checkpoint / "config.json", out / "config.json");
  return out;
}

std::vector<float> flat_copy(const LlamaModel& m) {
  return {m.flat_parameters().begin(), m.flat_parameters().end()};
}

// The run config with load_parameters_path's config.json applied, validated for `ranks`.
RunConfig loaded_config(std::map<std::string, ConfigValue> v, const fs::path& weights, int64_t ranks = 1) {
  v["load_parameters_path"] = weights.string();
  RunConfig c = config_from_values(v);
  apply_hf_model_config(c);
  validate_config(c, ranks);
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// `mpiexec -n 4 longctx eval` of the config file with the overrides; the eval JSON.
json eval_4_ranks(const fs::path& dir, const RunConfig& c, const std::string& overrides, const std::string& name) {
  const fs::path cfg = dir / (name + ".yml"), out = dir / (name + ".json");
  std::ofstream(cfg) << c.to_yaml();
  const CommandResult r = run_command(
      "env OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -n 4 " +
      shell_quote(LONGCTX_BINARY) + " eval " + shell_quote(cfg.string()) + " " + overrides +
      " eval_output=" + shell_quote(out.string()));
  EXPECT_EQ(r.status, 0) << r.output;
  if (r.status != 0 || !fs::exists(out)) return json();
  return json::parse(read(out));
}

// The venv's python with torch + transformers, or "" (the caller skips).
std::string transformers_python() {
  if (!fs::exists(kSource / "build/venv-hf/.installed")) return "";
  const CommandResult r =
      run_command(shell_quote((kSource / "scripts/python_env.sh").string()) + " hf torch transformers safetensors");
  if (r.status != 0) return "";
  const std::string py = r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1);
  return py.substr(0, py.find('\n'));
}
#define REQUIRE_TRANSFORMERS(py)                                                                          \
  const std::string py = transformers_python();                                                           \
  if (py.empty())                                                                                         \
    GTEST_SKIP() << "transformers venv missing: run scripts/python_env.sh hf torch transformers safetensors " \
                    "(scripts/test.sh does; needs PyPI)";

// "hf_loss DIR value" lines of hf_transformers_check.py.
double hf_value(const std::string& output, const std::string& key, const fs::path& dir) {
  const std::string tag = key + " " + dir.string() + " ";
  const auto at = output.find(tag);
  return at == std::string::npos ? std::nan("") : std::strtod(output.c_str() + at + tag.size(), nullptr);
}

}  // namespace

TEST(HfModels, WidensBf16AndF16Exactly) {
  // bit patterns -> values: 1, -2, the largest/smallest normal, a subnormal, inf
  const uint16_t bf16[] = {0x3f80, 0xc000, 0x7f7f, 0x0080, 0x0001, 0x7f80};
  const float bf16_want[] = {1.0f, -2.0f, 3.3895313892515355e38f, 1.1754943508222875e-38f, 9.183549615799121e-41f, INFINITY};
  const uint16_t f16[] = {0x3c00, 0xc000, 0x7bff, 0x0400, 0x0001, 0x03ff, 0xfc00, 0x8000};
  const float f16_want[] = {1.0f, -2.0f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 6.097555160522461e-05f, -INFINITY, -0.0f};
  float out[8];
  widen_to_f32(StoredType::bf16, bf16, 6, out);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], bf16_want[i]) << i;
  widen_to_f32(StoredType::f16, f16, 8, out);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[i], f16_want[i]) << i;
  EXPECT_TRUE(std::signbit(out[7]));
  const uint16_t nan16 = 0x7e00;
  widen_to_f32(StoredType::f16, &nan16, 1, out);
  EXPECT_TRUE(std::isnan(out[0]));
}

// Sharded directory -> model -> save_checkpoint -> load: the same bytes, for
// GQA, tied embeddings and Llama 3.1 RoPE scaling; config.json gives the shape.
TEST(HfModels, ShardedDirectoryLoadsAndRoundTrips) {
  for (const bool variant : {false, true}) {
    TempDir t;
    auto v = base_values(write_tokens(t.path, 300, 1), 300);
    v["logits_via_embedding"] = variant;
    v["rope_use_scaling"] = variant;
    v["rope_original_max_position"] = int64_t(32);
    const RunConfig c = config_from_values(v);
    const fs::path a = save_random(c, t.path / "a", 5 + variant);
    const fs::path sharded = shard(a, t.path / "hf");

    // The shape comes from config.json: a run config with only the defaults.
    RunConfig fresh = loaded_config({{"dataset_type", std::string("synthetic")}, {"max_target_length", kSeq}}, sharded);
    EXPECT_EQ(fresh.model.d_model, 48);
    EXPECT_EQ(fresh.model.num_kv_heads, 2);
    EXPECT_EQ(fresh.model.head_dim, 12);
    EXPECT_EQ(fresh.model.tie_embeddings, variant);
    EXPECT_EQ(fresh.model.rope_llama3_scaling, variant);
    EXPECT_EQ(fresh.model.rope_original_max_position, variant ? 32 : 8192);
    EXPECT_EQ(fresh.model.rope_theta, 10000.0);

    LlamaModel original(c.model, ModelOptions{}, 5 + variant);
    randomise(original, 5 + variant);
    LlamaModel loaded(fresh.model, ModelOptions{}, 99);
    load_hf_parameters(sharded.string(), loaded);
    EXPECT_EQ(flat_copy(loaded), flat_copy(original));
    AdamW opt(loaded, fresh, one_rank());
    const fs::path b = save_checkpoint((t.path / "b").string(), loaded, opt, TrainState{1, 0, 0}, fresh, one_rank());
    EXPECT_EQ(read(a / "model.safetensors"), read(b / "model.safetensors"));
    EXPECT_EQ(json::parse(read(a / "config.json")), json::parse(read(b / "config.json")));
    LlamaModel again(fresh.model, ModelOptions{}, 98);
    load_hf_parameters(b.string(), again);
    EXPECT_EQ(flat_copy(again), flat_copy(original));
  }
}

TEST(HfModels, MismatchesAreErrorsNamingTheTensorFileAndRule) {
  TempDir t;
  const fs::path tokens = write_tokens(t.path, 300, 2);
  const RunConfig c = config_from_values(base_values(tokens, 300));
  const fs::path hf = shard(save_random(c, t.path / "ckpt", 3), t.path / "hf");
  const fs::path shard1 = hf / "model-00001-of-00002.safetensors", index = hf / "model.safetensors.index.json";
  const std::string shard1_bytes = read(shard1), index_text = read(index);
  auto restore = [&] {
    std::ofstream(shard1, std::ios::binary | std::ios::trunc) << shard1_bytes;
    std::ofstream(index, std::ios::trunc) << index_text;
  };
  auto load_error = [&] {
    LlamaModel m(c.model, ModelOptions{}, 1);
    return error_of([&] { load_hf_parameters(hf.string(), m); });
  };
  auto rewrite_shard1 = [&](const std::function<void(std::map<std::string, HostTensor>&)>& edit) {
    auto w = read_safetensors(shard1.string());
    edit(w);
    std::vector<std::pair<std::string, const HostTensor*>> list;
    json idx = json::parse(index_text);
    for (const auto& [name, tensor] : w) {
      list.emplace_back(name, &tensor);
      idx["weight_map"][name] = shard1.filename().string();
    }
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end();)
      it = (it.value() == shard1.filename().string() && !w.count(it.key())) ? idx["weight_map"].erase(it) : std::next(it);
    write_safetensors(shard1.string(), list);
    std::ofstream(index, std::ios::trunc) << idx.dump();
  };
  EXPECT_EQ(load_error(), "(no error)");

  rewrite_shard1([](auto& w) { w.erase("model.layers.0.post_attention_layernorm.weight"); });
  EXPECT_NE(load_error().find("tensor 'model.layers.0.post_attention_layernorm.weight' is missing"), std::string::npos)
      << load_error();
  restore();
  rewrite_shard1([](auto& w) { w["model.layers.0.extra.weight"] = HostTensor{{2}, {1, 2}}; });
  EXPECT_NE(load_error().find("unexpected tensor 'model.layers.0.extra.weight'"), std::string::npos) << load_error();
  restore();
  rewrite_shard1([](auto& w) { w["model.norm.weight"] = HostTensor{{47}, std::vector<float>(47, 1.0f)}; });
  EXPECT_NE(load_error().find("tensor 'model.norm.weight' has shape [47], the model wants [48]"), std::string::npos)
      << load_error();
  restore();
  {  // F64 with the right byte count: the dtype is what is refused
    std::string bytes = shard1_bytes;
    const auto at = bytes.find("\"F32\"");
    bytes.replace(at, 5, "\"I32\"");
    std::ofstream(shard1, std::ios::binary | std::ios::trunc) << bytes;
    EXPECT_NE(load_error().find("unsupported dtype \"I32\""), std::string::npos) << load_error();
    EXPECT_NE(load_error().find(shard1.string()), std::string::npos) << load_error();
  }
  restore();
  fs::rename(shard1, t.path / "aside");
  EXPECT_NE(load_error().find("shard 'model-00001-of-00002.safetensors' named by model.safetensors.index.json is missing"),
            std::string::npos) << load_error();
  fs::rename(t.path / "aside", shard1);
  for (const std::string outside : {"../ckpt/x.safetensors", "/etc/passwd", ".."}) {
    json idx = json::parse(index_text);
    idx["weight_map"]["model.norm.weight"] = outside;
    std::ofstream(index, std::ios::trunc) << idx.dump();
    EXPECT_NE(load_error().find("shard files must be plain names inside the model directory"), std::string::npos)
        << load_error();
  }
  restore();
  {  // a tensor the index places in the wrong shard
    json idx = json::parse(index_text);
    idx["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
    std::ofstream(index, std::ios::trunc) << idx.dump();
    EXPECT_NE(load_error().find("does not list there"), std::string::npos) << load_error();
  }
  restore();

  // The data's vocabulary must fit the model's (from config.json: 300).
  fs::create_directories(t.path / "big");
  const fs::path big_vocab = write_tokens(t.path / "big", 400, 3);
  RunConfig d = loaded_config({{"dataset_type", std::string("binary")}, {"dataset_path", big_vocab.string()},
                               {"max_target_length", kSeq}}, hf);
  EXPECT_NE(error_of([&] { load_corpus(d); }).find("vocab"), std::string::npos) << error_of([&] { load_corpus(d); });

  // An explicit shape key that contradicts config.json; an explicit RoPE key wins.
  EXPECT_NE(error_of([&] { loaded_config({{"base_emb_dim", int64_t(64)}, {"dataset_type", std::string("synthetic")}}, hf); })
                .find("the model shape key 'base_emb_dim' is 64 (set in config) but 48 in config.json"),
            std::string::npos);
  EXPECT_EQ(loaded_config({{"rope_max_timescale", 5e5}, {"dataset_type", std::string("synthetic")}}, hf).model.rope_theta, 5e5);
  EXPECT_EQ(loaded_config({{"dataset_type", std::string("synthetic")}}, hf).model.rope_theta, 1e4);
}

// Per-bucket losses of `longctx eval` = the numpy reference's per-token
// losses summed by position, at 1 rank and at 4 ranks (ring zigzag, ulysses, tp x ring).
TEST(HfModels, EvalBucketsMatchNumpyReferencePerTokenLosses) {
  TempDir t;
  const fs::path tokens = write_tokens(t.path, 300, 4);
  const auto v = base_values(tokens, 300);
  const fs::path ckpt = save_random(config_from_values(v), t.path / "ckpt", 8);
  std::vector<int32_t> ids;
  {
    std::istringstream in(read(t.path / "tokens.txt"));
    for (int32_t x; in >> x;) ids.push_back(x);
  }
  const std::vector<PositionBucket> edges = position_buckets(kSeq, 8);
  ASSERT_EQ(edges.size(), 4u);  // 0-8, 8-16, 16-32, 32-64
  std::vector<double> want(edges.size(), 0.0);
  for (int64_t k = 0; k < kWindows; ++k) {
    std::ostringstream window;
    for (int64_t i = 0; i <= kSeq; ++i) window << ids[k * kSeq + i] << " ";
    const fs::path wf = t.write("window.txt", window.str());
    ASSERT_FALSE(numpy_python().empty()) << "python3 with numpy not found (Debian: apt-get install python3-numpy)";
    const CommandResult r = run_command(numpy_python() + " " + shell_quote((kSource / "tests/hf_llama_reference.py").string()) +
                                        " " + shell_quote(ckpt.string()) + " " + shell_quote(wf.string()) + " --token-losses");
    ASSERT_EQ(r.status, 0) << r.output;
    std::istringstream losses(r.output.substr(r.output.find("hf_reference_token_losses ") + 26));
    for (int64_t p = 0; p < kSeq; ++p) {
      double l;
      ASSERT_TRUE(losses >> l) << r.output;
      size_t b = 0;
      while (p >= edges[b].end) ++b;
      want[b] += l;
    }
  }
  auto expect_buckets = [&](const std::vector<double>& loss_sums, const std::vector<double>& counts, const std::string& what) {
    ASSERT_EQ(loss_sums.size(), want.size()) << what;
    for (size_t b = 0; b < want.size(); ++b) {
      EXPECT_EQ(counts[b], double(kWindows * (edges[b].end - edges[b].begin))) << what << " bucket " << b;
      EXPECT_NEAR(loss_sums[b], want[b], 2e-6 * std::abs(want[b])) << what << " bucket " << b;
    }
  };
  const RunConfig c = loaded_config(v, ckpt);
  const EvalResult one = evaluate(c, one_rank());
  std::vector<double> sums, counts;
  for (const PositionBucket& b : one.buckets) sums.push_back(b.loss_sum), counts.push_back(b.tokens);
  expect_buckets(sums, counts, "1 rank");
  for (const auto& [name, overrides] : std::vector<std::pair<std::string, std::string>>{
           {"ring", "ici_context_parallelism=4 context_parallel_strategy=ring context_parallel_load_balance=true"},
           {"ulysses", "ici_context_parallelism=4 context_parallel_strategy=ulysses"},
           {"tp_ring", "ici_tensor_parallelism=2 ici_context_parallelism=2 context_parallel_strategy=ring"}}) {
    const json j = eval_4_ranks(t.path, c, overrides, name);
    ASSERT_TRUE(j.is_object()) << name;
    sums.clear(), counts.clear();
    for (const json& b : j["buckets"]) sums.push_back(b["loss_sum"]), counts.push_back(b["tokens"]);
    expect_buckets(sums, counts, name);
  }
}

// A tiny Llama built and saved (bf16, sharded) by transformers: longctx's loss
// equals transformers' float32 loss on the same bf16 values, at 1 and 4 ranks.
TEST(HfModels, TransformersLlamaLoadsAndScoresTheSame) {
  REQUIRE_TRANSFORMERS(py);
  TempDir t;
  const fs::path tokens = write_tokens(t.path, 320, 6);
  const fs::path untied = t.path / "untied", tied = t.path / "tied";
  const CommandResult r = run_command(py + " " + shell_quote((kSource / "tests/hf_transformers_check.py").string()) +
                                      " make " + shell_quote((t.path / "tokens.txt").string()) + " " +
                                      std::to_string(kSeq) + " " + std::to_string(kWindows) + " " +
                                      shell_quote(untied.string()) + " " + shell_quote(tied.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const fs::path& dir : {untied, tied}) {
    ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json")) << "not sharded: " << r.output;
    const double hf = hf_value(r.output, "hf_loss", dir);
    ASSERT_TRUE(std::isfinite(hf)) << r.output;
    // The shape keys all come from transformers' config.json.
    const RunConfig c = loaded_config({{"dataset_type", std::string("binary")}, {"dataset_path", tokens.string()},
                                       {"eval_dataset_path", tokens.string()}, {"packing", false},
                                       {"max_target_length", kSeq}, {"eval_steps", kWindows}}, dir);
    EXPECT_EQ(c.model.tie_embeddings, dir == tied);
    const double one = evaluate(c, one_rank()).mean();
    std::printf("%s: transformers %.9f, longctx 1 rank %.9f (relative %.1e)\n", dir.filename().c_str(), hf, one,
                std::abs(one - hf) / hf);
    EXPECT_NEAR(one, hf, 1e-5 * hf);
    for (const std::string strategy : {"ring", "ulysses"}) {
      const json j = eval_4_ranks(t.path, c, "ici_context_parallelism=4 context_parallel_strategy=" + strategy,
                                  dir.filename().string() + strategy);
      ASSERT_TRUE(j.is_object()) << strategy;
      EXPECT_NEAR(j["loss"].get<double>(), hf, 1e-5 * hf) << strategy;
    }
  }
}

// What a checkpoint's config.json says is what transformers computes: causal
// as Llama, local as Mistral's sliding window (its off-by-one included);
// chunked and full attention get no config.json, and transformers refuses them.
TEST(HfModels, ExportedAttentionIsWhatTransformersComputes) {
  REQUIRE_TRANSFORMERS(py);
  TempDir t;
  write_tokens(t.path, 300, 9);
  std::ifstream in(t.path / "tokens.txt");
  std::vector<int32_t> ids;
  for (int32_t x; in >> x;) ids.push_back(x);
  std::vector<int64_t> positions(kSeq);
  for (int64_t i = 0; i < kSeq; ++i) positions[i] = i;
  struct Case {
    std::string name;
    std::map<std::string, ConfigValue> attention;
    bool exported;
    fs::path dir;
    double loss = 0;
  };
  std::vector<Case> cases = {
      {"causal", {{"attention_type", std::string("causal")}}, true, {}},
      {"local", {{"attention_type", std::string("local")}, {"sliding_window_size", int64_t(5)}}, true, {}},
      {"chunked", {{"attention_type", std::string("chunked")}, {"chunk_attn_window_size", int64_t(16)}}, false, {}},
      {"full", {{"attention_type", std::string("full")}}, false, {}}};
  std::string dirs;
  std::vector<double> off_by_one;
  for (Case& k : cases) {
    auto v = base_values(t.path / "tokens.bin", 300);
    v.insert(k.attention.begin(), k.attention.end());
    const RunConfig c = config_from_values(v);
    k.dir = save_random(c, t.path / k.name, 21);
    dirs += " " + shell_quote(k.dir.string());
    // longctx's loss of these weights under a mask (config.json or not, the weights load).
    auto loss_with = [&](const MaskSpec& mask) {
      ModelOptions o;
      o.mask = mask;
      LlamaModel model(c.model, o, 21);
      load_hf_parameters(k.dir.string(), model);
      double sum = 0;
      for (int64_t w = 0; w < kWindows; ++w) {
        Batch b;
        b.batch = 1;
        b.seq_local = kSeq;
        b.tokens = ids.data() + w * kSeq;
        b.targets = ids.data() + w * kSeq + 1;
        b.positions = positions.data();
        sum += model.forward(b).loss_sum;
      }
      return sum / (kWindows * kSeq);
    };
    k.loss = loss_with(c.mask());
    if (k.name == "local")  // a window one token shorter or longer: what an off-by-one would compute
      for (int64_t w : {4, 6}) off_by_one.push_back(loss_with(MaskSpec::local(w - 1, 0)));
    ModelOptions o;
    o.mask = c.mask();
    EXPECT_EQ(fs::exists(k.dir / "config.json"), k.exported) << k.name;
    EXPECT_EQ(fs::exists(k.dir / "README.txt"), !k.exported) << k.name;
    if (!k.exported) {
      EXPECT_NE(read(k.dir / "README.txt").find("attention_type " + k.name), std::string::npos) << read(k.dir / "README.txt");
      EXPECT_TRUE(json::parse(read(k.dir / "MANIFEST.json"))["no_hf_config"].is_string());
      // Still resumable: its model keys are checked against run_config.yml.
      LlamaModel again(c.model, o, 1);
      AdamW opt(again, c, one_rank());
      EXPECT_EQ(load_checkpoint(k.dir.string(), again, opt).step, 1);
    }
  }

  const CommandResult r = run_command(py + " " + shell_quote((kSource / "tests/hf_transformers_check.py").string()) +
                                      " loss " + shell_quote((t.path / "tokens.txt").string()) + " " +
                                      std::to_string(kSeq) + " " + std::to_string(kWindows) + dirs);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const Case& k : cases) {
    if (k.exported) {
      const double hf = hf_value(r.output, "hf_loss", k.dir);
      std::printf("%s: transformers %.9f, longctx %.9f\n", k.name.c_str(), hf, k.loss);
      EXPECT_NEAR(k.loss, hf, 1e-6 * k.loss) << k.name << "\n" << r.output;
      // The comparison has power: the other attentions land clearly farther away.
      for (double other : k.name == "local" ? off_by_one : std::vector<double>{cases[1].loss}) {
        std::printf("  %s: a neighbouring mask gives %.9f (relative %.1e)\n", k.name.c_str(), other, std::abs(other - hf) / hf);
        EXPECT_GT(std::abs(other - hf), 2e-5 * hf) << k.name;
      }
      EXPECT_NE(r.output.find("hf_model " + k.dir.string() + (k.name == "local" ? " MistralForCausalLM" : " LlamaForCausalLM")),
                std::string::npos) << r.output;
    } else {
      EXPECT_NE(r.output.find("hf_refused " + k.dir.string()), std::string::npos) << k.name << "\n" << r.output;
    }
  }
}
