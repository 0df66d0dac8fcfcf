#include "core/device.h"

#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "core/tensor.h"

namespace longctx {

namespace {

thread_local Device* current_device = nullptr;  // nullptr: the CPU
thread_local int64_t repeat_factor = 1;          // CountRepeat

// Meta storage starts at a non-canonical x86-64 address (bit 63 set, bits
// 48-62 clear): no process can map it, so a missed host loop faults at its
// first access instead of writing anywhere; offsets below 2^62 bytes stay
// in the range without wrapping.
constexpr uintptr_t kMetaBase = uintptr_t{1} << 63;
constexpr uintptr_t kMetaEnd = kMetaBase + (uintptr_t{1} << 62);

}  // namespace

Device::Device(bool meta, int kernel_threads, std::optional<KernelSet> kernels)
    : meta_(meta), kernel_threads_(kernel_threads), kernels_(std::move(kernels)),
      own_tracker_(meta ? std::make_unique<MemoryTracker>() : nullptr),
      tracker_(meta ? own_tracker_.get() : &MemoryTracker::global()) {
  if (meta) tracker_->keep_contents();  // what a counted step held at its peaks, by name
}

Device& Device::cpu() {
  static Device device(false, 0, std::nullopt);
  return device;
}

std::unique_ptr<Device> Device::make_cpu(KernelSet kernels) {
  if (kernels.counts) throw Error("Device::make_cpu: a counting kernel set is a meta device's (make_meta)");
  return std::unique_ptr<Device>(new Device(false, 0, std::move(kernels)));
}

std::unique_ptr<Device> Device::make_meta(int kernel_threads, KernelSet kernels) {
  if (!kernels.counts) throw Error("Device::make_meta: a meta device's kernel set must count (counting_kernel_set)");
  return std::unique_ptr<Device>(new Device(true, kernel_threads < 1 ? 1 : kernel_threads, std::move(kernels)));
}

Device& Device::current() { return current_device ? *current_device : cpu(); }

DeviceScope::DeviceScope(Device& device) : previous_(current_device), device_(&device) { current_device = &device; }
DeviceScope::~DeviceScope() {
  // Scopes nest on their thread: one ended out of order would leave a
  // device current after its owner freed it.
  if (current_device != device_) std::abort();
  current_device = previous_;
}

void Device::count(KernelId kernel, double amount) {
  counted_[static_cast<std::size_t>(kernel)] += amount * double(repeat_factor);
}

Device& device_of(const void* out) {
  Device& device = Device::current();
  if (!is_meta(out)) return device.is_meta() ? Device::cpu() : device;
  if (!device.is_meta()) throw Error("a meta device's storage outside its DeviceScope (core/device.h)");
  return device;
}

Device& device_of(const TensorView& out) {
  if (!is_meta(out)) return device_of(static_cast<const void*>(nullptr));
  return *out.device;
}

void hold_counted_scratch(Device& device, KernelId id, int64_t bytes) {
  if (bytes <= 0) return;
  // A Buffer is made on the current device: it must be the one counting.
  if (&Device::current() != &device)
    throw Error(std::string(kernel_name(id)) + ": a meta device's tensor outside its DeviceScope (core/device.h)");
  const bool backward = id == KernelId::attention_backward;
  const Buffer scratch(MemCategory::scratch,
                       id == KernelId::attention_forward ? "attention forward scratch"
                       : backward                        ? "attention backward scratch"
                                                         : kernel_name(id),
                       bytes);
}

bool is_meta(const TensorView& view) { return view.device && view.device->is_meta(); }

CountRepeat::CountRepeat(int64_t n) : previous_(repeat_factor) { repeat_factor *= n; }
CountRepeat::~CountRepeat() { repeat_factor = previous_; }
int64_t count_repeat() { return repeat_factor; }

void* meta_storage() { return reinterpret_cast<void*>(kMetaBase); }

bool is_meta(const void* data) {
  const auto a = reinterpret_cast<uintptr_t>(data);
  return a >= kMetaBase && a < kMetaEnd;
}

}  // namespace longctx
