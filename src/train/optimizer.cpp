#include "train/optimizer.h"

#include <cmath>
#include <numbers>

#include "comm/mesh.h"
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

AdamW::AdamW(const LlamaModel& model, const RunConfig& c)
    : b1_(c.adam_b1), b2_(c.adam_b2), eps_(c.adam_eps), weight_decay_(c.adam_weight_decay),
      count_(model.flat_parameters().size()),
      m_(MemCategory::optimizer, "adamw.exp_avg", count_ * sizeof(float)),
      v_(MemCategory::optimizer, "adamw.exp_avg_sq", count_ * sizeof(float)) {}

void AdamW::update(LlamaModel& model, double lr) {
  ++step_;
  const float* flat = model.flat_parameters().data();
  const auto& params = model.parameters();
  const auto& grads = model.gradients();
  for (size_t i = 0; i < params.size(); ++i) {
    float* p = params[i].local.f32();
    const size_t offset = static_cast<size_t>(p - flat);  // same offset in m and v
    AdamWParams h;
    h.lr = static_cast<float>(lr);
    h.beta1 = static_cast<float>(b1_);
    h.beta2 = static_cast<float>(b2_);
    h.eps = static_cast<float>(eps_);
    h.weight_decay = params[i].local.rank == 2 ? static_cast<float>(weight_decay_) : 0.0f;
    h.step = step_;
    adamw_update(p, grads[i].local.f32(), m_.as<float>() + offset, v_.as<float>() + offset,
                 params[i].local.numel(), h);
  }
}

}  // namespace longctx
