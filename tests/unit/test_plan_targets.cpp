// A plan for an accelerator counts the accelerator's kernels, never the
// planning host's (HardwareProfile::kernels, kernels/cpu/select.h): the
// same memory, bytes and time whatever kernel set the host's CPU has. Each
// host variant is pinned in turn (a CPU device of its own, as a CPU with
// those kernels would choose them) and the plans are compared line by line.
// The control: the same profile told to count this host's kernels (kernels:
// cpu) must differ between the pins, so the pins reach the planner and the
// comparison could fail.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "kernels/attention/dot/dot.h"
#include "pinned_kernels.h"
#include "plan/hardware.h"
#include "plan/planner.h"

namespace longctx {
namespace {

RunConfig load(const std::vector<std::string>& overrides) {
  return load_config(LONGCTX_SOURCE_DIR "/configs/base.yml", overrides);
}

// The kernel sets a planning host could have: an old CPU (sgemm tiles, bf16
// widened), fused vector tiles, native bf16 GEMM tiles, bf16 dot products
// (AVX512-BF16's and AMX's templates: their portable twins, on any CPU).
std::vector<std::pair<std::string, KernelSet>> host_variants() {
  const attn::DotTileKernels* lanes = attn::dot_tile_kernels_portable_lanes();
  const attn::DotTileKernels* tiles = attn::dot_tile_kernels_portable_tiles();
  KernelSet old = pinned_set({AttentionTilePath::bf16_widened});
  old.f32_attention = AttentionTilePath::f32, old.fused = nullptr, old.dot = nullptr;
  KernelSet fused = pinned_set({AttentionTilePath::bf16_fused});
  fused.f32_attention = AttentionTilePath::f32_fused, fused.fused = lanes->fp32;
  return {{"sgemm tiles, bf16 widened", old},
          {"fused tiles", fused},
          {"bf16 native", pinned_set({AttentionTilePath::bf16_native})},
          {"bf16 dot, lanes", pinned_set({AttentionTilePath::bf16_dot, lanes})},
          {"bf16 dot, tiles", pinned_set({AttentionTilePath::bf16_dot, tiles})}};
}

// Everything of a plan that follows from what is counted: its memory lines
// and total, its communication lines, and its time.
std::string summary(const StrategyPlan& p) {
  std::string out = "total " + std::to_string(p.memory_total) + "\n";
  for (const MemoryLine& m : p.memory) out += m.name + " " + std::to_string(m.bytes) + "\n";
  for (const CommLine& c : p.comm)
    out += c.what + " " + std::to_string(c.calls) + " calls " + std::to_string(c.bytes_sent) + " bytes\n";
  out += "sent " + std::to_string(p.comm_bytes_sent) + ", step " + std::to_string(p.step_seconds) + " s\n";
  return out;
}

struct Case {
  const char* profile;
  const char* dtype;
  const char* strategy;
  int64_t cp, usp;
};

std::vector<std::string> summaries(const Case& k, const HardwareProfile& hw) {
  const RunConfig c = load({"model_name=llama3.1-8b", std::string("dtype=") + k.dtype, "remat_policy=full",
                            "per_device_batch_size=1", "max_target_length=131072",
                            "ici_context_parallelism=" + std::to_string(k.cp), "ici_data_parallelism=1",
                            "ici_fsdp_parallelism=-1", std::string("context_parallel_strategy=") + k.strategy,
                            "ici_context_usp_ulysses_parallelism=" + std::to_string(k.usp)});
  std::vector<std::string> out;
  for (const auto& [name, set] : host_variants()) {
    const PinnedKernels pinned(set);
    const StrategyPlan p = plan_strategy(c, hw, PlanOptions{16, 0});
    EXPECT_TRUE(p.valid) << p.invalid_reason;
    out.push_back(summary(p));
  }
  return out;
}

const Case kCases[] = {{"tpu-v5p", "bfloat16", "ring", 8, 1},   {"h100", "float32", "all_gather", 4, 1},
                       {"h100", "bfloat16", "ulysses", 8, 1},   {"h100", "bfloat16", "usp", 8, 2},
                       {"tpu-v7", "bfloat16", "ring", 16, 1}};

TEST(PlanTargets, AnAcceleratorsPlanIsTheSameOnEveryHostKernelSet) {
  for (const Case& k : kCases) {
    SCOPED_TRACE(std::string(k.profile) + " " + k.dtype + " " + k.strategy);
    const HardwareProfile hw = load_hardware_profile(k.profile, LONGCTX_SOURCE_DIR "/configs/hardware");
    ASSERT_EQ(hw.kernels, KernelTarget::accelerator);
    const std::vector<std::string> plans = summaries(k, hw);
    const std::vector<std::pair<std::string, KernelSet>> hosts = host_variants();
    for (size_t i = 1; i < plans.size(); ++i) EXPECT_EQ(plans[i], plans[0]) << hosts[i].first << " vs " << hosts[0].first;
    // No attention tile scratch in an accelerator's device memory.
    EXPECT_EQ(plans[0].find("attention forward scratch"), std::string::npos) << plans[0];
  }
}

// The control: counting this host's kernels, the pins change the plan (the
// attention scratch differs between the paths).
TEST(PlanTargets, AHostsPlanFollowsItsKernelSet) {
  HardwareProfile hw = load_hardware_profile("tpu-v5p", LONGCTX_SOURCE_DIR "/configs/hardware");
  hw.kernels = KernelTarget::cpu;
  const std::vector<std::string> plans = summaries({"tpu-v5p", "bfloat16", "ring", 8, 1}, hw);
  EXPECT_NE(plans[0].find("attention forward scratch"), std::string::npos) << plans[0];
  int differ = 0;
  for (size_t i = 1; i < plans.size(); ++i) differ += plans[i] != plans[0];
  EXPECT_GE(differ, 3);
}

}  // namespace
}  // namespace longctx
