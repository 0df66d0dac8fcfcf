// The measured cpu-local profile (`plan --measure`, and train's quick one)
// carries the kernel tables of both compute dtypes: the quick measurement on
// one rank (a few seconds) has every table in fp32 and in its bf16 section,
// each elementwise kernel that runs in a dtype timed in it (and only those),
// and the profile file keeps them. No number is compared with a time: only
// that each was measured and is a rate.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "comm/communicator.h"
#include "plan/hardware.h"
#include "plan/measure.h"
#include "plan/planner.h"
#include "temp_dir.h"

namespace longctx {
namespace {

void expect_measured(const KernelTables& t, DType dtype) {
  const std::string what = name_of(dtype);
  auto positive = [&](const std::map<int64_t, double>& m, const char* table) {
    EXPECT_FALSE(m.empty()) << what << " " << table;
    for (const auto& [key, value] : m) EXPECT_TRUE(std::isfinite(value) && value > 0) << what << " " << table << " " << key;
  };
  positive(t.matmul_efficiency_per_width, "matmul_efficiency_per_width");
  positive(t.attention_efficiency_per_head_dim, "attention_efficiency_per_head_dim");
  positive(t.attention_forward_efficiency_per_head_dim, "attention_forward_efficiency_per_head_dim");
  for (const char* kind : {"causal", "local", "chunked"}) {
    ASSERT_TRUE(t.attention_partial_tile_cost.count(kind)) << what << " " << kind;
    positive(t.attention_partial_tile_cost.at(kind), kind);
  }
  for (const ElementwiseKernel& k : elementwise_kernels()) {
    const auto it = t.elementwise_bandwidth_per_kernel.find(k.name());
    if (k.bytes_per_element(dtype) == 0) {
      EXPECT_TRUE(it == t.elementwise_bandwidth_per_kernel.end()) << what << ": " << k.name() << " does not run in it";
      continue;
    }
    ASSERT_TRUE(it != t.elementwise_bandwidth_per_kernel.end()) << what << ": " << k.name() << " not measured";
    EXPECT_TRUE(std::isfinite(it->second) && it->second > 0) << what << " " << k.name();
  }
}

TEST(PlanMeasure, QuickProfileHasFp32AndBf16Tables) {
  const Communicator one = Communicator::single();
  const HardwareProfile h = measure_cpu_local_profile(one, MeasureSize::quick);
  EXPECT_GT(h.peak_flops_fp32, 0);
  EXPECT_GT(h.peak_flops_bf16, 0);
  expect_measured(h, DType::f32);
  ASSERT_TRUE(h.bf16.has_value());
  expect_measured(*h.bf16, DType::bf16);
  EXPECT_TRUE(h.sources.count("bf16"));

  TempDir dir;
  const std::string path = (dir.path / "cpu-local.yml").string();
  save_hardware_profile(h, path);
  const HardwareProfile g = load_hardware_profile(path);
  ASSERT_TRUE(g.bf16.has_value());
  EXPECT_EQ(g.bf16->matmul_efficiency_per_width.size(), h.bf16->matmul_efficiency_per_width.size());
  EXPECT_EQ(g.bf16->elementwise_bandwidth_per_kernel.size(), h.bf16->elementwise_bandwidth_per_kernel.size());
  for (const auto& [kernel, bw] : h.bf16->elementwise_bandwidth_per_kernel)
    EXPECT_NEAR(g.bf16->elementwise_bandwidth_per_kernel.at(kernel), bw, 1e-6 * bw) << kernel;
}

}  // namespace
}  // namespace longctx
