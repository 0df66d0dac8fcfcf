// The bf16 dot kernels' layouts (attention/dot/dot.h) and their portable twins:
// the AVX512-BF16 template on plain C++ lanes and the AMX template on
// emulated tiles, with the instructions' documented arithmetic (Intel SDM,
// VDPBF16PS and TDPBF16PS: per fp32 lane, the odd pair's product added,
// then the even one's, each rounded to nearest; bf16 denormal inputs read
// as zero, denormal results flushed to zero). This file is compiled with
// -ffp-contract=off (CMakeLists.txt), as the lanes need.
#include "kernels/attention/dot/dot.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention/dot/dot_impl.h"
#include "kernels/attention/fused/fused_impl.h"
#include "kernels/simd/portable_lanes.h"

namespace longctx::attn {

namespace {

float flush_denormal(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float widen(uint16_t b) { return flush_denormal(std::bit_cast<float>(uint32_t(b) << 16)); }

// One fp32 lane += the pair (a_lo, a_hi) . (b_lo, b_hi): odd product first.
float dot2_lane(float acc, uint32_t a, uint32_t b) {
  acc = flush_denormal(std::fma(widen(uint16_t(a >> 16)), widen(uint16_t(b >> 16)), acc));
  return flush_denormal(std::fma(widen(uint16_t(a)), widen(uint16_t(b)), acc));
}

using Lanes16 = PortableLanes<16, 8>;
constexpr FusedTileKernels kPortableFp32 = fused_impl::kernels_of<Lanes16>("portable, 16 lanes");

struct PortableDotLanes : Lanes16 {
  struct RB {
    uint32_t pair[16];
  };
  static RB loadb(const bf16* p) {
    RB r;
    std::memcpy(r.pair, p, sizeof r.pair);
    return r;
  }
  static RB pair(const bf16* p) {
    RB r;
    std::memcpy(&r.pair[0], p, 4);
    std::fill(r.pair + 1, r.pair + 16, r.pair[0]);
    return r;
  }
  static R dot2(R acc, RB a, RB b) {
    return each([&](int i) { return dot2_lane(acc.v[i], a.pair[i], b.pair[i]); });
  }
};

// Eight tiles of 16 rows x 64 bytes per thread, as the registers.
struct PortableTiles {
  struct Tile {
    uint8_t bytes[16][64];
  };
  static Tile* regs() {
    thread_local Tile t[8];
    return t;
  }
  static void configure() {}
  static void release() {}
  template <int t>
  static void zero() { std::memset(regs()[t].bytes, 0, sizeof(Tile)); }
  template <int t>
  static void load(const void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(regs()[t].bytes[r], static_cast<const char*>(p) + r * stride, 64);
  }
  template <int t>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < 16; ++r) std::memcpy(static_cast<char*>(p) + r * stride, regs()[t].bytes[r], 64);
  }
  // c[m][n] += sum_k a[m][pair k] . b[k][pair n], k in order.
  template <int c, int a, int b>
  static void dp() {
    Tile &C = regs()[c], &A = regs()[a], &B = regs()[b];
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float acc;
        std::memcpy(&acc, C.bytes[m] + 4 * n, 4);
        for (int k = 0; k < 16; ++k) {
          uint32_t x, y;
          std::memcpy(&x, A.bytes[m] + 4 * k, 4);
          std::memcpy(&y, B.bytes[k] + 4 * n, 4);
          acc = dot2_lane(acc, x, y);
        }
        std::memcpy(C.bytes[m] + 4 * n, &acc, 4);
      }
  }
};

// The softmax's conversions with bf16's own rounding (core/tensor.h).
struct PortableConvert {
  static void plain32(const float* x, uint16_t* out) {
    for (int i = 0; i < 32; ++i) out[i] = bf16::round_bits(std::bit_cast<uint32_t>(x[i]));
  }
  static void pairs16(const float* lo, const float* hi, uint32_t* out) {
    for (int i = 0; i < 16; ++i)
      out[i] = bf16::round_bits(std::bit_cast<uint32_t>(lo[i])) | uint32_t(bf16::round_bits(std::bit_cast<uint32_t>(hi[i]))) << 16;
  }
  static void pairs16(const Lanes16::R& lo, const Lanes16::R& hi, uint32_t* out) {
    pairs16(lo.v, hi.v, out);
  }
};

constexpr DotTileKernels kPortableLanes = lanes::kernels_of<PortableDotLanes, PortableConvert, Lanes16>("portable lanes (AVX512-BF16's twin)", &kPortableFp32);
constexpr DotTileKernels kPortableTiles = tiles::kernels_of<PortableTiles, PortableConvert, Lanes16>("portable tiles (AMX-BF16's twin)", &kPortableFp32);

// Row r of x (fp32 or bf16) as bf16 bits: rounded to nearest even, or as is.
inline uint16_t bits_at(const void* x, DType dtype, int64_t i) {
  if (dtype == DType::bf16) return static_cast<const bf16*>(x)[i].bits;
  return bf16::round_bits(std::bit_cast<uint32_t>(static_cast<const float*>(x)[i]));
}
inline const char* bytes_at(const void* x, DType dtype, int64_t i) {
  return static_cast<const char*>(x) + i * int64_t(dtype_size(dtype));
}

}  // namespace

const DotTileKernels* dot_tile_kernels_portable_lanes() { return &kPortableLanes; }
const DotTileKernels* dot_tile_kernels_portable_tiles() { return &kPortableTiles; }

void dot_rows_to_panels(const void* x, DType dtype, int64_t ld_x, int64_t rows, int64_t D, int64_t Dd, int64_t ld,
                        bf16* qp, bf16* b2) {
  constexpr int64_t P = kDotPanel;
  const int64_t padded = round_up(rows, P);
  std::fill(qp, qp + padded * Dd, bf16());
  if (b2) std::fill(b2, b2 + padded * ld, bf16());
  // One row as bf16 bits, an even count. A local buffer: a thread_local one
  // made the backward 15% slower (its data pointer reloaded in every loop).
  std::vector<uint16_t> row(round_up(D, 2) + 1, 0);
  uint32_t* panels = reinterpret_cast<uint32_t*>(qp);  // pairs of d: [panels][Dd/2][P]
  uint32_t* pairs = reinterpret_cast<uint32_t*>(b2);   // pairs of rows: [rows/2][ld]
  const int64_t row_bytes = D * int64_t(dtype_size(dtype));
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kPrefetchRows < rows) prefetch_row(bytes_at(x, dtype, (r + kPrefetchRows) * ld_x), row_bytes);
    for (int64_t d = 0; d < D; ++d) row[d] = bits_at(x, dtype, r * ld_x + d);
    uint32_t* panel = panels + (r / P) * (Dd / 2) * P + r % P;
    for (int64_t t = 0; t < (D + 1) / 2; ++t) panel[t * P] = uint32_t(row[2 * t]) | uint32_t(row[2 * t + 1]) << 16;
    if (!b2) continue;
    uint32_t* out = pairs + (r / 2) * ld;  // row r's bits in the low (even r) or high (odd r) half
    const int shift = r % 2 ? 16 : 0;
    for (int64_t d = 0; d < D; ++d) out[d] |= uint32_t(row[d]) << shift;
  }
}

void dot_rows(const void* x, DType dtype, int64_t ld_x, int64_t cols, int64_t D, int64_t Dd, int64_t kv_align,
              bf16* k) {
  const int64_t padded = round_up(cols, kv_align), row_bytes = D * int64_t(dtype_size(dtype));
  uint16_t* out = reinterpret_cast<uint16_t*>(k);
  for (int64_t c = 0; c < padded; ++c) {
    if (c + kPrefetchRows < cols) prefetch_row(bytes_at(x, dtype, (c + kPrefetchRows) * ld_x), row_bytes);
    uint16_t* row = out + c * Dd;
    int64_t d = 0;
    if (c < cols && dtype == DType::bf16) {
      std::memcpy(row, static_cast<const bf16*>(x) + c * ld_x, D * sizeof(bf16));
      d = D;
    }
    for (; d < Dd; ++d) row[d] = c < cols && d < D ? bits_at(x, dtype, c * ld_x + d) : 0;
  }
}

}  // namespace longctx::attn
