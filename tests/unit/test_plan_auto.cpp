// `longctx train ... context_parallel_strategy=auto` works out of the box:
// with no cpu-local hardware profile (LONGCTX_HARDWARE_DIR points at an empty
// directory) train measures a quick one on the fly on both ranks, prints the
// recommendation with its reason, and trains two steps with a valid strategy.
// Runs the real command under mpiexec (this test itself is one process).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

namespace fs = std::filesystem;

namespace {

int run(const std::string& command, std::string& output) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST(PlanAuto, TrainWithAutoStrategyMeasuresAProfileAndRuns) {
  const fs::path longctx = LONGCTX_BINARY, root = LONGCTX_SOURCE_DIR;
  const fs::path empty = fs::temp_directory_path() / ("longctx_no_profile_" + std::to_string(::getpid()));
  fs::create_directories(empty);
  const std::string command =
      "cd " + root.string() + " && LONGCTX_HARDWARE_DIR=" + empty.string() +
      " OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -n 2 " +
      longctx.string() +
      " train configs/base.yml model_name=tiny dataset_type=synthetic max_target_length=256 "
      "ici_context_parallelism=2 context_parallel_strategy=auto steps=2 enable_checkpointing=false "
      "peak_tflops_per_device=1 num_threads=1 metrics_file=/dev/null 2>&1";
  std::string out;
  const int rc = run(command, out);
  fs::remove_all(empty);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("no cpu-local hardware profile"), std::string::npos) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("auto: context_parallel_strategy=(\\w+) ici_context_parallelism=(\\d+)")))
      << out;
  const std::string strategy = m[1];
  EXPECT_TRUE(strategy == "all_gather" || strategy == "ulysses" || strategy == "ring" || strategy == "usp")
      << strategy;
  EXPECT_EQ(m[2], "2") << out;  // the mesh is pinned (ici_data_parallelism=1): cp stays
  EXPECT_NE(out.find("quick profile measured in"), std::string::npos) << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("\n  why: \\S"))) << out;
  // (the search may shard the parameters over the cp ranks: FSDP over context)
  EXPECT_TRUE(std::regex_search(out, std::regex("mesh dp=1 (fsdp=\\d+ )?cp=2 \\(ulysses=1 x ring=2\\) tp=1 "
                                                "(\\(fsdp over context\\) )?\\(" + strategy)))
      << out;
  EXPECT_TRUE(std::regex_search(out, std::regex("step 2 \\|"))) << out;
}
