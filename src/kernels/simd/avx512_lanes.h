#pragma once
// The fused kernels' vector type on AVX-512 (attention/fused/fused_impl.h): 16
// fp32 lanes. Shared by the fused kernels (attention/fused/avx512.cpp) and
// the bf16 dot kernels' softmax (attention/dot/avx512bf16.cpp,
// attention/dot/amx.cpp), so both run the same softmax (the dot kernels with
// exp2_bf16 in place of exp2). Include
// only from files compiled with -mavx512f; internal linkage, as
// attention/dot/dot_impl.h says why.
#if defined(__AVX512F__)
#include <immintrin.h>

#include "kernels/simd/exp2_poly.h"

namespace longctx::attn {
namespace {

struct Avx512 {
  using R = __m512;
  static constexpr int W = 16;
  // 8 rows x 2 accumulators: 16 registers of 32 (more rows measured no faster;
  // 8 divides the 128-row tiles and D = 64, 128).
  static constexpr int kRows = 8;
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R zero() { return _mm512_setzero_ps(); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  // Whether a < b in any lane (false where either is NaN).
  static bool any_less(R a, R b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ) != 0; }
  // avx2::exp2_ps's arithmetic, 16 lanes: the same result in every lane.
  static R exp2(R x) {
    const R lo = set1(-126.0f);
    const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);  // false for -inf and NaN
    const R xc = _mm512_min_ps(_mm512_max_ps(x, lo), set1(127.0f));
    const R n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const R p = exp2_poly(sub(xc, n), fmadd, set1);
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e)),
                                x);
  }
  // 2^x for the bf16 dot kernels' softmax (exp2_poly_bf16): 2^f 2^floor(x)
  // with f = x - floor(x) in [0, 1) (reduce, rounding the difference down
  // too; f is 0 for infinite x and NaN for NaN) and scalef, which floors x
  // itself and gives 2^-inf = 0,
  // 2^inf = inf and NaN for NaN: 6 instructions where exp2 takes 17 (and the
  // softmax 1.25x faster than with round, subtract and clamp before).
  static R exp2_bf16(R x) {
    const R f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(exp2_poly_bf16(f, fmadd, set1), x);
  }
  static R zero_where_neg_inf(R x) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(-__builtin_inff()), _CMP_EQ_OQ), x, zero());
  }
};

}  // namespace
}  // namespace longctx::attn
#endif
