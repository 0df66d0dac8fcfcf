#pragma once
// Row-major GEMM through oneDNN: C = alpha * op(A) op(B) + beta * C.
// The one way longctx multiplies matrices; called inside OpenMP regions it
// runs on the calling thread (nested parallelism is off).
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace longctx {

// Off by default: oneDNN threads each product itself, and its last bits
// depend on the thread count. On (deterministic_across_thread_counts), a
// product outside a parallel region is cut into pieces that depend only on
// its shape, so results are bit-identical at any thread count (src/kernels/gemm.cpp);
// for gemm_f32 and gemm_bf16 alike.
void set_gemm_thread_count_independent(bool on);

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc);

// The same with bf16 inputs, fp32 accumulation and an fp32 C: oneDNN's
// matmul primitive, which picks the CPU's matrix units by itself (AMX-BF16,
// AVX512-BF16) and falls back to a portable (slow, exact-in-fp32) kernel
// elsewhere. Primitives are created once per shape and cached; safe to call
// from several threads at once (each runs on its calling thread).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// gemm_f32 or gemm_bf16 as the operands' dtype says (A and B both `dtype`;
// C fp32): what the model and the profile measurement call.
void gemm(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The oneDNN implementation gemm_bf16 uses for an n x n x n product (e.g.
// "brg:avx512_core_amx_bf16" or "ref:any"): benchmarks print it.
std::string gemm_bf16_implementation(int64_t n);

// Whether gemm_bf16 runs on bf16 hardware: oneDNN has a bf16 matmul for this
// CPU and its effective ISA has bf16 dot products (AVX512-BF16 or AMX-BF16;
// oneDNN 2.6.3 requests the Linux AMX tile-data permission itself:
// amx::init() in src/cpu/x64/cpu_isa_traits.cpp calls
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) and mayiuse(amx_tile)
// is false when it is refused). Asked once, then cached.
bool gemm_bf16_is_native();

// Measures the GEMM rate (GFLOP/s) of an n x n x n product in `dtype` with the
// current OpenMP thread count: the reference that benchmarks and MFU divide by.
double measure_gemm_gflops(DType dtype, int64_t n = 2048, double min_seconds = 0.5);

}  // namespace longctx
