#pragma once
// Tests pin the kernels an op runs with a CPU device of their own
// (Device::make_cpu) for a scope's life: no process-wide setter, nothing to
// restore, and a pin never leaks into the next test.
#include <memory>
#include <utility>

#include "core/device.h"
#include "kernels/attention/dot/dot.h"
#include "kernels/cpu/select.h"

namespace longctx {

// What a test pins; the rest stays the CPU's choice.
struct KernelPin {
  // f32 and f32_fused pin fp32 inputs' path, the others bf16 inputs'
  // (automatic: the CPU's). A path the set lacks kernels for is a
  // ShapeError when an op runs.
  AttentionTilePath path = AttentionTilePath::automatic;
  const attn::DotTileKernels* dot = nullptr;  // bf16_dot's kernels (a portable twin on any CPU); null: the CPU's
  int64_t backward_kv_blocks = 0, dot_forward_q_blocks = 0;  // 0: automatic
};

inline KernelSet pinned_set(const KernelPin& pin, KernelSet set = cpu_kernel_set()) {
  set.name = "cpu (pinned by a test)";
  const bool f32 = pin.path == AttentionTilePath::f32 || pin.path == AttentionTilePath::f32_fused;
  if (pin.path != AttentionTilePath::automatic) (f32 ? set.f32_attention : set.bf16_attention) = pin.path;
  if (pin.dot) set.dot = pin.dot;
  set.backward_kv_blocks = pin.backward_kv_blocks;
  set.dot_forward_q_blocks = pin.dot_forward_q_blocks;
  return set;
}

class PinnedKernels {
 public:
  explicit PinnedKernels(KernelSet set) : device_(Device::make_cpu(std::move(set))), on_device_(*device_) {}
  explicit PinnedKernels(const KernelPin& pin) : PinnedKernels(pinned_set(pin)) {}

 private:
  std::unique_ptr<Device> device_;
  DeviceScope on_device_;
};

}  // namespace longctx
