// `longctx plan --longest` (longest_length): the longest max_target_length,
// a multiple of the granule, at which a config fits its budgets. Checked
// against the planner's own memory function at the found length and one
// granule more (device and host pool), for 1 and 2 ranks, every lever the
// ladder adds, an odd granule and GQA; and against a real run at a tiny
// shape: one step at the found length stays within device_memory_budget, one
// granule more is an OutOfMemoryError.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/memory.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "plan_profile.h"
#include "error_text.h"
#include "temp_dir.h"
#include "train_run.h"

namespace longctx {
namespace {

using test::one_rank;

HardwareProfile profile() { return test::plan_test_profile("longest"); }

// A small GQA model (3 query heads, 1 KV head) with a sliding window,
// remat full, one kernel thread. 4 layers: more than the staging slots an
// offloaded tensor keeps on the device (3 for the layer input), so offload frees memory.
RunConfig small(std::map<std::string, ConfigValue> extra = {}) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(24)},     {"base_num_query_heads", int64_t(3)},
      {"base_num_kv_heads", int64_t(1)}, {"head_dim", int64_t(8)},
      {"base_mlp_dim", int64_t(40)},     {"base_num_decoder_layers", int64_t(4)},
      {"attention_type", std::string("local")}, {"sliding_window_size", int64_t(100)},
      {"dataset_type", std::string("synthetic")}, {"packing", false},
      {"remat_policy", std::string("full")},      {"num_threads", int64_t(1)},
      {"steps", int64_t(1)},             {"enable_checkpointing", false},
      {"peak_tflops_per_device", 1.0},   {"progress_interval_seconds", 0.0}};
  for (const auto& [k, x] : extra) v[k] = x;
  return config_from_values(v);
}

RunConfig at_length(RunConfig c, int64_t length) {
  c.max_target_length = length;
  return c;
}

// The planner's memory function at the found length fits both budgets; one granule more breaks one.
void expect_boundary(const RunConfig& c, int64_t granule, const std::string& what) {
  SCOPED_TRACE(what);
  const LongestLength r = longest_length(c, profile(), PlanOptions{}, granule);
  ASSERT_GT(r.length, 0);
  EXPECT_EQ(r.length % granule, 0);
  auto fits = [&](int64_t length) {
    int64_t host = 0;
    const int64_t device = predicted_memory_bytes(at_length(c, length), 1, &host);
    return device <= c.device_memory_budget && (c.host_memory_budget == 0 || host <= c.host_memory_budget);
  };
  EXPECT_TRUE(fits(r.length)) << r.length;
  EXPECT_FALSE(fits(r.length + granule)) << r.length + granule;
  EXPECT_EQ(r.plan.memory_total, predicted_memory_bytes(at_length(c, r.length), 1));
  EXPECT_TRUE(r.plan.fits);
  EXPECT_FALSE(r.next.fits);
}

TEST(PlanLongest, FoundLengthFitsAndOneGranuleMoreDoesNotForEachLever) {
  const int64_t budget = 3 << 20;
  // 1 rank: nothing, remat none, the saved tensors, then the layer inputs offloaded (host, disk).
  expect_boundary(small({{"device_memory_budget", budget}}), 256, "1 rank, remat full");
  expect_boundary(small({{"device_memory_budget", budget}, {"remat_policy", std::string("none")}}), 256,
                  "1 rank, remat none");
  for (const char* target : {"host", "disk"})
    expect_boundary(small({{"device_memory_budget", budget}, {"remat_policy", std::string("custom")},
                           {"decoder_layer_input", std::string("offload")}, {"offload_target", std::string(target)},
                           {"optimizer_memory_host_offload", true}}),
                    256, std::string("1 rank, layer inputs offloaded to ") + target);
  // 2 ranks: ring zigzag with an odd granule (a multiple of 2 x ring), all_gather with FSDP over cp and ZeRO-1.
  expect_boundary(small({{"device_memory_budget", budget}, {"ici_context_parallelism", int64_t(2)},
                         {"context_parallel_strategy", std::string("ring")}}),
                  4 * 37, "cp=2 ring");
  expect_boundary(small({{"device_memory_budget", budget}, {"ici_context_parallelism", int64_t(2)},
                         {"context_parallel_strategy", std::string("all_gather")}, {"fsdp_over_context", true},
                         {"shard_optimizer_over_data", true}, {"remat_policy", std::string("custom")},
                         {"decoder_layer_input", std::string("offload")}, {"offload_target", std::string("disk")}}),
                  4 * 37, "cp=2 all_gather, FSDP over cp, layer inputs on disk");
}

TEST(PlanLongest, AHostBudgetCapsTheLengthWhenTheLayerInputsGoToTheHost) {
  const RunConfig free_host = small({{"device_memory_budget", int64_t(3 << 20)}, {"remat_policy", std::string("custom")},
                                     {"decoder_layer_input", std::string("offload")}});
  const LongestLength unbounded = longest_length(free_host, profile(), PlanOptions{}, 64);
  ASSERT_GT(host_pool_bytes(unbounded.plan), 0);
  RunConfig capped = free_host;
  capped.host_memory_budget = host_pool_bytes(unbounded.plan) / 2;
  expect_boundary(capped, 64, "host pool half of what the device budget alone allows");
  EXPECT_LT(longest_length(capped, profile(), PlanOptions{}, 64).length, unbounded.length);
}

TEST(PlanLongest, ClearAnswersForBadGranulesAndBudgetsTooSmall) {
  const RunConfig ring = small({{"device_memory_budget", int64_t(3 << 20)}, {"ici_context_parallelism", int64_t(2)},
                                {"context_parallel_strategy", std::string("ring")}});
  const std::string err = error_text<ConfigError>([&] { longest_length(ring, profile(), PlanOptions{}, 6); });
  EXPECT_NE(err.find("zigzag"), std::string::npos) << err;
  EXPECT_NE(err.find("granule 6"), std::string::npos) << err;
  EXPECT_THROW(longest_length(ring, profile(), PlanOptions{}, 0), ConfigError);
  RunConfig automatic = ring;
  automatic.cp_strategy = std::nullopt;  // auto: the length depends on the strategy
  EXPECT_NE(error_text<ConfigError>([&] { longest_length(automatic, profile(), PlanOptions{}, 64); })
                .find("context_parallel_strategy"),
            std::string::npos);
  // Not even one granule fits: length 0, the plan at one granule says by how much.
  const LongestLength none = longest_length(small({{"device_memory_budget", int64_t(1000)}}), profile(), PlanOptions{}, 64);
  EXPECT_EQ(none.length, 0);
  EXPECT_FALSE(none.plan.fits);
  EXPECT_GT(none.plan.memory_total, 1000);
}

// A real run confirms the boundary: the found length trains one step within
// the budget (its peak exactly the prediction), one granule more runs out of
// device memory. Layer inputs offloaded to disk (the last rung but remat).
TEST(PlanLongest, ARealStepAtTheFoundLengthFitsAndOneGranuleMoreIsOutOfMemory) {
  TempDir t;
  MemoryTracker& mt = MemoryTracker::global();
  ASSERT_EQ(mt.current_total(), 0u) << "the budget counts every tracked byte of this process";
  const int64_t granule = 96;
  RunConfig c = small({{"remat_policy", std::string("custom")}, {"decoder_layer_input", std::string("offload")},
                       {"offload_target", std::string("disk")}, {"base_output_directory", t.path.string()}});
  // A budget between two multiples of the granule.
  c.device_memory_budget = predicted_memory_bytes(at_length(c, 10 * granule + granule / 2), 1);
  const LongestLength r = longest_length(c, profile(), PlanOptions{}, granule);
  ASSERT_EQ(r.length, 10 * granule);

  RunConfig fits = at_length(c, r.length);
  validate_config(fits, 1);
  mt.reset_peaks();
  {
    Trainer trainer(fits, one_rank());
    trainer.train_step();
  }
  EXPECT_EQ(int64_t(mt.peak_total()), r.plan.memory_total);
  EXPECT_LE(int64_t(mt.peak_total()), c.device_memory_budget);

  RunConfig over = at_length(c, r.length + granule);
  validate_config(over, 1);
  const std::string err = error_text<OutOfMemoryError>([&] {
    Trainer trainer(over, one_rank());
    trainer.train_step();
  });
  EXPECT_NE(err.find("device_memory_budget"), std::string::npos) << err;
  mt.set_budget(0);
}

}  // namespace
}  // namespace longctx
