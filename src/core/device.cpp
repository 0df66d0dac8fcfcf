#include "core/device.h"

#include <cstdint>

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

Device::Device(bool meta, int kernel_threads)
    : meta_(meta), kernel_threads_(kernel_threads),
      own_tracker_(meta ? std::make_unique<MemoryTracker>() : nullptr),
      tracker_(meta ? own_tracker_.get() : &MemoryTracker::global()) {
  if (meta) tracker_->keep_contents();  // what a counted step held at its peaks, by name
}

Device& Device::cpu() {
  static Device device(false, 0);
  return device;
}

std::unique_ptr<Device> Device::make_meta(int kernel_threads) {
  return std::unique_ptr<Device>(new Device(true, kernel_threads < 1 ? 1 : kernel_threads));
}

Device& Device::current() { return current_device ? *current_device : cpu(); }

DeviceScope::DeviceScope(Device& device) : previous_(current_device) { current_device = &device; }
DeviceScope::~DeviceScope() { current_device = previous_; }

void Device::count(const char* kernel, double amount) {
  amount *= double(repeat_factor);
  for (auto& [name, total] : counted_)
    if (name == kernel) {
      total += amount;
      return;
    }
  counted_.emplace_back(kernel, amount);
}

std::map<std::string, double> Device::counted() const {
  std::map<std::string, double> out;  // one line per name (equal literals may have several addresses)
  for (const auto& [name, total] : counted_) out[name] += total;
  return out;
}

Device& device_of(const void* data) {
  if (!is_meta(data)) return Device::cpu();
  Device& device = Device::current();
  if (!device.is_meta()) throw Error("a meta device's storage outside its DeviceScope (core/device.h)");
  return device;
}

bool counted_on_meta(const void* data, const char* kernel, double amount) {
  if (!is_meta(data)) return false;
  device_of(data).count(kernel, amount);
  return true;
}

bool counted_on_meta(const TensorView& out, const char* kernel, double amount) {
  if (!is_meta(out)) return false;
  out.device->count(kernel, amount);
  return true;
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
