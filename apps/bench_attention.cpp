#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_bench_attention(const Args&) { throw Error("'bench_attention' is not built yet"); }

}  // namespace longctx
