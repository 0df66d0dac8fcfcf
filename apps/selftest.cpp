#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_selftest(const Args&) { throw Error("'selftest' is not built yet"); }

}  // namespace longctx
