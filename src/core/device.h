#pragma once
// Where buffers live and kernels run: the seam a GPU backend plugs into.
//
// Two devices today:
//   Device::cpu()          RAM, counted by MemoryTracker::global().
//   Device::make_meta(t)   counts and never backs: a Buffer made on it is
//                          tracked by the device's own tracker, and its data()
//                          is an address that is never mapped (views and
//                          offsets can be formed; any access faults). Kernels
//                          handed such data allocate the scratch they would
//                          (for `t` threads) and return at once; cp/ skips its
//                          host loops over it (is_meta).
//
// A Buffer is made on the calling thread's current device: the CPU unless a
// DeviceScope says otherwise (as a GPU runtime's current device is per
// thread). The planner runs a strategy's real forward and backward inside a
// DeviceScope of a meta device over a counting mesh, and reads the peak from
// the meta device's tracker (src/cp/cp_count.cpp): the buffers are counted
// where they are allocated, never re-derived.
#include <cstdint>
#include <memory>

#include "core/memory.h"

namespace longctx {

class Device {
 public:
  static Device& cpu();
  static std::unique_ptr<Device> make_meta(int kernel_threads);
  // The calling thread's current device (DeviceScope), the CPU by default.
  static Device& current();

  bool is_meta() const { return meta_; }
  MemoryTracker& tracker() const { return *tracker_; }
  // Threads a counted kernel stands for (its per-thread scratch) on a meta
  // device; 0 on the CPU, whose kernels use their OpenMP team.
  int kernel_threads() const { return kernel_threads_; }

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

 private:
  Device(bool meta, int kernel_threads);
  bool meta_;
  int kernel_threads_;
  std::unique_ptr<MemoryTracker> own_tracker_;  // meta devices count apart from the process
  MemoryTracker* tracker_;
};

// Makes `device` the calling thread's current device until destroyed.
class DeviceScope {
 public:
  explicit DeviceScope(Device& device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device* previous_;
};

// Whether `data` is storage of a meta device (never to be touched).
bool is_meta(const void* data);
// The address a meta Buffer's data() starts at (for Buffer).
void* meta_storage();

}  // namespace longctx
