#pragma once
// Where this process's model is in a step (a pass and a layer), for the
// trainer's progress line (src/train/progress.h). The model publishes with
// one relaxed atomic store per layer and pass and never prints; a reporting
// thread reads it. One position per process: the model of this rank.
#include <atomic>
#include <cstdint>

namespace longctx {

enum class StepPass : uint32_t { idle, batch, forward, loss, backward, optimizer };

constexpr const char* step_pass_name(StepPass p) {
  constexpr const char* names[] = {"idle", "batch", "forward", "loss", "backward", "optimizer"};
  return names[static_cast<uint32_t>(p)];
}

struct StepPosition {
  StepPass pass = StepPass::idle;
  int64_t layer = -1;  // -1: the pass is not per layer
};

namespace detail {
inline std::atomic<uint64_t> step_position{0};  // pass << 32 | (layer + 1)
inline std::atomic<void (*)(StepPass, int64_t)> step_position_observer{nullptr};
}

inline void publish_step_position(StepPass pass, int64_t layer = -1) {
  detail::step_position.store(uint64_t(pass) << 32 | uint32_t(layer + 1), std::memory_order_relaxed);
  if (auto observe = detail::step_position_observer.load(std::memory_order_relaxed)) observe(pass, layer);
}

// Tests only: `observer` sees every position published, on the publishing
// thread (nullptr: none), so a test checks what the model publishes without
// racing the reporter's clock.
inline void observe_step_positions(void (*observer)(StepPass, int64_t)) {
  detail::step_position_observer.store(observer, std::memory_order_relaxed);
}

inline StepPosition step_position() {
  const uint64_t v = detail::step_position.load(std::memory_order_relaxed);
  return {static_cast<StepPass>(v >> 32), static_cast<int64_t>(v & 0xffffffffu) - 1};
}

}  // namespace longctx
