#pragma once
// Row-major GEMM through oneDNN: C = alpha * op(A) op(B) + beta * C.
// The one way longctx multiplies matrices; called inside OpenMP regions it
// runs on the calling thread (nested parallelism is off).
#include <cstdint>

#include "core/tensor.h"

namespace longctx {

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc);

// Measures the GEMM rate (GFLOP/s) of an n x n x n product in `dtype` (fp32 today; bf16 throws until
// a bf16 GEMM lands) with the
// current OpenMP thread count: the reference that benchmarks and MFU divide by.
double measure_gemm_gflops(DType dtype, int64_t n = 2048, double min_seconds = 0.5);

}  // namespace longctx
