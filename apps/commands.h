#pragma once
// Subcommands of the `longctx` command. Each takes the arguments after its
// name and returns the process exit status; errors are thrown as
// longctx::Error and turned into one line on stderr by main.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace longctx {

using Args = std::vector<std::string>;

// An integer flag's value, at least `min`; a ConfigError naming the command
// and the flag otherwise.
inline int64_t parse_int_flag(const std::string& command, const std::string& flag, const std::string& value,
                              int64_t min = std::numeric_limits<int64_t>::min()) {
  long long v = 0;
  try {
    size_t used = 0;
    v = std::stoll(value, &used);
    if (used != value.size()) throw ConfigError("");
  } catch (...) {
    throw ConfigError(command + ": " + flag + " expects an integer, got '" + value + "'");
  }
  if (v < min) throw ConfigError(command + ": " + flag + " must be >= " + std::to_string(min) + ", got " + value);
  return v;
}

int run_train(const Args& args);           // apps/train.cpp
int run_plan(const Args& args);            // apps/plan.cpp
int run_eval(const Args& args);            // apps/eval.cpp
int run_selftest(const Args& args);        // apps/selftest.cpp
int run_bench_attention(const Args& args); // apps/bench_attention.cpp
int run_bench_cp(const Args& args);        // apps/bench_cp.cpp
int run_bench_model(const Args& args);     // apps/bench_model.cpp
int run_info(const Args& args);            // apps/info.cpp

// Each subcommand's usage, defined beside it. main prints it for -h/--help
// anywhere in the subcommand's arguments (exit 0), so no subcommand parses
// help itself; usage errors append it to their message.
extern const char* const kTrainUsage;
extern const char* const kPlanUsage;
extern const char* const kEvalUsage;
extern const char* const kSelftestUsage;
extern const char* const kBenchAttentionUsage;
extern const char* const kBenchCpUsage;
extern const char* const kBenchModelUsage;
extern const char* const kInfoUsage;

}  // namespace longctx
