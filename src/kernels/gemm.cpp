#include "kernels/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <vector>

#include "core/timer.h"

namespace longctx {

void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                beta, C, ldc);
  if (st != dnnl_success) throw ShapeError("dnnl_sgemm failed (bad sizes or leading dims)");
}

double measure_gemm_gflops(DType dtype, int64_t n, double min_seconds) {
  if (dtype != DType::f32) throw ConfigError("bf16 GEMM is not supported yet: use fp32");
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto once = [&] {
    gemm_f32(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  once();  // warm-up: page faults, oneDNN dispatch
  double best = 0.0;
  Timer total;
  int reps = 0;
  while (total.seconds() < min_seconds || reps < 3) {
    Timer t;
    once();
    best = std::max(best, 2.0 * n * n * n / t.seconds() / 1e9);
    ++reps;
  }
  return best;
}

}  // namespace longctx
