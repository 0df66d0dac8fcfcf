#pragma once
// The forward's tile arithmetic in hand-written AVX2/FMA kernels (the
// bf16_fused tile path, attention.h). Internal to src/kernels.
//
// A q block is kept transposed, as panels of kPanel q rows side by side, and
// so are its scores and its running output: S^T = K Q^T broadcasts K
// (row-major, as widened) against vectors of 16 q rows, and O^T += V^T P^T
// broadcasts V against the same vectors of P. No operand is packed per
// product (the widened K, V tiles are used as they are; Q is transposed once
// per q block), and the online softmax's reductions over kv (max, sum) and
// its rescaling of the output are elementwise across vectors, never
// horizontal. Layouts (fp32):
//   qp   [panels][D][16]         q block transposed (rows past the block zero)
//   s    [panels][s_panel]       scores, then probabilities: [cols][16] per panel
//   acc  [panels][D][16]         running output, transposed
//   m, l, alpha [panels * 16]    per q row: running max, sum (base 2), rescale factor
//   k, v [cols][D]               row-major
#include <cstdint>

namespace longctx::attn {

constexpr int64_t kPanel = 16;

// Whether the kernels below were compiled (x86: for AVX2 + FMA) and this CPU
// has AVX2 and FMA (asked at run time). The kernels run only when it is true.
bool fused_tiles_supported();
bool fused_tiles_built();  // the first half: compiled in

// s[p][c][j] = scale sum_d qp[p][d][j] k[c][d], for p < panels, c < cols.
void fused_scores(const float* qp, int64_t panels, const float* k, int64_t cols, int64_t D, float scale,
                  float* s, int64_t s_panel);

// One tile of the online softmax, per q row (m, l of a row that has seen
// nothing allowed yet: -inf, 0):
//   m' = max(m, max_c s[c]);  s[c] = 2^(s[c] - m');  alpha = 2^(m - m');
//   l = alpha l + sum_c s[c];  m = m'.
// A row with m' = -inf (nothing allowed yet) gets s = 0 and alpha = 0.
void fused_softmax(float* s, int64_t panels, int64_t cols, int64_t s_panel, float* m, float* l, float* alpha);

// acc[p][d][j] = alpha[p][j] acc[p][d][j] + sum_c s[p][c][j] v[c][d].
void fused_pv(const float* s, int64_t panels, int64_t cols, int64_t s_panel, const float* v, int64_t D,
              const float* alpha, float* acc);

}  // namespace longctx::attn
