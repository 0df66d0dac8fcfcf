#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_bench_cp(const Args&) { throw Error("'bench_cp' is not built yet"); }

}  // namespace longctx
