#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_bench_model(const Args&) { throw Error("'bench_model' is not built yet"); }

}  // namespace longctx
