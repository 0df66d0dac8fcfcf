// The config loader: base.yml agrees with the schema, inheritance and
// overrides, unknown keys and types, and each validation rule.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace longctx;

namespace {

const fs::path kConfigs = fs::path(__FILE__).parent_path().parent_path().parent_path() / "configs";


std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, BaseYmlListsEveryKeyWithTheSchemaDefault) {
  YAML::Node base = YAML::LoadFile((kConfigs / "base.yml").string());
  std::vector<std::string> file_keys;
  for (const auto& kv : base) file_keys.push_back(kv.first.as<std::string>());
  std::vector<std::string> schema_keys;
  for (const auto& k : config_keys()) schema_keys.push_back(k.name);
  EXPECT_EQ(file_keys, schema_keys);
  // Loading base.yml alone gives exactly the built-in defaults.
  RunConfig from_file = load_config((kConfigs / "base.yml").string());
  RunConfig defaults = config_from_values({});
  for (const auto& k : config_keys()) EXPECT_EQ(from_file.values().at(k.name), defaults.values().at(k.name)) << k.name;
}

TEST(Config, EveryShippedRecipeLoadsAndValidates) {
  for (const auto& e : fs::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".yml") continue;
    RunConfig c = load_config(e.path().string());
    int64_t world = std::max<int64_t>(c.dp, 1) * c.cp * c.tp;
    EXPECT_NO_THROW(validate_config(c, world)) << e.path();
  }
}

TEST(Config, RecipeInheritsBaseAndCommandLineWins) {
  TempDir t;
  t.write("base.yml", "steps: 7\nlearning_rate: 0.5\nrun_name: base\n");
  t.write("mid.yml", "base_config: base.yml\nsteps: 8\n");
  fs::path leaf = t.write("sub/leaf.yml", "base_config: ../mid.yml\nlearning_rate: 2\n");
  RunConfig c = load_config(leaf.string(), {"run_name=cli", "packing=false"});
  EXPECT_EQ(c.steps, 8);
  EXPECT_DOUBLE_EQ(c.learning_rate, 2.0);  // an integer is a valid number
  EXPECT_EQ(c.run_name, "cli");
  EXPECT_FALSE(c.packing);
  EXPECT_EQ(c.get<int64_t>("steps"), 8);
  EXPECT_EQ(c.sources.at("run_name"), "command line");
  EXPECT_EQ(c.max_target_length, 1024);  // untouched keys keep the default
}

TEST(Config, ModelNameLoadsTheModelFileBeforeOverrides) {
  TempDir t;
  t.write("model/toy.yml", "base_emb_dim: 48\nbase_num_decoder_layers: 3\n");
  t.write("base.yml", "base_emb_dim: 16\n");
  fs::path r = t.write("recipe.yml", "base_config: base.yml\nmodel_name: toy\n");
  RunConfig c = load_config(r.string(), {"base_num_decoder_layers=1"});
  EXPECT_EQ(c.model.d_model, 48);
  EXPECT_EQ(c.model.num_layers, 1);
  EXPECT_NE(error_of([&] { load_config(r.string(), {"model_name=nope"}); }).find("no model file"), std::string::npos);
}

TEST(Config, UnknownKeySuggestsTheNearest) {
  TempDir t;
  fs::path r = t.write("r.yml", "ici_context_paralelism: 2\n");
  std::string e = error_of([&] { load_config(r.string()); });
  EXPECT_NE(e.find("unknown key 'ici_context_paralelism'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'ici_context_parallelism'"), std::string::npos) << e;
  e = error_of([&] { load_config(r.string(), {"learnin_rate=1"}); });
  EXPECT_NE(e.find("did you mean"), std::string::npos);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
}

TEST(Config, TypesAreChecked) {
  TempDir t;
  fs::path r = t.write("r.yml", "steps: ten\n");
  EXPECT_NE(error_of([&] { load_config(r.string()); }).find("'steps' must be an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { load_config(t.write("b.yml", "packing: maybe\n").string()); }).find("boolean"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_config(t.write("c.yml", "steps: [1, 2]\n").string()); }).find("list"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_config(r.string(), {"steps"}); }).find("not key=value"), std::string::npos);
  RunConfig c = load_config(t.write("d.yml", "device_memory_budget: 2GiB\nsteps: 1e3\n").string());
  EXPECT_EQ(c.device_memory_budget, int64_t(2) << 30);
  EXPECT_EQ(c.steps, 1000);
  EXPECT_THROW(c.get<bool>("steps"), ConfigError);
}

TEST(Config, CycleIsAnError) {
  TempDir t;
  t.write("a.yml", "base_config: b.yml\n");
  t.write("b.yml", "base_config: a.yml\n");
  EXPECT_NE(error_of([&] { load_config((t.path / "a.yml").string()); }).find("cycle"), std::string::npos);
}

TEST(Config, ToYamlRoundTrips) {
  TempDir t;
  RunConfig c = config_from_values({{"learning_rate", 1e-3}, {"run_name", std::string("x: y")},
                                    {"adam_b2", 1.0 - 1e-9}, {"peak_tflops_per_device", 2.0}});
  fs::path p = t.write("dump.yml", c.to_yaml());
  RunConfig back = load_config(p.string());
  EXPECT_EQ(back.values(), c.values());
}

TEST(Config, ParseBytes) {
  EXPECT_EQ(parse_bytes("123"), 123);
  EXPECT_EQ(parse_bytes("64MiB"), int64_t(64) << 20);
  EXPECT_EQ(parse_bytes("1.5KB"), 1500);
  EXPECT_THROW(parse_bytes("lots"), ConfigError);
}

TEST(Config, ValidationRulesNameTheRule) {
  auto rule = [](std::map<std::string, ConfigValue> v, int64_t world) {
    v.emplace("dataset_type", std::string("synthetic"));
    RunConfig c = config_from_values(v);
    return error_of([&] { validate_config(c, world); });
  };
  using S = std::string;
  using I = int64_t;
  EXPECT_EQ(rule({}, 1), "");
  EXPECT_NE(rule({{"ici_context_parallelism", I(2)}}, 4).find("must equal the number of ranks (4)"), S::npos);
  EXPECT_NE(rule({{"ici_context_parallelism", I(3)}, {"max_target_length", I(1024)}}, 3)
                .find("divisible by ici_context_parallelism"), S::npos);
  EXPECT_NE(rule({{"ici_context_parallelism", I(4)}, {"max_target_length", I(36)}}, 4).find("divisible by 2 * ring"),
            S::npos);
  EXPECT_EQ(rule({{"ici_context_parallelism", I(4)}, {"max_target_length", I(36)},
                  {"context_parallel_load_balance", false}}, 4), "");
  // usp: the ring factor is cp / ulysses.
  EXPECT_EQ(rule({{"ici_context_parallelism", I(4)}, {"max_target_length", I(36)}, {"ici_context_usp_ulysses_parallelism", I(2)},
                  {"context_parallel_strategy", S("usp")}}, 4), "");
  EXPECT_NE(rule({{"ici_tensor_parallelism", I(4)}}, 4).find("base_num_kv_heads (2) must be divisible by ici_tensor"),
            S::npos);
  EXPECT_NE(rule({{"base_num_query_heads", I(6)}, {"base_num_kv_heads", I(4)}}, 1).find("GQA"), S::npos);
  EXPECT_NE(rule({{"context_parallel_strategy", S("ulysses")}, {"ici_context_parallelism", I(8)}}, 8)
                .find("query heads per tp rank (4) divisible by the ulysses degree (8)"), S::npos);
  EXPECT_EQ(rule({{"context_parallel_strategy", S("ulysses")}, {"ici_context_parallelism", I(4)}}, 4), "");
  EXPECT_NE(rule({{"context_parallel_strategy", S("ring")}, {"ici_context_usp_ulysses_parallelism", I(2)},
                  {"ici_context_parallelism", I(2)}}, 2).find("only used by"), S::npos);
  EXPECT_NE(rule({{"context_parallel_strategy", S("usp")}, {"ici_context_usp_ulysses_parallelism", I(3)},
                  {"ici_context_parallelism", I(4)}}, 4).find("must divide"), S::npos);
  // Names are parsed when the configuration is read, before validation.
  EXPECT_NE(error_of([] { config_from_values({{"context_parallel_strategy", S("spiral")}}); })
                .find("all_gather|ulysses|ring|usp|auto"), S::npos);
  EXPECT_NE(rule({{"attention_type", S("local")}}, 1).find("sliding_window_size > 0"), S::npos);
  EXPECT_NE(rule({{"attention_type", S("chunked")}}, 1).find("chunk_attn_window_size > 0"), S::npos);
  EXPECT_NE(rule({{"weight_dtype", S("bfloat16")}}, 1).find("weight_dtype must be float32"), S::npos);
  EXPECT_NE(rule({{"remat_policy", S("custom")}, {"decoder_layer_input", S("remat")}}, 1).find("recompute boundary"),
            S::npos);
  EXPECT_NE(rule({{"steps", I(0)}}, 1).find("steps must be >= 1"), S::npos);
  EXPECT_NE(rule({{"num_threads", I(100000)}}, 1).find("num_threads must be <= 1024"), S::npos);
  EXPECT_NE(rule({{"head_dim", I(7)}}, 1).find("even"), S::npos);
  // ZeRO-1: any mesh, as long as every replica owns at least one parameter (16 here).
  EXPECT_EQ(rule({{"shard_optimizer_over_data", true}, {"ici_data_parallelism", I(2)},
                  {"ici_context_parallelism", I(2)}, {"ici_tensor_parallelism", I(2)}}, 8), "");
  const std::map<std::string, ConfigValue> speck = {
      {"shard_optimizer_over_data", true}, {"vocab_size", I(1)},       {"base_emb_dim", I(1)},
      {"base_num_query_heads", I(1)},      {"base_num_kv_heads", I(1)}, {"head_dim", I(2)},
      {"base_mlp_dim", I(1)},              {"base_num_decoder_layers", I(1)}};
  auto with_dp = [&](int64_t dp) {
    auto v = speck;
    v["ici_data_parallelism"] = dp;
    return v;
  };
  EXPECT_EQ(rule(with_dp(16), 16), "");
  EXPECT_NE(rule(with_dp(32), 32).find("shard_optimizer_over_data needs at least one parameter per replica"), S::npos);
  // State off the device: parameters need FSDP; on disk they do not take ZeRO-1 pieces over replicas.
  EXPECT_NE(rule({{"parameter_memory_host_offload", true}}, 1).find("parameter_memory_host_offload needs FSDP"), S::npos);
  const std::map<std::string, ConfigValue> disk_params = {
      {"parameter_memory_host_offload", true}, {"state_offload_target", S("disk")},
      {"ici_fsdp_parallelism", I(2)},          {"ici_data_parallelism", I(2)}};
  EXPECT_EQ(rule(disk_params, 4), "");
  auto with_zero1 = disk_params;
  with_zero1["shard_optimizer_over_data"] = true;
  EXPECT_NE(rule(with_zero1, 4).find("does not combine with shard_optimizer_over_data"), S::npos);
  EXPECT_NE(error_of([] { config_from_values({{"state_offload_target", S("tape")}}); }).find("host|disk"), S::npos);
  EXPECT_NE(rule({{"layer_token_chunk", I(-1)}}, 1).find("layer_token_chunk must be >= 0"), S::npos);
  // dp = -1 fills the world.
  RunConfig c = config_from_values({{"dataset_type", S("synthetic")}, {"ici_data_parallelism", I(-1)},
                                    {"ici_context_parallelism", I(2)}});
  validate_config(c, 8);
  EXPECT_EQ(c.dp, 4);
}

// Bad input files: each is a ConfigError naming the file and the rule.
TEST(Config, MalformedFilesNameTheFileAndRule) {
  TempDir t;
  auto load = [&](const std::string& name, const std::string& text) {
    const std::string p = t.write(name, text).string();
    return error_of([&] { load_config(p); });
  };
  // yaml-cpp read an unclosed quote to the end, swallowing 'steps'.
  std::string e = load("q.yml", "run_name: \"abc\nsteps: 3\n");
  EXPECT_NE(e.find("q.yml' line 1: unclosed quote"), std::string::npos) << e;
  e = load("q1.yml", "steps: 3\nrun_name: 'it''s\n");
  EXPECT_NE(e.find("q1.yml' line 2: unclosed quote"), std::string::npos) << e;
  EXPECT_EQ(load("ok.yml", "run_name: \"a \\\" b\"\ndataset_path: 'it''s'\n"), "");
  // The later duplicate silently won.
  e = load("dup.yml", "steps: 3\nlearning_rate: 1\nsteps: 4\n");
  EXPECT_NE(e.find("dup.yml' line 3: duplicate key 'steps' (first set on line 1)"), std::string::npos) << e;
  e = load("key.yml", "[a, b]: 3\n");
  EXPECT_NE(e.find("key.yml' line 1: a key must be a plain name"), std::string::npos) << e;
  // A directory "exists": it must be named as a directory.
  fs::create_directories(t.path / "adir");
  e = error_of([&] { load_config((t.path / "adir").string()); });
  EXPECT_NE(e.find("adir' is a directory"), std::string::npos) << e;
  e = load("base_dir.yml", "base_config: adir\n");
  EXPECT_NE(e.find("base_dir.yml': base_config '"), std::string::npos) << e;
  EXPECT_NE(e.find("adir' is a directory"), std::string::npos) << e;
  e = load("base_missing.yml", "base_config: nothere.yml\n");
  EXPECT_NE(e.find("base_missing.yml': base_config '"), std::string::npos) << e;
  EXPECT_NE(e.find("nothere.yml' does not exist"), std::string::npos) << e;
  // Was "yaml-cpp: bad conversion", without the file.
  e = load("base_list.yml", "base_config: [a, b]\n");
  EXPECT_NE(e.find("base_list.yml': base_config must be one file name"), std::string::npos) << e;
  // Found by fuzzing: bytes that are not UTF-8 loaded, but to_yaml() wrote
  // them back changed (the run_config.yml of a checkpoint differed).
  e = load("utf8.yml", "dataset_path: \xff\xfe/data\n");
  EXPECT_NE(e.find("utf8.yml: key 'dataset_path' must be UTF-8 text"), std::string::npos) << e;
  EXPECT_EQ(load("utf8_ok.yml", "run_name: caf\xc3\xa9-\xf0\x9f\x99\x82\n"), "");
  fs::create_directories(t.path / "model" / "toy.yml");
  e = load("model_dir.yml", "model_name: toy\n");
  EXPECT_NE(e.find("toy.yml' is a directory"), std::string::npos) << e;
}

// Products of config sizes overflowed silently: 4611686018427387904 * 4 printed "= 0".
TEST(Config, SizeProductsAreOverflowChecked) {
  auto rule = [](std::map<std::string, ConfigValue> v, int64_t world) {
    v.emplace("dataset_type", std::string("synthetic"));
    RunConfig c = config_from_values(v);
    return error_of([&] { validate_config(c, world); });
  };
  using I = int64_t;
  std::string e = rule({{"ici_data_parallelism", I(4611686018427387904)}, {"ici_context_parallelism", I(4)}}, 4);
  EXPECT_NE(e.find("ici_data_parallelism * ici_fsdp_parallelism * ici_context_parallelism * ici_tensor_parallelism "
                   "overflows int64"),
            std::string::npos) << e;
  e = rule({{"ici_data_parallelism", I(-1)}, {"ici_context_parallelism", I(4611686018427387904)},
            {"ici_tensor_parallelism", I(4)}}, 4);
  EXPECT_NE(e.find("ici_context_parallelism * ici_tensor_parallelism overflows"), std::string::npos) << e;
  e = rule({{"base_num_decoder_layers", I(1) << 60}}, 1);
  EXPECT_NE(e.find("overflows int64"), std::string::npos) << e;
  e = rule({{"vocab_size", I(1) << 40}, {"base_emb_dim", I(1) << 40}}, 1);
  EXPECT_NE(e.find("overflows int64"), std::string::npos) << e;
  e = rule({{"max_target_length", I(1) << 62}}, 1);
  EXPECT_NE(e.find("per_device_batch_size * max_target_length * vocab_size overflows"), std::string::npos) << e;
  EXPECT_THROW(parse_bytes("1e300GiB"), ConfigError);  // llround of it was undefined
}
