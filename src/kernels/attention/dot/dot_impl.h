#pragma once
// The bf16 dot kernels (attention/dot/dot.h), written once over the operations
// of their ISA and compiled per ISA file:
//   lanes::kernels_of<L>  over 16 fp32 lanes with a pair dot product
//                         (AVX512-BF16's vdpbf16ps; plain C++ lanes);
//   tiles::kernels_of<T>  over AMX tile registers (AMX-BF16; emulated tiles).
// Include only from the ISA files (attention_dot_*.cpp). Everything here
// has internal linkage (an unnamed namespace): each file compiles it for its
// own ISA, and the linker must never pick one file's copy for another.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention/dot/dot.h"
#include "kernels/simd/convert.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace longctx::attn {
namespace {

constexpr int64_t up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// The softmax of the fused kernels (fused_impl::softmax and softmax_grad,
// V their vector type of 16 lanes; the forward's running max is lazy,
// kLazyMax, and scale s - shift one fmadd), with exp2 to degree 4,
// V::exp2_bf16 (P and dS are rounded to bf16 next, and the polynomial's
// error is u/1400 of that rounding), and with P and dS written
// straight as bf16 operands of the next products: the fp32 P and dS are
// never stored, and no pass reads them back to round them (that pass and the
// stores were 6% of the kernels' time; the short exp2 another 4-8%).
// C converts: plain32 (32 floats to 32 bf16, to nearest even) and pairs16
// (16 lanes of two kv rows into 16 pairs; from memory or from V's
// registers). Outputs are zero past cols up to up(cols, kv_align).

// The forward's online softmax of one panel's scale s [cols][P] (base 2)
// into its pairs [kv/2][P]; m, l, alpha of its P rows. before(c0, c1) runs
// ahead of each 32 columns [c0, c1) of the one pass (the AMX forward
// multiplies the next panel's scores there, tiles::forward_run, so that the
// tiles work while the vector units run this panel); where neither half's
// rows can take the one pass, once for all columns first.
template <class V, class C, class Before>
void softmax_panel_to_pairs(const float* sp, int64_t cols, float scale, int64_t padded, float* m, float* l,
                            float* alpha, uint32_t* pairs, Before&& before) {
  constexpr int64_t P = kDotPanel, W = V::W, kChunk = 32;
  static_assert(W == 16 && P == 2 * W);
  using R = typename V::R;
  const R sc = V::set1(scale), none = V::set1(-std::numeric_limits<float>::infinity());
  // P = 2^(scale s - shift) of half h's columns [c, c_end) into the pairs,
  // adding to the sums acc[0..1].
  const auto exp_cols = [&](int64_t h, R neg_shift, int64_t c, int64_t c_end, R(&acc)[2]) {
    const float* col = sp + h;
    for (; c + 2 <= c_end; c += 2) {
      const R e0 = V::exp2_bf16(V::fmadd(V::load(col + c * P), sc, neg_shift));
      const R e1 = V::exp2_bf16(V::fmadd(V::load(col + (c + 1) * P), sc, neg_shift));
      acc[0] = V::add(acc[0], e0), acc[1] = V::add(acc[1], e1);
      C::pairs16(e0, e1, pairs + (c / 2) * P + h);
    }
    if (c < c_end) {  // the odd last column: its partner zero
      const R e0 = V::exp2_bf16(V::fmadd(V::load(col + c * P), sc, neg_shift));
      acc[0] = V::add(acc[0], e0);
      C::pairs16(e0, V::zero(), pairs + (c / 2) * P + h);
    }
  };
  const auto start = [&](R(&acc)[2]) { acc[0] = acc[1] = V::zero(); };
  const auto sum_of = [&](const R(&acc)[2]) { return V::add(acc[0], acc[1]); };
  const R m_old[2] = {V::load(m), V::load(m + W)};
  // One pass where every row has a running max; it stands where no row's P
  // summed above 2^kLazyMax (attention/dot/dot.h), so no P passed it either (NaN
  // sums pass: NaN reaches the output through P). Else the max first, and
  // the pass again. The sum is the pass's own: no compare per score.
  const R lowest = V::set1(std::numeric_limits<float>::lowest()), most = V::set1(std::ldexp(1.0f, int(kLazyMax)));
  const bool one_pass[2] = {!V::any_less(m_old[0], lowest), !V::any_less(m_old[1], lowest)};
  const R neg_shift[2] = {V::sub(V::zero(), m_old[0]), V::sub(V::zero(), m_old[1])};
  R acc[2][2];
  start(acc[0]), start(acc[1]);
  if (one_pass[0] || one_pass[1]) {
    for (int64_t c = 0; c < cols; c += kChunk) {
      const int64_t c_end = std::min(cols, c + kChunk);
      before(c, c_end);
      for (int64_t h = 0; h < 2; ++h)
        if (one_pass[h]) exp_cols(h * W, neg_shift[h], c, c_end, acc[h]);
    }
  } else {
    before(0, cols);
  }
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t c = up(cols, 2); c < padded; c += 2)
      std::fill(pairs + (c / 2) * P + h * W, pairs + (c / 2) * P + h * W + W, 0u);
    if (one_pass[h] && !V::any_less(most, sum_of(acc[h]))) {
      V::store(alpha + h * W, V::set1(1.0f));
      V::store(l + h * W, V::add(V::load(l + h * W), sum_of(acc[h])));
      continue;
    }
    // The max first (four independent chains; the max of the unscaled
    // scores scaled once: scale > 0 and rounding is monotonic, so it is the
    // max of the scaled scores, bit for bit), then the pass shifted by it.
    const float* col = sp + h * W;
    R mx[4] = {none, none, none, none};
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4)
      for (int x = 0; x < 4; ++x) mx[x] = V::max(mx[x], V::load(col + (c + x) * P));
    for (; c < cols; ++c) mx[0] = V::max(mx[0], V::load(col + c * P));
    const R top = V::mul(V::max(V::max(mx[0], mx[1]), V::max(mx[2], mx[3])), sc);
    const R m_new = V::max(m_old[h], top);
    const R shift = V::zero_where_neg_inf(m_new);  // rows with nothing allowed yet: 0, alpha 0
    start(acc[h]);
    exp_cols(h * W, V::sub(V::zero(), shift), 0, cols, acc[h]);
    const R a = V::exp2_bf16(V::sub(m_old[h], shift));
    V::store(alpha + h * W, a);
    V::store(l + h * W, V::fmadd(V::load(l + h * W), a, sum_of(acc[h])));
    V::store(m + h * W, m_new);
  }
}

// The forward's online softmax of scale s [panels][cols][P] (base 2) into p2.
template <class V, class C>
void softmax_to_pairs(const float* s, int64_t panels, int64_t cols, int64_t s_panel, float scale, int64_t kv_align,
                      float* m, float* l, float* alpha, bf16* p2) {
  for (int64_t p = 0; p < panels; ++p)
    softmax_panel_to_pairs<V, C>(s + p * s_panel, cols, scale, up(cols, kv_align), m + p * kDotPanel,
                                 l + p * kDotPanel, alpha + p * kDotPanel,
                                 reinterpret_cast<uint32_t*>(p2) + p * s_panel / 2, [](int64_t, int64_t) {});
}

// The backward's P = 2^(s_scale s - lse2) into pa and dS = scale P (dp - delta) into
// ds2 (pairs) and dsa (plain), from s and dp [panels][cols][P].
template <class V, class C>
void softmax_grad_to_bf16(const float* s, const float* dp, int64_t panels, int64_t cols, int64_t s_panel,
                          float s_scale, const float* lse2, const float* delta, float scale, int64_t kv_align,
                          bf16* pa, bf16* ds2, bf16* dsa) {
  constexpr int64_t P = kDotPanel, W = V::W;
  static_assert(W == 16 && P == 2 * W);
  using R = typename V::R;
  const R sc = V::set1(scale), ssc = V::set1(s_scale);
  const int64_t padded = up(cols, kv_align);
  alignas(64) float pr[2][P], ds[2][P];  // two kv rows of the panel's 32 lanes
  for (int64_t p = 0; p < panels; ++p) {
    const R l[2] = {V::load(lse2 + p * P), V::load(lse2 + p * P + W)};
    const R dl[2] = {V::load(delta + p * P), V::load(delta + p * P + W)};
    uint16_t* a_out = reinterpret_cast<uint16_t*>(pa) + p * s_panel;
    uint16_t* ds_out = reinterpret_cast<uint16_t*>(dsa) + p * s_panel;
    uint32_t* pairs = reinterpret_cast<uint32_t*>(ds2) + p * s_panel / 2;  // [kv/2][P]
    for (int64_t c = 0; c < cols; c += 2) {
      for (int64_t x = 0; x < 2; ++x)
        for (int half = 0; half < 2; ++half) {
          if (c + x >= cols) {  // the odd last row's partner: zero
            V::store(pr[x] + half * W, V::zero()), V::store(ds[x] + half * W, V::zero());
            continue;
          }
          const int64_t at = p * s_panel + (c + x) * P + half * W;
          const R e = V::exp2_bf16(V::sub(V::mul(V::load(s + at), ssc), l[half]));
          V::store(pr[x] + half * W, e);
          V::store(ds[x] + half * W, V::mul(V::mul(e, V::sub(V::load(dp + at), dl[half])), sc));
        }
      for (int64_t x = 0; x < 2 && c + x < padded; ++x) {
        C::plain32(pr[x], a_out + (c + x) * P);
        C::plain32(ds[x], ds_out + (c + x) * P);
      }
      C::pairs16(ds[0], ds[1], pairs + (c / 2) * P);
      C::pairs16(ds[0] + W, ds[1] + W, pairs + (c / 2) * P + W);
    }
    const int64_t done = up(cols, 2);
    std::fill(a_out + done * P, a_out + padded * P, uint16_t(0));
    std::fill(ds_out + done * P, ds_out + padded * P, uint16_t(0));
    std::fill(pairs + (done / 2) * P, pairs + (padded / 2) * P, 0u);
  }
}

namespace lanes {

// L provides: R (16 fp32 lanes), RB (32 bf16: a pair per lane), kRows (rows
// per register block), load, store, mul, set1, zero, loadb (RB from 32
// bf16), pair (both bf16 of one pair, in every lane), dot2 (acc + a.lo b.lo
// + a.hi b.hi per lane, fp32).
constexpr int64_t P = kDotPanel;

// f.template operator()<MR>(r0) for blocks of MR rows covering [0, n), the
// last one shorter (as the fused kernels').
template <int MR, int Max, class F>
inline void for_row_blocks(int64_t n, int64_t r0, F&& f) {
  if constexpr (MR == Max)
    for (; r0 + MR <= n; r0 += MR) f.template operator()<MR>(r0);
  if constexpr (MR > 1) {
    if (n - r0 == MR - 1) return f.template operator()<MR - 1>(r0);
    for_row_blocks<MR - 1, Max>(n, r0, f);
  }
}

// acc[i] (two vectors: 32 q lanes) += sum_t pair(a + i * a_row + t * a_step) . b[t], t < n in order.
template <class L, int MR>
inline void dot_rows(typename L::R (&acc)[MR][2], const bf16* a, int64_t a_row, int64_t a_step, const bf16* b,
                     int64_t b_row, int64_t n) {
  for (int64_t t = 0; t < n; ++t) {
    const typename L::RB b0 = L::loadb(b + t * b_row), b1 = L::loadb(b + t * b_row + 32);
    for (int i = 0; i < MR; ++i) {
      const typename L::RB x = L::pair(a + i * a_row + t * a_step);
      acc[i][0] = L::dot2(acc[i][0], x, b0);
      acc[i][1] = L::dot2(acc[i][1], x, b1);
    }
  }
}

template <class L>
void scores(const bf16* qp, int64_t panels, const bf16* k, int64_t cols, int64_t Dd, float* s, int64_t s_panel) {
  using R = typename L::R;
  for (int64_t p = 0; p < panels; ++p)
    for_row_blocks<L::kRows, L::kRows>(cols, 0, [&]<int MR>(int64_t c0) {
      R acc[MR][2];
      for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = L::zero();
      dot_rows<L, MR>(acc, k + c0 * Dd, Dd, 2, qp + p * Dd * P, 2 * P, Dd / 2);
      float* out = s + p * s_panel + c0 * P;
      for (int i = 0; i < MR; ++i) {
        L::store(out + i * P, acc[i][0]);
        L::store(out + i * P + 16, acc[i][1]);
      }
    });
}

// packed [cols2 / 2][D][2]: pairs of kv rows side by side.
inline int64_t packed_elements(int64_t cols, int64_t D) { return up(cols, 2) * D; }
inline void pack_kv(const bf16* x, int64_t ld_x, int64_t cols, int64_t D, bf16* packed) {
  const uint16_t* in = reinterpret_cast<const uint16_t*>(x);
  uint32_t* out = reinterpret_cast<uint32_t*>(packed);
  for (int64_t c = 0; c < cols; c += 2) {  // rows c, c + 1 interleaved (the missing last one zero)
    for (int64_t ahead = c + kPrefetchRows; ahead < std::min(cols, c + kPrefetchRows + 2); ++ahead)
      prefetch_row(in + ahead * ld_x, D * 2);
    const uint16_t* lo = in + c * ld_x;
    const uint16_t* hi = c + 1 < cols ? lo + ld_x : nullptr;
    for (int64_t d = 0; d < D; ++d) out[(c / 2) * D + d] = uint32_t(lo[d]) | (hi ? uint32_t(hi[d]) << 16 : 0u);
  }
}

template <class L>
void pv(const bf16* p2, int64_t panels, int64_t cols, int64_t p_panel, const bf16* packed, int64_t D,
        const float* alpha, float* acc) {
  using R = typename L::R;
  for (int64_t p = 0; p < panels; ++p) {
    const R a0 = L::load(alpha + p * P), a1 = L::load(alpha + p * P + 16);
    for_row_blocks<L::kRows, L::kRows>(D, 0, [&]<int MR>(int64_t d0) {
      float* at = acc + (p * D + d0) * P;
      R o[MR][2];
      for (int i = 0; i < MR; ++i) {
        o[i][0] = L::mul(L::load(at + i * P), a0);
        o[i][1] = L::mul(L::load(at + i * P + 16), a1);
      }
      // The pair of kv rows t of column d0 + i sits at packed[(t D + d0 + i) 2].
      dot_rows<L, MR>(o, packed + d0 * 2, 2, 2 * D, p2 + p * p_panel, 2 * P, up(cols, 2) / 2);
      for (int i = 0; i < MR; ++i) {
        L::store(at + i * P, o[i][0]);
        L::store(at + i * P + 16, o[i][1]);
      }
    });
  }
}

template <class L>
void panel_t_times(const bf16* a, int64_t rows, int64_t cols, int64_t a_panel, const bf16* b2, int64_t ld,
                   float* out) {
  using R = typename L::R;
  for (int64_t x0 = 0; x0 < ld; x0 += P)
    for_row_blocks<L::kRows, L::kRows>(cols, 0, [&]<int MR>(int64_t c0) {
      R acc[MR][2];
      for (int i = 0; i < MR; ++i) {
        acc[i][0] = L::load(out + (c0 + i) * ld + x0);
        acc[i][1] = L::load(out + (c0 + i) * ld + x0 + 16);
      }
      for (int64_t p = 0; p * P < rows; ++p)  // q row pairs in order, panel after panel
        dot_rows<L, MR>(acc, a + p * a_panel + c0 * P, P, 2, b2 + ((p * P / 2) * ld + x0) * 2, 2 * ld,
                        (std::min(P, rows - p * P) + 1) / 2);
      for (int i = 0; i < MR; ++i) {
        L::store(out + (c0 + i) * ld + x0, acc[i][0]);
        L::store(out + (c0 + i) * ld + x0 + 16, acc[i][1]);
      }
    });
}

template <class L, class C, class V>
constexpr DotTileKernels kernels_of(const char* isa, const FusedTileKernels* fp32) {
  return {isa,           fp32,      2,           2, &packed_elements, &pack_kv, &softmax_to_pairs<V, C>,
          &softmax_grad_to_bf16<V, C>, &scores<L>, &pv<L>, &panel_t_times<L>, nullptr};
}

}  // namespace lanes

namespace tiles {

// T provides, on tile registers 0..7 (every tile 16 rows of 64 bytes):
// configure() (once per call: another library may have changed the
// configuration), release(), zero<t>(), load<t>(ptr, stride bytes),
// store<t>(ptr, stride bytes) and dp<c, a, b>() (tdpbf16ps: c[16][16] fp32
// += a[16][32] bf16 times b, 16 rows of 16 pairs).
constexpr int64_t P = kDotPanel;
constexpr int64_t kAlign = 32;  // a tile's depth in bf16; 16 rows, 16 fp32 columns

// packed [cols32 / 32][up(D, 32)][32]: V^T (or K^T) in groups of 32 kv
// columns, zero padded (pv takes 32 d rows at a time). Groups outermost so
// that the packs of consecutive kv blocks (multiples of 32 columns) are one
// pack of all their columns, which pv takes in one call.
inline int64_t packed_elements(int64_t cols, int64_t D) { return up(D, 32) * up(cols, kAlign); }
inline void pack_kv(const bf16* x, int64_t ld_x, int64_t cols, int64_t D, bf16* packed) {
  const int64_t c32 = up(cols, kAlign), d32 = up(D, 32);
  for (int64_t c0 = 0; c0 < c32; c0 += 32)
    for (int64_t d = 0; d < d32; ++d) {  // sequential stores, no separate zero pass
      bf16* out = packed + c0 * d32 + d * 32;
      for (int64_t c = 0; c < 32; ++c) out[c] = d < D && c0 + c < cols ? x[(c0 + c) * ld_x + d] : bf16();
    }
}

// S^T of kv rows [c0, c0 + 32) against one panel's 32 lanes (qp, sp: the
// panel's), tiles configured: four C tiles.
template <class T>
inline void scores_block(const bf16* qp, const bf16* k, int64_t c0, int64_t Dd, float* sp) {
  T::template zero<0>(), T::template zero<1>(), T::template zero<2>(), T::template zero<3>();
  for (int64_t d0 = 0; d0 < Dd; d0 += kAlign) {
    T::template load<4>(k + c0 * Dd + d0, Dd * 2);
    T::template load<5>(k + (c0 + 16) * Dd + d0, Dd * 2);
    const bf16* b = qp + (d0 / 2) * P * 2;
    T::template load<6>(b, P * 4);
    T::template load<7>(b + 32, P * 4);
    T::template dp<0, 4, 6>(), T::template dp<1, 4, 7>(), T::template dp<2, 5, 6>(), T::template dp<3, 5, 7>();
  }
  float* out = sp + c0 * P;
  T::template store<0>(out, P * 4), T::template store<1>(out + 16, P * 4);
  T::template store<2>(out + 16 * P, P * 4), T::template store<3>(out + 16 * P + 16, P * 4);
}

// S^T for 32 kv rows at a time against a panel's 32 lanes.
template <class T>
void scores(const bf16* qp, int64_t panels, const bf16* k, int64_t cols, int64_t Dd, float* s, int64_t s_panel) {
  T::configure();
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t c0 = 0; c0 < cols; c0 += 32) scores_block<T>(qp + p * Dd * P, k, c0, Dd, s + p * s_panel);
  T::release();
}

// O^T (or dQ^T) 32 columns of d at a time, both halves of the panel's lanes:
// four independent accumulators, so that a product's latency hides behind
// the other three (with two, pv ran at the tiles' latency).
// pv, tiles configured.
template <class T>
void pv_configured(const bf16* p2, int64_t panels, int64_t cols, int64_t p_panel, const bf16* packed, int64_t D,
                   const float* alpha, float* acc) {
  const int64_t c32 = up(cols, kAlign);
  for (int64_t p = 0; p < panels; ++p) {  // the tiles add to acc in memory: rescale it there first
    const float* a = alpha + p * P;
    if (std::all_of(a, a + P, [](float x) { return x == 1.0f; })) continue;  // the running max held (dQ: always)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < P; ++j) acc[(p * D + d) * P + j] *= a[j];
  }
  const int64_t d32 = up(D, 32);
  float tail[32 * P];  // the last d block's rows when D is not a multiple of 32
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t d0 = 0; d0 < D; d0 += 32) {
      const bool whole = d0 + 32 <= D;
      float* at = acc + (p * D + d0) * P;
      if (!whole) {
        std::fill(tail, tail + 32 * P, 0.0f);
        std::memcpy(tail, at, (D - d0) * P * sizeof(float));
      }
      float* c = whole ? at : tail;
      T::template load<0>(c, P * 4), T::template load<1>(c + 16, P * 4);
      T::template load<2>(c + 16 * P, P * 4), T::template load<3>(c + 16 * P + 16, P * 4);
      for (int64_t c0 = 0; c0 < c32; c0 += kAlign) {
        T::template load<4>(packed + c0 * d32 + d0 * 32, 64);
        T::template load<5>(packed + c0 * d32 + (d0 + 16) * 32, 64);
        const bf16* b = p2 + p * p_panel + (c0 / 2) * P * 2;
        T::template load<6>(b, P * 4);
        T::template load<7>(b + 32, P * 4);
        T::template dp<0, 4, 6>(), T::template dp<1, 4, 7>(), T::template dp<2, 5, 6>(), T::template dp<3, 5, 7>();
      }
      T::template store<0>(c, P * 4), T::template store<1>(c + 16, P * 4);
      T::template store<2>(c + 16 * P, P * 4), T::template store<3>(c + 16 * P + 16, P * 4);
      if (!whole) std::memcpy(at, tail, (D - d0) * P * sizeof(float));
    }
}

template <class T>
void pv(const bf16* p2, int64_t panels, int64_t cols, int64_t p_panel, const bf16* packed, int64_t D,
        const float* alpha, float* acc) {
  T::configure();
  pv_configured<T>(p2, panels, cols, p_panel, packed, D, alpha, acc);
  T::release();
}

// The forward of a run of whole tiles (no mask): scores, softmax_to_pairs
// and pv panel by panel, each panel's softmax with the next panel's scores
// products issued between its 32-column steps, so that the tiles may
// multiply while the vector units exponentiate, and the tiles configured
// once per run. On the AMX Xeon measured the forward ran 1.04x at D = 128,
// 1.02x at D = 64: there the tile products and AVX-512 work barely overlap
// (bench/micro/dot_forward_parts.cpp), so a run costs about the sum of its
// parts.
template <class T, class V, class C>
void forward_run(const bf16* qp, int64_t panels, const bf16* k, int64_t cols, int64_t Dd, float* s, int64_t s_panel,
                 float scale, int64_t kv_align, float* m, float* l, float* alpha, bf16* p2, const bf16* packed,
                 int64_t D, float* acc) {
  T::configure();
  for (int64_t c0 = 0; c0 < cols; c0 += 32) scores_block<T>(qp, k, c0, Dd, s);
  for (int64_t p = 0; p < panels; ++p) {
    const auto next_scores = [&](int64_t c0, int64_t c1) {
      if (p + 1 < panels)
        for (; c0 < c1; c0 += 32) scores_block<T>(qp + (p + 1) * Dd * P, k, c0, Dd, s + (p + 1) * s_panel);
    };
    softmax_panel_to_pairs<V, C>(s + p * s_panel, cols, scale, up(cols, kv_align), m + p * P, l + p * P,
                                 alpha + p * P, reinterpret_cast<uint32_t*>(p2) + p * s_panel / 2, next_scores);
    pv_configured<T>(p2 + p * s_panel, 1, cols, s_panel, packed, D, alpha + p * P, acc + p * D * P);
  }
  T::release();
}

// dK or dV: 32 kv rows by 32 columns of d at a time, a panel (32 q rows) per step.
template <class T>
void panel_t_times(const bf16* a, int64_t rows, int64_t cols, int64_t a_panel, const bf16* b2, int64_t ld,
                   float* out) {
  T::configure();
  const int64_t c32 = up(cols, kAlign), panels = (rows + P - 1) / P;
  for (int64_t c0 = 0; c0 < c32; c0 += 32)
    for (int64_t x0 = 0; x0 < ld; x0 += 32) {
      float* o = out + c0 * ld + x0;
      T::template load<0>(o, ld * 4), T::template load<1>(o + 16, ld * 4);
      T::template load<2>(o + 16 * ld, ld * 4), T::template load<3>(o + 16 * ld + 16, ld * 4);
      for (int64_t p = 0; p < panels; ++p) {
        T::template load<4>(a + p * a_panel + c0 * P, P * 2);
        T::template load<5>(a + p * a_panel + (c0 + 16) * P, P * 2);
        const bf16* b = b2 + ((p * P / 2) * ld + x0) * 2;
        T::template load<6>(b, ld * 4);
        T::template load<7>(b + 32, ld * 4);
        T::template dp<0, 4, 6>(), T::template dp<1, 4, 7>(), T::template dp<2, 5, 6>(), T::template dp<3, 5, 7>();
      }
      T::template store<0>(o, ld * 4), T::template store<1>(o + 16, ld * 4);
      T::template store<2>(o + 16 * ld, ld * 4), T::template store<3>(o + 16 * ld + 16, ld * 4);
    }
  T::release();
}

// pack: pack_kv, or an ISA's own that writes the same bytes.
template <class T, class C, class V>
constexpr DotTileKernels kernels_of(const char* isa, const FusedTileKernels* fp32,
                                    void (*pack)(const bf16*, int64_t, int64_t, int64_t, bf16*) = &pack_kv) {
  return {isa,           fp32,      kAlign,      kAlign, &packed_elements, pack, &softmax_to_pairs<V, C>,
          &softmax_grad_to_bf16<V, C>, &scores<T>, &pv<T>, &panel_t_times<T>, &forward_run<T, V, C>};
}

}  // namespace tiles

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// The conversions of softmax_to_pairs and softmax_grad_to_bf16 on vcvtne2ps2bf16 (to nearest even; denormals
// read as and flushed to zero), pairs interleaved by vpermw.
struct Avx512Bf16Convert {
  static void plain32(const float* x, uint16_t* out) {
    _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
  }
  static void pairs16(const float* lo, const float* hi, uint32_t* out) {
    pairs16(_mm512_loadu_ps(lo), _mm512_loadu_ps(hi), out);
  }
  static void pairs16(__m512 lo, __m512 hi, uint32_t* out) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lo 0..15, hi 0..15
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    _mm512_storeu_si512(out, _mm512_permutexvar_epi16(order, both));
  }
};
#endif

}  // namespace
}  // namespace longctx::attn
