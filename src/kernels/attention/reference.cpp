// Float64 naive attention: the independent reference every fast path and
// every context-parallel strategy is tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/simd/convert.h"

namespace longctx {

namespace {

struct Dims {
  int64_t B, Sq, Skv, H, G, D, group;
  double scale;
};

Dims check_args(const AttentionArgs& a) {
  check_shape(a.q.rank == 4 && a.k.rank == 4 && a.v.rank == 4, "attention: q, k, v must be rank 4");
  Dims d{a.q.dim(0), a.q.dim(1), a.k.dim(1), a.q.dim(2), a.k.dim(2), a.q.dim(3), 1, 0.0};
  check_shape(a.k.dim(0) == d.B && a.v.dim(0) == d.B, "attention: batch sizes differ");
  check_shape(a.v.dim(1) == d.Skv && a.v.dim(2) == d.G, "attention: k and v shapes differ");
  check_shape(a.k.dim(3) == d.D && a.v.dim(3) == d.D, "attention: head dims differ");
  check_shape(d.G > 0 && d.H % d.G == 0,
              "attention: query heads (" + std::to_string(d.H) +
                  ") must be a multiple of kv heads (" + std::to_string(d.G) + ")");
  check_shape(a.q_pos && a.kv_pos, "attention: positions are required");
  check_shape(!a.mask.same_segment || (a.q_seg && a.kv_seg),
              "attention: mask needs segment ids but none were given");
  d.group = d.H / d.G;
  d.scale = a.scale != 0.0f ? a.scale : 1.0 / std::sqrt(static_cast<double>(d.D));
  return d;
}

bool pair_allowed(const AttentionArgs& a, int64_t b, int64_t i, int64_t j, const Dims& d) {
  int64_t qp = a.q_pos[b * d.Sq + i], kp = a.kv_pos[b * d.Skv + j];
  if (a.mask.same_segment && a.q_seg[b * d.Sq + i] != a.kv_seg[b * d.Skv + j]) return false;
  return a.mask.allows(qp, kp);
}

// A contiguous fp32 copy of a [B, S, heads, D] view of either dtype (bf16
// widened exactly): the reference reads every input through one, so it sees
// exactly the values the fast kernel is given.
struct Widened {
  std::vector<float> data;
  TensorView view;
  explicit Widened(const TensorView& t) : data(t.numel()) {
    check_shape(t.rank == 4, "attention: inputs must be rank 4");
    view = TensorView(data.data(), DType::f32, {t.dim(0), t.dim(1), t.dim(2), t.dim(3)});
    for (int64_t b = 0; b < t.dim(0); ++b)
      for (int64_t s = 0; s < t.dim(1); ++s)
        for (int64_t h = 0; h < t.dim(2); ++h)
          load_f32(element_ptr(t, {b, s, h}), t.dtype, view.at<float>({b, s, h}), t.dim(3));
  }
};

// The same args reading the widened q, k, v.
AttentionArgs widened_args(const AttentionArgs& a, const Widened& q, const Widened& k, const Widened& v) {
  AttentionArgs w = a;
  w.q = q.view;
  w.k = k.view;
  w.v = v.view;
  return w;
}

}  // namespace

int64_t attention_unmasked_pairs(const AttentionArgs& a) {
  Dims d = check_args(a);
  int64_t pairs = 0;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t i = 0; i < d.Sq; ++i)
      for (int64_t j = 0; j < d.Skv; ++j) pairs += pair_allowed(a, b, i, j, d);
  return pairs * d.H;
}

void attention_forward_reference(const AttentionArgs& args, const TensorView& o, float* lse) {
  Dims d = check_args(args);
  const Widened wq(args.q), wk(args.k), wv(args.v);
  const AttentionArgs a = widened_args(args, wq, wk, wv);
  std::vector<double> s(d.Skv), acc(d.D);
  std::vector<float> out(d.D);  // one output row, stored in o's dtype
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) {
        const float* qi = a.q.at<float>({b, i, h});
        double mx = -INFINITY;
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (!pair_allowed(a, b, i, j, d)) {
            s[j] = -INFINITY;
            continue;
          }
          const float* kj = a.k.at<float>({b, j, h / d.group});
          double dot = 0;
          for (int64_t x = 0; x < d.D; ++x) dot += static_cast<double>(qi[x]) * kj[x];
          s[j] = dot * d.scale;
          mx = std::max(mx, s[j]);
        }
        char* oi = element_ptr(o, {b, i, h});
        float* l = lse + (b * d.Sq + i) * d.H + h;
        if (mx == -INFINITY) {
          std::fill(out.begin(), out.end(), 0.0f);
          store_f32(out.data(), oi, o.dtype, d.D);
          *l = kNegInf;
          continue;
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (s[j] == -INFINITY) continue;
          double p = std::exp(s[j] - mx);
          sum += p;
          const float* vj = a.v.at<float>({b, j, h / d.group});
          for (int64_t x = 0; x < d.D; ++x) acc[x] += p * vj[x];
        }
        for (int64_t x = 0; x < d.D; ++x) out[x] = static_cast<float>(acc[x] / sum);
        store_f32(out.data(), oi, o.dtype, d.D);
        *l = static_cast<float>(mx + std::log(sum));
      }
}

namespace {

// Every allowed (q row i of head h, kv row j) pair of a row whose LSE is
// finite, in (b, h, i, j) order, with P = exp(S - lse) and
// dS = P (dO V^T - delta) in float64: f(b, h, i, g, j, qi, kj, vj, doi, p, ds).
template <class F>
void for_each_backward_pair(const AttentionArgs& a, const Dims& d, const TensorView& dout, const float* lse,
                            const float* delta, F f) {
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) {
        double l = lse[(b * d.Sq + i) * d.H + h];
        if (std::isinf(l)) continue;  // fully masked row: no gradient
        double dl = delta[(b * d.Sq + i) * d.H + h];
        const float* qi = a.q.at<float>({b, i, h});
        const float* doi = dout.at<float>({b, i, h});
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (!pair_allowed(a, b, i, j, d)) continue;
          int64_t g = h / d.group;
          const float* kj = a.k.at<float>({b, j, g});
          const float* vj = a.v.at<float>({b, j, g});
          double dot = 0, dp = 0;
          for (int64_t x = 0; x < d.D; ++x) {
            dot += static_cast<double>(qi[x]) * kj[x];
            dp += static_cast<double>(doi[x]) * vj[x];
          }
          double p = std::exp(dot * d.scale - l);
          f(b, h, i, g, j, qi, kj, vj, doi, p, p * (dp - dl));
        }
      }
}

// Adds (or writes) float64 sums [B, S, heads, D] into an fp32 view of that shape.
void add_to(const std::vector<double>& src, const TensorView& dst, bool accumulate) {
  check_shape(dst.dtype == DType::f32 && dst.numel() == int64_t(src.size()),
              "attention: gradient outputs must be fp32 views of the shapes of q and k");
  for (int64_t b = 0; b < dst.dim(0); ++b)
    for (int64_t s = 0; s < dst.dim(1); ++s)
      for (int64_t h = 0; h < dst.dim(2); ++h) {
        const double* from = src.data() + ((b * dst.dim(1) + s) * dst.dim(2) + h) * dst.dim(3);
        float* to = dst.at<float>({b, s, h});
        for (int64_t x = 0; x < dst.dim(3); ++x)
          to[x] = accumulate ? to[x] + static_cast<float>(from[x]) : static_cast<float>(from[x]);
      }
}

}  // namespace

void attention_backward_reference(const AttentionArgs& args, const TensorView& dout_in,
                                  const float* lse, const float* delta, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv) {
  Dims d = check_args(args);
  const Widened wq(args.q), wk(args.k), wv(args.v), wdout(dout_in);
  const AttentionArgs a = widened_args(args, wq, wk, wv);
  // dQ, dK, dV sum in float64, added to the caller's fp32 buffers once at the end.
  std::vector<double> dq_sum(d.B * d.Sq * d.H * d.D, 0.0);
  std::vector<double> dk_sum(d.B * d.Skv * d.G * d.D, 0.0), dv_sum(dk_sum.size(), 0.0);
  for_each_backward_pair(a, d, wdout.view, lse, delta,
                         [&](int64_t b, int64_t h, int64_t i, int64_t g, int64_t j, const float* qi, const float* kj,
                             const float*, const float* doi, double p, double ds) {
                           double* dqi = dq_sum.data() + ((b * d.Sq + i) * d.H + h) * d.D;
                           double* dkj = dk_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
                           double* dvj = dv_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
                           for (int64_t x = 0; x < d.D; ++x) {
                             dqi[x] += ds * d.scale * kj[x];
                             dkj[x] += ds * d.scale * qi[x];
                             dvj[x] += p * doi[x];
                           }
                         });
  add_to(dq_sum, dq, true);
  add_to(dk_sum, dk, true);
  add_to(dv_sum, dv, true);
}

void attention_abs_terms_reference(const AttentionArgs& args, const TensorView& dout_in, const float* lse,
                                   const float* delta, const TensorView& o_abs, const TensorView& dq_abs,
                                   const TensorView& dk_abs, const TensorView& dv_abs) {
  Dims d = check_args(args);
  const Widened wq(args.q), wk(args.k), wv(args.v), wdout(dout_in);
  const AttentionArgs a = widened_args(args, wq, wk, wv);
  std::vector<double> o(d.B * d.Sq * d.H * d.D, 0.0), dq(o.size(), 0.0);
  std::vector<double> dk(d.B * d.Skv * d.G * d.D, 0.0), dv(dk.size(), 0.0);
  for_each_backward_pair(a, d, wdout.view, lse, delta,
                         [&](int64_t b, int64_t h, int64_t i, int64_t g, int64_t j, const float* qi, const float* kj,
                             const float* vj, const float* doi, double p, double ds) {
                           const double abs_ds = std::abs(ds) * d.scale;
                           double* oi = o.data() + ((b * d.Sq + i) * d.H + h) * d.D;
                           double* dqi = dq.data() + ((b * d.Sq + i) * d.H + h) * d.D;
                           double* dkj = dk.data() + ((b * d.Skv + j) * d.G + g) * d.D;
                           double* dvj = dv.data() + ((b * d.Skv + j) * d.G + g) * d.D;
                           for (int64_t x = 0; x < d.D; ++x) {
                             oi[x] += p * std::abs(vj[x]);
                             dqi[x] += abs_ds * std::abs(kj[x]);
                             dkj[x] += abs_ds * std::abs(qi[x]);
                             dvj[x] += p * std::abs(doi[x]);
                           }
                         });
  add_to(o, o_abs, false);
  add_to(dq, dq_abs, false);
  add_to(dk, dk_abs, false);
  add_to(dv, dv_abs, false);
}

}  // namespace longctx
