#pragma once
// Subcommands of the `longctx` command. Each takes the arguments after its
// name and returns the process exit status; errors are thrown as
// longctx::Error and turned into one line on stderr by main.
#include <string>
#include <vector>

namespace longctx {

using Args = std::vector<std::string>;

int run_train(const Args& args);           // apps/train.cpp
int run_plan(const Args& args);            // apps/plan.cpp
int run_selftest(const Args& args);        // apps/selftest.cpp
int run_bench_attention(const Args& args); // apps/bench_attention.cpp
int run_bench_cp(const Args& args);        // apps/bench_cp.cpp
int run_bench_model(const Args& args);     // apps/bench_model.cpp

}  // namespace longctx
