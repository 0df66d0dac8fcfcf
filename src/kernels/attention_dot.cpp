// The bf16 dot kernels' layouts (attention_dot.h) and their portable twins:
// the AVX512-BF16 template on plain C++ lanes and the AMX template on
// emulated tiles, with the instructions' documented arithmetic (Intel SDM,
// VDPBF16PS and TDPBF16PS: per fp32 lane, the odd pair's product added,
// then the even one's, each rounded to nearest; bf16 denormal inputs read
// as zero, denormal results flushed to zero). This file is compiled with
// -ffp-contract=off (CMakeLists.txt), as the lanes need.
#include "kernels/attention_dot.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/attention_dot_impl.h"
#include "kernels/attention_fused_impl.h"
#include "kernels/portable_lanes.h"

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

constexpr DotTileKernels kPortableLanes = lanes::kernels_of<PortableDotLanes>("portable lanes (AVX512-BF16's twin)", &kPortableFp32);
constexpr DotTileKernels kPortableTiles = tiles::kernels_of<PortableTiles>("portable tiles (AMX-BF16's twin)", &kPortableFp32);

// Row r of x (fp32 or bf16) as bf16 bits: rounded to nearest even, or as is.
inline uint16_t bits_at(const void* x, DType dtype, int64_t i) {
  if (dtype == DType::bf16) return static_cast<const bf16*>(x)[i].bits;
  return bf16::round_bits(std::bit_cast<uint32_t>(static_cast<const float*>(x)[i]));
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
  uint16_t* q = reinterpret_cast<uint16_t*>(qp);
  uint16_t* b = reinterpret_cast<uint16_t*>(b2);  // may be null: no row pairs wanted
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = r * ld_x;
    uint16_t* panel = q + (r / P) * Dd * P + (r % P) * 2;  // [Dd/2][P][2]
    uint16_t* pairs = b2 ? b + (r / 2) * ld * 2 + r % 2 : nullptr;  // [rows/2][ld][2]
    for (int64_t d = 0; d < D; ++d) {
      const uint16_t v = bits_at(x, dtype, row + d);
      panel[(d / 2) * P * 2 + d % 2] = v;
      if (b2) pairs[d * 2] = v;
    }
  }
}

void dot_rows(const void* x, DType dtype, int64_t ld_x, int64_t cols, int64_t D, int64_t Dd, int64_t kv_align,
              bf16* k) {
  const int64_t padded = round_up(cols, kv_align);
  uint16_t* out = reinterpret_cast<uint16_t*>(k);
  for (int64_t c = 0; c < padded; ++c) {
    uint16_t* row = out + c * Dd;
    int64_t d = 0;
    if (c < cols && dtype == DType::bf16) {
      std::memcpy(row, static_cast<const bf16*>(x) + c * ld_x, D * sizeof(bf16));
      d = D;
    }
    for (; d < Dd; ++d) row[d] = c < cols && d < D ? bits_at(x, dtype, c * ld_x + d) : 0;
  }
}

void dot_round(const float* s, int64_t panels, int64_t cols, int64_t s_panel, int64_t kv_align, bf16* p2, bf16* a) {
  constexpr int64_t P = kDotPanel;
  const int64_t padded = round_up(cols, kv_align);
  for (int64_t p = 0; p < panels; ++p) {
    const float* sp = s + p * s_panel;
    if (a) {
      uint16_t* ap = reinterpret_cast<uint16_t*>(a) + p * s_panel;
      for (int64_t x = 0; x < cols * P; ++x) ap[x] = bf16::round_bits(std::bit_cast<uint32_t>(sp[x]));
      std::fill(ap + cols * P, ap + padded * P, uint16_t(0));
    }
    if (p2) {
      uint32_t* pp = reinterpret_cast<uint32_t*>(p2) + p * s_panel / 2;  // [kv/2][P] pairs
      for (int64_t c = 0; c < padded; c += 2)
        for (int64_t j = 0; j < P; ++j) {
          const uint32_t lo = c < cols ? bf16::round_bits(std::bit_cast<uint32_t>(sp[c * P + j])) : 0;
          const uint32_t hi = c + 1 < cols ? bf16::round_bits(std::bit_cast<uint32_t>(sp[(c + 1) * P + j])) : 0;
          pp[(c / 2) * P + j] = lo | hi << 16;
        }
    }
  }
}

}  // namespace longctx::attn
