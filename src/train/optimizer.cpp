#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "comm/mesh.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace longctx {

double learning_rate_at(const RunConfig& c, int64_t step) {
  const double peak = c.learning_rate;
  const int64_t warmup = std::llround(c.warmup_steps_fraction * static_cast<double>(c.steps));
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = std::max<int64_t>(1, c.steps - warmup);
  const double t = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_steps));
  const double final_lr = c.cosine_learning_rate_final_fraction * peak;
  return final_lr + (peak - final_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
}

FlatPiece flat_piece(size_t n, int replicas, int rank) {
  FlatPiece p;
  const size_t R = static_cast<size_t>(std::max(replicas, 1)), r = static_cast<size_t>(rank);
  p.block = n / R;
  p.tail = n % R;
  p.begin = r * p.block;
  p.size = p.block + (r + 1 == R ? p.tail : 0);
  return p;
}

namespace {

FlatPiece piece_for(const LlamaModel& model, const RunConfig& c, const Mesh& mesh, bool& sharded) {
  const size_t n = model.flat_gradients().size();
  sharded = c.shard_optimizer_over_data && mesh.replicas().size() > 1;
  if (!sharded) return flat_piece(n, 1, 0);
  const int R = mesh.replicas().size();
  if (n < static_cast<size_t>(R))
    throw ConfigError("shard_optimizer_over_data: " + std::to_string(n) + " parameters cannot be split over " +
                      std::to_string(R) + " replicas");
  return flat_piece(n, R, mesh.replicas().rank());
}

}  // namespace

AdamW::AdamW(const LlamaModel& model, const RunConfig& c, const Mesh& mesh)
    : mesh_(mesh), b1_(c.adam_b1), b2_(c.adam_b2), eps_(c.adam_eps), weight_decay_(c.adam_weight_decay),
      clip_(c.gradient_clipping_threshold),
      piece_(piece_for(model, c, mesh, sharded_)) {
  const std::vector<StateChunk> chunks =
      state_chunks(parameter_units(model.config(), model.tp(), model.shards()), int64_t(piece_.begin),
                   int64_t(piece_.size));
  m_ = std::make_unique<StateStore>(c.optimizer_tier(), MemCategory::optimizer, MemCategory::optimizer,
                                    "AdamW first moment exp_avg (fp32)", chunks, c.offload_dir);
  v_ = std::make_unique<StateStore>(c.optimizer_tier(), MemCategory::optimizer, MemCategory::optimizer,
                                    "AdamW second moment exp_avg_sq (fp32)", chunks, c.offload_dir);
  // Parameters on disk stream through the same chunks (config: no ZeRO-1 piece then).
  const StateStore& params = model.parameter_store();
  check_shape(params.tier() != StateTier::disk ||
                  (piece_.begin == 0 && int64_t(piece_.size) == params.size() && params.chunks().size() == chunks.size()),
              "AdamW: parameters on disk need the optimizer's piece to be the whole shard");
  const size_t lo = piece_.begin, hi = piece_.begin + piece_.size;
  for (const ShardSegment& s : model.shard_segments()) {
    const size_t b = static_cast<size_t>(s.shard_begin), e = b + static_cast<size_t>(s.size);
    const size_t from = std::max(b, lo), to = std::min(e, hi);
    if (from < to) segments_.push_back({from - lo, to - from, static_cast<size_t>(s.param)});
  }
  // In piece order (the units', then each unit's parameters'): update walks them beside the chunks.
  check_shape(std::is_sorted(segments_.begin(), segments_.end(),
                             [](const Segment& a, const Segment& b) { return a.begin < b.begin; }),
              "AdamW: the shard's segments must run in order");
}

void AdamW::reduce_gradients(LlamaModel& model, double loss_sums[2]) {
  const Communicator& reps = mesh_.replicas();
  std::span<float> grads = model.flat_gradients();
  if (sharded_) {
    staging_ = Buffer(MemCategory::communication, "zero1 gradient/parameter piece", piece_.block * sizeof(float));
    reps.reduce_scatter_sum(grads.data(), staging_.as<float>(), piece_.block);
    copy_f32(staging_.as<float>(), static_cast<int64_t>(piece_.block), grads.data() + piece_.begin);
    if (piece_.tail > 0) reps.all_reduce_sum(grads.data() + grads.size() - piece_.tail, piece_.tail);
  } else if (reps.size() > 1) {
    reps.all_reduce_sum(grads.data(), grads.size());
  }
  // Every slice of the batch: the replicas and, with FSDP, the shard group.
  if (mesh_.data().size() > 1) mesh_.data().all_reduce_sum(loss_sums, 2);
}

double AdamW::gradient_norm(const LlamaModel& model) const {
  const float* g = model.flat_gradients().data() + piece_.begin;
  const int tp_rank = mesh_.tp_rank();
  double sum_sq = 0.0;
  for (const Segment& s : segments_) {
    // A replicated tensor is identical on every tp rank: count it on one.
    if (model.gradients()[s.param].split == TpSplit::none && tp_rank != 0) continue;
    sum_sq += sum_of_squares(g + s.begin, static_cast<int64_t>(s.size));
  }
  if (sharded_) mesh_.replicas().all_reduce_sum(&sum_sq, 1);
  if (model.shards() > 1) mesh_.shards().all_reduce_sum(&sum_sq, 1);  // FSDP: the other shards
  if (mesh_.shape().tp > 1) mesh_.tp().all_reduce_sum(&sum_sq, 1);
  return std::sqrt(sum_sq);
}

void AdamW::step(LlamaModel& model, double lr, double norm) {
  if (clip_ > 0 && norm > clip_) {
    const float scale = static_cast<float>(clip_ / norm);
    scale_f32(model.flat_gradients().data() + piece_.begin, static_cast<int64_t>(piece_.size), scale);
  }
  update(model, lr);
  if (sharded_) gather_pieces(model);
}

// Every replica gets the full updated parameters back.
void AdamW::gather_pieces(LlamaModel& model) {
  const Communicator& reps = mesh_.replicas();
  std::span<float> params = model.flat_parameters();
  copy_f32(params.data() + piece_.begin, static_cast<int64_t>(piece_.block), staging_.as<float>());
  reps.all_gather(staging_.as<float>(), params.data(), piece_.block * sizeof(float));
  if (piece_.tail > 0) {
    std::vector<float> tails(piece_.tail * static_cast<size_t>(reps.size()));
    float* mine = params.data() + params.size() - piece_.tail;
    reps.all_gather(mine, tails.data(), piece_.tail * sizeof(float));
    copy_f32(tails.data() + (tails.size() - piece_.tail), static_cast<int64_t>(piece_.tail), mine);  // the last replica's
  }
  staging_ = Buffer();
}

// One pass over the moments' chunks (core/state_store.h): on disk, chunk
// k + 1 is read and chunk k - 1 written while chunk k is updated.
void AdamW::update(LlamaModel& model, double lr) {
  ++step_;
  StateStore& params = model.parameter_store();
  const bool stream_params = params.tier() == StateTier::disk;
  const float* g = model.flat_gradients().data() + piece_.begin;
  const auto& tensors = model.parameters();
  std::vector<StateStore*> passes{m_.get(), v_.get()};
  if (stream_params) passes.push_back(&params);
  for (StateStore* s : passes) s->begin_pass();
  const std::vector<StateChunk>& chunks = m_->chunks();
  size_t first = 0;  // the first segment not wholly before chunk k (both run in piece order)
  for (size_t k = 0; k < chunks.size(); ++k) {
    const int64_t lo = chunks[k].begin, hi = lo + chunks[k].size;
    float* p = stream_params ? params.chunk(k) : params.data() + piece_.begin + lo;
    float* m = m_->chunk(k);
    float* v = v_->chunk(k);
    while (first < segments_.size() && int64_t(segments_[first].begin + segments_[first].size) <= lo) ++first;
    for (size_t i = first; i < segments_.size() && int64_t(segments_[i].begin) < hi; ++i) {
      const Segment& s = segments_[i];
      const int64_t from = std::max<int64_t>(lo, int64_t(s.begin)), to = std::min<int64_t>(hi, int64_t(s.begin + s.size));
      if (from >= to) continue;
      AdamWParams h;
      h.lr = static_cast<float>(lr);
      h.beta1 = static_cast<float>(b1_);
      h.beta2 = static_cast<float>(b2_);
      h.eps = static_cast<float>(eps_);
      h.weight_decay = tensors[s.param].local.rank == 2 ? static_cast<float>(weight_decay_) : 0.0f;
      h.step = step_;
      adamw_update(p + (from - lo), g + from, m + (from - lo), v + (from - lo), to - from, h);
    }
    for (StateStore* s : passes) s->done(k, true);
  }
  for (StateStore* s : passes) s->end_pass();
}

}  // namespace longctx
