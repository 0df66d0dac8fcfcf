#pragma once
// Storage outside device memory for offloaded saved activations
// (src/model/offload.h schedules the moves): numbered blocks of bytes, copied
// in and out by one background thread so that the moves overlap compute.
//
//   host: each block is a Buffer in the host pool (MemCategory::host_offload,
//         host_memory_budget). On this CPU backend device and host are both
//         RAM, so a move is a memcpy; a GPU backend puts pinned host memory
//         and asynchronous device<->host copies behind the same calls.
//   disk: each block is a spill file in `dir`, written with a CRC-32 per
//         1 MiB piece after the data; a read checks the file's size and every
//         CRC (DataError naming the file, never silent garbage). Files are
//         removed when the store is destroyed; spill files of processes that
//         no longer run (a crashed run) are removed when a store opens `dir`.
//
// On a meta device (core/device.h: the planner's counted step) a store
// moves and holds nothing: its tiers are not device memory, and the planner
// sizes them apart (src/model/offload.h, core/state_store.h).
//
// Moves run in the order they were queued (a get after a put of the same
// block sees its bytes). The caller keeps a put's source unchanged and does
// not read a get's destination until wait() on its ticket returns.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "core/memory.h"
#include "core/vocabulary.h"

namespace longctx {

class OffloadStore {
 public:
  using Ticket = uint64_t;

  // disk: creates `dir` and removes stale spill files in it (ConfigError when
  // it cannot be created). host: `dir` is unused.
  OffloadStore(OffloadTarget target, const std::string& dir);
  ~OffloadStore();  // waits for queued moves, removes this store's spill files
  OffloadStore(const OffloadStore&) = delete;
  OffloadStore& operator=(const OffloadStore&) = delete;

  OffloadTarget target() const { return target_; }
  // Queues a copy of `bytes` bytes from `src` into block `id` (host: its
  // buffer is allocated here on first use, OutOfMemoryError over
  // host_memory_budget). `name` names the block in errors.
  Ticket put(int64_t id, const std::string& name, const void* src, size_t bytes);
  // Queues a copy of block `id` (put before) into `dst`.
  Ticket get(int64_t id, void* dst);
  // Blocks until the move and every move queued before it are done;
  // rethrows the first error of the background thread (DataError for a bad
  // spill file, Error for a failed write).
  void wait(Ticket t);
  void wait_all() { wait(queued_); }

  // The spill file of block `id` (disk), for errors and tests.
  std::string path_of(int64_t id) const;
  // Test hook: called on the caller's thread in wait() for each disk put
  // that completed, with the file's path (to corrupt it between forward
  // and backward). Empty = none.
  static void set_after_write_hook(std::function<void(const std::string& path)> hook);

 private:
  struct Block {
    std::string name;
    size_t bytes = 0;
    Buffer host;  // host tier
  };
  struct Move {
    Ticket ticket;
    bool put;
    Block* block;
    int64_t id;
    void* data;
  };
  void run();
  void execute(const Move& m);
  void write_file(int64_t id, const Block& b, const void* src) const;
  void read_file(int64_t id, const Block& b, void* dst) const;

  OffloadTarget target_;
  std::string dir_;
  bool meta_;  // made on a meta device
  long number_ = 0;  // among this process's stores: in spill file names
  std::map<int64_t, Block> blocks_;  // touched by the caller's thread only, before queueing
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Move> queue_;
  std::deque<std::string> written_;  // disk puts done, for the test hook
  Ticket queued_ = 0, done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace longctx
