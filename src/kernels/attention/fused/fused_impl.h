#pragma once
// The fused forward and backward tiles (attention/fused/fused.h), written once
// over a vector type V and compiled once per ISA: attention/fused/avx2.cpp
// (8 lanes, panels of 16 q rows) and attention/fused/avx512.cpp (16 lanes,
// panels of 32). Each lane holds one q row and every sum runs over d
// (scores) or kv (P V, dQ) in the same order in both, or (dK, dV) one
// column of d and sums over q in order, so the two ISAs give bit-identical
// results (tested). Include only from those two files and the tests.
//
// V provides: R (a register of W floats), W, kRows (rows per register block:
// kRows x 2 accumulators, two panel vectors and a broadcast fit the ISA's
// registers), load, store, set1, zero, add, sub, mul, fmadd, max, exp2 (2^x, 0
// below -126, same arithmetic as avx2::exp2_ps) and zero_where_neg_inf.
#include <algorithm>
#include <cstdint>

#include "kernels/attention/fused/fused.h"

namespace longctx::attn::fused_impl {

template <class V>
constexpr int64_t kPanelOf = 2 * V::W;

// acc[i] += sum_t a[i * a_row + t * a_step] b[t * b_row + 0..2W), for t < n
// in order, on MR rows held in registers.
template <class V, int MR>
inline void accumulate_rows(typename V::R (&acc)[MR][2], const float* a, int64_t a_row, int64_t a_step,
                            const float* b, int64_t b_row, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const typename V::R b0 = V::load(b + t * b_row), b1 = V::load(b + t * b_row + V::W);
    for (int i = 0; i < MR; ++i) {
      const typename V::R x = V::set1(a[i * a_row + t * a_step]);
      acc[i][0] = V::fmadd(x, b0, acc[i][0]);
      acc[i][1] = V::fmadd(x, b1, acc[i][1]);
    }
  }
}

// S^T rows c0..c0+MR of one panel: s[i] = scale sum_d k[c0+i][d] qp[d][0..panel).
template <class V, int MR>
void scores_rows(const float* qp, const float* k, int64_t D, typename V::R scale, float* s) {
  constexpr int64_t P = kPanelOf<V>;
  typename V::R acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = V::zero();
  accumulate_rows<V, MR>(acc, k, D, 1, qp, P, D);
  for (int i = 0; i < MR; ++i) {
    V::store(s + i * P, V::mul(acc[i][0], scale));
    V::store(s + i * P + V::W, V::mul(acc[i][1], scale));
  }
}

// O^T rows d0..d0+MR of one panel: acc[i] = alpha acc[i] + sum_c v[c][d0+i] p[c][0..panel).
template <class V, int MR>
void pv_rows(const float* p, int64_t cols, const float* v, int64_t D, const float* alpha, float* acc) {
  constexpr int64_t P = kPanelOf<V>;
  const typename V::R a0 = V::load(alpha), a1 = V::load(alpha + V::W);
  typename V::R o[MR][2];
  for (int i = 0; i < MR; ++i) {
    o[i][0] = V::mul(V::load(acc + i * P), a0);
    o[i][1] = V::mul(V::load(acc + i * P + V::W), a1);
  }
  accumulate_rows<V, MR>(o, v, 1, D, p, P, cols);
  for (int i = 0; i < MR; ++i) {
    V::store(acc + i * P, o[i][0]);
    V::store(acc + i * P + V::W, o[i][1]);
  }
}

// f.template operator()<MR>(r0) for blocks of V::kRows rows covering [0, n),
// the last one shorter.
template <class V, int MR = V::kRows, class F>
inline void for_row_blocks(int64_t n, int64_t r0, F&& f) {
  if constexpr (MR == V::kRows)
    for (; r0 + MR <= n; r0 += MR) f.template operator()<MR>(r0);
  if constexpr (MR > 1) {
    if (n - r0 == MR - 1) return f.template operator()<MR - 1>(r0);
    for_row_blocks<V, MR - 1>(n, r0, f);
  }
}

template <class V>
void scores(const float* qp, int64_t panels, const float* k, int64_t cols, int64_t D, float scale, float* s,
            int64_t s_panel) {
  constexpr int64_t P = kPanelOf<V>;
  const typename V::R sc = V::set1(scale);
  for (int64_t p = 0; p < panels; ++p)  // the panel of Q (D x P floats) stays in L1
    for_row_blocks<V>(cols, 0, [&]<int MR>(int64_t c0) {
      scores_rows<V, MR>(qp + p * D * P, k + c0 * D, D, sc, s + p * s_panel + c0 * P);
    });
}

template <class V>
void softmax(float* s, int64_t panels, int64_t cols, int64_t s_panel, float* m, float* l, float* alpha) {
  constexpr int64_t P = kPanelOf<V>;
  using R = typename V::R;
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t h = 0; h < P; h += V::W) {  // W q rows at a time, down the tile's columns
      float* col = s + p * s_panel + h;
      const int64_t row = p * P + h;
      const R m_old = V::load(m + row);
      // Four independent chains: one max per cycle, not one per max's latency.
      R mx[4] = {m_old, m_old, m_old, m_old};
      int64_t c = 0;
      for (; c + 4 <= cols; c += 4)
        for (int x = 0; x < 4; ++x) mx[x] = V::max(mx[x], V::load(col + (c + x) * P));
      for (; c < cols; ++c) mx[0] = V::max(mx[0], V::load(col + c * P));
      const R m_new = V::max(V::max(mx[0], mx[1]), V::max(mx[2], mx[3]));
      // Rows with nothing allowed yet shift by 0: their -inf scores give 0, alpha 2^-inf = 0.
      const R shift = V::zero_where_neg_inf(m_new);
      R sum0 = V::zero(), sum1 = V::zero();
      for (c = 0; c + 2 <= cols; c += 2) {  // two independent chains
        const R e0 = V::exp2(V::sub(V::load(col + c * P), shift));
        const R e1 = V::exp2(V::sub(V::load(col + (c + 1) * P), shift));
        V::store(col + c * P, e0);
        V::store(col + (c + 1) * P, e1);
        sum0 = V::add(sum0, e0);
        sum1 = V::add(sum1, e1);
      }
      if (c < cols) {
        const R e0 = V::exp2(V::sub(V::load(col + c * P), shift));
        V::store(col + c * P, e0);
        sum0 = V::add(sum0, e0);
      }
      const R a = V::exp2(V::sub(m_old, shift));
      V::store(alpha + row, a);
      V::store(l + row, V::fmadd(V::load(l + row), a, V::add(sum0, sum1)));
      V::store(m + row, m_new);
    }
}

template <class V>
void pv(const float* s, int64_t panels, int64_t cols, int64_t s_panel, const float* v, int64_t D,
        const float* alpha, float* acc) {
  constexpr int64_t P = kPanelOf<V>;
  for (int64_t p = 0; p < panels; ++p)  // the panel of P (cols x P floats) stays in L1
    for_row_blocks<V>(D, 0, [&]<int MR>(int64_t d0) {
      pv_rows<V, MR>(s + p * s_panel, cols, v + d0, D, alpha + p * P, acc + (p * D + d0) * P);
    });
}

template <class V>
void softmax_grad(float* s, float* ds, int64_t panels, int64_t cols, int64_t s_panel, const float* lse2,
                  const float* delta, float scale) {
  constexpr int64_t P = kPanelOf<V>;
  using R = typename V::R;
  const R sc = V::set1(scale);
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t h = 0; h < P; h += V::W) {  // W q rows at a time, down the tile's columns
      const int64_t row = p * P + h;
      const R l = V::load(lse2 + row), dl = V::load(delta + row);
      for (int64_t c = 0; c < cols; ++c) {
        float* sc_at = s + p * s_panel + c * P + h;
        float* ds_at = ds + p * s_panel + c * P + h;
        const R pr = V::exp2(V::sub(V::load(sc_at), l));
        V::store(sc_at, pr);
        V::store(ds_at, V::mul(V::mul(pr, V::sub(V::load(ds_at), dl)), sc));
      }
    }
}

template <class V>
void panel_t_times(const float* a, int64_t rows, int64_t cols, int64_t s_panel, const float* b, int64_t ld,
                   float* out) {
  constexpr int64_t P = kPanelOf<V>;
  using R = typename V::R;
  for (int64_t x0 = 0; x0 < ld; x0 += P)  // 2W columns of b and out at a time; b's slice stays in L1
    for_row_blocks<V>(cols, 0, [&]<int MR>(int64_t c0) {
      R acc[MR][2];
      for (int i = 0; i < MR; ++i) {
        acc[i][0] = V::load(out + (c0 + i) * ld + x0);
        acc[i][1] = V::load(out + (c0 + i) * ld + x0 + V::W);
      }
      for (int64_t p = 0; p * P < rows; ++p)  // q rows in order, panel after panel
        accumulate_rows<V, MR>(acc, a + p * s_panel + c0 * P, P, 1, b + p * P * ld + x0, ld,
                               std::min(P, rows - p * P));
      for (int i = 0; i < MR; ++i) {
        V::store(out + (c0 + i) * ld + x0, acc[i][0]);
        V::store(out + (c0 + i) * ld + x0 + V::W, acc[i][1]);
      }
    });
}

template <class V>
constexpr FusedTileKernels kernels_of(const char* isa) {
  return {kPanelOf<V>, isa, &scores<V>, &softmax<V>, &pv<V>, &softmax_grad<V>, &panel_t_times<V>};
}

}  // namespace longctx::attn::fused_impl
