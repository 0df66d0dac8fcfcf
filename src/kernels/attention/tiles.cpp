#include "kernels/attention/tiles.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include "kernels/simd/avx2_math.h"
#define LONGCTX_ATTN_AVX2 1
#endif

namespace longctx::attn {

std::vector<BlockBounds> block_bounds(const int64_t* pos, const int32_t* seg, int64_t n,
                                      int64_t block) {
  std::vector<BlockBounds> out;
  for (int64_t s0 = 0; s0 < n; s0 += block) {
    int64_t s1 = std::min(n, s0 + block);
    BlockBounds b{pos[s0], pos[s0], seg ? seg[s0] : 0, seg ? seg[s0] : 0};
    for (int64_t s = s0 + 1; s < s1; ++s) {
      b.pos_lo = std::min(b.pos_lo, pos[s]);
      b.pos_hi = std::max(b.pos_hi, pos[s]);
      if (seg) {
        b.seg_lo = std::min(b.seg_lo, seg[s]);
        b.seg_hi = std::max(b.seg_hi, seg[s]);
      }
    }
    out.push_back(b);
  }
  return out;
}

TileKind classify_tile(const MaskSpec& m, const BlockBounds& q, const BlockBounds& kv) {
  // Differences instead of q - left etc.: no overflow with huge windows.
  bool empty = false, full = false;
  switch (m.kind) {
    case MaskSpec::Kind::full:
      full = true;
      break;
    case MaskSpec::Kind::causal:  // kv <= q
      empty = kv.pos_lo > q.pos_hi;
      full = kv.pos_hi <= q.pos_lo;
      break;
    case MaskSpec::Kind::local:  // -right <= q - kv <= left
      empty = q.pos_lo - kv.pos_hi > m.left || kv.pos_lo - q.pos_hi > m.right;
      full = q.pos_hi - kv.pos_lo <= m.left && kv.pos_hi - q.pos_lo <= m.right;
      break;
    case MaskSpec::Kind::chunked: {  // causal and the same chunk (pos / chunk is monotone)
      int64_t qc_lo = q.pos_lo / m.chunk, qc_hi = q.pos_hi / m.chunk;
      int64_t kc_lo = kv.pos_lo / m.chunk, kc_hi = kv.pos_hi / m.chunk;
      empty = kv.pos_lo > q.pos_hi || kc_hi < qc_lo || kc_lo > qc_hi;
      full = kv.pos_hi <= q.pos_lo && qc_lo == qc_hi && kc_lo == kc_hi && qc_lo == kc_lo;
      break;
    }
  }
  if (m.same_segment) {
    empty = empty || q.seg_hi < kv.seg_lo || kv.seg_hi < q.seg_lo;
    full = full && q.seg_lo == q.seg_hi && kv.seg_lo == kv.seg_hi && q.seg_lo == kv.seg_lo;
  }
  return empty ? TileKind::empty : full ? TileKind::full : TileKind::partial;
}

namespace {

// The kind switch is hoisted out of the element loop.
template <typename Allowed>
void mask_with(Allowed allowed, float* s, int64_t rows, int64_t cols, int64_t ld, int64_t col_stride,
               const int64_t* q_pos, const int64_t* kv_pos, const int32_t* q_seg,
               const int32_t* kv_seg) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    const int64_t qp = q_pos[r];
    if (q_seg) {
      const int32_t qs = q_seg[r];
      for (int64_t c = 0; c < cols; ++c)
        if (kv_seg[c] != qs || !allowed(qp, kv_pos[c])) row[c * col_stride] = neg_inf;
    } else {
      for (int64_t c = 0; c < cols; ++c)
        if (!allowed(qp, kv_pos[c])) row[c * col_stride] = neg_inf;
    }
  }
}

}  // namespace

void mask_tile(const MaskSpec& m, float* s, int64_t rows, int64_t cols, int64_t ld, int64_t col_stride,
               const int64_t* q_pos, const int64_t* kv_pos, const int32_t* q_seg,
               const int32_t* kv_seg) {
  if (!m.same_segment) q_seg = kv_seg = nullptr;
  switch (m.kind) {
    case MaskSpec::Kind::full:
      mask_with([](int64_t, int64_t) { return true; }, s, rows, cols, ld, col_stride, q_pos, kv_pos, q_seg,
                kv_seg);
      break;
    case MaskSpec::Kind::causal:
      mask_with([](int64_t q, int64_t k) { return k <= q; }, s, rows, cols, ld, col_stride, q_pos, kv_pos,
                q_seg, kv_seg);
      break;
    case MaskSpec::Kind::local:
      mask_with([&m](int64_t q, int64_t k) { return q - k <= m.left && k - q <= m.right; }, s,
                rows, cols, ld, col_stride, q_pos, kv_pos, q_seg, kv_seg);
      break;
    case MaskSpec::Kind::chunked:
      mask_with([c = m.chunk](int64_t q, int64_t k) { return k <= q && q / c == k / c; }, s,
                rows, cols, ld, col_stride, q_pos, kv_pos, q_seg, kv_seg);
      break;
  }
}

namespace {

float exp2_scalar(float x) {  // as avx2::exp2_ps
  if (std::isnan(x)) return x;
  if (!(x >= -126.0f)) return 0.0f;  // also -inf
  return std::exp2(std::min(x, 127.0f));
}

}  // namespace

#ifdef LONGCTX_ATTN_AVX2
using avx2::exp2_ps;
using avx2::hmax;
using avx2::hsum;
#endif

float exp2_shifted_inplace(float* x, int64_t n, float shift) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef LONGCTX_ATTN_AVX2
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m256 a = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    __m256 b = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), sh));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    acc0 = _mm256_add_ps(acc0, a);
    acc1 = _mm256_add_ps(acc1, b);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, a);
    acc0 = _mm256_add_ps(acc0, a);
  }
  sum = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) {
    x[i] = exp2_scalar(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;  // max drops a NaN operand: tracked apart
  int64_t i = 0;
#ifdef LONGCTX_ATTN_AVX2
  __m256 a = _mm256_set1_ps(m), b = a, unordered = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 u = _mm256_loadu_ps(x + i), v = _mm256_loadu_ps(x + i + 8);
    a = _mm256_max_ps(a, u);
    b = _mm256_max_ps(b, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(u, v, _CMP_UNORD_Q));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 u = _mm256_loadu_ps(x + i);
    a = _mm256_max_ps(a, u);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(u, u, _CMP_UNORD_Q));
  }
  m = hmax(_mm256_max_ps(a, b));
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    m = std::max(m, x[i]);
    nan = nan || std::isnan(x[i]);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

void scale_row(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;  // auto-vectorised
}

void softmax_grad_row(const float* p, float* dp, int64_t n, float delta) {
  for (int64_t i = 0; i < n; ++i) dp[i] = p[i] * (dp[i] - delta);  // auto-vectorised
}

}  // namespace longctx::attn
