// The planner's search (recommend) against the published recipes: for every
// MaxText Llama 3.1 8B long-context recipe in bench/results/calibration.md
// (bench/results/calibration.py RUNS: the recipes' own configuration, head
// dim 256, 64 chips), `auto` at the same model, batch, length and devices
// (ici_data_parallelism=-1, strategy auto, the remat policy left open) must
// predict at least 0.98 of the MFU the planner predicts for the recipe's own
// configuration (fitting or not: the planner finds the v5p 1M recipe larger
// than the device). NVIDIA's 8-H100 run is not a row here: its 32 sequences
// per rank are gradient accumulation, which this engine does not have, so
// its configuration does not fit the planner's device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "plan/hardware.h"
#include "plan/planner.h"

namespace longctx {
namespace {

struct Recipe {
  const char* profile;
  int64_t seq, cp, fsdp, batch;
  std::vector<std::string> remat;  // the recipe's remat keys
};

std::vector<std::string> custom(const char* context, const char* inputs) {
  return {"remat_policy=custom", std::string("context=") + context, std::string("decoder_layer_input=") + inputs};
}

std::vector<Recipe> recipes() {
  auto with = [](std::vector<std::string> v, const char* extra) {
    v.push_back(extra);
    return v;
  };
  return {{"tpu-v5p", 65536, 4, 16, 2, custom("device", "device")},
          {"tpu-v5p", 262144, 16, 4, 2, custom("offload", "offload")},
          {"tpu-v5p", 1048576, 64, 1, 2, custom("offload", "device")},
          {"tpu-v5p", 2097152, 64, 1, 2, custom("offload", "offload")},
          {"tpu-v5p", 4194304, 64, 1, 2, custom("offload", "offload")},
          {"tpu-v5p", 10485760, 64, 1, 1, {"remat_policy=full"}},
          {"tpu-v5p", 14680064, 64, 1, 1, custom("remat", "offload")},
          {"tpu-v7", 65536, 1, 64, 1, custom("device", "device")},
          {"tpu-v7", 262144, 4, 16, 1, custom("device", "device")},
          {"tpu-v7", 1048576, 16, 4, 1, custom("device", "device")},
          {"tpu-v7", 2097152, 32, 2, 1, custom("device", "device")},
          {"tpu-v7", 4194304, 64, 1, 1, custom("device", "device")},
          {"tpu-v7", 10485760, 64, 1, 1, with(custom("device", "device"), "optimizer_memory_host_offload=true")},
          {"tpu-v7", 14680064, 64, 1, 1, with(custom("offload", "offload"), "optimizer_memory_host_offload=true")}};
}

RunConfig load(const std::vector<std::string>& overrides) {
  return load_config(LONGCTX_SOURCE_DIR "/configs/base.yml", overrides);
}

TEST(PlanSearch, AutoIsAtLeastAsFastAsEveryPublishedRecipe) {
  for (const Recipe& r : recipes()) {
    const std::string what = std::string(r.profile) + " S=" + std::to_string(r.seq);
    SCOPED_TRACE(what);
    const HardwareProfile hw = load_hardware_profile(r.profile, LONGCTX_SOURCE_DIR "/configs/hardware");
    const PlanOptions devices{64, 0};
    std::vector<std::string> common = {"model_name=llama3.1-8b", "dtype=bfloat16", "head_dim=256",
                                       "base_num_query_heads=16", "base_num_kv_heads=4",
                                       "max_target_length=" + std::to_string(r.seq),
                                       "per_device_batch_size=" + std::to_string(r.batch)};
    std::vector<std::string> own = common;
    for (const std::string& k : {"ici_context_parallelism=" + std::to_string(r.cp),
                                 "ici_fsdp_parallelism=" + std::to_string(r.fsdp), std::string("ici_data_parallelism=1"),
                                 std::string("context_parallel_strategy=ring")})
      own.push_back(k);
    own.insert(own.end(), r.remat.begin(), r.remat.end());
    const StrategyPlan recipe = plan_strategy(load(own), hw, devices);
    ASSERT_TRUE(recipe.valid) << what << ": " << recipe.invalid_reason;

    std::vector<std::string> open = common;
    open.push_back("ici_data_parallelism=-1");
    open.push_back("context_parallel_strategy=auto");
    const PlanRecommendation a = recommend(load(open), hw, devices);
    ASSERT_TRUE(a.found) << a.reason;
    EXPECT_GE(a.plan.mfu, 0.98 * recipe.mfu) << what << ": auto " << a.plan.mfu << " (" << a.reason
                                             << ") against the recipe's " << recipe.mfu;
    // (A recipe the planner finds too large for the device is compared all the same.)
    std::printf("  %-8s %9lld  recipe %.1f%%%s  auto %.1f%%  (%s cp=%lld, remat %s)\n", r.profile, (long long)r.seq,
                100 * recipe.mfu, recipe.fits ? "" : " (does not fit here)", 100 * a.plan.mfu, name_of(a.strategy),
                (long long)a.cp, name_of(a.remat_policy));
  }
}


// The reference's qualitative claim, as a ranking: "P2P can outperform
// all-gather across almost every tested context length from 64K to 14M on
// 64 v5p chips". At each v5p recipe's own mesh, remat and length, the ring's
// predicted step against all-gather's: the ring at least as fast (within 1%)
// at all but at most one length. (Where all-gather cannot hold the gathered
// K,V the ring wins by fitting; the comparison is of time, fitting or not.)
TEST(PlanSearch, TheRingOutrunsAllGatherOnV5pAtAlmostEveryLength) {
  const HardwareProfile hw = load_hardware_profile("tpu-v5p", LONGCTX_SOURCE_DIR "/configs/hardware");
  int ring_faster = 0, lengths = 0;
  for (const Recipe& r : recipes()) {
    if (std::string(r.profile) != "tpu-v5p") continue;
    std::vector<std::string> own = {"model_name=llama3.1-8b", "dtype=bfloat16", "head_dim=256",
                                    "base_num_query_heads=16", "base_num_kv_heads=4",
                                    "max_target_length=" + std::to_string(r.seq),
                                    "per_device_batch_size=" + std::to_string(r.batch),
                                    "ici_context_parallelism=" + std::to_string(r.cp),
                                    "ici_fsdp_parallelism=" + std::to_string(r.fsdp), "ici_data_parallelism=1"};
    own.insert(own.end(), r.remat.begin(), r.remat.end());
    auto step = [&](const char* strategy) {
      std::vector<std::string> k = own;
      k.push_back(std::string("context_parallel_strategy=") + strategy);
      return plan_strategy(load(k), hw, PlanOptions{64, 0}).step_seconds;
    };
    const double ring = step("ring"), gather = step("all_gather");
    ++lengths;
    ring_faster += ring <= 1.01 * gather;
    std::printf("  v5p S=%lld cp=%lld: ring %.1f s, all_gather %.1f s\n", (long long)r.seq, (long long)r.cp, ring,
                gather);
  }
  EXPECT_GE(ring_faster, lengths - 1);
}

}  // namespace
}  // namespace longctx
