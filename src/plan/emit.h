#pragma once
// A resolved run configuration (the planner's recommendation) written as
// another framework's settings, so that a user of that framework runs the
// plan without translating it by hand (`longctx plan --emit FRAMEWORK`):
//   maxtext     YAML keys over MaxText's configs/base.yml (MaxText 0.2.5):
//               the model, the mesh, the batch in MaxText's units, the
//               attention kernel for the hardware, remat and offload by
//               MaxText's tensor names, precision, optimizer sharding;
//   megatron    the environment and command-line flags of Megatron-Core's
//               pretrain_gpt.py (megatron-core 0.19.2, whose
//               megatron/training/arguments.py parses and validates them);
//   torchtitan  the command line of TorchTitan 0.3.0's trainer (its
//               ConfigManager: a model config function and overrides; 0.3.0
//               reads no TOML job files).
// tests/frameworks/validate.py hands every emitted plan of a table to each
// framework's own configuration code (scripts/framework_env.sh installs
// them); test_plan_frameworks runs it.
//
// A plan a framework cannot run as planned (a strategy it lacks on that
// hardware, a memory lever it has no setting for) is refused by name
// (framework_refusal), never emitted as something else: `plan --emit`
// searches only the plans the framework runs. What it runs differently
// without changing the memory or the batch (a ring that exchanges every
// chunk) is a "# note:" line.
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/vocabulary.h"

namespace longctx {

// Why `framework` cannot run exactly this plan on `platform`, "" when it can.
// The rules are the framework's own checks (cited in emit.cpp) and the
// levers it has no setting for.
std::string framework_refusal(const RunConfig& config, int64_t devices, Platform platform, Framework framework);
// The same reasons, one per entry.
std::vector<std::string> framework_refusals(const RunConfig& config, int64_t devices, Platform platform,
                                            Framework framework);

// `devices`: the job's devices (an axis at -1 takes what the others leave).
// ConfigError with framework_refusal's reason when the framework cannot run it.
std::string emit_settings(const RunConfig& config, int64_t devices, Platform platform, Framework framework);

}  // namespace longctx
