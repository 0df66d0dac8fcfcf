// Fast attention: PLACEHOLDER that forwards to the reference until the
// block-sparse kernel lands (issue 2). delta and merge are final.
#include <cmath>

#include "kernels/attention.h"

namespace longctx {

AttentionBlocking attention_blocking(int64_t head_dim) { return {64, 64}; }

void attention_forward(const AttentionArgs& args, const TensorView& o, float* lse,
                       AttentionStats* stats) {
  attention_forward_reference(args, o, lse);
}

void attention_backward(const AttentionArgs& args, const TensorView& dout, const float* lse,
                        const float* delta, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, AttentionStats* stats) {
  attention_backward_reference(args, dout, lse, delta, dq, dk, dv);
}

void attention_delta(const TensorView& o, const TensorView& dout, float* delta) {
  const int64_t B = o.dim(0), S = o.dim(1), H = o.dim(2), D = o.dim(3);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const float* oi = o.at<float>({b, s, h});
        const float* gi = dout.at<float>({b, s, h});
        float acc = 0.0f;
        for (int64_t x = 0; x < D; ++x) acc += oi[x] * gi[x];
        delta[(b * S + s) * H + h] = acc;
      }
}

void attention_merge(const TensorView& o_a, float* lse_a, const TensorView& o_b,
                     const float* lse_b) {
  const int64_t B = o_a.dim(0), S = o_a.dim(1), H = o_a.dim(2), D = o_a.dim(3);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        int64_t r = (b * S + s) * H + h;
        float la = lse_a[r], lb = lse_b[r];
        if (lb == kNegInf) continue;
        float* oa = o_a.at<float>({b, s, h});
        const float* ob = o_b.at<float>({b, s, h});
        if (la == kNegInf) {
          for (int64_t x = 0; x < D; ++x) oa[x] = ob[x];
          lse_a[r] = lb;
          continue;
        }
        float m = std::max(la, lb);
        float l = m + std::log(std::exp(la - m) + std::exp(lb - m));
        float wa = std::exp(la - l), wb = std::exp(lb - l);
        for (int64_t x = 0; x < D; ++x) oa[x] = wa * oa[x] + wb * ob[x];
        lse_a[r] = l;
      }
}

}  // namespace longctx
