#pragma once
// A resolved run configuration (the planner's recommendation) written as
// another framework's settings, so a user of that framework can run the
// plan without translating it by hand (`longctx plan --emit maxtext|megatron`):
//   maxtext   YAML keys of MaxText's src/maxtext/configs/base.yml (most are
//             ours: longctx's keys follow MaxText's);
//   megatron  command-line flags of Megatron-Core's pretrain_gpt.py
//             (megatron/training/arguments.py and the config dataclasses
//             it generates flags from: model_parallel_config.py,
//             transformer/transformer_config.py).
// What the framework cannot express is written as a comment line ("# ...")
// naming the setting and what the framework would do instead: never dropped.
#include <cstdint>
#include <string>

#include "core/config.h"

namespace longctx {

enum class EmitFormat { maxtext, megatron };
EmitFormat parse_emit_format(const std::string& name);  // ConfigError naming the formats

// `devices`: the job's devices (Megatron derives data parallelism from it).
std::string emit_settings(const RunConfig& config, int64_t devices, EmitFormat format);

}  // namespace longctx
