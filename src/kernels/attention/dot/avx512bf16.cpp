// The bf16 dot kernels on AVX512-BF16 (attention/dot/dot_impl.h, lanes): 16 fp32
// lanes, vdpbf16ps adding a pair of bf16 products to each. This file alone
// is compiled with -mavx512f -mavx512bf16 on x86 (CMakeLists.txt); the
// kernels run only where dot_tile_kernels_avx512bf16() says the CPU has it.
#include "kernels/attention/dot/dot.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include <cstring>

#include "kernels/attention/dot/dot_impl.h"
#include "kernels/simd/avx512_lanes.h"
#include "kernels/gemm.h"

namespace longctx::attn {

namespace {

struct Avx512Bf16 {
  using R = __m512;
  using RB = __m512bh;
  // 12 rows x 2 accumulators, two operand vectors and a broadcast: 27 of 32
  // registers (8 rows measured 2-3% slower on Zen 4: more operand loads per product).
  static constexpr int kRows = 12;
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R zero() { return _mm512_setzero_ps(); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static RB loadb(const bf16* p) { return (RB)_mm512_loadu_si512(p); }
  static RB pair(const bf16* p) {
    int32_t x;
    std::memcpy(&x, p, sizeof x);
    return (RB)_mm512_set1_epi32(x);
  }
  static R dot2(R acc, RB a, RB b) { return _mm512_dpbf16_ps(acc, a, b); }
};

constinit const DotTileKernels kAvx512Bf16 =
    lanes::kernels_of<Avx512Bf16, Avx512Bf16Convert, Avx512>("AVX512-BF16", &kFusedAvx512);

}  // namespace

const DotTileKernels* dot_tile_kernels_avx512bf16_built() { return &kAvx512Bf16; }

}  // namespace longctx::attn

#else  // not built for AVX512-BF16

namespace longctx::attn {
const DotTileKernels* dot_tile_kernels_avx512bf16_built() { return nullptr; }
}  // namespace longctx::attn

#endif
