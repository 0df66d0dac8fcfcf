// The fused forward tiles (attention_fused.h). This file alone is compiled
// for AVX2 + FMA on x86 (CMakeLists.txt); attention.cpp calls it only when
// fused_tiles_supported(). Elsewhere the kernels are absent
// (fused_tiles_built() is false).
#include "kernels/attention_fused.h"

#include <cstdlib>

#if defined(__AVX2__) && defined(__FMA__)
#include "kernels/avx2_math.h"

namespace longctx::attn {

namespace {

// Rows per register block: MR rows x 16 columns of accumulators (2 vectors
// each) plus two column vectors and one broadcast: 15 of the 16 registers
// at MR = 6.
constexpr int kRows = 6;

// The one product both tiles are made of, on MR rows of 16 q columns held
// in registers: acc[i] += sum_t a[i * a_row + t * a_step] b[t][0..16), for
// t < n (b [n][16], one panel).
template <int MR>
inline void accumulate_rows(__m256 (&acc)[MR][2], const float* a, int64_t a_row, int64_t a_step, const float* b,
                            int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const __m256 b0 = _mm256_loadu_ps(b + t * kPanel), b1 = _mm256_loadu_ps(b + t * kPanel + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i * a_row + t * a_step);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
}

// S^T rows c0..c0+MR of one panel: s[i] = scale sum_d k[c0+i][d] qp[d][0..16).
template <int MR>
void scores_rows(const float* qp, const float* k, int64_t D, __m256 scale, float* s) {
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  accumulate_rows<MR>(acc, k, D, 1, qp, D);
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(s + i * kPanel, _mm256_mul_ps(acc[i][0], scale));
    _mm256_storeu_ps(s + i * kPanel + 8, _mm256_mul_ps(acc[i][1], scale));
  }
}

// O^T rows d0..d0+MR of one panel: acc[i] = alpha acc[i] + sum_c v[c][d0+i] p[c][0..16).
template <int MR>
void pv_rows(const float* p, int64_t cols, const float* v, int64_t D, const float* alpha, float* acc) {
  const __m256 a0 = _mm256_loadu_ps(alpha), a1 = _mm256_loadu_ps(alpha + 8);
  __m256 o[MR][2];
  for (int i = 0; i < MR; ++i) {
    o[i][0] = _mm256_mul_ps(_mm256_loadu_ps(acc + i * kPanel), a0);
    o[i][1] = _mm256_mul_ps(_mm256_loadu_ps(acc + i * kPanel + 8), a1);
  }
  accumulate_rows<MR>(o, v, 1, D, p, cols);
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(acc + i * kPanel, o[i][0]);
    _mm256_storeu_ps(acc + i * kPanel + 8, o[i][1]);
  }
}

// f.template operator()<MR>(r0) for blocks of kRows rows covering [0, n),
// the last one shorter.
template <class F>
void for_row_blocks(int64_t n, F&& f) {
  int64_t r0 = 0;
  for (; r0 + kRows <= n; r0 += kRows) f.template operator()<kRows>(r0);
  switch (n - r0) {
    case 1: f.template operator()<1>(r0); break;
    case 2: f.template operator()<2>(r0); break;
    case 3: f.template operator()<3>(r0); break;
    case 4: f.template operator()<4>(r0); break;
    case 5: f.template operator()<5>(r0); break;
    default: break;
  }
}

}  // namespace

bool fused_tiles_built() { return true; }

void fused_scores(const float* qp, int64_t panels, const float* k, int64_t cols, int64_t D, float scale,
                  float* s, int64_t s_panel) {
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t p = 0; p < panels; ++p)  // the panel of Q (D x 64 bytes) stays in L1
    for_row_blocks(cols, [&]<int MR>(int64_t c0) {
      scores_rows<MR>(qp + p * D * kPanel, k + c0 * D, D, sc, s + p * s_panel + c0 * kPanel);
    });
}

void fused_softmax(float* s, int64_t panels, int64_t cols, int64_t s_panel, float* m, float* l, float* alpha) {
  using avx2::exp2_ps;
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff()), zero = _mm256_setzero_ps();
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t h = 0; h < kPanel; h += 8) {  // 8 q rows at a time, down the tile's columns
      float* col = s + p * s_panel + h;
      const int64_t row = p * kPanel + h;
      const __m256 m_old = _mm256_loadu_ps(m + row);
      __m256 m_new = m_old;
      for (int64_t c = 0; c < cols; ++c) m_new = _mm256_max_ps(m_new, _mm256_loadu_ps(col + c * kPanel));
      // Rows with nothing allowed yet shift by 0: their -inf scores give 0, alpha 2^-inf = 0.
      const __m256 shift = _mm256_blendv_ps(m_new, zero, _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
      __m256 sum0 = zero, sum1 = zero;
      int64_t c = 0;
      for (; c + 2 <= cols; c += 2) {  // two independent chains
        const __m256 e0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + c * kPanel), shift));
        const __m256 e1 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + (c + 1) * kPanel), shift));
        _mm256_storeu_ps(col + c * kPanel, e0);
        _mm256_storeu_ps(col + (c + 1) * kPanel, e1);
        sum0 = _mm256_add_ps(sum0, e0);
        sum1 = _mm256_add_ps(sum1, e1);
      }
      if (c < cols) {
        const __m256 e0 = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(col + c * kPanel), shift));
        _mm256_storeu_ps(col + c * kPanel, e0);
        sum0 = _mm256_add_ps(sum0, e0);
      }
      const __m256 a = exp2_ps(_mm256_sub_ps(m_old, shift));
      _mm256_storeu_ps(alpha + row, a);
      _mm256_storeu_ps(l + row, _mm256_fmadd_ps(_mm256_loadu_ps(l + row), a, _mm256_add_ps(sum0, sum1)));
      _mm256_storeu_ps(m + row, m_new);
    }
}

void fused_pv(const float* s, int64_t panels, int64_t cols, int64_t s_panel, const float* v, int64_t D,
              const float* alpha, float* acc) {
  for (int64_t p = 0; p < panels; ++p)  // the panel of P (cols x 64 bytes) stays in L1
    for_row_blocks(D, [&]<int MR>(int64_t d0) {
      pv_rows<MR>(s + p * s_panel, cols, v + d0, D, alpha + p * kPanel, acc + (p * D + d0) * kPanel);
    });
}

}  // namespace longctx::attn

#else  // not built for AVX2 + FMA: never called (fused_tiles_built() is false)

namespace longctx::attn {

bool fused_tiles_built() { return false; }
void fused_scores(const float*, int64_t, const float*, int64_t, int64_t, float, float*, int64_t) { std::abort(); }
void fused_softmax(float*, int64_t, int64_t, int64_t, float*, float*, float*) { std::abort(); }
void fused_pv(const float*, int64_t, int64_t, int64_t, const float*, int64_t, const float*, float*) { std::abort(); }

}  // namespace longctx::attn

#endif
