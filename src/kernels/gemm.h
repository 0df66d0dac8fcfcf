#pragma once
// Row-major GEMM through oneDNN: C = alpha * op(A) op(B) + beta * C.
// The one way longctx multiplies matrices; called inside OpenMP regions it
// runs on the calling thread (nested parallelism is off).
#include <cstdint>
#include <string>

#include "core/tensor.h"
#include "core/kernel_set.h"

namespace longctx {

// On the calling thread's device (core/device.h: its kernel set says how;
// a meta device counts the FLOPs). With the set's
// gemm_thread_count_independent (the run's deterministic_across_thread_counts;
// off by default, as oneDNN threads each product itself and its last bits
// depend on the thread count) a product outside a parallel region is cut
// into pieces that depend only on its shape, so results are bit-identical
// at any thread count; for gemm_f32 and gemm_bf16 alike.

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc);

// The same with bf16 inputs, fp32 accumulation and an fp32 C, on the
// kernel set's path (by default whichever of two is faster on this CPU,
// measured once per process: kernels/cpu/select.cpp): oneDNN's bf16 matmul, which picks the
// CPU's matrix units by itself (AMX-BF16, AVX512-BF16), or the operands
// widened to fp32 (exactly) and dnnl_sgemm, where the CPU has no bf16
// matmul or its bf16 dot products are slower than its fp32 FMAs (AVX512-BF16
// without AMX on Intel: half the rate). Primitives are created once per
// shape and cached; safe to call from several threads at once (each runs
// on its calling thread).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// gemm_f32 or gemm_bf16 as the operands' dtype says (A and B both `dtype`;
// C fp32): what the model and the profile measurement call.
void gemm(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);

// What gemm_bf16 runs for an n x n x n product (e.g.
// "brg:avx512_core_amx_bf16", or "bf16 widened to fp32, dnnl_sgemm (faster
// here than brg:avx512_core_bf16)"): benchmarks and run headers print it.
std::string gemm_bf16_implementation(int64_t n);

// The products of a kernel set for kernels that hold it already (the
// attention tiles, on their worker threads): gemm_f32 and gemm_bf16 with
// `set`'s settings, gemm_bf16 on `path` (native or widened).
void gemm_f32_on(const KernelSet& set, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16_on(const KernelSet& set, Bf16GemmPath path, bool trans_a, bool trans_b, int64_t M, int64_t N,
                  int64_t K, float alpha, const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta,
                  float* C, int64_t ldc);

// Whether oneDNN has a bf16 matmul for this CPU (its effective ISA has
// AVX512-BF16 or AMX-BF16; oneDNN 2.6.3 requests the Linux AMX tile-data
// permission itself and does without AMX where it is refused).
bool gemm_bf16_matmul_available();
// gemm_bf16's two paths timed on a 512^3 product, one thread (where the
// matmul is available): what kernels/cpu/select.cpp chooses by.
struct Bf16GemmRates {
  double native_gflops = 0, widened_gflops = 0;
};
Bf16GemmRates time_gemm_bf16_paths();

// Tests: the size of the calling thread's widening scratch (floats) after
// its calls so far (the set's gemm_widen_floats bounds it).
int64_t gemm_bf16_widen_scratch_floats();

// Measures the GEMM rate (GFLOP/s) of an n x n x n product in `dtype` with the
// current OpenMP thread count: the reference that benchmarks and MFU divide by.
double measure_gemm_gflops(DType dtype, int64_t n = 2048, double min_seconds = 0.5);

}  // namespace longctx
