// The `longctx` command: train, eval, plan, bench, selftest.
// Every subcommand runs under MPI (one process is a valid launch), through the
// comm layer (src/comm/communicator.h). An error on any rank prints one line
// and aborts the whole job, so peers never hang.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>
#include <string>

#include "apps/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/float_env.h"

namespace {

const char* kUsage =
    "usage: longctx <command> [args]\n"
    "  train CONFIG.yml [key=value ...]     train a model (mpiexec -n N for N ranks)\n"
    "  eval CONFIG.yml [key=value ...]      held-out loss by context position (load_parameters_path=...)\n"
    "  plan CONFIG.yml [key=value ...]      predict memory/communication/time per strategy\n"
    "  selftest [--json]                    check every CP strategy against one rank\n"
    "  bench attention [flags]              attention kernel FLOP/s vs GEMM\n"
    "  bench cp --strategy S [flags]        context-parallel attention scaling\n"
    "  bench model [flags]                  one training step of a model\n"
    "  info (or --version)                  version, build, this CPU's features and each op's kernel\n";

int dispatch(const longctx::Args& a) {
  using namespace longctx;
  if (a.empty() || a[0] == "-h" || a[0] == "--help" || a[0] == "help") {
    std::fputs(kUsage, stdout);
    return a.empty() ? 2 : 0;
  }
  struct Command {
    const char* name;
    int (*run)(const Args&);
    const char* usage;
  };
  static const Command commands[] = {
      {"train", run_train, kTrainUsage},
      {"eval", run_eval, kEvalUsage},
      {"plan", run_plan, kPlanUsage},
      {"selftest", run_selftest, kSelftestUsage},
      {"bench attention", run_bench_attention, kBenchAttentionUsage},
      {"bench cp", run_bench_cp, kBenchCpUsage},
      {"bench model", run_bench_model, kBenchModelUsage},
      {"info", run_info, kInfoUsage},
  };
  // "bench" takes its target as part of the command name.
  const bool bench = a[0] == "bench";
  if (bench && (a.size() < 2 || a[1] == "-h" || a[1] == "--help")) {
    std::fputs(kBenchAttentionUsage, stdout);
    std::fputs(kBenchCpUsage, stdout);
    std::fputs(kBenchModelUsage, stdout);
    if (a.size() < 2) throw ConfigError("bench needs a target: attention, cp or model");
    return 0;
  }
  const std::string name = bench ? "bench " + a[1] : a[0] == "--version" ? "info" : a[0];
  const Args rest(a.begin() + (bench ? 2 : 1), a.end());
  for (const Command& c : commands) {
    if (name != c.name) continue;
    for (const std::string& arg : rest)
      if (arg == "-h" || arg == "--help") {
        std::fputs(c.usage, stdout);
        return 0;
      }
    return c.run(rest);
  }
  if (bench) throw ConfigError("unknown bench target '" + a[1] + "': expected attention, cp or model");
  throw ConfigError("unknown command '" + a[0] + "'; run `longctx --help`");
}

// After an error: if every rank fails (a config error all ranks detect), they
// meet here and exit cleanly, each having printed its line; if some rank is
// still working, the job is aborted after a grace period so no rank hangs.
[[noreturn]] void exit_after_error(longctx::Communicator& error_comm) {
  if (error_comm.size() > 1) {
    longctx::Request req = error_comm.ibarrier();
    bool done = false;
    for (int i = 0; i < 300 && !done; ++i) {
      done = error_comm.test(req);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!done) longctx::comm_abort(1);
  }
  { longctx::Communicator gone = std::move(error_comm); }  // freed before finalize
  longctx::comm_finalize();
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  longctx::flush_subnormals_to_zero();  // before MPI or OpenMP start threads
  longctx::comm_init(&argc, &argv);
  int status = 0;
  {
    longctx::Communicator error_comm = longctx::Communicator::world("errors");
    try {
      status = dispatch(longctx::Args(argv + 1, argv + argc));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "longctx: error (rank %d): %s\n", error_comm.rank(), e.what());
      std::fflush(stderr);
      exit_after_error(error_comm);
    }
  }
  longctx::comm_finalize();
  return status;
}
