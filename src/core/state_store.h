#pragma once
// Where a flat fp32 vector of training state lives for the whole run: the
// FSDP parameter shard and the AdamW moments. Device memory by default;
// parameter_memory_host_offload / optimizer_memory_host_offload move it to
// state_offload_target: the host pool (one Buffer there) or disk (spill
// files of an OffloadStore, checked on every read).
//
// The vector is cut into chunks (state_chunks: the FSDP units' blocks, cut
// again at kStateChunkElements), and whoever changes it walks the chunks in
// order through a pass:
//
//   begin_pass(); for k: v = chunk(k); ...; done(k, modified); end_pass();
//
// On device or host a chunk is a pointer into the vector. On disk the pass
// streams the chunks through two staging slots in device memory (tracked
// as `staging_category`): chunk k + 1 is read while chunk k is worked on and
// chunk k is written back while chunk k + 1 is, by the store's background
// thread. So a disk pass holds at most 2 x the largest chunk on the device.
// Chunks never written read as zeros (a fresh store is all zeros).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/model_shape.h"
#include "core/offload_store.h"
#include "core/vocabulary.h"

namespace longctx {

// The largest chunk (elements): bounds a disk pass's staging (2 slots).
constexpr int64_t kStateChunkElements = int64_t{1} << 22;

struct StateChunk {
  int64_t begin = 0, size = 0;  // in the vector
};

// The chunks of [begin, begin + size) of a shard (shard coordinates, as in
// ParameterUnit::shard_begin), relative to `begin`: cut at every unit's block
// boundary and every kStateChunkElements.
std::vector<StateChunk> state_chunks(const std::vector<ParameterUnit>& units, int64_t begin, int64_t size);
// The elements of the largest of those chunks.
int64_t largest_state_chunk(const std::vector<ParameterUnit>& units, int64_t begin, int64_t size);

class StateStore {
 public:
  // resident_category: the Buffer's category on the device (host tier: the
  // host pool). dir: the spill directory (disk tier only).
  StateStore(StateTier tier, MemCategory resident_category, MemCategory staging_category, std::string name,
             std::vector<StateChunk> chunks, const std::string& dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  StateTier tier() const { return tier_; }
  int64_t size() const { return size_; }
  const std::vector<StateChunk>& chunks() const { return chunks_; }
  // The whole vector (device, host); nullptr on disk.
  float* data() const { return resident_.as<float>(); }

  // A pass over every chunk in order (see above). chunk(k)'s values are
  // valid until done(k); `modified` writes them back (disk).
  void begin_pass();
  float* chunk(size_t k);
  void done(size_t k, bool modified);
  void end_pass();

  // Values [begin, begin + n) into `dst` (a whole number of chunks from a
  // chunk's start): copied now, or on disk queued (wait(ticket) before
  // reading `dst`).
  OffloadStore::Ticket read(int64_t begin, int64_t n, float* dst);
  void wait(OffloadStore::Ticket t);
  // Waits for every queued move, ignoring their errors (error paths, before
  // the buffers they target are freed).
  void settle() noexcept;
  // The whole vector out and in (checkpoints, initialization).
  std::vector<float> read_all();
  void write(int64_t begin, std::span<const float> values);  // whole chunks, as read()

  // The spill file of chunk k (disk), for errors and tests.
  std::string path_of(size_t k) const { return spill_->path_of(static_cast<int64_t>(k)); }

 private:
  size_t first_chunk_at(int64_t begin) const;
  void check_whole_chunks(int64_t begin, int64_t n) const;
  void queue_read(size_t k);

  const StateTier tier_;
  const MemCategory staging_category_;
  const std::string name_;
  const std::vector<StateChunk> chunks_;
  int64_t size_ = 0, largest_ = 0;
  Buffer resident_;                // device, host
  std::vector<bool> stored_;       // disk: chunk k has a spill file
  Buffer slots_[2];                // disk: the pass's staging
  std::vector<OffloadStore::Ticket> reads_;  // disk: chunk k's read in the pass
  // Declared last: destroyed first, so that its thread is done with the
  // slots before they are freed.
  std::unique_ptr<OffloadStore> spill_;
};

}  // namespace longctx
