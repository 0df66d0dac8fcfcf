#pragma once
// Block-sparse flash attention, forward and backward, used by every
// context-parallel strategy (src/cp).
//
// Shapes (views may be strided; the head dim must be contiguous):
//   q, o, dq, dout   [B, Sq,  H, D]
//   k, v, dk, dv     [B, Skv, G, D]    GQA: H % G == 0, q head h reads kv head h / (H/G)
//   lse, delta       [B, Sq, H] fp32, contiguous (token-major, like O)
// Dtypes: q, k, v all fp32 or all bf16; o and dout each fp32 or bf16, on
// their own; lse, delta, dq, dk, dv always fp32. Scores, the softmax
// statistics (max, sum, LSE), the running output and every accumulation are
// fp32 (attention_tile_path says how bf16 tiles are multiplied).
//   q_pos / kv_pos   [B, Sq] / [B, Skv] int64 global positions (any permutation)
//   q_seg / kv_seg   [B, Sq] / [B, Skv] int32 segment (document) ids, or nullptr
//
// A fully masked row gives O = 0 and LSE = -inf; its gradients are 0.
#include <cstdint>
#include <limits>
#include <string>

#include "core/device.h"
#include "core/mask.h"
#include "core/tensor.h"
#include "core/vocabulary.h"
#include "core/kernel_set.h"

namespace longctx {

struct AttentionArgs {
  TensorView q, k, v;
  const int64_t* q_pos = nullptr;
  const int64_t* kv_pos = nullptr;
  const int32_t* q_seg = nullptr;  // required iff mask.same_segment
  const int32_t* kv_seg = nullptr;
  MaskSpec mask;
  float scale = 0.0f;  // 0 means 1/sqrt(D); else > 0 and finite
  KernelImpl impl = KernelImpl::fast;
};

// Counters a test or benchmark can read. Blocks are (q block, kv block) tiles
// of one (batch, q head) pair. The fast kernel ADDS to them (a caller can sum
// over ring steps); the reference leaves them alone.
struct AttentionStats {
  int64_t blocks_total = 0;    // all tiles
  int64_t blocks_partial = 0;  // computed with the elementwise mask
  int64_t blocks_full = 0;     // computed without the mask
  int64_t blocks_computed() const { return blocks_partial + blocks_full; }
};

// The fast kernel's tiles: square, kAttentionTile x kAttentionTile tokens,
// for every head dim (measured best for D = 64, 128 and 256: oneDNN's
// per-call packing is amortised and a tile's working set stays in a 1 MiB
// L2). Tests count non-empty tiles with it, the ring cuts its chunks on it,
// and the planner classifies tiles with it.
constexpr int64_t kAttentionTile = 128;

// How the fast kernel multiplies the tiles of q, k, v in `dtype`:
//   f32           fp32 inputs: fp32 tile copies, gemm_f32.
//   f32_fused     as f32, where the CPU has AVX2 and FMA or AVX-512 (asked at
//                 run time, capped by oneDNN's ISA): the tiles in
//                 hand-written vector kernels (attention/fused/fused.h), forward
//                 (Q K^T, online softmax, P V) and backward (Q K^T, dO V^T,
//                 the softmax gradient, dS K, and P^T dO, dS^T Q), the
//                 backward in units of up to 4 kv blocks. Same arithmetic
//                 as f32 (fp32 throughout), summed in another order and
//                 with the softmax scale applied to dS rather than to its
//                 products; the same results on AVX2 and AVX-512.
//   bf16_widened  bf16 inputs where gemm_bf16 widens (no bf16 matmul, or
//                 one slower than fp32: gemm_bf16_is_native is false) and
//                 the CPU has no fused kernels: tiles widened (exactly) to
//                 fp32 while copied, then the f32 path.
//   bf16_native   bf16 inputs where gemm_bf16 runs natively (AMX-BF16, or
//                 AVX512-BF16 that beats fp32: gemm_bf16_is_native): bf16
//                 tile copies and gemm_bf16 (fp32 accumulation and C); the P
//                 and dS tiles are rounded to bf16 for the P V, P^T dO, dS K
//                 and dS^T Q products, as flash attention implementations do.
//   bf16_fused    as bf16_widened with f32_fused's kernels, where gemm_bf16
//                 widens and the CPU has the fused kernels.
//   bf16_dot      bf16 inputs on the CPU's bf16 dot products (AVX512-BF16's
//                 vdpbf16ps, or AMX-BF16 tiles; attention/dot/dot.h), fused like
//                 bf16_fused: bf16 tile copies laid out for them, the fp32
//                 softmax of the fused kernels, and bf16_native's arithmetic
//                 (products exact, fp32 sums, P and dS rounded to bf16).
// The path is the kernel set's (core/kernel_set.h; the enum lives
// there), which the calling thread's device holds: on the CPU's
// (kernels/cpu/select.h), fp32 inputs run f32_fused where the CPU has the
// fused kernels, else f32; bf16 inputs run the fastest of the bf16 paths
// this CPU has, timed once per process on one thread (a forward and
// backward of 2048 tokens, 2 heads, D = 64, causal);
// LONGCTX_BF16_ATTENTION=dot|fused|native|widened pins it (an error where
// the CPU lacks it). Tests pin a path with a CPU device of their own
// (Device::make_cpu): a ShapeError where the set lacks its kernels.
AttentionTilePath attention_tile_path(DType dtype);  // the calling thread's device's
// Whether `path` rounds P and dS to bf16 for their products (bf16_native,
// bf16_dot): error bounds gain bf16's unit roundoff times their sums.
bool attention_path_rounds_p_and_ds(AttentionTilePath path);
// The path's name, with the ISA of `set`'s kernels.
std::string attention_tile_path_name(AttentionTilePath path, const KernelSet& set = current_kernels());
// Whether this CPU runs the fused paths (AVX2 and FMA, or AVX-512, and the
// kernels compiled in), and bf16_dot (AVX512-BF16 or AMX-BF16, not capped
// by ONEDNN_MAX_CPU_ISA): the CPU's kernel set has them.
bool attention_fused_tiles_supported();
bool attention_dot_tiles_supported();

// Scratch bytes one fast forward / backward call with q, k, v in `dtype`
// allocates (per thread, times `threads`) on `set`'s path: what the kernel
// allocates, and what a counting set's target kernels would (0 for an
// accelerator's: KernelSet::attention_tile_scratch).
int64_t attention_forward_scratch_bytes(int64_t head_dim, int64_t threads, DType dtype, const KernelSet& set);
int64_t attention_backward_scratch_bytes(int64_t head_dim, int64_t threads, DType dtype, const KernelSet& set);

// O (written) and LSE (written). A NaN in q, k or v makes O (and for q, k
// LSE) NaN in every row that attends to it, never a masked-looking zero (a
// NaN in v also reaches the rows of its tile that the mask hides from it:
// 0 x NaN); a fully masked row gives O = 0 and LSE = -inf.
void attention_forward(const AttentionArgs& args, const TensorView& o, float* lse,
                       AttentionStats* stats = nullptr);

// delta[b,s,h] = sum_d dout * o  (written, fp32 sums of the widened values).
// Needed once per row for backward.
void attention_delta(const TensorView& o, const TensorView& dout, float* delta);

// Gradients given the FINAL lse and delta of each q row (after any merge), so
// that running it on one kv shard is exact. dq, dk and dv are fp32 and
// ACCUMULATED (+=): the caller zeroes them once, then may call this for each
// kv shard (ring) and keep summing.
void attention_backward(const AttentionArgs& args, const TensorView& dout, const float* lse,
                        const float* delta, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, AttentionStats* stats = nullptr);

// Merges partial result b into a, exactly, in fp32 (o_a, o_b fp32):
//   lse = logaddexp(lse_a, lse_b); o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b.
// o_a, o_b [B, S, H, D]; lse_a, lse_b [B, S, H]. -inf on both sides stays o = 0, lse = -inf.
void attention_merge(const TensorView& o_a, float* lse_a, const TensorView& o_b,
                     const float* lse_b);

// Float64 naive reference of the same functions (same interface and dtypes,
// ignores impl): bf16 inputs are read as their exact values, widened.
void attention_forward_reference(const AttentionArgs& args, const TensorView& o, float* lse);
void attention_backward_reference(const AttentionArgs& args, const TensorView& dout,
                                  const float* lse, const float* delta, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv);

// Float64 sums of absolute values that bound how far a rounding inside the
// kernel (P or dS rounded to bf16, a partial dK, dV rounded on the wire) can
// move each output, for test bounds; with P = exp(S - lse) and
// dS = P (dO V^T - delta), written (not accumulated) into fp32 views:
//   o_abs  [B,Sq,H,D]  sum_j P_ij |V_j|          dq_abs [B,Sq,H,D]  scale sum_j |dS_ij| |K_j|
//   dk_abs [B,Skv,G,D] scale sum_i |dS_ij| |Q_i|  dv_abs [B,Skv,G,D] sum_i P_ij |dO_i|
void attention_abs_terms_reference(const AttentionArgs& args, const TensorView& dout, const float* lse,
                                   const float* delta, const TensorView& o_abs, const TensorView& dq_abs,
                                   const TensorView& dk_abs, const TensorView& dv_abs);

// Number of (q, kv) pairs the mask allows over all batches and q heads: the
// FLOP count basis (forward 4*D per pair, backward 10*D per pair).
int64_t attention_unmasked_pairs(const AttentionArgs& args);
// The same count, exact, from the fast kernel's tile classification: full
// tiles count whole, only partial tiles are checked pair by pair
// (O(tiles + partial tiles x tile area) instead of O(Sq * Skv)).
int64_t attention_unmasked_pairs_blocked(const AttentionArgs& args);

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace longctx
