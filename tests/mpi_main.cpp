// gtest main for MPI tests: every rank runs every test; rank 0 prints the
// usual report, other ranks print only their failed assertions, tagged with
// their rank. The exit status is non-zero on every rank if any rank failed.
// A fatal failure (a failed ASSERT) aborts the job at once: the failing rank
// leaves its test early, and the others would wait in that test's
// collectives until the watchdog or ctest's timeout, 10 minutes on.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "comm/communicator.h"
#include "core/float_env.h"

namespace {
class FailuresOnlyOnOtherRanks : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnlyOnOtherRanks(int rank) : rank_(rank) {}
  // (gtest holds its own lock during OnTestPartResult: remember the name here.)
  void OnTestStart(const testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_;
};
class AbortOnFatalFailure : public testing::EmptyTestEventListener {
 public:
  explicit AbortOnFatalFailure(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (!r.fatally_failed() || longctx::comm_world_size() == 1) return;
    std::fprintf(stderr, "[rank %d] fatal failure: aborting the job (the other ranks would wait for this one)\n",
                 rank_);
    std::fflush(stderr);
    longctx::comm_abort(1);
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  longctx::flush_subnormals_to_zero();  // as the longctx command runs
  longctx::comm_init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  const int rank = longctx::comm_world_rank();
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnlyOnOtherRanks(rank));
  }
  // After the printers: the failure is out before the job ends.
  testing::UnitTest::GetInstance()->listeners().Append(new AbortOnFatalFailure(rank));
  int64_t any_failed = RUN_ALL_TESTS();
  {
    const longctx::Communicator world = longctx::Communicator::world("gtest");
    world.all_reduce_max(&any_failed, 1);
  }
  longctx::comm_finalize();
  return static_cast<int>(any_failed);
}
