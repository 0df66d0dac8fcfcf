// Float64 naive references of the model ops: one plain loop per formula,
// written from the definitions (not from the fast code), for tests.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace longctx {

namespace {
double get(const TensorView& t, int64_t r, int64_t c) {
  return t.f32()[r * t.stride[0] + c * t.stride[1]];
}
float& ref(const TensorView& t, int64_t r, int64_t c) {
  return t.f32()[r * t.stride[0] + c * t.stride[1]];
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

void rmsnorm_forward_reference(const TensorView& x, const float* w, double eps,
                               const TensorView& y) {
  const int64_t N = x.dim(0), C = x.dim(1);
  for (int64_t r = 0; r < N; ++r) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += get(x, r, c) * get(x, r, c) / C;
    for (int64_t c = 0; c < C; ++c) ref(y, r, c) = get(x, r, c) / std::sqrt(ms + eps) * w[c];
  }
}

void rmsnorm_backward_reference(const TensorView& x, const float* w, double eps,
                                const TensorView& dy, const TensorView& dx, float* dw) {
  // Chain rule through s = sqrt(mean(x^2) + eps): dy_c/dx_j = w_c (delta_cj / s - x_c x_j / (C s^3)).
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<double> dw_acc(C, 0.0);
  for (int64_t r = 0; r < N; ++r) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += get(x, r, c) * get(x, r, c) / C;
    const double s = std::sqrt(ms + eps);
    for (int64_t j = 0; j < C; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        double jac = w[c] * ((c == j ? 1.0 / s : 0.0) - get(x, r, c) * get(x, r, j) / (C * s * s * s));
        acc += get(dy, r, c) * jac;
      }
      ref(dx, r, j) = static_cast<float>(get(dx, r, j) + acc);
      dw_acc[j] += get(dy, r, j) * get(x, r, j) / s;
    }
  }
  for (int64_t c = 0; c < C; ++c) dw[c] = static_cast<float>(dw[c] + dw_acc[c]);
}

void rope_reference(const RopeParams& p, const TensorView& x, const int64_t* positions,
                    bool inverse) {
  const int64_t N = x.dim(0), H = x.dim(1), D = x.dim(2), half = D / 2;
  const std::vector<double> inv = rope_inv_freq(p, D);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float* v = x.f32() + t * x.stride[0] + h * x.stride[1];
      for (int64_t i = 0; i < half; ++i) {
        double a = static_cast<double>(positions[t]) * inv[i];
        if (inverse) a = -a;
        const double x1 = v[i], x2 = v[i + half];
        v[i] = static_cast<float>(x1 * std::cos(a) - x2 * std::sin(a));
        v[i + half] = static_cast<float>(x2 * std::cos(a) + x1 * std::sin(a));
      }
    }
}

void swiglu_forward_reference(const TensorView& g, const TensorView& u, const TensorView& a) {
  for (int64_t r = 0; r < g.dim(0); ++r)
    for (int64_t f = 0; f < g.dim(1); ++f) {
      const double x = get(g, r, f);
      ref(a, r, f) = static_cast<float>(x * sigmoid(x) * get(u, r, f));
    }
}

void swiglu_backward_reference(const TensorView& g, const TensorView& u, const TensorView& da,
                               const TensorView& dg, const TensorView& du) {
  for (int64_t r = 0; r < g.dim(0); ++r)
    for (int64_t f = 0; f < g.dim(1); ++f) {
      const double x = get(g, r, f), y = get(u, r, f), d = get(da, r, f);
      const double s = sigmoid(x);
      // d silu/dx = s + x s (1 - s)
      ref(dg, r, f) = static_cast<float>(d * y * (s + x * s * (1.0 - s)));
      ref(du, r, f) = static_cast<float>(d * x * s);
    }
}

double cross_entropy_reference(const TensorView& logits, const int32_t* targets,
                               const float* weights, float grad_scale,
                               const TensorView* dlogits) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  double total = 0.0;
  std::vector<double> p(V);
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] < 0 || targets[r] >= V) throw DataError("target id outside the vocabulary");
    double norm = 0.0;
    for (int64_t j = 0; j < V; ++j) norm += std::exp(get(logits, r, j));
    const double w = weights ? weights[r] : 1.0;
    total += w * -std::log(std::exp(get(logits, r, targets[r])) / norm);
    if (dlogits) {
      for (int64_t j = 0; j < V; ++j) p[j] = std::exp(get(logits, r, j)) / norm;
      for (int64_t j = 0; j < V; ++j)
        ref(*dlogits, r, j) =
            static_cast<float>(grad_scale * w * (p[j] - (j == targets[r] ? 1.0 : 0.0)));
    }
  }
  return total;
}

void embedding_backward_reference(const int32_t* tokens, int64_t n, const TensorView& dout,
                                  float* dtable, int64_t vocab) {
  const int64_t C = dout.dim(1);
  std::vector<double> acc(static_cast<size_t>(vocab * C), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) acc[tokens[t] * C + c] += get(dout, t, c);
  for (int64_t i = 0; i < vocab * C; ++i) dtable[i] = static_cast<float>(dtable[i] + acc[i]);
}

void adamw_update_reference(float* param, const float* grad, float* m, float* v, int64_t n,
                            const AdamWParams& h) {
  for (int64_t i = 0; i < n; ++i) {
    const double mi = h.beta1 * static_cast<double>(m[i]) + (1.0 - h.beta1) * grad[i];
    const double vi = h.beta2 * static_cast<double>(v[i]) +
                      (1.0 - h.beta2) * static_cast<double>(grad[i]) * grad[i];
    const double mhat = mi / (1.0 - std::pow(static_cast<double>(h.beta1), h.step));
    const double vhat = vi / (1.0 - std::pow(static_cast<double>(h.beta2), h.step));
    double p = param[i];
    p -= h.lr * h.weight_decay * p;
    p -= h.lr * mhat / (std::sqrt(vhat) + h.eps);
    param[i] = static_cast<float>(p);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
  }
}

}  // namespace longctx
