#include "apps/commands.h"
#include "core/error.h"

namespace longctx {

// PLACEHOLDER until its issue lands.
int run_train(const Args&) { throw Error("'train' is not built yet"); }

}  // namespace longctx
