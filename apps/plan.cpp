#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_plan(const Args&) { throw Error("'plan' is not built yet"); }

}  // namespace longctx
