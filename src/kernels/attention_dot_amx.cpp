// The bf16 dot kernels on AMX-BF16 tiles (attention_dot_impl.h, tiles). This
// file alone is compiled with -mamx-tile -mamx-bf16 on x86 (CMakeLists.txt);
// the kernels run only where dot_tile_kernels_amx() says the CPU has AMX,
// Linux granted the tile data, and oneDNN's ISA is not capped below it.
#include "kernels/attention_dot.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "kernels/attention_dot_impl.h"
#include "kernels/avx512_lanes.h"
#include "kernels/gemm.h"

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
    static const Config config = [] {
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

// Linux hands out the AMX tile data only on request (arch_prctl, once per
// process; oneDNN asks too).
bool tile_data_granted() {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const DotTileKernels* dot_tile_kernels_amx() {
  static const DotTileKernels kernels = tiles::kernels_of<Amx, Avx512Bf16Convert, Avx512>("AMX-BF16", fused_tile_kernels_avx512());
  static const bool runs = fused_tile_kernels_avx512() && __builtin_cpu_supports("amx-bf16") &&
                           onednn_bf16_isa() == Bf16Isa::amx && tile_data_granted();
  return runs ? &kernels : nullptr;
}

}  // namespace longctx::attn

#else  // not built for AMX

namespace longctx::attn {
const DotTileKernels* dot_tile_kernels_amx() { return nullptr; }
}  // namespace longctx::attn

#endif
