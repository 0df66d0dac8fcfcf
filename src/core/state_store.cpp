#include "core/state_store.h"

#include <algorithm>
#include <cstring>

#include "core/device.h"
#include "core/error.h"

namespace longctx {

std::vector<StateChunk> state_chunks(const std::vector<ParameterUnit>& units, int64_t begin, int64_t size) {
  std::vector<StateChunk> out;
  const int64_t end = begin + size;
  for (const ParameterUnit& unit : units) {
    const int64_t lo = std::max(begin, unit.shard_begin), hi = std::min(end, unit.shard_begin + unit.block);
    for (int64_t b = lo; b < hi; b += kStateChunkElements)
      out.push_back({b - begin, std::min(kStateChunkElements, hi - b)});
  }
  return out;
}

int64_t largest_state_chunk(const std::vector<ParameterUnit>& units, int64_t begin, int64_t size) {
  int64_t largest = 0;
  for (const StateChunk& c : state_chunks(units, begin, size)) largest = std::max(largest, c.size);
  return largest;
}

StateStore::StateStore(StateTier tier, MemCategory resident_category, MemCategory staging_category, std::string name,
                       std::vector<StateChunk> chunks, const std::string& dir)
    : tier_(tier), staging_category_(staging_category), name_(std::move(name)), chunks_(std::move(chunks)) {
  for (const StateChunk& c : chunks_) {
    check_shape(c.begin == size_, "state store '" + name_ + "': chunks must tile the vector in order");
    size_ += c.size;
    largest_ = std::max(largest_, c.size);
  }
  if (tier_ == StateTier::disk) {
    stored_.assign(chunks_.size(), false);
    spill_ = std::make_unique<OffloadStore>(OffloadTarget::disk, dir);
  } else {
    resident_ = Buffer(tier_ == StateTier::host ? MemCategory::host_offload : resident_category, name_,
                       static_cast<size_t>(size_) * 4);
  }
}

StateStore::~StateStore() = default;

void StateStore::queue_read(size_t k) {
  float* slot = slots_[k % 2].as<float>();
  if (stored_[k]) {
    reads_[k] = spill_->get(static_cast<int64_t>(k), slot);
  } else {
    // Queued behind the write of chunk k - 2 from the same slot: wait for it
    // before zeroing (rare: only before a chunk's first write).
    spill_->wait_all();
    if (!is_meta(slot)) std::fill_n(slot, chunks_[k].size, 0.0f);
    reads_[k] = 0;
  }
}

void StateStore::begin_pass() {
  if (tier_ != StateTier::disk) return;
  spill_->wait_all();  // a pass an error cut short may have moves queued
  for (Buffer& s : slots_)
    if (!s.data()) s = Buffer(staging_category_, name_ + " (disk staging)", static_cast<size_t>(largest_) * 4);
  reads_.assign(chunks_.size(), 0);
  for (size_t k = 0; k < std::min<size_t>(2, chunks_.size()); ++k) queue_read(k);
}

float* StateStore::chunk(size_t k) {
  if (tier_ != StateTier::disk) return data() + chunks_[k].begin;
  if (reads_[k]) spill_->wait(reads_[k]);
  return slots_[k % 2].as<float>();
}

void StateStore::done(size_t k, bool modified) {
  if (tier_ != StateTier::disk) return;
  if (modified) {
    spill_->put(static_cast<int64_t>(k), name_ + " chunk " + std::to_string(k), slots_[k % 2].data(),
                static_cast<size_t>(chunks_[k].size) * 4);
    stored_[k] = true;
  }
  // Queued after the write, which reads the slot first.
  if (k + 2 < chunks_.size()) queue_read(k + 2);
}

void StateStore::end_pass() {
  if (tier_ != StateTier::disk) return;
  spill_->wait_all();
  for (Buffer& s : slots_) s = Buffer();
}

size_t StateStore::first_chunk_at(int64_t begin) const {
  const auto it = std::lower_bound(chunks_.begin(), chunks_.end(), begin,
                                   [](const StateChunk& c, int64_t b) { return c.begin < b; });
  check_shape(it != chunks_.end() && it->begin == begin,
              "state store '" + name_ + "': a read or write must start at a chunk");
  return static_cast<size_t>(it - chunks_.begin());
}

void StateStore::check_whole_chunks(int64_t begin, int64_t n) const {
  const size_t k = first_chunk_at(begin);
  int64_t end = begin;
  for (size_t j = k; j < chunks_.size() && end < begin + n; ++j) end += chunks_[j].size;
  check_shape(end == begin + n, "state store '" + name_ + "': a read or write must cover whole chunks");
}

OffloadStore::Ticket StateStore::read(int64_t begin, int64_t n, float* dst) {
  if (n == 0) return 0;
  check_whole_chunks(begin, n);
  if (tier_ != StateTier::disk) {
    if (!is_meta(dst)) std::copy_n(data() + begin, n, dst);  // a meta device's: counted, never read
    return 0;
  }
  OffloadStore::Ticket last = 0;
  for (size_t k = first_chunk_at(begin); n > 0; ++k) {
    const StateChunk& c = chunks_[k];
    float* to = dst + (c.begin - begin);
    if (stored_[k])
      last = spill_->get(static_cast<int64_t>(k), to);
    else if (!is_meta(to))
      std::fill_n(to, c.size, 0.0f);
    n -= c.size;
  }
  return last;
}

void StateStore::wait(OffloadStore::Ticket t) {
  if (t) spill_->wait(t);
}

void StateStore::settle() noexcept {
  if (!spill_) return;
  try {
    spill_->wait_all();
  } catch (...) {
    // Reported by the wait that failed first; the store's later waits rethrow it.
  }
}

std::vector<float> StateStore::read_all() {
  std::vector<float> out(static_cast<size_t>(size_));
  wait(read(0, size_, out.data()));
  return out;
}

void StateStore::write(int64_t begin, std::span<const float> values) {
  int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return;
  check_whole_chunks(begin, n);
  if (tier_ != StateTier::disk) {
    if (!is_meta(data())) std::copy_n(values.data(), n, data() + begin);
    return;
  }
  for (size_t k = first_chunk_at(begin); n > 0; ++k) {
    const StateChunk& c = chunks_[k];
    spill_->put(static_cast<int64_t>(k), name_ + " chunk " + std::to_string(k), values.data() + (c.begin - begin),
                static_cast<size_t>(c.size) * 4);
    stored_[k] = true;
    n -= c.size;
  }
  spill_->wait_all();  // the caller may free `values`
}

}  // namespace longctx
