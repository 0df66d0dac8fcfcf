// The command line: bad configurations, run through the real `longctx` binary under mpiexec on
// 2 ranks: each must exit non-zero within 30 s on every rank, each rank
// printing one line that names the broken rule (never a hang).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct RunResult {
  int status;
  std::string output;
};

RunResult run_longctx(const std::string& flags, int ranks = 2) {
  const std::filesystem::path exe = LONGCTX_BINARY;
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 30 mpiexec --oversubscribe --allow-run-as-root "
                          "--bind-to none -n " + std::to_string(ranks) + " " + exe.string() + " " + flags + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  RunResult r{-1, ""};
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  r.status = pclose(pipe);
  return r;
}

void expect_rule(const std::string& flags, const std::string& rule) {
  RunResult r = run_longctx(flags);
  SCOPED_TRACE(flags + "\n" + r.output);
  ASSERT_NE(r.status, 0);
  EXPECT_NE(WEXITSTATUS(r.status), 124) << "timed out";
  for (int rank : {0, 1}) {
    const std::string line = "longctx: error (rank " + std::to_string(rank) + "): ";
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos);
    const std::string message = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(message.find(rule), std::string::npos) << message;
  }
}

TEST(ConfigErrors, CpMustDivideSequence) {
  expect_rule("selftest --seq 31", "cp (2) must divide the sequence length (31)");
}

TEST(ConfigErrors, ZigzagNeedsTwiceRingChunks) {
  expect_rule("selftest --seq 34 --layout zigzag", "2 x ring (4) must divide the sequence length (34)");
}

TEST(ConfigErrors, UlyssesDegreeVersusHeads) {
  expect_rule("selftest --strategy ulysses --heads 3 --kv-heads 3 --mask causal",
              "ulysses degree (2) must divide the query heads (3)");
  expect_rule("selftest --strategy ulysses --heads 6 --kv-heads 3 --mask causal",
              "the kv heads (3) and the ulysses degree (2) must divide one another");
}

TEST(ConfigErrors, MeshProductMustEqualWorld) {
  expect_rule("selftest --cp 3", "dp x fsdp x cp x tp = 1 x 1 x 3 x 1 = 3 but the job has 2 ranks");
}

// Memory is checked against the planner's prediction before anything is
// allocated (a 10^12-token sequence used to run for tens of seconds, then
// die in a bare std::bad_alloc).
TEST(ConfigErrors, MemoryNeedIsCheckedBeforeAllocating) {
  const std::string train = std::string("train ") + LONGCTX_SOURCE_DIR +
                            "/configs/base.yml dataset_type=synthetic ici_data_parallelism=2 ";
  expect_rule(train + "max_target_length=1000000000000", "per rank (predicted by the planner) but this host has");
  expect_rule(train + "device_memory_budget=1MiB", "but device_memory_budget is 1.00 MiB");
  expect_rule(train + "max_target_length=1000000000000 base_emb_dim=10000000",
              "needs more than 4 EiB per rank");
}

TEST(ConfigErrors, UnknownStrategy) {
  expect_rule("selftest --strategy spiral", "unknown context_parallel_strategy 'spiral'");
}

// -h / --help anywhere after a command prints that command's usage and exits 0.
TEST(CommandLine, HelpForEveryCommand) {
  for (const char* command : {"train", "plan", "selftest", "bench attention", "bench cp", "bench model"})
    for (const char* flag : {"--help", "--json -h"}) {
      RunResult r = run_longctx(std::string(command) + " " + flag, 1);
      SCOPED_TRACE(std::string(command) + " " + flag + "\n" + r.output);
      EXPECT_EQ(r.status, 0);
      EXPECT_NE(r.output.find(std::string("longctx ") + command), std::string::npos);
      EXPECT_EQ(r.output.find("error"), std::string::npos);
    }
}

}  // namespace
