#pragma once
// Memory accounting. Every long-lived buffer is a Buffer, registered with the
// process-wide MemoryTracker under a category, so that runs report current and
// peak bytes per category and an optional budget (device_memory_budget) is
// enforced at the allocation that would breach it.
//
// Two pools: device (every category but host_offload; device_memory_budget)
// and host (host_offload: saved activations offloaded to the host tier,
// src/model/offload.h; host_memory_budget). On this CPU backend both are
// RAM; the host pool is the seam where a GPU backend puts pinned host memory
// filled by asynchronous device-to-host copies.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace longctx {

enum class MemCategory { parameters, gradients, optimizer, activations, communication, scratch, host_offload };
constexpr int kNumMemCategories = 7;
const char* mem_category_name(MemCategory c);
// host_offload is the host pool; all others are device memory.
inline bool is_host_pool(MemCategory c) { return c == MemCategory::host_offload; }

// Buffers of one category and name live together at a peak: `count` of
// them, `bytes` in all.
struct LiveBuffers {
  MemCategory category;
  std::string name;
  int64_t count = 0;
  size_t bytes = 0;
};

class MemoryTracker {
 public:
  static MemoryTracker& global();

  // Records an allocation; throws OutOfMemoryError naming `name`, the request,
  // the peak and the budget when its pool's budget would be exceeded.
  // Returns the allocation's ticket for on_release (0 unless the tracker
  // keeps its contents).
  uint64_t on_allocate(MemCategory c, const std::string& name, size_t bytes);
  void on_release(MemCategory c, size_t bytes, uint64_t ticket = 0);

  // From now on, remember which buffers are live at each peak (a meta
  // device's tracker: the planner's memory lines are what its counted step
  // held, by buffer name). Costs a log entry per allocation and release;
  // the contents are replayed from it when asked.
  void keep_contents();
  // The buffers live when category c first reached its peak, grouped by name.
  std::vector<LiveBuffers> contents_at_peak(MemCategory c) const;
  // Transients: communication and scratch, the buffers that live within
  // one kernel or collective call. Their peak together (each category's
  // own peak may come in another call) and what was live then.
  size_t transient_peak() const { return transient_.peak; }
  std::vector<LiveBuffers> transient_contents_at_peak() const;

  void set_budget(size_t bytes);  // device pool; 0 = unlimited
  size_t budget() const { return budget_; }
  void set_host_budget(size_t bytes);  // host pool; 0 = unlimited
  size_t host_budget() const { return host_.budget; }
  size_t current(MemCategory c) const { return current_[static_cast<int>(c)]; }
  size_t peak(MemCategory c) const { return peak_[static_cast<int>(c)]; }
  // Device pool totals (every category but host_offload).
  size_t current_total() const { return current_total_; }
  size_t peak_total() const { return peak_total_; }
  size_t host_current() const { return host_.current; }
  size_t host_peak() const { return host_.peak; }
  // Restarts peak measurement from the current usage.
  void reset_peaks();
  // One line per category: "parameters 1.2 MiB (peak 1.2 MiB)".
  std::string report() const;

 private:
  // keep_contents: every allocation and release in order (a release names
  // its allocation's entry: the ticket is that entry's index + 1), and for
  // each peak the log's length when it was first reached.
  struct LogEntry {
    MemCategory category;
    int32_t name;         // index into names_
    int64_t allocation;   // -1 for an allocation; for a release, its allocation's entry
    size_t bytes;
  };
  std::vector<LiveBuffers> replay(size_t length, uint32_t categories) const;

  mutable std::mutex mu_;
  std::array<size_t, kNumMemCategories> current_{}, peak_{};
  size_t current_total_ = 0, peak_total_ = 0, budget_ = 0;
  struct Pool { size_t current = 0, peak = 0, budget = 0; } host_, transient_;
  bool keep_contents_ = false;
  std::vector<LogEntry> log_;
  std::vector<std::string> names_;
  std::map<std::string, int32_t> name_index_;
  std::array<size_t, kNumMemCategories> peak_at_{};
  size_t transient_peak_at_ = 0;
};

class Device;  // core/device.h

// 64-byte aligned, zero-initialised, tracked, move-only storage on a device:
// the calling thread's current one (Device::current(), the CPU unless a
// DeviceScope says otherwise). On a meta device it is counted, never backed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemCategory category, const std::string& name, size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  // The device it was made on (the calling thread's current one then).
  Device& device() const { return *device_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t size() const { return bytes_; }

 private:
  void release();
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  uint64_t ticket_ = 0;  // the tracker's (MemoryTracker::on_allocate)
  MemCategory category_ = MemCategory::scratch;
};

std::string format_bytes(size_t bytes);  // "1.50 GiB"

}  // namespace longctx
