// The progress line of long steps: the model publishes its (pass, layer), a
// thread of the trainer prints it while a step runs. No timing is asserted:
// what the model publishes is observed, what the reporter prints is checked
// on positions the test holds, and a real run's lines for their form only.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>

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

// What the model publishes, seen by an observer (no clock involved): every
// pass of a step, forward and backward once per layer.
TEST(Progress, ARunPublishesEveryPassAndLayer) {
  static std::mutex mu;
  static std::set<std::pair<StepPass, int64_t>> seen;
  seen.clear();
  observe_step_positions([](StepPass pass, int64_t layer) {
    std::lock_guard<std::mutex> lock(mu);
    seen.insert({pass, layer});
  });
  TempDir t;
  RunConfig c = run_config(t, 0.0);
  c.steps = 1;
  run_and_read_progress(c);
  observe_step_positions(nullptr);
  const std::set<std::pair<StepPass, int64_t>> want = {
      {StepPass::batch, -1},    {StepPass::forward, 0},  {StepPass::forward, 1},  {StepPass::forward, 2},
      {StepPass::loss, -1},     {StepPass::backward, 0}, {StepPass::backward, 1}, {StepPass::backward, 2},
      {StepPass::optimizer, -1}, {StepPass::idle, -1}};
  EXPECT_EQ(seen, want);
}

// What the reporter prints, for positions the test publishes and holds
// until they are printed (a line is due every 0.01 s; the deadline only
// ends a broken reporter).
TEST(Progress, TheReporterPrintsThePublishedPosition) {
  TempDir t;
  const std::string path = (t.path / "progress.txt").string();
  std::FILE* out = std::fopen(path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  auto printed = [&](const std::string& what) {
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
         std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(std::chrono::milliseconds(5))) {
      std::ifstream in(path);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.find(what) != std::string::npos) return true;
    }
    return false;
  };
  {
    ProgressReporter reporter(0.01, 20, 4, 0, out);
    reporter.step_started(7);
    publish_step_position(StepPass::forward, 1);
    EXPECT_TRUE(printed("rank 0 in forward, layer 2 of 4\n"));
    publish_step_position(StepPass::backward, 3);
    EXPECT_TRUE(printed("rank 0 in backward, layer 4 of 4\n"));
    reporter.step_finished();
  }
  std::fclose(out);
  std::ifstream in(path);
  const std::regex line(R"(longctx: step 7/20, [0-9.]+ s in: rank 0 in (batch|forward, layer 2 of 4|backward, layer 4 of 4))");
  size_t lines = 0;
  for (std::string l; std::getline(in, l); ++lines) EXPECT_TRUE(std::regex_match(l, line)) << l;
  EXPECT_GE(lines, 2u);
}

// A real run's lines (however many the clock gives) are whole and well formed.
TEST(Progress, ARunsLinesAreWellFormed) {
  TempDir t;
  const std::string text = run_and_read_progress(run_config(t, 0.05));
  const std::regex line(R"(longctx: step ([1-3])/3, [0-9.]+ s in: rank 0 in (batch|forward|loss|backward|optimizer)(, layer ([1-3]) of 3)?)");
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    const std::string l = text.substr(start, end - start);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, line)) << l;
    const bool per_layer = m[2] == "forward" || m[2] == "backward";
    EXPECT_EQ(m[3].matched, per_layer) << l;  // forward and backward name their layer, the others none
  }
  EXPECT_EQ(start, text.size()) << "a partial line: " << text.substr(start);
}

TEST(Progress, IntervalZeroPrintsNothing) {
  TempDir t;
  RunConfig c = run_config(t, 0.0);
  c.steps = 1;
  EXPECT_EQ(run_and_read_progress(c), "");
  c.progress_interval_seconds = -1;
  EXPECT_THROW(validate_config(c, 1), ConfigError);
}
