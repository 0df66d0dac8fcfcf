#pragma once
// Where the model's parameters and gradients live: FSDP (ZeRO-3) over a
// shard group of R ranks (Mesh::shards(): the fsdp ranks, times the cp ranks
// with fsdp_over_context), or all of them here when R = 1.
//
// Each rank keeps its block of every unit (core/model_shape.h,
// parameter_units): the shard, fp32, with the gradients in the same layout.
// The parameter shard is a StateStore (core/state_store.h): device memory,
// or with parameter_memory_host_offload the host pool or disk, from where
// each gather reads this rank's block of the unit.
// The model uses a unit's weights only between gather(u) and release(u):
// gather all-gathers the blocks into a full fp32 copy of the unit (and, for
// bf16 compute, rounds a bf16 copy of it); prefetch(u) posts the next
// unit's all-gather on a helper thread so that it arrives while the current
// unit computes. Gradients of a unit accumulate between begin_gradients(u)
// and reduce_gradients(u) into a full zeroed copy, which the reduce-scatter
// then adds into this rank's block. Every copy is a tracked Buffer that
// exists only while its unit is in use; gathered_peak_bytes() says how much
// that is at the peak, for the schedule the model follows (llama.cpp run()):
//   forward:  embedding, layer 0 .. L-1, head (+ embedding when tied)
//   backward: head (+ embedding when tied) with gradients, layer L-1 .. 0
//             with gradients, then the embedding's gradients (no weights)
// with the next use's weights prefetched during each use.
//
// With R = 1 nothing is copied: the views point into the shard (which is the
// whole flat vector), gather/release do nothing, and the bf16 compute copy
// covers the whole model, refreshed by refresh_compute_copy() at each
// forward (as before FSDP existed).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/model_shape.h"
#include "core/state_store.h"
#include "core/tensor.h"

namespace longctx {

// Bytes of the compute copy of `parameters` fp32 master weights: a bf16 copy
// for dtype bf16, none for fp32 (the unsharded model's, refreshed at each forward).
int64_t compute_weight_copy_bytes(int64_t parameters, DType dtype);

// Bytes of gathered copies (fp32 weights, their bf16 copy, fp32 gradients)
// alive at once at the peak of one training step (training) or forward
// (evaluation), by memory category: [0] parameters, [1] gradients. Zero for R = 1.
std::array<int64_t, 2> gathered_peak_bytes(const LlamaConfig& config, int64_t tp, int64_t shards, DType compute,
                                           bool training);

// One contiguous piece of a parameter inside this rank's shard.
struct ShardSegment {
  int64_t shard_begin = 0, size = 0;
  int param = 0;  // index in parameter_table order
};

class ShardedParameters {
 public:
  // Allocates the shard's parameters and gradients (tracked); zero.
  // parameter_tier host or disk (spill files in `dir`) needs R > 1: the
  // model then only reads gathered copies, which are device memory.
  ShardedParameters(const LlamaConfig& config, int64_t tp, const Communicator& shards, DType compute,
                    StateTier parameter_tier = StateTier::device, const std::string& dir = "");
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  int64_t shards() const { return R_; }
  const std::vector<ParameterUnit>& units() const { return units_; }
  int unit_of(int param) const { return unit_of_[static_cast<size_t>(param)]; }
  // This rank's shard of the parameters (padding included; chunked by
  // state_chunks over the whole shard) and of the gradients.
  StateStore& param_store() const { return *param_shard_; }
  std::span<float> grads() const { return {grad_shard_.as<float>(), static_cast<size_t>(shard_elements_)}; }
  // Where each parameter's elements lie in this rank's shard (padding excluded).
  std::vector<ShardSegment> segments() const;

  // ---- the model's uses of a unit (no-ops for R = 1, except as said)
  void prefetch(int unit);  // posts the all-gather; at most one in flight
  void gather(int unit);    // the unit's weights are usable (waits for its prefetch)
  void release(int unit);
  void begin_gradients(int unit);
  void reduce_gradients(int unit);
  // Drops every copy and abandons a prefetch in flight (after an error, so
  // that the next step starts clean).
  void reset();
  // R = 1, bf16 compute: rounds the whole compute copy from the masters.
  void refresh_compute_copy();

  // While the unit of `param` is gathered: its fp32 master weights, its
  // weights in the compute dtype (bf16 copy or the master) and, between
  // begin_gradients and reduce_gradients, its gradient (R = 1: always).
  float* param(int param) const;
  const void* weight(int param) const;
  float* grad(int param) const;

  // Checkpoints: a vector in shard layout (parameters, gradients, moments)
  // to the tp rank's flat vector (collective over the shard group), and back.
  std::vector<float> unshard(std::span<const float> shard) const;
  void reshard(std::span<const float> flat, std::span<float> shard) const;
  // Copies this rank's block of unit u's full values (unit order) into
  // `shard`, or into the parameter store.
  void keep_block(int u, const float* unit_values, std::span<float> shard) const;
  void keep_block(int u, const float* unit_values);

 private:
  struct Resident;  // a unit's gathered copies
  int64_t offset_in_unit(int param) const { return offsets_[static_cast<size_t>(param)]; }
  void finish_prefetch();
  void copy_block(int unit, const float* unit_values, float* block) const;

  const Communicator& comm_;
  Communicator gathers_;  // comm_'s ranks, for the all-gathers only (prefetch)
  const int64_t R_;
  const int rank_;
  const DType compute_;
  std::vector<ParameterUnit> units_;
  std::vector<int> unit_of_;
  std::vector<int64_t> offsets_;  // each parameter's offset in its unit
  int64_t shard_elements_ = 0;
  std::unique_ptr<StateStore> param_shard_;
  Buffer grad_shard_;
  Buffer compute_copy_;  // R = 1, bf16: the whole model's bf16 copy
  std::vector<std::unique_ptr<Resident>> resident_;  // per unit, null when not in use
  int prefetching_ = -1;                             // the unit whose all-gather is in flight
  int meta_prefetched_ = -1;                         // counted: the unit prefetch() allocated, not yet gathered
  std::unique_ptr<CommWorker> worker_;
};

}  // namespace longctx
