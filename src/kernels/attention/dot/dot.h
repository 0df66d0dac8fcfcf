#pragma once
// The tile products of the bf16_dot tile path (attention.h) on the CPU's
// native bf16 instructions: AVX512-BF16 dot products (vdpbf16ps: two bf16
// products added to an fp32 lane) or AMX-BF16 tiles (16 x 16 fp32 += 16 x 32
// bf16 times 32 x 16). The softmax and its gradient stay fp32 (the fused
// kernels' softmax and softmax_grad, attention/fused/fused.h); P and dS are
// rounded to bf16 as the next product's operand, as flash attention
// implementations do (the arithmetic of bf16_native). Internal to
// src/kernels.
//
// Both ISAs, and their portable twins (plain C++ on any CPU, what the tests
// run everywhere), share these layouts (bf16 unless said; P = kDotPanel q
// rows per panel; Dd = the head dim rounded up to d_align, zero-padded):
//   qp  [panels][Dd/2][P][2]  Q (or dO) panels, pairs of d side by side
//   k   [cols][Dd]            K (or V) row-major, for S^T = K Q^T (dP^T = V dO^T)
//   s   [panels][cols][P]     fp32 scores, unscaled (the fused kernels' layout)
//   p2  [panels][kv/2][P][2]  P or dS, pairs of kv side by side (zero past cols,
//                             up to cols rounded to 32)
//   a   [panels][cols][P]     P or dS, plain (rows past the block zero)
//   b2  [rows/2][ld][2]       Q or dO, pairs of q rows side by side (ld: multiple of P)
//   packed                    V (forward) or K (backward, for dQ), as pack_kv
//                             writes it: its ISA's operand of pv. The packs of
//                             consecutive blocks of 32k rows, one after the
//                             other, are the pack of all their rows (the
//                             forward's kv runs take them in one pv call)
//   acc [panels][D][P]        fp32 running output (or dQ), transposed
#include <cstdint>

#include "core/tensor.h"
#include "kernels/attention/fused/fused.h"

namespace longctx::attn {

constexpr int64_t kDotPanel = 32;
// The forward's running max moves only where a tile's P = 2^(scale s - m)
// summed over its columns above 2^kLazyMax in some row: so P stays below
// 2^kLazyMax and the max trails the scores by at most kLazyMax (base 2;
// bf16 and fp32 hold it with room to spare, and the output and LSE are the
// same ratios). The common tile takes one pass over the scores and no
// rescale of the output (alpha exactly 1, which pv skips) instead of a max
// pass first (the forward 1.10-1.13x on AMX), and the test is on the sum
// the pass makes anyway, not a compare per score (the softmax 1.08x).
// 2^16, not less: a run of 256 columns whose scores rose a little past the
// max must not take the second pass.
constexpr float kLazyMax = 16.0f;

struct DotTileKernels {
  const char* isa;                 // "AVX512-BF16", "AMX-BF16", or a twin's name
  const FusedTileKernels* fp32;    // the masks of the fused kernels on the same panels (panel == kDotPanel)
  int64_t d_align;                 // the head dim of qp and k is padded to a multiple of this
  int64_t kv_align;                // k and a are written (zero) up to cols rounded to this
  // Elements of `packed` for cols x D.
  int64_t (*packed_elements)(int64_t cols, int64_t D);
  // packed from row-major x [cols][D] (row stride ld_x).
  void (*pack_kv)(const bf16* x, int64_t ld_x, int64_t cols, int64_t D, bf16* packed);
  // fp32's softmax (fp32->softmax and softmax_grad; the forward's max is
  // lazy, kLazyMax), P and dS rounded to bf16 (to nearest even) as they are
  // written, zero past cols up to cols rounded to kv_align. The scores come
  // unscaled; the softmax multiplies by scale (base 2) as it reads them, so
  // that no pass of its own rescales s (on AMX that pass was 40% of the
  // scores' time). The forward's: m, l, alpha as fp32->softmax (alpha
  // exactly 1 where the one pass ran); P into p2.
  void (*softmax_to_pairs)(const float* s, int64_t panels, int64_t cols, int64_t s_panel, float scale,
                           int64_t kv_align, float* m, float* l, float* alpha, bf16* p2);
  // The backward's: P = 2^(s_scale s - lse2) into a (pa), dS = scale P (dp - delta) into p2 (ds2) and a (dsa).
  void (*softmax_grad_to_bf16)(const float* s, const float* dp, int64_t panels, int64_t cols, int64_t s_panel,
                               float s_scale, const float* lse2, const float* delta, float scale, int64_t kv_align,
                               bf16* pa, bf16* ds2, bf16* dsa);
  // s[p][c][j] = sum_d k[c][d] qp[p][d][j], c < cols (kv_align rows computed).
  void (*scores)(const bf16* qp, int64_t panels, const bf16* k, int64_t cols, int64_t Dd, float* s, int64_t s_panel);
  // acc[p][d][j] = alpha[j] acc[p][d][j] + sum_c packed(c, d) p2[p][c][j].
  void (*pv)(const bf16* p2, int64_t panels, int64_t cols, int64_t p_panel, const bf16* packed, int64_t D,
             const float* alpha, float* acc);
  // out[c][x] += sum_q a[q / P][c][q % P] b2(q, x), q < rows rounded to even, x < ld.
  void (*panel_t_times)(const bf16* a, int64_t rows, int64_t cols, int64_t a_panel, const bf16* b2, int64_t ld,
                        float* out);
  // Where the products run on units of their own (AMX, and its portable
  // twin that the tests run everywhere; else null): the
  // forward's scores, softmax_to_pairs and pv of tiles with nothing masked,
  // the products of one panel overlapping the softmax of another.
  void (*forward_run)(const bf16* qp, int64_t panels, const bf16* k, int64_t cols, int64_t Dd, float* s,
                      int64_t s_panel, float scale, int64_t kv_align, float* m, float* l, float* alpha, bf16* p2,
                      const bf16* packed, int64_t D, float* acc);
};

// Each ISA file's kernels (null where the build did not compile them in).
// Only kernels/cpu/select.cpp calls these, after cpu_features() says the
// CPU runs the ISA (AMX: and Linux granted the tile data); the tables are
// constant (constinit), so nothing of an ISA file runs before that check.
const DotTileKernels* dot_tile_kernels_avx512bf16_built();
const DotTileKernels* dot_tile_kernels_amx_built();
// The AVX-512 fused kernels' table (attention/fused/avx512.cpp): the dot
// kernels' fp32 softmax and masks.
extern const FusedTileKernels kFusedAvx512;
// The twins, on any CPU: the AVX512-BF16 kernels' template on plain lanes,
// and the AMX kernels' template on emulated tiles.
const DotTileKernels* dot_tile_kernels_portable_lanes();
const DotTileKernels* dot_tile_kernels_portable_tiles();

// Layout helpers shared by the kernels' callers (attention.cpp) and tests.
inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
// Q (or dO) rows [rows][D] (row stride ld_x, fp32 or bf16 as `dtype`) into
// qp (panels, Dd = round_up(D, d_align)) and, if b2 is not null, b2
// ([round_up(rows, P) / 2][ld][2]); padding zero.
void dot_rows_to_panels(const void* x, DType dtype, int64_t ld_x, int64_t rows, int64_t D, int64_t Dd, int64_t ld,
                        bf16* qp, bf16* b2);
// K (or V) rows [cols][D] into k [kv rows][Dd], zero past D and past cols up to round_up(cols, kv_align).
void dot_rows(const void* x, DType dtype, int64_t ld_x, int64_t cols, int64_t D, int64_t Dd, int64_t kv_align,
              bf16* k);

}  // namespace longctx::attn
