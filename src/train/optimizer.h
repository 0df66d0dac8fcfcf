#pragma once
// AdamW over the model's fp32 master weights (this rank's TP shards), the
// learning-rate schedule, and global-norm gradient clipping.
#include <cstdint>
#include <span>
#include <vector>

#include "core/config.h"
#include "core/tensor.h"
#include "model/llama.h"

namespace longctx {

class Mesh;

// Linear warmup to the peak over round(warmup_steps_fraction * steps) steps
// (step 0 already gets peak / warmup), then cosine decay from the peak to
// cosine_learning_rate_final_fraction * peak at `steps`. step is 0-based.
double learning_rate_at(const RunConfig& config, int64_t step);

// The global L2 norm of the gradients over the whole model: every TP shard
// counted once (sum of squares all-reduced over tp), replicated tensors
// (TpSplit::none) counted once, dp/cp replicas not at all (they hold equal,
// already reduced gradients). mesh == nullptr: one rank.
double global_gradient_norm(const std::vector<NamedTensor>& gradients, const Mesh* mesh);

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
  AdamW(const LlamaModel& model, const RunConfig& config, const Mesh* mesh = nullptr);

  // One update of this rank's piece with this learning rate, from the
  // gradients at the same flat offsets; increments step(). Weight decay is
  // applied to matrices only (rank-2 parameters), not to norm weights.
  void update(LlamaModel& model, double lr);

  // Sum of squared gradients over this rank's piece, each parameter counted
  // as global_gradient_norm counts it (replicated tensors on tp rank 0 only).
  double piece_gradient_sum_sq(const LlamaModel& model, int tp_rank) const;
  // Multiplies the gradients of this rank's piece by `scale`.
  void scale_piece_gradients(LlamaModel& model, float scale) const;

  int64_t step() const { return step_; }  // updates done
  void set_step(int64_t step) { step_ = step; }
  bool sharded() const { return sharded_; }
  const FlatPiece& piece() const { return piece_; }
  // Flat moments of this rank's piece: element i belongs to
  // flat_parameters()[piece().begin + i].
  std::span<float> exp_avg() const { return {m_.as<float>(), piece_.size}; }
  std::span<float> exp_avg_sq() const { return {v_.as<float>(), piece_.size}; }

 private:
  // Where a parameter tensor overlaps the piece.
  struct Segment {
    size_t begin, size;  // in the piece
    size_t param;        // index into LlamaModel::parameters()
  };
  double b1_, b2_, eps_, weight_decay_;
  int64_t step_ = 0;
  bool sharded_ = false;
  FlatPiece piece_;
  std::vector<Segment> segments_;
  Buffer m_, v_;  // [piece_.size] each
};

}  // namespace longctx
