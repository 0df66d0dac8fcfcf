// `plan --emit`: the recommended plan as MaxText keys and Megatron-Core flags.
// Every key and flag emitted must be one the framework documents (the lists
// below, copied from the documents cited), with a value it accepts, and
// each longctx setting must map to the one that means it; what cannot be
// expressed must appear as a "# not expressible" line.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "plan/emit.h"

namespace longctx {
namespace {

// MaxText, src/maxtext/configs/base.yml (AI-Hypercomputer/maxtext, commit
// e591f30cbbf2, 2026-08-22): the keys the emitter may write.
const std::set<std::string> kMaxTextKeys = {
    "ici_data_parallelism", "ici_fsdp_parallelism", "ici_context_parallelism",
    "ici_context_usp_ulysses_parallelism", "ici_tensor_parallelism", "context_parallel_strategy",
    "context_parallel_load_balance", "max_target_length", "per_device_batch_size", "dtype", "weight_dtype",
    "attention_type", "sliding_window_size", "chunk_attn_window_size", "remat_policy", "decoder_layer_input",
    "qkv_proj", "context", "out_proj", "mlpwi", "mlpwo", "optimizer_memory_host_offload",
    "parameter_memory_host_offload", "shard_optimizer_over_data"};
// Its documented values: attention_type ("Supported attention_type: global,
// local_sliding, chunk, mla, full, ..."), context_parallel_strategy
// ("all_gather", "ring", "ulysses", or "usp"), remat_policy (the listed
// policies and 'custom'), a custom tensor ['remat','device','offload'].
const std::set<std::string> kMaxTextAttentionTypes = {"'global'", "'local_sliding'", "'chunk'", "'full'"};
const std::set<std::string> kMaxTextStrategies = {"'all_gather'", "'ring'", "'ulysses'", "'usp'"};
const std::set<std::string> kMaxTextTensorChoices = {"'remat'", "'device'", "'offload'"};

// Megatron-Core (NVIDIA/Megatron-LM, commit d98e8a64ddf3, 2026-08-22):
// megatron/training/arguments.py (--cp-comm-type: "p2p, a2a, allgather or
// a2a+p2p"; --hierarchical-context-parallel-sizes; --use-distributed-optimizer;
// --data-parallel-sharding-strategy; --optimizer-cpu-offload; --seq-length)
// and the dataclass fields it turns into flags (argument_utils.py: "--" +
// name with '_' as '-'): model_parallel_config.py (tensor_model_parallel_size,
// sequence_parallel, context_parallel_size, bf16, cpu_offloading,
// cpu_offloading_num_layers, cpu_offloading_activations,
// cpu_offloading_weights), transformer_config.py (recompute_granularity
// full|selective, recompute_method uniform|block, recompute_num_layers,
// recompute_modules), distributed_data_parallel_config.py (use_megatron_fsdp),
// training batch flags (--micro-batch-size, --global-batch-size,
// --max-position-embeddings).
const std::set<std::string> kMegatronFlags = {
    "--tensor-model-parallel-size", "--sequence-parallel", "--context-parallel-size", "--cp-comm-type",
    "--hierarchical-context-parallel-sizes", "--seq-length", "--max-position-embeddings", "--micro-batch-size",
    "--global-batch-size", "--bf16", "--use-distributed-optimizer", "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--recompute-modules", "--cpu-offloading", "--cpu-offloading-num-layers", "--cpu-offloading-activations",
    "--cpu-offloading-weights", "--optimizer-cpu-offload"};
const std::set<std::string> kMegatronCommTypes = {"p2p", "a2a", "allgather", "a2a+p2p"};

struct Emitted {
  std::map<std::string, std::string> settings;  // key or flag -> value ("" for a switch)
  std::vector<std::string> gaps;                // the "# not expressible" lines
};

Emitted parse(const std::string& text, EmitFormat f) {
  Emitted e;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# not expressible: ", 0) == 0) e.gaps.push_back(line);
    if (line.empty() || line[0] == '#') continue;
    if (f == EmitFormat::maxtext) {
      const size_t colon = line.find(": ");
      EXPECT_NE(colon, std::string::npos) << line;
      std::string value = line.substr(colon + 2);
      value = value.substr(0, value.find("  #"));  // a trailing comment
      e.settings[line.substr(0, colon)] = value;
    } else {
      const size_t space = line.find(' ');
      e.settings[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
    }
  }
  return e;
}

RunConfig config(const std::map<std::string, ConfigValue>& v) {
  std::map<std::string, ConfigValue> all = {{"base_num_query_heads", int64_t(8)}, {"base_num_kv_heads", int64_t(2)},
                                            {"max_target_length", int64_t(8192)}, {"dtype", std::string("bfloat16")}};
  for (const auto& [k, x] : v) all[k] = x;
  return config_from_values(all);
}

Emitted emit(const RunConfig& c, EmitFormat f, int64_t devices) {
  const std::string text = emit_settings(c, devices, f);
  Emitted e = parse(text, f);
  for (const auto& [key, value] : e.settings) {
    if (f == EmitFormat::maxtext) {
      EXPECT_TRUE(kMaxTextKeys.count(key)) << "MaxText has no key '" << key << "'\n" << text;
    } else {
      EXPECT_TRUE(kMegatronFlags.count(key)) << "Megatron-Core has no flag '" << key << "'\n" << text;
    }
  }
  return e;
}

TEST(PlanEmit, EveryStrategyMapsToTheFrameworksOwnName) {
  struct Row {
    const char* strategy;
    int64_t cp, ulysses;
    const char* megatron;
  };
  for (const Row& r : std::vector<Row>{{"ring", 4, 1, "p2p"},
                                       {"all_gather", 4, 1, "allgather"},
                                       {"ulysses", 2, 1, "a2a"},
                                       {"usp", 8, 2, "a2a+p2p"}}) {
    SCOPED_TRACE(r.strategy);
    const RunConfig c = config({{"context_parallel_strategy", std::string(r.strategy)},
                                {"ici_context_parallelism", r.cp},
                                {"ici_context_usp_ulysses_parallelism", r.ulysses}});
    const Emitted m = emit(c, EmitFormat::maxtext, r.cp);
    EXPECT_EQ(m.settings.at("context_parallel_strategy"), "'" + std::string(r.strategy) + "'");
    EXPECT_TRUE(kMaxTextStrategies.count(m.settings.at("context_parallel_strategy")));
    EXPECT_EQ(m.settings.at("ici_context_parallelism"), std::to_string(r.cp));
    EXPECT_EQ(m.settings.at("ici_context_usp_ulysses_parallelism"), std::to_string(r.ulysses));
    EXPECT_TRUE(kMaxTextAttentionTypes.count(m.settings.at("attention_type")));
    EXPECT_EQ(m.settings.at("attention_type"), "'global'");  // causal
    const Emitted g = emit(c, EmitFormat::megatron, r.cp);
    EXPECT_EQ(g.settings.at("--cp-comm-type"), r.megatron);
    EXPECT_TRUE(kMegatronCommTypes.count(g.settings.at("--cp-comm-type")));
    EXPECT_EQ(g.settings.at("--context-parallel-size"), std::to_string(r.cp));
    if (std::string(r.strategy) == "usp") {
      EXPECT_EQ(g.settings.at("--hierarchical-context-parallel-sizes"), "2 4");  // a2a within, p2p across
    } else {
      EXPECT_FALSE(g.settings.count("--hierarchical-context-parallel-sizes"));
    }
    EXPECT_EQ(g.settings.at("--seq-length"), "8192");
    EXPECT_TRUE(g.settings.count("--bf16"));
  }
}

TEST(PlanEmit, MemoryLeversAndDataParallelism) {
  const RunConfig c = config({{"context_parallel_strategy", std::string("ring")}, {"ici_context_parallelism", int64_t(2)},
                              {"ici_tensor_parallelism", int64_t(2)}, {"ici_data_parallelism", int64_t(-1)},
                              {"tensor_sequence_parallelism", true}, {"shard_optimizer_over_data", true},
                              {"optimizer_memory_host_offload", true}, {"per_device_batch_size", int64_t(2)},
                              {"remat_policy", std::string("custom")}, {"qkv_proj", std::string("offload")},
                              {"context", std::string("device")}, {"mlpwi", std::string("remat")}});
  const Emitted g = emit(c, EmitFormat::megatron, 16);  // dp = 16 / (2 x 2) = 4
  EXPECT_EQ(g.settings.at("--tensor-model-parallel-size"), "2");
  EXPECT_TRUE(g.settings.count("--sequence-parallel"));
  EXPECT_TRUE(g.settings.count("--use-distributed-optimizer"));
  EXPECT_TRUE(g.settings.count("--optimizer-cpu-offload"));
  EXPECT_EQ(g.settings.at("--micro-batch-size"), "2");
  EXPECT_EQ(g.settings.at("--global-batch-size"), "8");  // 2 sequences x 4 data-parallel ranks
  EXPECT_EQ(g.settings.at("--recompute-granularity"), "selective");
  EXPECT_EQ(g.settings.at("--recompute-modules"), "mlp");  // mlpwi dropped, context saved
  EXPECT_TRUE(g.settings.count("--cpu-offloading"));       // qkv_proj offloaded
  EXPECT_FALSE(g.gaps.empty());                            // out_proj recomputed, whole-layer offload

  const Emitted m = emit(c, EmitFormat::maxtext, 16);
  EXPECT_EQ(m.settings.at("ici_data_parallelism"), "4");  // -1 resolved
  EXPECT_EQ(m.settings.at("remat_policy"), "'custom'");
  EXPECT_EQ(m.settings.at("qkv_proj"), "'offload'");
  EXPECT_EQ(m.settings.at("context"), "'device'");
  EXPECT_EQ(m.settings.at("mlpwi"), "'remat'");
  EXPECT_EQ(m.settings.at("decoder_layer_input"), "'device'");
  for (const char* k : {"decoder_layer_input", "qkv_proj", "context", "out_proj", "mlpwi", "mlpwo"})
    EXPECT_TRUE(kMaxTextTensorChoices.count(m.settings.at(k))) << k;
  EXPECT_EQ(m.settings.at("shard_optimizer_over_data"), "true");
  EXPECT_EQ(m.settings.at("optimizer_memory_host_offload"), "true");
  ASSERT_EQ(m.gaps.size(), 1u);  // sequence parallelism over tp is not MaxText's tensor_sequence axis
  EXPECT_NE(m.gaps[0].find("tensor_sequence_parallelism"), std::string::npos);
}

// What neither framework can express is said, never dropped.
TEST(PlanEmit, WhatTheFrameworkCannotExpressIsFlagged) {
  // A sliding window on the ring (longctx skips the chunks the window never reaches), token chunks.
  const RunConfig sparse = config({{"context_parallel_strategy", std::string("ring")},
                                   {"ici_context_parallelism", int64_t(4)}, {"attention_type", std::string("local")},
                                   {"sliding_window_size", int64_t(512)}, {"layer_token_chunk", int64_t(1024)}});
  for (EmitFormat f : {EmitFormat::maxtext, EmitFormat::megatron}) {
    const Emitted e = emit(sparse, f, 4);
    ASSERT_EQ(e.gaps.size(), 2u);
    EXPECT_NE(e.gaps[0].find("sparse ring"), std::string::npos);
    EXPECT_NE(e.gaps[1].find("layer_token_chunk"), std::string::npos);
  }
  EXPECT_EQ(emit(sparse, EmitFormat::maxtext, 4).settings.at("attention_type"), "'local_sliding'");
  EXPECT_EQ(emit(sparse, EmitFormat::maxtext, 4).settings.at("sliding_window_size"), "512");
  // Ulysses over more ranks than KV heads: longctx replicates them.
  const RunConfig wide = config({{"context_parallel_strategy", std::string("ulysses")},
                                 {"ici_context_parallelism", int64_t(4)}});
  for (EmitFormat f : {EmitFormat::maxtext, EmitFormat::megatron}) {
    const Emitted e = emit(wide, f, 4);
    ASSERT_EQ(e.gaps.size(), 1u);
    EXPECT_NE(e.gaps[0].find("exceeds the 2 KV heads"), std::string::npos);
  }
  // Nothing to flag: no gap lines.
  EXPECT_TRUE(emit(config({}), EmitFormat::megatron, 1).gaps.empty());
  EXPECT_THROW(parse_emit_format("deepspeed"), ConfigError);
}

}  // namespace
}  // namespace longctx
