#include "core/offload_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "core/crc32.h"
#include "core/device.h"
#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;

namespace {

constexpr size_t kPiece = size_t{1} << 20;  // bytes covered by one CRC
constexpr const char* kPrefix = "longctx-spill-";

size_t pieces(size_t bytes) { return (bytes + kPiece - 1) / kPiece; }

std::function<void(const std::string&)>& after_write_hook() {
  static std::function<void(const std::string&)> hook;
  return hook;
}

// The stores of this process that are open, by number.
std::mutex live_mu;
std::set<long> live_stores;
long next_store = 0;

// Spill files are named longctx-spill-<pid>-<store>-<block>.bin. A file is
// stale when its pid no longer runs, or is this process's but names no open
// store (a pid reused after a crash).
void remove_stale_spill_files(const fs::path& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    char* rest = nullptr;
    const long pid = std::strtol(name.c_str() + std::strlen(kPrefix), &rest, 10);
    const long store = *rest == '-' ? std::strtol(rest + 1, nullptr, 10) : -1;
    bool running;
    if (pid == ::getpid()) {
      std::lock_guard<std::mutex> lock(live_mu);
      running = live_stores.count(store) > 0;
    } else {
      running = pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
    }
    if (!running) fs::remove(e.path(), ec);
  }
}

}  // namespace

void OffloadStore::set_after_write_hook(std::function<void(const std::string& path)> hook) {
  after_write_hook() = std::move(hook);
}

OffloadStore::OffloadStore(OffloadTarget target, const std::string& dir)
    : target_(target), dir_(dir), meta_(Device::current().is_meta()) {
  if (meta_) return;  // a counted step's: moves nothing, touches no directory
  {
    std::lock_guard<std::mutex> lock(live_mu);
    number_ = next_store++;
    live_stores.insert(number_);
  }
  if (target_ == OffloadTarget::disk) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec || !fs::is_directory(dir_))
      throw ConfigError("offload_dir '" + dir_ + "' cannot be created: " + ec.message());
    remove_stale_spill_files(dir_);
  }
  worker_ = std::thread([this] { run(); });
}

OffloadStore::~OffloadStore() {
  if (meta_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
  if (target_ == OffloadTarget::disk) {
    std::error_code ec;
    for (const auto& [id, block] : blocks_) fs::remove(path_of(id), ec);
  }
  std::lock_guard<std::mutex> lock(live_mu);
  live_stores.erase(number_);
}

std::string OffloadStore::path_of(int64_t id) const {
  return (fs::path(dir_) / (kPrefix + std::to_string(::getpid()) + "-" + std::to_string(number_) + "-" +
                                std::to_string(id) + ".bin")).string();
}

OffloadStore::Ticket OffloadStore::put(int64_t id, const std::string& name, const void* src, size_t bytes) {
  if (meta_) return 0;
  Block& b = blocks_[id];
  if (b.bytes == 0) {
    b.name = name;
    b.bytes = bytes;
    if (target_ == OffloadTarget::host) b.host = Buffer(MemCategory::host_offload, name + " (offloaded)", bytes);
  }
  check_shape(b.bytes == bytes, "offload: block '" + name + "' changed size");
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back({++queued_, true, &b, id, const_cast<void*>(src)});
  cv_.notify_all();
  return queued_;
}

OffloadStore::Ticket OffloadStore::get(int64_t id, void* dst) {
  if (meta_) return 0;
  auto it = blocks_.find(id);
  check_shape(it != blocks_.end(), "offload: block " + std::to_string(id) + " was never stored");
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back({++queued_, false, &it->second, id, dst});
  cv_.notify_all();
  return queued_;
}

void OffloadStore::wait(Ticket t) {
  if (meta_) return;
  std::deque<std::string> written;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= t || error_; });
    if (error_) std::rethrow_exception(error_);
    written.swap(written_);
  }
  if (after_write_hook())
    for (const std::string& path : written) after_write_hook()(path);
}

void OffloadStore::run() {
  for (;;) {
    Move m;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      m = queue_.front();
      queue_.pop_front();
      if (error_) continue;  // after an error, drop the rest: wait() rethrows it
    }
    std::exception_ptr failed;
    try {
      execute(m);
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed && !error_) error_ = failed;
      done_ = m.ticket;
      if (!failed && m.put && target_ == OffloadTarget::disk) written_.push_back(path_of(m.id));
    }
    cv_.notify_all();
  }
}

void OffloadStore::execute(const Move& m) {
  const Block& b = *m.block;
  if (target_ == OffloadTarget::host) {
    if (m.put)
      std::memcpy(b.host.data(), m.data, b.bytes);
    else
      std::memcpy(m.data, b.host.data(), b.bytes);
  } else if (m.put) {
    write_file(m.id, b, m.data);
  } else {
    read_file(m.id, b, m.data);
  }
}

// The file: the block's bytes, then one CRC-32 (native byte order: the file
// never leaves this process) per 1 MiB piece.
void OffloadStore::write_file(int64_t id, const Block& b, const void* src) const {
  const std::string path = path_of(id);
  std::vector<uint32_t> crcs(pieces(b.bytes));
  const char* p = static_cast<const char*>(src);
  for (size_t i = 0; i < crcs.size(); ++i) crcs[i] = crc32(p + i * kPiece, std::min(kPiece, b.bytes - i * kPiece));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("offload: cannot create spill file '" + path + "': " + std::strerror(errno));
  auto write_all = [&](const char* data, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        throw Error("offload: writing spill file '" + path + "' (" + b.name + ") failed: " + std::strerror(err) +
                    (err == ENOSPC ? " (disk full: free space or point offload_dir elsewhere)" : ""));
      }
      data += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(p, b.bytes);
  write_all(reinterpret_cast<const char*>(crcs.data()), crcs.size() * sizeof(uint32_t));
  ::close(fd);
}

void OffloadStore::read_file(int64_t id, const Block& b, void* dst) const {
  const std::string path = path_of(id);
  const size_t n = pieces(b.bytes), expected = b.bytes + n * sizeof(uint32_t);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("offload: spill file '" + path + "' (" + b.name + ") cannot be opened: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != expected) {
    ::close(fd);
    throw DataError("offload: spill file '" + path + "' (" + b.name + ") is " + std::to_string(st.st_size) +
                    " bytes, expected " + std::to_string(expected) + ": it was truncated or altered");
  }
  std::vector<uint32_t> crcs(n);
  auto read_all = [&](char* data, size_t left) {
    while (left > 0) {
      const ssize_t r = ::read(fd, data, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        ::close(fd);
        throw DataError("offload: short read of spill file '" + path + "' (" + b.name + ")");
      }
      data += r;
      left -= static_cast<size_t>(r);
    }
  };
  char* p = static_cast<char*>(dst);
  read_all(p, b.bytes);
  read_all(reinterpret_cast<char*>(crcs.data()), n * sizeof(uint32_t));
  ::close(fd);
  for (size_t i = 0; i < n; ++i)
    if (crc32(p + i * kPiece, std::min(kPiece, b.bytes - i * kPiece)) != crcs[i])
      throw DataError("offload: spill file '" + path + "' (" + b.name + ") fails its CRC-32 check at bytes [" +
                      std::to_string(i * kPiece) + ", " + std::to_string(std::min((i + 1) * kPiece, b.bytes)) +
                      "): it was altered");
}

}  // namespace longctx
