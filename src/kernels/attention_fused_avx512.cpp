// The fused tiles (forward and backward) for AVX-512 (attention_fused_impl.h). This file
// alone is compiled with -mavx512f on x86 (CMakeLists.txt); the kernels run
// only where fused_tile_kernels_avx512() says the CPU has it.
#include "kernels/attention_fused.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "kernels/attention_fused_impl.h"
#include "kernels/avx512_lanes.h"

namespace longctx::attn {

namespace {

constexpr FusedTileKernels kAvx512 = fused_impl::kernels_of<Avx512>("AVX-512");

}  // namespace

const FusedTileKernels* fused_tile_kernels_avx512_built() { return &kAvx512; }

}  // namespace longctx::attn

#else  // not built for AVX-512

namespace longctx::attn {
const FusedTileKernels* fused_tile_kernels_avx512_built() { return nullptr; }
}  // namespace longctx::attn

#endif
