// Float64 naive attention: the independent reference every fast path and
// every context-parallel strategy is tested against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/convert.h"

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

void attention_backward_reference(const AttentionArgs& args, const TensorView& dout_in,
                                  const float* lse, const float* delta, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv) {
  Dims d = check_args(args);
  const Widened wq(args.q), wk(args.k), wv(args.v), wdout(dout_in);
  const AttentionArgs a = widened_args(args, wq, wk, wv);
  const TensorView& dout = wdout.view;
  check_shape(dq.dtype == DType::f32 && dk.dtype == DType::f32 && dv.dtype == DType::f32,
              "attention: dq, dk and dv must be fp32");
  std::vector<double> dqi(d.D);
  // dK, dV sum over every q row (and every head of the group): in float64
  // too, added to the caller's fp32 buffers once at the end.
  std::vector<double> dk_sum(d.B * d.Skv * d.G * d.D, 0.0), dv_sum(dk_sum.size(), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) {
        double l = lse[(b * d.Sq + i) * d.H + h];
        if (std::isinf(l)) continue;  // fully masked row: no gradient
        double dl = delta[(b * d.Sq + i) * d.H + h];
        const float* qi = a.q.at<float>({b, i, h});
        const float* doi = dout.at<float>({b, i, h});
        std::fill(dqi.begin(), dqi.end(), 0.0);
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
          double ds = p * (dp - dl);
          double* dkj = dk_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
          double* dvj = dv_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
          for (int64_t x = 0; x < d.D; ++x) {
            dqi[x] += ds * d.scale * kj[x];
            dkj[x] += ds * d.scale * qi[x];
            dvj[x] += p * doi[x];
          }
        }
        float* dqp = dq.at<float>({b, i, h});
        for (int64_t x = 0; x < d.D; ++x) dqp[x] += static_cast<float>(dqi[x]);
      }
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t j = 0; j < d.Skv; ++j)
      for (int64_t g = 0; g < d.G; ++g) {
        const double* dks = dk_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
        const double* dvs = dv_sum.data() + ((b * d.Skv + j) * d.G + g) * d.D;
        float* dkj = dk.at<float>({b, j, g});
        float* dvj = dv.at<float>({b, j, g});
        for (int64_t x = 0; x < d.D; ++x) {
          dkj[x] += static_cast<float>(dks[x]);
          dvj[x] += static_cast<float>(dvs[x]);
        }
      }
}

void attention_abs_terms_reference(const AttentionArgs& args, const TensorView& dout_in, const float* lse,
                                   const float* delta, const TensorView& o_abs, const TensorView& dq_abs,
                                   const TensorView& dk_abs, const TensorView& dv_abs) {
  Dims d = check_args(args);
  const Widened wq(args.q), wk(args.k), wv(args.v), wdout(dout_in);
  const AttentionArgs a = widened_args(args, wq, wk, wv);
  const TensorView& dout = wdout.view;
  std::vector<double> o(d.B * d.Sq * d.H * d.D, 0.0), dq(o.size(), 0.0);
  std::vector<double> dk(d.B * d.Skv * d.G * d.D, 0.0), dv(dk.size(), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) {
        const double l = lse[(b * d.Sq + i) * d.H + h], dl = delta[(b * d.Sq + i) * d.H + h];
        if (std::isinf(l)) continue;
        const float* qi = a.q.at<float>({b, i, h});
        const float* doi = dout.at<float>({b, i, h});
        double* oi = o.data() + ((b * d.Sq + i) * d.H + h) * d.D;
        double* dqi = dq.data() + ((b * d.Sq + i) * d.H + h) * d.D;
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (!pair_allowed(a, b, i, j, d)) continue;
          const int64_t g = h / d.group;
          const float* kj = a.k.at<float>({b, j, g});
          const float* vj = a.v.at<float>({b, j, g});
          double dot = 0, dp = 0;
          for (int64_t x = 0; x < d.D; ++x) {
            dot += static_cast<double>(qi[x]) * kj[x];
            dp += static_cast<double>(doi[x]) * vj[x];
          }
          const double p = std::exp(dot * d.scale - l), ds = std::abs(p * (dp - dl)) * d.scale;
          double* dkj = dk.data() + ((b * d.Skv + j) * d.G + g) * d.D;
          double* dvj = dv.data() + ((b * d.Skv + j) * d.G + g) * d.D;
          for (int64_t x = 0; x < d.D; ++x) {
            oi[x] += p * std::abs(vj[x]);
            dqi[x] += ds * std::abs(kj[x]);
            dkj[x] += ds * std::abs(qi[x]);
            dvj[x] += p * std::abs(doi[x]);
          }
        }
      }
  auto write = [&](const std::vector<double>& src, const TensorView& dst) {
    check_shape(dst.dtype == DType::f32 && dst.numel() == int64_t(src.size()),
                "attention_abs_terms_reference: outputs must be fp32 views of the shapes of q and k");
    for (int64_t b = 0; b < dst.dim(0); ++b)
      for (int64_t s = 0; s < dst.dim(1); ++s)
        for (int64_t h = 0; h < dst.dim(2); ++h)
          for (int64_t x = 0; x < dst.dim(3); ++x)
            dst.at<float>({b, s, h})[x] = static_cast<float>(src[((b * dst.dim(1) + s) * dst.dim(2) + h) * dst.dim(3) + x]);
  };
  write(o, o_abs);
  write(dq, dq_abs);
  write(dk, dk_abs);
  write(dv, dv_abs);
}

}  // namespace longctx
