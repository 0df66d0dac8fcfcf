#pragma once
// The tile arithmetic of the forward and the backward in hand-written vector
// kernels (the f32_fused and bf16_fused tile paths, attention.h), for
// AVX2/FMA and for AVX-512.
// Internal to src/kernels.
//
// A q block is kept transposed, as panels of `panel` q rows side by side
// (two vectors: 16 rows on AVX2, 32 on AVX-512), and so are its scores and
// its running output: S^T = K Q^T broadcasts K (row-major, as widened)
// against the vectors of q rows, and O^T += V^T P^T broadcasts V against the
// same vectors of P. No operand is packed per product (the widened K, V
// tiles are used as they are; Q is transposed once per q block, and in the
// backward Q and dO once per q block of a work unit), and the
// online softmax's reductions over kv (max, sum) and its rescaling of the
// output are elementwise across vectors, never horizontal. Layouts (fp32):
//   qp   [panels][D][panel]      q block transposed (rows past the block zero)
//   s    [panels][s_panel]       scores, then probabilities: [cols][panel] per panel
//   acc  [panels][D][panel]      running output, transposed
//   m, l, alpha [panels * panel] per q row: running max, sum (base 2), rescale factor
//   k, v [cols][D]               row-major
// The backward keeps Q and dO both ways (panels for S^T = K Q^T and
// dP^T = V dO^T; row-major, padded to a multiple of the panel, for dK and
// dV, whose lanes run along d), and dQ as panels (dQ^T += K^T dS^T is
// pv's product).
#include <cstdint>

namespace longctx::attn {

struct FusedTileKernels {
  int64_t panel;    // q rows per panel
  const char* isa;  // "AVX2/FMA" or "AVX-512"
  // s[p][c][j] = scale sum_d qp[p][d][j] k[c][d], for p < panels, c < cols.
  void (*scores)(const float* qp, int64_t panels, const float* k, int64_t cols, int64_t D, float scale, float* s,
                 int64_t s_panel);
  // One tile of the online softmax, per q row (m, l of a row that has seen
  // nothing allowed yet: -inf, 0):
  //   m' = max(m, max_c s[c]);  s[c] = 2^(s[c] - m');  alpha = 2^(m - m');
  //   l = alpha l + sum_c s[c];  m = m'.
  // A row with m' = -inf (nothing allowed yet) gets s = 0 and alpha = 0.
  void (*softmax)(float* s, int64_t panels, int64_t cols, int64_t s_panel, float* m, float* l, float* alpha);
  // acc[p][d][j] = alpha[p][j] acc[p][d][j] + sum_c s[p][c][j] v[c][d].
  void (*pv)(const float* s, int64_t panels, int64_t cols, int64_t s_panel, const float* v, int64_t D,
             const float* alpha, float* acc);
  // The backward's softmax gradient on a tile whose s holds the scores (base
  // 2, masked -inf) and ds holds dP^T, per q row j (lse2: the row's LSE in
  // base 2, +inf for a row that has nothing allowed, so that its P is 0):
  //   s[c][j] = P = 2^(s[c][j] - lse2[j]);  ds[c][j] = (P (ds[c][j] - delta[j])) scale.
  void (*softmax_grad)(float* s, float* ds, int64_t panels, int64_t cols, int64_t s_panel, const float* lse2,
                       const float* delta, float scale);
  // out[c][x] += sum_q a[q / panel][c][q % panel] b[q][x], q < rows in order,
  // for c < cols and x < ld: the tile's P^T dO (dV) or dS^T Q (dK) with b
  // row-major [rows][ld], out [cols][ld], ld a multiple of the panel.
  void (*panel_t_times)(const float* a, int64_t rows, int64_t cols, int64_t s_panel, const float* b, int64_t ld,
                        float* out);
};

// Each ISA file's kernels (null where the build did not compile them in: a
// non-x86 target). Only kernels/cpu/select.cpp calls these, and only after
// cpu_features() says this CPU runs the ISA; the tables are constant
// (constinit), so nothing of an ISA file runs before that.
const FusedTileKernels* fused_tile_kernels_avx2_built();
const FusedTileKernels* fused_tile_kernels_avx512_built();

}  // namespace longctx::attn
