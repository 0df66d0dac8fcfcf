#include "core/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <new>

#include "core/device.h"
#include "core/error.h"

namespace longctx {

const char* mem_category_name(MemCategory c) {
  static const char* names[kNumMemCategories] = {"parameters",    "gradients",     "optimizer",
                                                 "activations",   "communication", "scratch",
                                                 "host_offload"};
  return names[static_cast<int>(c)];
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

MemoryTracker& MemoryTracker::global() {
  static MemoryTracker tracker;
  return tracker;
}

namespace {
bool is_transient(MemCategory c) { return c == MemCategory::communication || c == MemCategory::scratch; }
uint32_t bit(MemCategory c) { return uint32_t{1} << static_cast<int>(c); }
}  // namespace

void MemoryTracker::keep_contents() {
  std::lock_guard<std::mutex> lock(mu_);
  keep_contents_ = true;
}

// The buffers of the categories in `categories` (a bit per category) live
// after the first `length` log entries, grouped by category and name (in the
// order first allocated). Called with mu_ held.
std::vector<LiveBuffers> MemoryTracker::replay(size_t length, uint32_t categories) const {
  std::vector<int64_t> count(names_.size() * kNumMemCategories, 0);
  std::vector<size_t> bytes(count.size(), 0);
  std::vector<size_t> order;  // groups by first allocation
  std::vector<bool> seen(count.size(), false);
  for (size_t i = 0; i < length; ++i) {
    const LogEntry& e = log_[i];
    if (!(categories & bit(e.category))) continue;
    const size_t group = size_t(e.name) * kNumMemCategories + size_t(e.category);
    if (e.allocation < 0) {
      if (!seen[group]) order.push_back(group);
      seen[group] = true;
      ++count[group];
      bytes[group] += e.bytes;
    } else {
      --count[group];
      bytes[group] -= e.bytes;
    }
  }
  std::vector<LiveBuffers> out;
  for (size_t group : order)
    if (count[group] > 0)
      out.push_back({static_cast<MemCategory>(group % kNumMemCategories), names_[group / kNumMemCategories],
                     count[group], bytes[group]});
  return out;
}

std::vector<LiveBuffers> MemoryTracker::contents_at_peak(MemCategory c) const {
  std::lock_guard<std::mutex> lock(mu_);
  return replay(peak_at_[static_cast<int>(c)], bit(c));
}

std::vector<LiveBuffers> MemoryTracker::transient_contents_at_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replay(transient_peak_at_, bit(MemCategory::communication) | bit(MemCategory::scratch));
}

uint64_t MemoryTracker::on_allocate(MemCategory c, const std::string& name, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = static_cast<int>(c);
  // Logged once the budget has taken it (below): the ticket it will have.
  const uint64_t ticket = keep_contents_ ? log_.size() + 1 : 0;
  auto log = [&] {
    if (!keep_contents_) return;
    const auto [it, added] = name_index_.emplace(name, int32_t(names_.size()));
    if (added) names_.push_back(name);
    log_.push_back({c, it->second, -1, bytes});
  };
  if (is_host_pool(c)) {
    if (host_.budget != 0 && host_.current + bytes > host_.budget)
      throw OutOfMemoryError("host_memory_budget exceeded: allocating " + format_bytes(bytes) + " for '" + name +
                             "' on top of " + format_bytes(host_.current) + " in the host pool exceeds the budget of " +
                             format_bytes(host_.budget));
    log();
    current_[i] += bytes;
    if (current_[i] > peak_[i]) peak_at_[i] = log_.size();
    peak_[i] = std::max(peak_[i], current_[i]);
    host_.current += bytes;
    host_.peak = std::max(host_.peak, host_.current);
    return ticket;
  }
  if (budget_ != 0 && current_total_ + bytes > budget_) {
    throw OutOfMemoryError("device_memory_budget exceeded: allocating " + format_bytes(bytes) +
                           " for '" + name + "' (" + mem_category_name(c) + ") on top of " +
                           format_bytes(current_total_) + " in use (peak so far " +
                           format_bytes(peak_total_) + ") exceeds the budget of " +
                           format_bytes(budget_));
  }
  log();
  current_[i] += bytes;
  if (current_[i] > peak_[i]) {
    peak_[i] = current_[i];
    peak_at_[i] = log_.size();
  }
  current_total_ += bytes;
  if (current_total_ > peak_total_) peak_total_ = current_total_;
  if (is_transient(c)) {
    transient_.current += bytes;
    if (transient_.current > transient_.peak) {
      transient_.peak = transient_.current;
      transient_peak_at_ = log_.size();
    }
  }
  return ticket;
}

void MemoryTracker::on_release(MemCategory c, size_t bytes, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  current_[static_cast<int>(c)] -= bytes;
  (is_host_pool(c) ? host_.current : current_total_) -= bytes;
  if (is_transient(c)) transient_.current -= bytes;
  if (ticket) {
    const LogEntry& allocation = log_[ticket - 1];
    log_.push_back({allocation.category, allocation.name, int64_t(ticket - 1), allocation.bytes});
  }
}

void MemoryTracker::set_host_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  host_.budget = bytes;
}

void MemoryTracker::set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  budget_ = bytes;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = current_;
  peak_total_ = current_total_;
  host_.peak = host_.current;
  transient_.peak = transient_.current;
  peak_at_.fill(log_.size());
  transient_peak_at_ = log_.size();
}

std::string MemoryTracker::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (int i = 0; i < kNumMemCategories; ++i) {
    out += std::string(mem_category_name(static_cast<MemCategory>(i))) + " " +
           format_bytes(current_[i]) + " (peak " + format_bytes(peak_[i]) + ")\n";
  }
  out += "total " + format_bytes(current_total_) + " (peak " + format_bytes(peak_total_) + ")\n";
  out += "host pool " + format_bytes(host_.current) + " (peak " + format_bytes(host_.peak) + ")\n";
  return out;
}

namespace {
// Large buffers on 2 MiB pages where Linux offers them (transparent huge
// pages in "madvise" mode, as Debian ships them, give them only to ranges
// that ask). A kernel that walks a head's rows of a [B, S, heads, D]
// activation strides 2 KiB or more per row, a new 4 KiB page every row or
// two: with 4 KiB pages every such row cost a TLB miss, and under a
// hypervisor a two-level page walk (on an AMX Xeon VM the bf16 attention's
// forward and backward ran 4-6% faster on 2 MiB pages).
// Not scratch: kernels make and free it every call, and a fault on a huge
// page may wait for the kernel to compact memory.
constexpr size_t kHugePage = size_t(2) << 20;
void* host_allocate(size_t bytes, MemCategory category) {
  void* p = nullptr;
  const size_t alignment = bytes >= 2 * kHugePage && category != MemCategory::scratch ? kHugePage : 64;
  if (posix_memalign(&p, alignment, bytes) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
  if (alignment == kHugePage) madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: may be refused
#endif
  return p;
}
}  // namespace

Buffer::Buffer(MemCategory category, const std::string& name, size_t bytes)
    : bytes_(bytes), category_(category) {
  Device& device = Device::current();
  device_ = &device;
  if (bytes == 0) return;
  ticket_ = device.tracker().on_allocate(category, name, bytes);
  if (device.is_meta()) {
    data_ = meta_storage();
    return;
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = host_allocate(rounded, category);
  if (!data_) {
    device.tracker().on_release(category, bytes, ticket_);
    throw OutOfMemoryError("host allocation of " + format_bytes(bytes) + " for '" + name +
                           "' failed");
  }
  std::memset(data_, 0, rounded);
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (data_) {
    if (!device_->is_meta()) std::free(data_);
    device_->tracker().on_release(category_, bytes_, ticket_);
  }
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  ticket_ = 0;
}

Buffer::Buffer(Buffer&& other) noexcept
    : device_(other.device_), data_(other.data_), bytes_(other.bytes_), ticket_(other.ticket_),
      category_(other.category_) {
  other.device_ = nullptr;
  other.data_ = nullptr;
  other.bytes_ = 0;
  other.ticket_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    ticket_ = other.ticket_;
    category_ = other.category_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
    other.ticket_ = 0;
  }
  return *this;
}

}  // namespace longctx
