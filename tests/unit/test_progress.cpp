// The progress line of long steps: the model publishes its (pass, layer), a
// thread of the trainer prints it while a step runs. No timing is asserted:
// the run checks what the lines say, not how many there are or when.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <set>
#include <string>

#include "train/progress.h"
#include "train/trainer.h"
#include "temp_dir.h"

using namespace longctx;

namespace {

RunConfig run_config(const TempDir& t, double interval) {
  // Steps of some tenths of a second here: the 0.05 s reporter sees several positions.
  RunConfig c = config_from_values({{"base_emb_dim", int64_t(128)},       {"base_num_query_heads", int64_t(4)},
                                    {"base_num_kv_heads", int64_t(2)},    {"head_dim", int64_t(32)},
                                    {"base_mlp_dim", int64_t(384)},       {"base_num_decoder_layers", int64_t(3)},
                                    {"dataset_type", std::string("synthetic")},
                                    {"max_target_length", int64_t(1024)}, {"steps", int64_t(3)},
                                    {"peak_tflops_per_device", 1.0},      {"enable_checkpointing", false},
                                    {"num_threads", int64_t(1)},          {"remat_policy", std::string("full")},
                                    {"base_output_directory", t.path.string()},
                                    {"progress_interval_seconds", interval}});
  validate_config(c, 1);
  return c;
}

std::string run_and_read_progress(const RunConfig& c) {
  static const Mesh mesh = Mesh::single();
  std::FILE* progress = std::tmpfile();
  std::FILE* out = std::tmpfile();
  Trainer(c, mesh).run(out, progress);
  std::string text(static_cast<size_t>(std::ftell(progress)), '\0');
  std::rewind(progress);
  text.resize(std::fread(text.data(), 1, text.size(), progress));
  std::fclose(progress);
  std::fclose(out);
  return text;
}

}  // namespace

TEST(Progress, TheLineNamesStepPassAndLayer) {
  publish_step_position(StepPass::backward, 4);
  EXPECT_EQ(progress_line(3, 20, 41.27, step_position(), 32, 0),
            "longctx: step 3/20, 41.3 s in: rank 0 in backward, layer 5 of 32");
  publish_step_position(StepPass::loss);
  EXPECT_EQ(progress_line(3, 20, 0.04, step_position(), 32, 0), "longctx: step 3/20, 0.0 s in: rank 0 in loss");
  publish_step_position(StepPass::idle);
  EXPECT_EQ(step_position().pass, StepPass::idle);
  EXPECT_EQ(step_position().layer, -1);
}

TEST(Progress, ARunPrintsWhereTheModelIs) {
  TempDir t;
  const std::string text = run_and_read_progress(run_config(t, 0.05));
  const std::regex line(R"(longctx: step ([1-3])/3, [0-9.]+ s in: rank 0 in (batch|forward|loss|backward|optimizer)(, layer ([1-3]) of 3)?)");
  std::set<std::string> passes;
  size_t start = 0, lines = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1, ++lines) {
    const std::string l = text.substr(start, end - start);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    const bool per_layer = m[2] == "forward" || m[2] == "backward";
    EXPECT_EQ(m[3].matched, per_layer) << l;  // forward and backward name their layer, the others none
    passes.insert(m[2]);
  }
  EXPECT_EQ(start, text.size()) << "a partial line: " << text.substr(start);
  EXPECT_GT(lines, 0u) << "no progress line in a run of 3 steps at interval 0.05 s";
  EXPECT_TRUE(passes.count("forward") && passes.count("backward")) << text;
}

TEST(Progress, IntervalZeroPrintsNothing) {
  TempDir t;
  RunConfig c = run_config(t, 0.0);
  c.steps = 1;
  EXPECT_EQ(run_and_read_progress(c), "");
  c.progress_interval_seconds = -1;
  EXPECT_THROW(validate_config(c, 1), ConfigError);
}
