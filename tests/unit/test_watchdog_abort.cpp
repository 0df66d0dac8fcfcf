// The watchdog's default action, through a real 2-rank job (tests/watchdog_stall.cpp):
// a rank that waits longer than collective_timeout_seconds prints which operation
// it waited on and aborts the job, so every rank exits non-zero within seconds
// instead of hanging until the scheduler kills it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace {

TEST(Watchdog, AbortsTheWholeJobNamingTheOperation) {
  const auto helper = std::filesystem::canonical("/proc/self/exe").parent_path() / "watchdog_stall";
  ASSERT_TRUE(std::filesystem::exists(helper)) << helper;
  const std::string cmd = "OMP_NUM_THREADS=1 timeout 60 mpiexec --oversubscribe --allow-run-as-root "
                          "--bind-to none -n 2 " + helper.string() + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string output;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe)) output += buf.data();
  const int status = pclose(pipe);
  SCOPED_TRACE(output);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  // Rank 1 sleeps 120 s, so only the abort can end the job before `timeout 60`.
  EXPECT_NE(WEXITSTATUS(status), 124) << "the job hung until timeout killed it";
  EXPECT_NE(output.find("watchdog: rank 0 of communicator 'stall' waited more than"), std::string::npos);
  EXPECT_NE(output.find("on recv with rank 1"), std::string::npos);
}

}  // namespace
