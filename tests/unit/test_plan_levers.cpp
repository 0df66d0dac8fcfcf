// The planner's memory ladder inside the search (recommend): when a run does
// not fit, the levers come in MaxText's order: ZeRO-1, FSDP over the dp and
// cp ranks, sequence parallelism, token chunks (without sequence
// parallelism), offload of the saved activations (one named tensor at a
// time, the largest first), of the optimizer state, of
// the layer inputs, of the parameters, and (the user having set the remat
// policy) heavier remat last. For each rung the test builds the config by
// hand, plans it, and gives the device exactly that rung's memory: the
// recommendation must have every lever up to that rung, in order, be at
// least as fast as the rung's own plan, and carry a lever past the rung only
// when that makes it faster (by more than 1%: otherwise fewer levers win).
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "core/config.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan_profile.h"

namespace longctx {
namespace {

HardwareProfile profile() { return test::plan_test_profile("levers"); }

// dp 2 x cp 2 x tp 2, remat minimal (it saves activations besides the layer inputs).
RunConfig base() {
  RunConfig c = config_from_values({});
  c.model.vocab_size = 32000;  // large parameters next to the activations
  c.model.d_model = 256;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.head_dim = 64;
  c.model.mlp_dim = 1024;
  c.model.num_layers = 4;
  c.max_target_length = 8192;
  c.dp = 2;
  c.cp = 2;
  c.tp = 2;
  c.remat_policy = RematPolicy::minimal;
  c.sources["remat_policy"] = "the test";  // set by the user: the search keeps it
  c.packing = false;
  c.cp_strategy = CpStrategy::ring;
  return c;
}

constexpr CpStrategy kStrategies[] = {CpStrategy::all_gather, CpStrategy::ring};

// The smallest memory of any strategy at the config's cp.
int64_t least_memory(const RunConfig& c, const HardwareProfile& hw) {
  int64_t least = std::numeric_limits<int64_t>::max();
  for (CpStrategy s : kStrategies) {
    RunConfig k = c;
    k.cp_strategy = s;
    const StrategyPlan p = plan_strategy(k, hw, PlanOptions{});
    if (p.valid) least = std::min(least, p.memory_total);
  }
  return least;
}

// The fastest tokens/s of the config's own plans that fit on `hw`.
double fastest_fitting(const RunConfig& c, const HardwareProfile& hw) {
  double best = 0;
  for (CpStrategy s : kStrategies) {
    RunConfig k = c;
    k.cp_strategy = s;
    const StrategyPlan p = plan_strategy(k, hw, PlanOptions{8, 0});
    if (p.valid && p.fits) best = std::max(best, p.tokens_per_second);
  }
  return best;
}

// Gives the device exactly each rung's memory (rungs built by hand from
// `asked`). Returns the last rung's memory.
int64_t check_rungs(const RunConfig& asked_config, HardwareProfile hw,
                    const std::vector<std::pair<std::string, RunConfig>>& rungs) {
  int64_t previous = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < rungs.size(); ++i) {
    const auto& [lever, config] = rungs[i];
    const int64_t need = least_memory(config, hw);
    EXPECT_LT(need, previous) << "rung " << i << " (" << lever << ") saves nothing";
    previous = need;
    hw.memory_bytes = need;  // fits this rung, not the one before
    RunConfig asked = asked_config;
    asked.cp_strategy = std::nullopt;
    const PlanRecommendation r = recommend(asked, hw, PlanOptions{8, 0});
    EXPECT_TRUE(r.found) << "rung " << i << ": " << r.reason;
    if (!r.found) continue;
    EXPECT_TRUE(r.plan.fits) << "rung " << i;
    // Every lever so far, in order (the rungs before do not fit).
    size_t at = 0;
    for (size_t j = 1; j <= i; ++j) {
      const size_t found = r.levers.find(rungs[j].first, at);
      EXPECT_NE(found, std::string::npos) << "rung " << i << " lacks " << rungs[j].first << ": " << r.levers;
      if (found != std::string::npos) at = found;
    }
    // At least as fast as this rung's own plan; a lever past it only when it pays.
    const double rung_speed = fastest_fitting(config, hw);
    EXPECT_GE(r.plan.tokens_per_second, 0.99 * rung_speed) << "rung " << i;
    bool past = false;
    for (size_t j = i + 1; j < rungs.size(); ++j) past = past || r.levers.find(rungs[j].first) != std::string::npos;
    if (past) {
      EXPECT_GT(r.plan.tokens_per_second, 1.01 * rung_speed) << "rung " << i << ": a lever that does not pay: " << r.levers;
    } else {
      EXPECT_EQ(r.config.shard_optimizer_over_data, config.shard_optimizer_over_data) << "rung " << i;
      EXPECT_EQ(r.config.fsdp_over_context, config.fsdp_over_context) << "rung " << i;
      EXPECT_EQ(r.config.tp_sequence_parallel, config.tp_sequence_parallel) << "rung " << i;
      EXPECT_EQ(r.config.layer_token_chunk, config.layer_token_chunk) << "rung " << i;
      EXPECT_EQ(r.config.remat_custom_offload, config.remat_custom_offload) << "rung " << i;
      EXPECT_EQ(r.config.optimizer_memory_host_offload, config.optimizer_memory_host_offload) << "rung " << i;
      EXPECT_EQ(r.config.parameter_memory_host_offload, config.parameter_memory_host_offload) << "rung " << i;
    }
    EXPECT_EQ(r.levers.find("remat_policy=save_context"), std::string::npos) << "remat comes last: " << r.levers;
  }
  return previous;
}

TEST(PlanLevers, EachRungIsAddedOnlyWhenTheOnesBeforeDoNotFit) {
  HardwareProfile hw = profile();
  // The rungs, by hand.
  std::vector<std::pair<std::string, RunConfig>> rungs;
  RunConfig k = base();
  rungs.push_back({"", k});
  k.shard_optimizer_over_data = true;
  rungs.push_back({"shard_optimizer_over_data=true", k});
  k.fsdp = 2, k.dp = 1, k.fsdp_over_context = true;
  rungs.push_back({"fsdp_over_context=true", k});
  k.tp_sequence_parallel = true;
  rungs.push_back({"tensor_sequence_parallelism=true", k});
  // minimal saves qkv_proj, out_proj, mlpwi: offloaded one at a time, the
  // largest per token first (mlpwi 2F/tp = 1024, out_proj 2d = 512, qkv_proj
  // (H+2G)D/tp = 256 elements).
  k.remat_policy = RematPolicy::custom;
  k.remat_custom_save = {true, true, false, true, true, false};
  k.remat_custom_offload = {false, false, false, false, true, false};
  rungs.push_back({"decoder_layer_input=device qkv_proj=device context=remat out_proj=device mlpwi=offload", k});
  k.remat_custom_offload = {false, false, false, true, true, false};
  rungs.push_back({"decoder_layer_input=device qkv_proj=device context=remat out_proj=offload mlpwi=offload", k});
  k.remat_custom_offload = {false, true, false, true, true, false};
  rungs.push_back({"decoder_layer_input=device qkv_proj=offload context=remat out_proj=offload mlpwi=offload", k});
  k.optimizer_memory_host_offload = true;
  rungs.push_back({"optimizer_memory_host_offload=true", k});
  k.remat_custom_offload[0] = true;
  rungs.push_back({"decoder_layer_input=offload qkv_proj=offload context=remat out_proj=offload mlpwi=offload", k});
  k.parameter_memory_host_offload = true;
  rungs.push_back({"parameter_memory_host_offload=true", k});

  const int64_t previous = check_rungs(base(), hw, rungs);
  // Below the last rung only heavier remat helps, and it comes with every lever.
  hw.memory_bytes = previous - 1;
  RunConfig asked = base();
  asked.cp_strategy = std::nullopt;
  const PlanRecommendation r = recommend(asked, hw, PlanOptions{8, 0});
  if (r.found) {
    EXPECT_NE(r.levers.find("remat_policy="), std::string::npos) << r.levers;
    EXPECT_TRUE(r.config.fsdp_over_context && r.config.tp_sequence_parallel && r.config.shard_optimizer_over_data);
  }
}

// Without tp (so without sequence parallelism) token chunks come after the
// sharding levers and before any offload.
TEST(PlanLevers, TokenChunksComeAfterShardingAndBeforeAnyOffload) {
  RunConfig asked = base();
  asked.dp = 4;
  asked.tp = 1;
  asked.max_target_length = 32768;  // 16384 tokens per cp rank: 4 chunks
  std::vector<std::pair<std::string, RunConfig>> rungs;
  RunConfig k = asked;
  rungs.push_back({"", k});
  k.shard_optimizer_over_data = true;
  rungs.push_back({"shard_optimizer_over_data=true", k});
  k.fsdp = 4, k.dp = 1, k.fsdp_over_context = true;
  rungs.push_back({"fsdp_over_context=true", k});
  k.layer_token_chunk = 4096;
  rungs.push_back({"layer_token_chunk=4096", k});
  // Without tp: mlpwi (2048 per token) first, then qkv_proj and out_proj
  // (512 each, in SavePoint order).
  k.remat_policy = RematPolicy::custom;
  k.remat_custom_save = {true, true, false, true, true, false};
  k.remat_custom_offload = {false, false, false, false, true, false};
  rungs.push_back({"decoder_layer_input=device qkv_proj=device context=remat out_proj=device mlpwi=offload", k});
  k.remat_custom_offload = {false, true, false, false, true, false};
  rungs.push_back({"decoder_layer_input=device qkv_proj=offload context=remat out_proj=device mlpwi=offload", k});
  check_rungs(asked, profile(), rungs);
}

}  // namespace
}  // namespace longctx
