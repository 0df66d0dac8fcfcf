#pragma once
// One training step of one rank, counted by running it: the engine's own
// forward, backward, gradient reduction and update (src/model, src/train)
// on a meta device (core/device.h) over a counting mesh (Mesh::counting),
// so the planner reads what the engine does instead of re-listing it:
// - every collective, per mesh axis and operation, in the communicator's
//   own byte conventions (src/comm/communicator.h);
// - what each kernel was asked to do (Device::counted: elements per
//   elementwise kernel, FLOPs of the GEMMs);
// - the memory peaks, per category, of the transients together and of all
//   together, and the buffers live at each, from the meta device's tracker:
//   what the real step's tracker would see (tests/mpi/test_plan_memory.cpp
//   holds the planner, which reports them, against real steps).
// Offloaded activations and state run with their tiers: the device keeps
// the staging slots and disk staging the real step does, while the host
// and disk tiers themselves hold and move nothing on a meta device
// (core/offload_store.h).
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/memory.h"
#include "core/mesh_shape.h"
#include "kernels/cpu/select.h"

namespace longctx {

struct StepCount {
  // Indexed by MeshAxis. The attention's own axes (cp, ulysses, ring) are
  // counted too; the planner takes them per call from count_cp_call
  // instead, on every ring rank, for the busiest.
  std::array<CommCounters, kMeshAxes.size()> axes{};
  // What each op was asked to do (Device::counted), by KernelId.
  std::array<double, kNumKernels> kernels{};
  double kernel(KernelId id) const { return kernels[static_cast<size_t>(id)]; }
  // The meta device's tracker: each category's peak and the peak of all
  // together (device pool), as the real step would allocate them.
  std::array<int64_t, kNumMemCategories> peaks{};
  std::array<std::vector<LiveBuffers>, kNumMemCategories> at_peak;
  // Communication and scratch together (MemoryTracker::transient_peak).
  int64_t transient_peak = 0;
  std::vector<LiveBuffers> transient_at_peak;
  int64_t peak_total = 0;
  const CommCounters& operator[](MeshAxis a) const { return axes[static_cast<size_t>(a)]; }
};

// `config` on `devices` devices (its data axes resolved from them), as world
// rank `rank`, with `threads` kernel threads (per-thread scratch) of
// `target`'s kernels (kernels/cpu/select.h: this host's, or an accelerator's).
StepCount count_step(const RunConfig& config, int64_t devices, int64_t threads, KernelTarget target, int rank);

}  // namespace longctx
