#pragma once
// AVX2/FMA vector helpers shared by the attention kernels' row operations
// (attention/tiles.cpp, compiled for the build machine) and the fused
// tiles (attention/fused/avx2.cpp, compiled for AVX2 + FMA and
// called only when the CPU has them; attention/fused/avx512.cpp repeats
// exp2_ps's arithmetic on 16 lanes with these constants). Include only where
// __AVX2__ and __FMA__ are defined. `static`: each translation unit keeps its own copy, compiled with
// its own flags.
#include <immintrin.h>

#include "kernels/simd/exp2_poly.h"

namespace longctx::attn::avx2 {

// 2^x per lane; x < -126 (also -inf) gives exactly 0, NaN gives NaN (a NaN
// score must reach the output, not vanish like a masked one).
static inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);  // false for -inf and NaN
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
  __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 p = exp2_poly(
      _mm256_sub_ps(xc, n), [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
      [](float c) { return _mm256_set1_ps(c); });
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_blendv_ps(_mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep), x,
                          _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

}  // namespace longctx::attn::avx2
