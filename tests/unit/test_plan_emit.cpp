// `plan --emit`: what the frameworks accept is tested against the frameworks
// themselves (tests/frameworks/test_plan_frameworks.sh hands every emitted
// plan of a table to MaxText's, Megatron-Core's and TorchTitan's own config
// code). Here, longctx's side: each refusal rule refuses (and only where the
// framework's own check or a missing setting says so), emit never writes a
// refused plan, and the search under --emit recommends only plans the
// framework runs, leaving off the ladder the levers the framework lacks.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "plan/emit.h"
#include "plan/hardware.h"
#include "plan/planner.h"

namespace longctx {
namespace {

RunConfig config(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"model_name=llama3.1-8b", "dtype=bfloat16", "max_target_length=131072"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return load_config(LONGCTX_SOURCE_DIR "/configs/base.yml", all);
}

std::string refusal(const std::vector<std::string>& overrides, int64_t devices, Platform p, Framework f) {
  return framework_refusal(config(overrides), devices, p, f);
}

bool says(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PlanEmit, EachFrameworksRefusalsAreItsOwnRules) {
  const std::vector<std::string> usp = {"context_parallel_strategy=usp", "ici_context_parallelism=8",
                                        "ici_context_usp_ulysses_parallelism=2"};
  const std::vector<std::string> ulysses16 = {"context_parallel_strategy=ulysses", "ici_context_parallelism=16"};
  const std::vector<std::string> ring8 = {"context_parallel_strategy=ring", "ici_context_parallelism=8"};
  // MaxText: usp and ulysses on TPU only; ring on GPU or TPU.
  EXPECT_TRUE(says(refusal(usp, 8, Platform::gpu, Framework::maxtext), "TPU only"));
  EXPECT_EQ(refusal(usp, 8, Platform::tpu, Framework::maxtext), "");
  EXPECT_EQ(refusal(ring8, 8, Platform::gpu, Framework::maxtext), "");
  EXPECT_TRUE(says(refusal(ring8, 8, Platform::cpu, Framework::maxtext), "GPU or TPU only"));
  // An all-to-all degree the KV heads (8) do not divide: MaxText and Megatron refuse it.
  EXPECT_TRUE(says(refusal(ulysses16, 16, Platform::tpu, Framework::maxtext), "divide"));
  EXPECT_TRUE(says(refusal(ulysses16, 16, Platform::gpu, Framework::megatron), "must divide"));
  EXPECT_EQ(refusal({"context_parallel_strategy=ulysses", "ici_context_parallelism=8"}, 8, Platform::gpu,
                    Framework::megatron), "");
  // MaxText's TPU ring: global attention only.
  std::vector<std::string> ring_window = ring8;
  ring_window.insert(ring_window.end(), {"attention_type=local", "sliding_window_size=4096"});
  EXPECT_TRUE(says(refusal(ring_window, 8, Platform::tpu, Framework::maxtext), "global (causal) attention only"));
  EXPECT_EQ(refusal(ring_window, 8, Platform::gpu, Framework::megatron), "");  // --window-size
  // Offload granularity: Megatron has no module for the SwiGLU input, nor parameters in host memory.
  EXPECT_TRUE(says(refusal({"remat_policy=custom", "mlpwi=offload"}, 1, Platform::gpu, Framework::megatron), "mlpwi"));
  EXPECT_EQ(refusal({"remat_policy=custom", "mlpwi=offload"}, 1, Platform::gpu, Framework::maxtext), "");
  EXPECT_EQ(refusal({"remat_policy=custom", "qkv_proj=offload", "out_proj=device"}, 1, Platform::gpu,
                    Framework::megatron), "");
  EXPECT_TRUE(says(refusal({"ici_fsdp_parallelism=8", "parameter_memory_host_offload=true"}, 8, Platform::gpu,
                           Framework::megatron), "parameters in host memory"));
  // No framework chunks a layer's tokens; TorchTitan all-gathers K,V, on GPUs, for its own model configs.
  for (Framework f : {Framework::maxtext, Framework::megatron, Framework::torchtitan})
    EXPECT_TRUE(says(refusal({"layer_token_chunk=4096"}, 1, Platform::gpu, f), "token-chunked")) << name_of(f);
  EXPECT_TRUE(says(refusal(ring8, 8, Platform::gpu, Framework::torchtitan), "all-gathers"));
  EXPECT_EQ(refusal({"context_parallel_strategy=all_gather", "ici_context_parallelism=8"}, 8, Platform::gpu,
                    Framework::torchtitan), "");
  EXPECT_TRUE(says(refusal({"base_num_decoder_layers=2"}, 1, Platform::gpu, Framework::torchtitan), "8B, 70B"));
  EXPECT_TRUE(says(refusal({}, 1, Platform::tpu, Framework::megatron), "NVIDIA GPUs only"));
}

TEST(PlanEmit, ARefusedPlanIsNeverEmitted) {
  const RunConfig usp = config({"context_parallel_strategy=usp", "ici_context_parallelism=8",
                                "ici_context_usp_ulysses_parallelism=2"});
  try {
    emit_settings(usp, 8, Platform::gpu, Framework::maxtext);
    FAIL() << "usp emitted for MaxText on GPU";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(says(e.what(), "TPU only")) << e.what();
  }
  EXPECT_FALSE(emit_settings(usp, 8, Platform::tpu, Framework::maxtext).empty());
  EXPECT_THROW(parse_enum<Framework>("deepspeed"), ConfigError);
}

// The recommendation under --emit is one the framework runs, on each
// platform, with the levers it has; where longctx's own best differs, the
// gap names what the framework lacks.
TEST(PlanEmit, TheSearchRecommendsOnlyWhatTheFrameworkRuns) {
  struct Row {
    const char* hardware;
    Framework framework;
    int64_t length;
  };
  for (const Row& r : {Row{"h100", Framework::maxtext, 1048576}, Row{"h100", Framework::megatron, 1048576},
                       Row{"h100", Framework::torchtitan, 262144}, Row{"tpu-v5p", Framework::maxtext, 1048576}}) {
    SCOPED_TRACE(std::string(r.hardware) + " " + name_of(r.framework));
    const RunConfig c = config({"max_target_length=" + std::to_string(r.length), "ici_data_parallelism=-1",
                                "context_parallel_strategy=auto"});
    const HardwareProfile hw = load_hardware_profile(r.hardware);
    PlanOptions o;
    o.devices = 64;
    const PlanRecommendation own = recommend(c, hw, o);
    o.framework = r.framework;
    const PlanRecommendation runnable = recommend(c, hw, o);
    ASSERT_TRUE(own.found);
    ASSERT_TRUE(runnable.found) << runnable.reason;
    EXPECT_EQ(framework_refusal(runnable.config, 64, hw.platform, r.framework), "");
    // Within 1% plans are equally fast (the one with fewer levers is longctx's pick).
    EXPECT_LE(runnable.plan.tokens_per_second, own.plan.tokens_per_second * 1.01);
    const std::string own_refused = framework_refusal(own.config, 64, hw.platform, r.framework);
    if (!own_refused.empty() && own.plan.tokens_per_second > runnable.plan.tokens_per_second * 1.01) {
      EXPECT_TRUE(says(runnable.framework_gap, own_refused)) << runnable.framework_gap;
    } else {
      EXPECT_EQ(runnable.framework_gap, "");
    }
  }
}

// A strategy the user named (not auto) is kept, with its usp factor when set.
TEST(PlanEmit, AStrategyTheUserNamedIsKept) {
  const HardwareProfile hw = load_hardware_profile("h100");
  PlanOptions o;
  o.devices = 64;
  o.framework = Framework::megatron;
  const PlanRecommendation ulysses =
      recommend(config({"ici_data_parallelism=8", "ici_context_parallelism=8", "context_parallel_strategy=ulysses"}), hw, o);
  ASSERT_TRUE(ulysses.found) << ulysses.reason;
  EXPECT_EQ(ulysses.strategy, CpStrategy::ulysses);
  const PlanRecommendation usp = recommend(config({"ici_data_parallelism=8", "ici_context_parallelism=8",
                                                   "context_parallel_strategy=usp", "ici_context_usp_ulysses_parallelism=2"}),
                                           hw, o);
  ASSERT_TRUE(usp.found) << usp.reason;
  EXPECT_EQ(usp.strategy, CpStrategy::usp);
  EXPECT_EQ(usp.ulysses, 2);
}

// A lever the framework lacks is left off the ladder, so the rungs after it
// (heavier levers it has) stay reachable: Megatron at 512K tokens on 8 GPUs
// needs memory levers, and gets them without the token chunks longctx's own
// best uses, or parameter offload.
TEST(PlanEmit, TheLadderSkipsLeversTheFrameworkLacks) {
  const RunConfig c = config({"max_target_length=524288", "ici_context_parallelism=8",
                              "context_parallel_strategy=ring"});
  PlanOptions o;
  o.devices = 8;
  o.framework = Framework::megatron;
  const PlanRecommendation r = recommend(c, load_hardware_profile("h100"), o);
  ASSERT_TRUE(r.found) << r.reason;
  EXPECT_EQ(r.config.layer_token_chunk, 0);
  EXPECT_FALSE(r.config.parameter_memory_host_offload);
  EXPECT_FALSE(r.levers.empty());
  EXPECT_EQ(framework_refusal(r.config, 8, Platform::gpu, Framework::megatron), "");
  EXPECT_TRUE(says(r.framework_gap, "token-chunked")) << r.framework_gap;  // longctx's own best chunks
}

}  // namespace
}  // namespace longctx
