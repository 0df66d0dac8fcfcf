// The fused tiles (forward and backward) for AVX-512 (attention/fused/fused_impl.h). This file
// alone is compiled with -mavx512f on x86 (CMakeLists.txt); the kernels run
// only where kernels/cpu/select.cpp found the CPU has it. Its one table is
// constant-initialized: no code of this file runs before that check.
#include "kernels/attention/fused/fused.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include "kernels/attention/fused/fused_impl.h"
#include "kernels/simd/avx512_lanes.h"

namespace longctx::attn {

// Shared with the bf16 dot kernels' files (their fp32 softmax and masks).
extern constinit const FusedTileKernels kFusedAvx512 = fused_impl::kernels_of<Avx512>("AVX-512");

const FusedTileKernels* fused_tile_kernels_avx512_built() { return &kFusedAvx512; }

}  // namespace longctx::attn

#else  // not built for AVX-512

namespace longctx::attn {
const FusedTileKernels* fused_tile_kernels_avx512_built() { return nullptr; }
}  // namespace longctx::attn

#endif
