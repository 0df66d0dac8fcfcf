#pragma once
// AdamW over the model's fp32 master weights (this rank's TP shards), the
// learning-rate schedule, global-norm gradient clipping, and the
// communication around the update: summing the gradients over the parameter
// replicas (all-reduce, or ZeRO-1's reduce-scatter) and gathering the
// updated pieces.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/config.h"
#include "core/memory.h"
#include "core/state_store.h"
#include "core/tensor.h"
#include "model/llama.h"

namespace longctx {

class Mesh;

// Linear warmup to the peak over round(warmup_steps_fraction * steps) steps
// (step 0 already gets peak / warmup), then cosine decay from the peak to
// cosine_learning_rate_final_fraction * peak at `steps`. step is 0-based.
double learning_rate_at(const RunConfig& config, int64_t step);

// The piece of the flat parameter vector (LlamaModel::flat_parameters) that
// replica `rank` of `replicas` owns under shard_optimizer_over_data (ZeRO-1):
// pieces of floor(n / replicas) elements in replica order, the last one also
// takes the n % replicas remainder ("tail"), so every piece is contiguous
// and the first replicas x floor(n / replicas) elements reduce-scatter in
// equal blocks.
struct FlatPiece {
  size_t begin = 0, size = 0;
  size_t block = 0;  // floor(n / replicas): the equal block of the reduce-scatter and all-gather
  size_t tail = 0;   // n % replicas: reduced and gathered separately, owned by the last replica
};
FlatPiece flat_piece(size_t n, int replicas, int rank);

// AdamW keeps two fp32 moments (m, v) per element of its piece.
constexpr int64_t kAdamWMoments = 2;

class AdamW {
 public:
  // Moments m, v (fp32, tracked as optimizer memory), zero, one per element
  // of this rank's piece: all local parameters, or with
  // shard_optimizer_over_data and a mesh with more than one replica, the
  // piece flat_piece(n, replicas().size(), replicas().rank()).
  AdamW(const LlamaModel& model, const RunConfig& config, const Mesh& mesh);

  // Sums the gradients and loss_sums over mesh.replicas(): all-reduced, or
  // when sharded (ZeRO-1) each replica receives only its piece of the sum
  // (the equal blocks by reduce-scatter, the last piece's tail by
  // all-reduce) through a communication staging buffer that step() reuses.
  void reduce_gradients(LlamaModel& model, double loss_sums[2]);
  // After reduce_gradients: the global L2 norm of the gradients, which the
  // trainer checks for NaN/Inf before anything is updated. Every TP shard
  // counted once (sums of squares all-reduced over tp), replicated tensors
  // (TpSplit::none) counted on tp rank 0 only, dp/cp replicas once (summed
  // from the pieces when sharded; equal, already reduced gradients otherwise).
  double gradient_norm(const LlamaModel& model) const;
  // Clipping to gradient_clipping_threshold by that norm, the update with
  // learning rate `lr`, and when sharded the all-gather of the updated
  // pieces to every replica.
  void step(LlamaModel& model, double lr, double gradient_norm);

  // One update of this rank's piece with this learning rate, from the
  // gradients at the same flat offsets; increments step(). Weight decay is
  // applied to matrices only (rank-2 parameters), not to norm weights.
  // No communication: step() is the whole step.
  void update(LlamaModel& model, double lr);

  int64_t step() const { return step_; }  // updates done
  void set_step(int64_t step) { step_ = step; }
  bool sharded() const { return sharded_; }
  const FlatPiece& piece() const { return piece_; }
  // Flat moments of this rank's piece: element i belongs to element
  // piece().begin + i of the parameter shard. Device memory, or with
  // optimizer_memory_host_offload the state_offload_target (host or disk),
  // chunked by state_chunks over the piece.
  StateStore& exp_avg() const { return *m_; }
  StateStore& exp_avg_sq() const { return *v_; }

 private:
  // Where a parameter tensor overlaps the piece.
  struct Segment {
    size_t begin, size;  // in the piece
    size_t param;        // index into LlamaModel::parameters()
  };
  void gather_pieces(LlamaModel& model);

  const Mesh& mesh_;
  double b1_, b2_, eps_, weight_decay_, clip_;
  int64_t step_ = 0;
  bool sharded_ = false;
  FlatPiece piece_;
  std::vector<Segment> segments_;
  std::unique_ptr<StateStore> m_, v_;  // [piece_.size] each
  // ZeRO-1: "zero1 gradient/parameter piece", [piece_.block], from
  // reduce_gradients to the end of step().
  Buffer staging_;
};

}  // namespace longctx
