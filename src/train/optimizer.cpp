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

double global_gradient_norm(const std::vector<NamedTensor>& gradients, const Mesh* mesh) {
  const int tp_rank = mesh ? mesh->tp_rank() : 0;
  double sum_sq = 0.0;
  for (const NamedTensor& g : gradients) {
    // A replicated tensor is identical on every tp rank: count it on one.
    if (g.split == TpSplit::none && tp_rank != 0) continue;
    const float* p = g.local.f32();
    const int64_t n = g.local.numel();
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * p[i];
    sum_sq += s;
  }
  if (mesh && mesh->shape().tp > 1) mesh->tp().all_reduce_sum(&sum_sq, 1);
  return std::sqrt(sum_sq);
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

FlatPiece piece_for(const LlamaModel& model, const RunConfig& c, const Mesh* mesh, bool& sharded) {
  const size_t n = model.flat_parameters().size();
  sharded = c.shard_optimizer_over_data && mesh && mesh->replicas().size() > 1;
  if (!sharded) return flat_piece(n, 1, 0);
  const int R = mesh->replicas().size();
  if (n < static_cast<size_t>(R))
    throw ConfigError("shard_optimizer_over_data: " + std::to_string(n) + " parameters cannot be split over " +
                      std::to_string(R) + " replicas");
  return flat_piece(n, R, mesh->replicas().rank());
}

}  // namespace

AdamW::AdamW(const LlamaModel& model, const RunConfig& c, const Mesh* mesh)
    : b1_(c.adam_b1), b2_(c.adam_b2), eps_(c.adam_eps), weight_decay_(c.adam_weight_decay),
      piece_(piece_for(model, c, mesh, sharded_)),
      m_(MemCategory::optimizer, "adamw.exp_avg", piece_.size * sizeof(float)),
      v_(MemCategory::optimizer, "adamw.exp_avg_sq", piece_.size * sizeof(float)) {
  const float* flat = model.flat_parameters().data();
  const auto& params = model.parameters();
  const size_t lo = piece_.begin, hi = piece_.begin + piece_.size;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t b = static_cast<size_t>(params[i].local.f32() - flat);
    const size_t e = b + static_cast<size_t>(params[i].local.numel());
    const size_t from = std::max(b, lo), to = std::min(e, hi);
    if (from < to) segments_.push_back({from - lo, to - from, i});
  }
}

double AdamW::piece_gradient_sum_sq(const LlamaModel& model, int tp_rank) const {
  const float* g = model.flat_gradients().data() + piece_.begin;
  double sum_sq = 0.0;
  for (const Segment& s : segments_) {
    // A replicated tensor is identical on every tp rank: count it on one.
    if (model.gradients()[s.param].split == TpSplit::none && tp_rank != 0) continue;
    double t = 0.0;
    for (size_t i = s.begin; i < s.begin + s.size; ++i) t += static_cast<double>(g[i]) * g[i];
    sum_sq += t;
  }
  return sum_sq;
}

void AdamW::scale_piece_gradients(LlamaModel& model, float scale) const {
  float* g = model.flat_gradients().data() + piece_.begin;
  for (size_t i = 0; i < piece_.size; ++i) g[i] *= scale;
}

void AdamW::update(LlamaModel& model, double lr) {
  ++step_;
  float* p = model.flat_parameters().data() + piece_.begin;
  const float* g = model.flat_gradients().data() + piece_.begin;
  const auto& params = model.parameters();
  for (const Segment& s : segments_) {
    AdamWParams h;
    h.lr = static_cast<float>(lr);
    h.beta1 = static_cast<float>(b1_);
    h.beta2 = static_cast<float>(b2_);
    h.eps = static_cast<float>(eps_);
    h.weight_decay = params[s.param].local.rank == 2 ? static_cast<float>(weight_decay_) : 0.0f;
    h.step = step_;
    adamw_update(p + s.begin, g + s.begin, m_.as<float>() + s.begin, v_.as<float>() + s.begin,
                 static_cast<int64_t>(s.size), h);
  }
}

}  // namespace longctx
