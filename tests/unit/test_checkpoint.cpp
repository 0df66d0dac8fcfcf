// Checkpoints: CRC-32 and safetensors format, a bit-exact round trip, and
// refusal (model untouched) of corrupt, incomplete or mismatched ones.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "train/checkpoint.h"
#include "error_text.h"
#include "temp_dir.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;

namespace {

RunConfig tiny_config(int64_t d_model = 32) {
  return config_from_values({{"base_emb_dim", d_model}, {"base_num_query_heads", int64_t(2)},
                             {"base_num_kv_heads", int64_t(1)}, {"head_dim", int64_t(16)},
                             {"base_mlp_dim", int64_t(48)}, {"base_num_decoder_layers", int64_t(1)},
                             {"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(16)}});
}

std::vector<float> snapshot(std::span<float> s) { return {s.begin(), s.end()}; }

void fill(std::span<float> s, float base) {
  for (size_t i = 0; i < s.size(); ++i) s[i] = base + 1e-3f * static_cast<float>(i % 97);
}

std::vector<float> snapshot(StateStore& s) { return s.read_all(); }

void fill(StateStore& s, float base) {
  std::vector<float> values(static_cast<size_t>(s.size()));
  fill(values, base);
  s.write(0, values);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST(Checkpoint, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32("", 0), 0u);
  EXPECT_EQ(crc32("56789", 5, crc32("1234", 4)), 0xCBF43926u);  // incremental
}

TEST(Checkpoint, SafetensorsLayoutFollowsTheFormat) {
  TempDir t;
  HostTensor a{{2, 3}, {1, 2, 3, 4, 5, 6}}, b{{2}, {-1.5f, 7}};
  const std::string path = (t.path / "x.safetensors").string();
  write_safetensors(path, {{"a.weight", &a}, {"b", &b}});
  // Parse the bytes independently: u64 header length, JSON, 8-aligned data.
  std::string bytes = read(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["a.weight"]["dtype"], "F32");
  EXPECT_EQ(header["a.weight"]["shape"], nlohmann::json({2, 3}));
  auto off = header["b"]["data_offsets"].get<std::vector<size_t>>();
  float b1;
  std::memcpy(&b1, bytes.data() + 8 + n + off[0] + 4, 4);
  EXPECT_EQ(b1, 7.0f);
  auto back = read_safetensors(path);
  EXPECT_EQ(back.at("a.weight").data, a.data);
  EXPECT_EQ(back.at("b").shape, b.shape);
}

TEST(Checkpoint, RoundTripIsBitExactAndTheConfigIsHuggingFaces) {
  TempDir t;
  RunConfig c = tiny_config();
  LlamaModel saved(c.model, ModelOptions{}, 1);
  AdamW opt(saved, c, one_rank());
  fill(opt.exp_avg(), 0.25f);
  fill(opt.exp_avg_sq(), 0.5f);
  opt.set_step(7);
  TrainState st{7, 42, 0};
  std::string dir = save_checkpoint(t.path.string(), saved, opt, st, c, one_rank());
  EXPECT_EQ(latest_checkpoint(t.path.string()), dir);

  LlamaModel loaded(c.model, ModelOptions{}, 2);  // other weights
  AdamW opt2(loaded, c, one_rank());
  TrainState back = load_checkpoint(dir, loaded, opt2);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.data_cursor, 42);
  EXPECT_EQ(opt2.step(), 7);
  EXPECT_EQ(snapshot(loaded.flat_parameters()), snapshot(saved.flat_parameters()));
  EXPECT_EQ(snapshot(opt2.exp_avg()), snapshot(opt.exp_avg()));
  EXPECT_EQ(snapshot(opt2.exp_avg_sq()), snapshot(opt.exp_avg_sq()));

  auto weights = read_safetensors(dir + "/model.safetensors");
  EXPECT_TRUE(weights.count("model.embed_tokens.weight"));
  EXPECT_TRUE(weights.count("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(weights.at("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{48, 32}));
  auto cfg = nlohmann::json::parse(read(dir + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["hidden_size"], 32);
  EXPECT_EQ(cfg["num_key_value_heads"], 1);
  EXPECT_EQ(cfg["intermediate_size"], 48);
}

TEST(Checkpoint, CorruptMissingOrMismatchedIsRefusedAndNothingIsLoaded) {
  TempDir t;
  RunConfig c = tiny_config();
  LlamaModel m(c.model, ModelOptions{}, 1);
  AdamW opt(m, c, one_rank());
  std::string dir = save_checkpoint(t.path.string(), m, opt, TrainState{3, 3, 0}, c, one_rank());

  LlamaModel other(c.model, ModelOptions{}, 9);
  AdamW opt2(other, c, one_rank());
  const std::vector<float> before = snapshot(other.flat_parameters());

  // One flipped byte near the end of the weights.
  const std::string good = read(dir + "/model.safetensors");
  std::string bytes = good;
  bytes[bytes.size() - 5] ^= 0x40;
  std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  EXPECT_NE(data_error([&] { load_checkpoint(dir, other, opt2); }).find("CRC-32"), std::string::npos);
  EXPECT_EQ(snapshot(other.flat_parameters()), before);

  std::ofstream(dir + "/model.safetensors", std::ios::binary | std::ios::trunc) << good;
  fs::remove(dir + "/optimizer.safetensors");
  EXPECT_NE(data_error([&] { load_checkpoint(dir, other, opt2); }).find("missing"), std::string::npos);

  // A checkpoint of another model shape.
  TempDir t2;
  RunConfig wide = tiny_config(48);
  LlamaModel w(wide.model, ModelOptions{}, 1);
  AdamW wopt(w, wide, one_rank());
  std::string wdir = save_checkpoint(t2.path.string(), w, wopt, TrainState{1, 1, 0}, wide, one_rank());
  std::string e = data_error([&] { load_checkpoint(wdir, other, opt2); });
  EXPECT_NE(e.find("shape"), std::string::npos) << e;
  EXPECT_EQ(snapshot(other.flat_parameters()), before);
  EXPECT_EQ(opt2.step(), 0);
}

TEST(Checkpoint, LatestSkipsIncompleteDirectories) {
  TempDir t;
  RunConfig c = tiny_config();
  LlamaModel m(c.model, ModelOptions{}, 1);
  AdamW opt(m, c, one_rank());
  save_checkpoint(t.path.string(), m, opt, TrainState{2, 2, 0}, c, one_rank());
  std::string five = save_checkpoint(t.path.string(), m, opt, TrainState{5, 5, 0}, c, one_rank());
  fs::create_directories(t.path / "step_00000009");               // no manifest: a crash mid-write
  fs::create_directories(t.path / ".step_00000011.tmp");          // never renamed
  EXPECT_EQ(latest_checkpoint(t.path.string()), five);
  EXPECT_EQ(latest_checkpoint((t.path / "nothing").string()), "");
}

// The safetensors reader's rules: each broken header is a DataError naming
// the file and the rule (it accepted overlapping offsets; [2^31, 2^31] wrapped
// numel * 4 into a bare vector::_M_default_append; a non-object header or a
// wrong JSON type gave nlohmann's message without the file).
TEST(Checkpoint, SafetensorsHeadersAreChecked) {
  // 8-byte length, the header, then `data` bytes of data section.
  auto file = [](const std::string& header, size_t data) {
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return out + header + std::string(data, '\0');
  };
  auto error = [&](const std::string& header, size_t data) {
    return data_error([&] { parse_safetensors(file(header, data), "w.safetensors"); });
  };
  const std::string t4 = R"("dtype":"F32","shape":[1])";  // 4 bytes
  EXPECT_EQ(error(R"({"a":{)" + t4 + R"(,"data_offsets":[0,4]},"b":{)" + t4 + R"(,"data_offsets":[4,8]}})", 8), "");
  const std::pair<std::string, const char*> cases[] = {
      {R"({"a":{)" + t4 + R"(,"data_offsets":[0,4]},"b":{)" + t4 + R"(,"data_offsets":[2,6]}})", "overlap"},
      {R"({"a":{)" + t4 + R"(,"data_offsets":[0,4]},"b":{)" + t4 + R"(,"data_offsets":[0,4]}})", "overlap"},
      {R"({"a":{)" + t4 + R"(,"data_offsets":[4,8]}})", "after a gap"},
      {R"({"a":{)" + t4 + R"(,"data_offsets":[0,4]}})", "cover 4 of the data section's 8 bytes"},
      {R"({"a":{)" + t4 + R"(,"data_offsets":[8,12]}})", "end past the data section"},
      {R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,8]}})",
       "has more bytes than int64 holds"},
      {R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
       "has more bytes than int64 holds"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "needs 12"},
      {R"([1, 2])", "the header must be a JSON object"},
      {R"({"a":[1]})", "tensor 'a' must be a JSON object"},
      {R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "unsupported dtype 7"},
      {R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "unsupported dtype \"F64\""},
      {R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", "of BF16 needs 6"},
      {R"({"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", "shape must be an array"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "non-negative integers"},
      {R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "non-negative integers"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", "data_offsets must be [begin, end]"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "begin <= end"},
      {R"({"__metadata__":3})", "__metadata__ must be a JSON object"},
  };
  for (const auto& [header, rule] : cases) {
    const std::string e = error(header, 8);
    EXPECT_NE(e.find("checkpoint file 'w.safetensors': "), std::string::npos) << header << " -> " << e;
    EXPECT_NE(e.find(rule), std::string::npos) << header << " -> " << e;
  }
}

// MANIFEST.json entries of the wrong JSON type were nlohmann's bare message,
// and a crc32 above 2^32 was truncated; train_state.json that is not an object.
TEST(Checkpoint, ManifestAndTrainStateTypesAreChecked) {
  TempDir t;
  for (const char* f : {"model.safetensors", "config.json", "optimizer.safetensors", "train_state.json",
                        "run_config.yml"})
    t.write(f, "x");
  const std::string dir = t.path.string();
  auto error = [&](const std::string& manifest) {
    t.write("MANIFEST.json", manifest);
    return data_error([&] { verify_checkpoint(dir); });
  };
  std::string e = error("[]");
  EXPECT_NE(e.find("MANIFEST.json must be an object with a \"files\" object"), std::string::npos) << e;
  e = error(R"({"files": {"model.safetensors": {"bytes": "1", "crc32": 0}}})");
  EXPECT_NE(e.find("MANIFEST.json entry of model.safetensors must be"), std::string::npos) << e;
  const uint32_t crc = crc32("x", 1);
  e = error(R"({"files": {"model.safetensors": {"bytes": 1, "crc32": )" + std::to_string(crc + (uint64_t(1) << 32)) +
            "}}}");
  EXPECT_NE(e.find("an integer below 2^32"), std::string::npos) << e;
  EXPECT_NE(e.find("checkpoint '" + dir + "' refused"), std::string::npos) << e;
  e = data_error([] { parse_train_state("[1]", "s/train_state.json"); });
  EXPECT_NE(e.find("checkpoint file 's/train_state.json': train_state.json must be a JSON object"),
            std::string::npos) << e;
  EXPECT_EQ(parse_train_state(R"({"step":3,"data_cursor":2,"init_weights_seed":1,"optimizer_step":3})", "x")
                .optimizer_step, 3);
}
