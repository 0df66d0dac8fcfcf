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

class AdamW {
 public:
  // Moments m, v (fp32, tracked as optimizer memory), zero, one per local parameter element.
  AdamW(const LlamaModel& model, const RunConfig& config);

  // One update with this learning rate; increments step(). Weight decay is
  // applied to matrices only (rank-2 parameters), not to norm weights.
  void update(LlamaModel& model, double lr);

  int64_t step() const { return step_; }  // updates done
  void set_step(int64_t step) { step_ = step; }
  // Flat moments, same layout as LlamaModel::flat_parameters().
  std::span<float> exp_avg() const { return {m_.as<float>(), count_}; }
  std::span<float> exp_avg_sq() const { return {v_.as<float>(), count_}; }

 private:
  double b1_, b2_, eps_, weight_decay_;
  int64_t step_ = 0;
  size_t count_;
  Buffer m_, v_;  // [count_] each
};

}  // namespace longctx
