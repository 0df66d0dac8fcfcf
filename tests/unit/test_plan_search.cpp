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

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/config.h"
#include "error_text.h"
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

// The reference's rules of thumb for choosing a strategy, as rankings of the
// planner's predicted steps. Llama 3.1 8B (32 query, 8 KV heads), bf16,
// remat full, FSDP over the rest of 64 devices, on an NVLink GPU (h200) and
// on a TPU torus (v5p).
StrategyPlan plan_8b(const char* profile, int64_t seq, int64_t cp, int64_t tp, const char* strategy,
                     int64_t usp_factor = 1) {
  const HardwareProfile hw = load_hardware_profile(profile, LONGCTX_SOURCE_DIR "/configs/hardware");
  const StrategyPlan p =
      plan_strategy(load({"model_name=llama3.1-8b", "dtype=bfloat16", "remat_policy=full", "per_device_batch_size=1",
                          "max_target_length=" + std::to_string(seq), "ici_context_parallelism=" + std::to_string(cp),
                          "ici_tensor_parallelism=" + std::to_string(tp), "ici_data_parallelism=1",
                          "ici_fsdp_parallelism=-1", std::string("context_parallel_strategy=") + strategy,
                          "ici_context_usp_ulysses_parallelism=" + std::to_string(usp_factor)}),
                    hw, PlanOptions{64, 0});
  EXPECT_TRUE(p.valid) << profile << " " << strategy << " U=" << usp_factor << ": " << p.invalid_reason;
  return p;
}

// The usp splits U x (cp/U) with 1 < U < cp and U dividing cp.
std::vector<int64_t> usp_factors(int64_t cp) {
  std::vector<int64_t> out;
  for (int64_t u = 2; u < cp; ++u)
    if (cp % u == 0) out.push_back(u);
  return out;
}

// "A2A up to the KV heads; ring-family beyond": at cp up to the 8 KV heads
// the all-to-all (ulysses) is within 1% of the fastest strategy; beyond them
// ulysses must replicate K,V heads and the ring family wins: the ring or a
// usp split whose A2A factor stays within the KV heads beats pure ulysses,
// and is at least as fast (within 0.1%) as every split whose A2A factor
// exceeds them. (On v5p at 1M the planner finds usp 16x2 0.06% faster than
// 8x4: a tie, the step being 99.9% compute; the torus's all-to-all
// bandwidth in tpu-v5p.yml is what keeps the replicated K,V heads cheap.)
TEST(PlanSearch, AllToAllUpToTheKvHeadsRingFamilyBeyond) {
  const int64_t kv_heads = 8;
  for (const char* profile : {"h200", "tpu-v5p"})
    for (int64_t seq : {131072, 1048576})
      for (int64_t cp : {2, 4, 8, 16, 32}) {
        SCOPED_TRACE(std::string(profile) + " S=" + std::to_string(seq) + " cp=" + std::to_string(cp));
        const double ulysses = plan_8b(profile, seq, cp, 1, "ulysses").step_seconds;
        const double none = std::numeric_limits<double>::infinity();  // no usp split with U > G at this cp
        double best_within = plan_8b(profile, seq, cp, 1, "ring").step_seconds, best_beyond = none;
        for (int64_t u : usp_factors(cp)) {
          double& best = u <= kv_heads ? best_within : best_beyond;
          best = std::min(best, plan_8b(profile, seq, cp, 1, "usp", u).step_seconds);
        }
        const double all_gather = plan_8b(profile, seq, cp, 1, "all_gather").step_seconds;
        std::printf("  %-8s S=%-8lld cp=%-3lld ulysses %.3f s, ring family (U <= G) %.3f s, usp U > G %.3f s\n",
                    profile, (long long)seq, (long long)cp, ulysses, best_within, best_beyond);
        if (cp <= kv_heads) {
          EXPECT_LE(ulysses, 1.01 * std::min({best_within, all_gather}));
        } else {
          EXPECT_LT(best_within, ulysses);
          EXPECT_LE(best_within, 1.001 * best_beyond);
        }
      }
}

// "USP when at least 2 KV heads are left for the A2A factor": tensor
// parallelism takes the KV heads first (8 / tp per rank). With 2 or more left
// the fastest usp split is at least as fast as the pure ring (within 0.1%);
// with 1 left any A2A factor replicates K,V and the pure ring is faster
// than every usp split.
TEST(PlanSearch, UspWhenTwoKvHeadsAreLeftForTheAllToAll) {
  for (const char* profile : {"h200", "tpu-v5p"})
    for (int64_t tp : {2, 4, 8}) {
      const int64_t cp = 32 / tp, kv_left = 8 / tp;
      SCOPED_TRACE(std::string(profile) + " tp=" + std::to_string(tp) + " cp=" + std::to_string(cp));
      const double ring = plan_8b(profile, 1048576, cp, tp, "ring").step_seconds;
      double usp = std::numeric_limits<double>::infinity();
      for (int64_t u : usp_factors(cp)) usp = std::min(usp, plan_8b(profile, 1048576, cp, tp, "usp", u).step_seconds);
      std::printf("  %-8s tp=%lld cp=%-2lld (%lld kv heads left): ring %.3f s, best usp %.3f s\n", profile,
                  (long long)tp, (long long)cp, (long long)kv_left, ring, usp);
      if (kv_left >= 2)
        EXPECT_LE(usp, 1.001 * ring);
      else
        EXPECT_LT(ring, usp);
    }
}

// "All-gather where the gathered K,V fits; ring-family beyond": on v5p at
// cp=8, all-gather fits at 128K and is within 1% of the fastest strategy at
// cp <= 4 there (where its gathered K,V moves fewer bytes than the
// all-to-all's Q,K,V,O); at 1M its gathered K,V no longer fits the device
// while the ring's chunks do.
TEST(PlanSearch, AllGatherWhereTheGatheredKvFitsRingBeyond) {
  for (int64_t cp : {2, 4}) {
    SCOPED_TRACE("cp=" + std::to_string(cp));
    const StrategyPlan gather = plan_8b("tpu-v5p", 131072, cp, 1, "all_gather");
    EXPECT_TRUE(gather.fits);
    double best = std::min(plan_8b("tpu-v5p", 131072, cp, 1, "ring").step_seconds,
                           plan_8b("tpu-v5p", 131072, cp, 1, "ulysses").step_seconds);
    for (int64_t u : usp_factors(cp)) best = std::min(best, plan_8b("tpu-v5p", 131072, cp, 1, "usp", u).step_seconds);
    EXPECT_LE(gather.step_seconds, 1.01 * best);
  }
  EXPECT_FALSE(plan_8b("tpu-v5p", 1048576, 8, 1, "all_gather").fits);
  EXPECT_TRUE(plan_8b("tpu-v5p", 1048576, 8, 1, "ring").fits);
}

// A mesh that does not fill the devices is the user's error, named with
// the config's own rule: a pinned ici_data_parallelism was once replaced by
// what the devices left (dp=3 planned as dp 4 on 4 devices), and a fill
// axis with nothing left divided by zero.
TEST(PlanSearch, AMeshThatDoesNotFillTheDevicesIsAnError) {
  const HardwareProfile hw = load_hardware_profile("tpu-v5p");
  auto error = [&](std::vector<std::string> keys, int64_t devices) {
    keys.push_back("model_name=demo");
    keys.push_back("max_target_length=1024");
    keys.push_back("dtype=bfloat16");
    const RunConfig c = load(keys);
    PlanOptions o;
    o.devices = devices;
    return error_text<ConfigError>([&] { make_plan(c, hw, o); });
  };
  EXPECT_NE(error({"ici_data_parallelism=3"}, 4).find("= 3 * 1 * 1 * 1 = 3 must equal the number of ranks (4)"),
            std::string::npos);
  EXPECT_NE(error({"ici_data_parallelism=4", "ici_fsdp_parallelism=-1"}, 2)
                .find("ici_fsdp_parallelism=-1 needs the world size (2) divisible by the product of the other axes (4)"),
            std::string::npos);
  EXPECT_NE(error({"ici_context_parallelism=4"}, 6).find("must equal the number of ranks (6)"), std::string::npos);
  EXPECT_EQ(error({"ici_data_parallelism=-1", "ici_context_parallelism=2"}, 8), "");
  EXPECT_EQ(error({"ici_data_parallelism=2", "ici_fsdp_parallelism=2"}, 4), "");
  // Candidates the search or the advice try that do not fill the devices are
  // invalid, never an error: cp = 8 beside fsdp = 2 on 8 devices, and the
  // advice's larger cp with dp and fsdp pinned.
  EXPECT_EQ(error({"ici_data_parallelism=-1", "ici_fsdp_parallelism=2"}, 8), "");
  const RunConfig pinned = load({"model_name=demo", "max_target_length=1024", "dtype=bfloat16",
                                 "ici_fsdp_parallelism=2", "ici_context_parallelism=2"});
  PlanOptions tiny;
  tiny.devices = 4;
  tiny.device_memory = int64_t(1) << 20;
  const PlanReport report = make_plan(pinned, hw, tiny);
  for (const StrategyPlan& p : report.candidates)
    if (p.valid) {
      EXPECT_NE(p.advice.find("does not fit"), std::string::npos) << p.advice;
    }
}

}  // namespace
}  // namespace longctx
