// The fused tiles (forward and backward) for AVX2/FMA (attention/fused/fused_impl.h). This file
// alone is compiled with -mavx2 -mfma on x86 (CMakeLists.txt); the kernels
// run only where kernels/cpu/select.cpp found the CPU has both; the table
// is constant-initialized, so no code of this file runs before that check.
#include "kernels/attention/fused/fused.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "kernels/attention/fused/fused_impl.h"
#include "kernels/simd/avx2_math.h"

namespace longctx::attn {

namespace {

struct Avx2 {
  using R = __m256;
  static constexpr int W = 8;
  // 6 rows x 2 accumulators, two panel vectors and a broadcast: 15 of the 16 registers.
  static constexpr int kRows = 6;
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R zero() { return _mm256_setzero_ps(); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R exp2(R x) { return avx2::exp2_ps(x); }
  static R zero_where_neg_inf(R x) {
    return _mm256_blendv_ps(x, zero(), _mm256_cmp_ps(x, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ));
  }
};

constinit const FusedTileKernels kAvx2 = fused_impl::kernels_of<Avx2>("AVX2/FMA");

}  // namespace

const FusedTileKernels* fused_tile_kernels_avx2_built() { return &kAvx2; }

}  // namespace longctx::attn

#else  // not built for AVX2 + FMA

namespace longctx::attn {
const FusedTileKernels* fused_tile_kernels_avx2_built() { return nullptr; }
}  // namespace longctx::attn

#endif
