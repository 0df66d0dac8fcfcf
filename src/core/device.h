#pragma once
// Where buffers live and kernels run: the seam a GPU backend plugs into.
//
// Two devices today:
//   Device::cpu()          RAM, counted by MemoryTracker::global().
//   Device::make_cpu(set)  RAM too, running a kernel set a test pinned.
//   Device::make_meta(t, set) counts and never backs: a Buffer made on it is
//                          tracked by the device's own tracker (which keeps
//                          the buffers live at each peak, by name), its data()
//                          is an address that is never mapped (views and
//                          offsets can be formed; any access faults). Its
//                          kernel set counts (core/kernel_set.h): an op
//                          handed such data counts its work, allocates the
//                          scratch the target's kernel would (for `t`
//                          threads) and runs nothing; cp/ skips its host
//                          loops over it (is_meta).
//
// Every op reaches its kernels through launch() below: the one place that
// asks which device an op runs on. Kernel bodies never ask.
//
// A Buffer is made on the calling thread's current device: the CPU unless a
// DeviceScope says otherwise (as a GPU runtime's current device is per
// thread). The planner runs the real step (src/plan/step_count.cpp) and
// each strategy's attention call (src/cp/cp_count.cpp) inside a DeviceScope
// of a meta device over a counting mesh, and reads the peaks from the meta
// device's tracker: the buffers are counted where they are allocated, never
// re-derived.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/memory.h"
#include "core/kernel_set.h"

namespace longctx {

class Device {
 public:
  // The CPU with the kernels chosen for it (kernels/cpu/select.h).
  static Device& cpu();
  // The CPU running `kernels` instead (tests pin a set; a benchmark times one).
  static std::unique_ptr<Device> make_cpu(KernelSet kernels);
  // A counting device: `kernels` must count (counting_kernel_set).
  static std::unique_ptr<Device> make_meta(int kernel_threads, KernelSet kernels);
  // The calling thread's current device (DeviceScope), the CPU by default.
  static Device& current();

  bool is_meta() const { return meta_; }
  // Its own set, or (the CPU) the CPU's chosen set, asked at the first op.
  const KernelSet& kernels() const { return kernels_ ? *kernels_ : cpu_kernel_set(); }
  MemoryTracker& tracker() const { return *tracker_; }
  // Threads a counted kernel stands for (its per-thread scratch) on a meta
  // device; 0 on the CPU, whose kernels use their OpenMP team.
  int kernel_threads() const { return kernel_threads_; }
  // What the ops handed this meta device's data were asked to do, per op:
  // elements in the units src/plan/planner.h prices (elementwise_kernels),
  // FLOPs for gemm. The planner reads them instead of re-listing the
  // model's calls.
  void count(KernelId kernel, double amount);
  const std::array<double, kNumKernels>& counted() const { return counted_; }

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

 private:
  Device(bool meta, int kernel_threads, std::optional<KernelSet> kernels);
  bool meta_;
  int kernel_threads_;
  std::optional<KernelSet> kernels_;
  std::unique_ptr<MemoryTracker> own_tracker_;  // meta devices count apart from the process
  MemoryTracker* tracker_;
  std::array<double, kNumKernels> counted_{};
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
  Device* device_;
};

// A loop whose iterations count alike (the same kernels and collectives on
// the same sizes, at other offsets: the model's token chunks, the loss
// head's row chunks) runs its first iteration on a meta device inside a
// CountRepeat(n - 1), and its last once: what it counts (Device::count, the
// communicators' counters) is counted n times. Planning a 14M-token step
// then costs its distinct iterations, not its hundreds of thousands of
// kernel calls. The last runs too because memory is not alike at the ends:
// with FSDP the last layer forward prefetches the head's weights, and the
// last layer backward prefetches nothing, so the counted peaks are the real
// step's.
class CountRepeat {
 public:
  explicit CountRepeat(int64_t n);
  ~CountRepeat();
  CountRepeat(const CountRepeat&) = delete;
  CountRepeat& operator=(const CountRepeat&) = delete;

 private:
  int64_t previous_;
};
// The product of the calling thread's enclosing CountRepeats (1 outside any).
int64_t count_repeat();
// body(i) for i in [0, n): on the current device, or on a meta device body(0)
// counted n - 1 times and body(n - 1) once. For loops of alike iterations only.
template <typename F>
void for_each_alike(int64_t n, F&& body) {
  if (n > 1 && Device::current().is_meta()) {
    {
      const CountRepeat repeat(n - 1);
      body(int64_t{0});
    }
    return body(n - 1);
  }
  for (int64_t i = 0; i < n; ++i) body(i);
}

struct TensorView;  // core/tensor.h

// A view carries its device (TensorView::device: its Tensor's Buffer's, and
// a view made over raw storage takes device_of that storage); kernels given
// views ask it. Raw storage (the kernels given pointers: GEMMs, the
// optimizer's arrays) is told apart by its address: every meta device's
// storage lies in one range that is never mapped.

// Whether `data` is storage of a meta device (never to be touched); whether a view's device is a meta device.
bool is_meta(const void* data);
bool is_meta(const TensorView& view);
// The device an op writing `out` runs on: a view's own meta device; for raw
// meta storage the calling thread's current device (which must be a meta
// device: Error otherwise; meta storage is only made and viewed inside its
// DeviceScope); else the calling thread's current device where it is a CPU
// one, else the CPU.
Device& device_of(const void* out);
Device& device_of(const TensorView& out);
// The kernel set of the calling thread's device (the CPU's by default).
inline const KernelSet& current_kernels() { return Device::current().kernels(); }

// An op's one way to its kernels: on a counting device, `amount` of `id`
// is counted, `scratch_bytes()` bytes of scratch are held for the call (the
// target kernel's, for the device's threads) and nothing runs (an op that
// returns a value returns its zero); else body(the device's kernel set).
// A Buffer of `bytes` of scratch named for `id`, made and freed on
// `device`, which must be the current one (Error otherwise): the counted
// scratch of launch.
void hold_counted_scratch(Device& device, KernelId id, int64_t bytes);
struct NoScratch {
  int64_t operator()() const { return 0; }
};
template <typename Body, typename Scratch = NoScratch>
auto launch(KernelId id, Device& device, double amount, Body&& body, Scratch&& scratch_bytes = {})
    -> decltype(body(device.kernels())) {
  using Result = decltype(body(device.kernels()));
  if (device.kernels().counts) {
    if (amount > 0) device.count(id, amount);
    hold_counted_scratch(device, id, scratch_bytes());
    return Result();
  }
  return body(device.kernels());
}
// The address a meta Buffer's data() starts at (for Buffer).
void* meta_storage();

}  // namespace longctx
