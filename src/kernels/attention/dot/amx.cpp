// The bf16 dot kernels on AMX-BF16 tiles (attention/dot/dot_impl.h, tiles). This
// file alone is compiled with -mamx-tile -mamx-bf16 on x86 (CMakeLists.txt);
// the kernels run only where kernels/cpu/select.cpp found the CPU has AMX,
// Linux granted the tile data (cpu/features.cpp asks), and oneDNN's ISA is
// not capped below it. The table is constant-initialized: no code of this
// file runs before that check.
#include "kernels/attention/dot/dot.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <immintrin.h>

#include <cstring>

#include "kernels/attention/dot/dot_impl.h"
#include "kernels/simd/avx512_lanes.h"
#include "kernels/simd/convert.h"

namespace longctx::attn {

namespace {

struct Amx {
  // Palette 1, tiles 0-7 each 16 rows of 64 bytes.
  struct alignas(64) Config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  };
  static void configure() {
    static constexpr Config config = [] {
      Config c;
      for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
      return c;
    }();
    _tile_loadconfig(&config);
  }
  static void release() { _tile_release(); }
  template <int t>
  static void zero();
  template <int t>
  static void load(const void* p, int64_t stride);
  template <int t>
  static void store(void* p, int64_t stride);
  template <int c, int a, int b>
  static void dp();
};

// The intrinsics take the tile's number as a literal (GCC pastes it into
// the register name): one specialisation per tile and per product used.
#define LONGCTX_AMX_LOAD(t)                              \
  template <>                                            \
  void Amx::load<t>(const void* p, int64_t stride) {     \
    _tile_loadd(t, p, stride);                           \
  }
#define LONGCTX_AMX_ACCUMULATOR(t)                       \
  LONGCTX_AMX_LOAD(t)                                    \
  template <>                                            \
  void Amx::zero<t>() {                                  \
    _tile_zero(t);                                       \
  }                                                      \
  template <>                                            \
  void Amx::store<t>(void* p, int64_t stride) {          \
    _tile_stored(t, p, stride);                          \
  }
LONGCTX_AMX_ACCUMULATOR(0)  // tiles 0-3: C (zeroed, loaded, stored)
LONGCTX_AMX_ACCUMULATOR(1)
LONGCTX_AMX_ACCUMULATOR(2)
LONGCTX_AMX_ACCUMULATOR(3)
LONGCTX_AMX_LOAD(4)  // tiles 4-7: the operands (loaded only)
LONGCTX_AMX_LOAD(5)
LONGCTX_AMX_LOAD(6)
LONGCTX_AMX_LOAD(7)
#undef LONGCTX_AMX_ACCUMULATOR
#undef LONGCTX_AMX_LOAD
#define LONGCTX_AMX_DP(c, a, b)  \
  template <>                    \
  void Amx::dp<c, a, b>() {      \
    _tile_dpbf16ps(c, a, b);     \
  }
LONGCTX_AMX_DP(0, 4, 6)
LONGCTX_AMX_DP(1, 4, 7)
LONGCTX_AMX_DP(2, 5, 6)
LONGCTX_AMX_DP(3, 5, 7)
#undef LONGCTX_AMX_DP

// tiles::pack_kv's bytes (V^T, or K^T: [cols32 / 32][up(D, 32)][32], zero padded)
// on AVX-512: the scalar transpose was 8-9% of the forward. Two kv rows
// interleave into 16 bf16 pairs (32-bit words, [kv pair][d]); a 16 x 16
// transpose of those words gives 16 d rows of 32 kv columns each.
inline void transpose_16x16_epi32(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane L: rows 2i, 2i+1 at columns 4L..4L+3
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + k], lane L: rows 4i..4i+3 of column 4L + k
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {  // column 4L + k: lane L of r[k], r[4 + k], r[8 + k], r[12 + k]
    const __m512i a = _mm512_shuffle_i32x4(r[k], r[4 + k], 0x44), b = _mm512_shuffle_i32x4(r[k], r[4 + k], 0xee);
    const __m512i c = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0x44);
    const __m512i d = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], 0xee);
    t[k] = _mm512_shuffle_i32x4(a, c, 0x88), t[4 + k] = _mm512_shuffle_i32x4(a, c, 0xdd);
    t[8 + k] = _mm512_shuffle_i32x4(b, d, 0x88), t[12 + k] = _mm512_shuffle_i32x4(b, d, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

void pack_kv_avx512(const bf16* x, int64_t ld_x, int64_t cols, int64_t D, bf16* packed) {
  const int64_t c32 = round_up(cols, tiles::kAlign), d32 = round_up(D, 32);
  for (int64_t c0 = 0; c0 < c32; c0 += 32) {
    for (int64_t c = c0 + 32; c < std::min(cols, c0 + 64); ++c) prefetch_row(x + c * ld_x, D * 2);  // convert.h
    for (int64_t d0 = 0; d0 < d32; d0 += 16) {
      const __mmask16 in_d = d0 >= D ? 0 : D - d0 >= 16 ? 0xffff : __mmask16((1u << (D - d0)) - 1);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {  // kv rows c0 + 2i (low halves) and c0 + 2i + 1 (high)
        const int64_t c = c0 + 2 * i;
        const __m256i lo = c < cols ? _mm256_maskz_loadu_epi16(in_d, x + c * ld_x + d0) : _mm256_setzero_si256();
        const __m256i hi =
            c + 1 < cols ? _mm256_maskz_loadu_epi16(in_d, x + (c + 1) * ld_x + d0) : _mm256_setzero_si256();
        r[i] = _mm512_or_si512(_mm512_cvtepu16_epi32(lo), _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
      }
      transpose_16x16_epi32(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(packed + c0 * d32 + (d0 + i) * 32, r[i]);
    }
  }
}

constinit const DotTileKernels kAmx =
    tiles::kernels_of<Amx, Avx512Bf16Convert, Avx512>("AMX-BF16", &kFusedAvx512, &pack_kv_avx512);

}  // namespace

const DotTileKernels* dot_tile_kernels_amx_built() { return &kAmx; }

}  // namespace longctx::attn

#else  // not built for AMX

namespace longctx::attn {
const DotTileKernels* dot_tile_kernels_amx_built() { return nullptr; }
}  // namespace longctx::attn

#endif
