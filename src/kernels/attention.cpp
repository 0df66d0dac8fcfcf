// Block-sparse flash attention on CPUs (the interface: attention.h).
//
// Every (q block, kv block) tile of a (batch, head) is classified from the
// bounds of its positions and segment ids before any FLOP: empty tiles are
// skipped, full tiles skip the elementwise mask. Tiles are copied out of the
// strided views (widened from bf16 unless multiplied natively), then
// multiplied with oneDNN GEMMs on the calling thread or run by the fused
// vector kernels (attention_fused.h; attention.h says which path runs
// where); the softmax works in base 2 (scale * log2(e) folded into the
// Q K^T product) with a vectorised exp2.
//
// Forward: one work unit per (batch, q head, group of q blocks), running
// softmax over its kv blocks. Backward: one unit per (batch, kv head, group
// of kv blocks: 1 on the gemm paths), so that a few heads over a long
// sequence still feed every thread; dK, dV of the unit stay in per-thread
// accumulators, and each unit's dQ sum for a q block is added in unit order
// (a per-(batch, head, q block) turn), so the result is bit-identical at
// any thread count. Forward units run head by head, heaviest first within a
// head; backward units head by head in kv order.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/memory.h"
#include "kernels/attention.h"
#include "kernels/attention_fused.h"
#include "kernels/attention_tiles.h"
#include "kernels/convert.h"
#include "kernels/gemm.h"

namespace longctx {

using attn::BlockBounds;
using attn::TileKind;

namespace {

// Tests and benchmarks: a path forced for fp32 or bf16 inputs (automatic: none).
std::atomic<AttentionTilePath> g_forced_f32_path{AttentionTilePath::automatic};
std::atomic<AttentionTilePath> g_forced_bf16_path{AttentionTilePath::automatic};
// Tests: the fused backward's kv blocks per unit (0: automatic).
std::atomic<int64_t> g_forced_backward_kv_blocks{0};

// q blocks per forward work unit, sharing each K, V tile copy (forward_fast).
constexpr int64_t kForwardQBlocks = 4;

// kv blocks per backward work unit on the fused path (backward_fast): its
// tiles are quick enough that building a q block's panels and adding its dQ
// once per tile cost a third of its backward (S = 8192, D = 128, 1
// thread), so up to 4 kv blocks share them. The scratch is sized for 4.
constexpr int64_t kFusedBackwardKvBlocks = 4;

// One thread's scratch: `floats` fp32 values, then `copies` tile copies of
// [kAttentionTile, D] in the tile dtype, then (bf16 tiles) one bf16
// [kAttentionTile, kAttentionTile] for P or dS as a product's operand.
int64_t per_thread_scratch_bytes(int64_t floats, int64_t copies, int64_t D, AttentionTilePath path) {
  const int64_t b = kAttentionTile;
  if (path != AttentionTilePath::bf16_native) return (floats + copies * b * D) * int64_t(sizeof(float));
  return floats * int64_t(sizeof(float)) + (copies * b * D + b * b) * int64_t(sizeof(bf16));
}

bool is_fused(AttentionTilePath path) {
  return path == AttentionTilePath::f32_fused || path == AttentionTilePath::bf16_fused;
}

}  // namespace

AttentionTilePath attention_tile_path(DType dtype) {
  const bool f32 = dtype == DType::f32;
  const AttentionTilePath forced = (f32 ? g_forced_f32_path : g_forced_bf16_path).load();
  if (forced != AttentionTilePath::automatic) return forced;
  // The fused kernels (attention_fused.h) against oneDNN's sgemm on the same
  // tiles: forward 76-82 vs 73 GFLOP/s a core on Zen 3 (AVX2, bf16, S = 8192,
  // D = 128); on an Intel Xeon (AVX-512), fp32 and bf16, D = 64 and 128, 1
  // and 2 threads, forward and backward faster
  // (bench/results/attention_fused_avx512.md). Native bf16 tiles win where
  // gemm_bf16 does (AMX: 6-8x).
  const bool fused = attention_fused_tiles_supported();
  if (f32) return fused ? AttentionTilePath::f32_fused : AttentionTilePath::f32;
  static const AttentionTilePath automatic = gemm_bf16_is_native() ? AttentionTilePath::bf16_native
                                             : fused               ? AttentionTilePath::bf16_fused
                                                                   : AttentionTilePath::bf16_widened;
  return automatic;
}

bool attention_fused_tiles_supported() { return attn::fused_tile_kernels() != nullptr; }

namespace attn {
// x86 only (the kernels are x86 vector code; elsewhere the files build empty).
const FusedTileKernels* fused_tile_kernels_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const FusedTileKernels* k =
      onednn_vector_isa() != VectorIsa::none && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
          ? fused_tile_kernels_avx2_built()
          : nullptr;
  return k;
#else
  return nullptr;
#endif
}
const FusedTileKernels* fused_tile_kernels_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  static const FusedTileKernels* k =
      onednn_vector_isa() == VectorIsa::avx512 && __builtin_cpu_supports("avx512f") ? fused_tile_kernels_avx512_built()
                                                                                     : nullptr;
  return k;
#else
  return nullptr;
#endif
}
const FusedTileKernels* fused_tile_kernels() {
  return fused_tile_kernels_avx512() ? fused_tile_kernels_avx512() : fused_tile_kernels_avx2();
}
}  // namespace attn

std::string attention_tile_path_name(AttentionTilePath path) {
  const std::string fused = std::string("fused ") +
                            (attention_fused_tiles_supported() ? attn::fused_tile_kernels()->isa : "(not on this CPU)") +
                            " forward and backward";
  switch (path) {
    case AttentionTilePath::f32: return "fp32 tiles, gemm_f32";
    case AttentionTilePath::f32_fused: return "fp32 tiles, " + fused;
    case AttentionTilePath::bf16_widened: return "bf16 widened to fp32 tiles, gemm_f32";
    case AttentionTilePath::bf16_native: return "bf16 tiles, gemm_bf16 (P, dS rounded to bf16)";
    case AttentionTilePath::bf16_fused: return "bf16 widened to fp32 tiles, " + fused;
    case AttentionTilePath::automatic: return "automatic";
  }
  return "";
}

void set_attention_tile_path(AttentionTilePath path) {
  check_shape(!is_fused(path) || attention_fused_tiles_supported(),
              "attention: a fused tile path needs a CPU with AVX2 and FMA (or AVX-512), and oneDNN's ISA not "
              "capped below it (ONEDNN_MAX_CPU_ISA)");
  const bool f32 = path == AttentionTilePath::f32 || path == AttentionTilePath::f32_fused;
  if (path == AttentionTilePath::automatic || f32) g_forced_f32_path = path;
  if (path == AttentionTilePath::automatic || !f32) g_forced_bf16_path = path;
  // Native tiles multiply natively too, whatever gemm_bf16 measured (still
  // widened where oneDNN has no bf16 matmul for this CPU).
  if (path == AttentionTilePath::automatic || !f32)
    force_gemm_bf16_path(path == AttentionTilePath::bf16_native ? Bf16GemmPath::native : Bf16GemmPath::automatic);
}

void set_attention_backward_kv_blocks(int64_t blocks) {
  check_shape(blocks >= 0 && blocks <= kFusedBackwardKvBlocks,
              "attention: the fused backward's kv blocks per unit must be 0 (automatic) to " +
                  std::to_string(kFusedBackwardKvBlocks));
  g_forced_backward_kv_blocks = blocks;
}

// Per thread, forward: fp32 s [bq, bk] scores then probabilities, and for
// each of the unit's kForwardQBlocks q blocks acc [bq, D], m and l [bq];
// contiguous copies of those q blocks' Q [bq, D], of K and V [bk, D]; on
// the fused path alpha [bq] (the output's rescale factors) after them.
namespace {
int64_t forward_scratch_bytes(int64_t D, int64_t threads, AttentionTilePath path) {
  const int64_t b = kAttentionTile, nb = kForwardQBlocks;
  const int64_t alpha = is_fused(path) ? b : 0;
  return threads * per_thread_scratch_bytes(b * b + nb * (b * D + 2 * b) + alpha, nb + 2, D, path);
}
}  // namespace
int64_t attention_forward_scratch_bytes(int64_t D, int64_t threads, DType dtype) {
  return forward_scratch_bytes(D, threads, attention_tile_path(dtype));
}

// Per thread, backward: fp32 s [bq, bk] (P), dp [bq, bk] (dP then dS),
// dk_acc, dv_acc [bk, D], dq_tile [bq, D]; contiguous copies of K, V [bk, D]
// and Q, dO [bq, D]. The fused path (fused_backward_tile) keeps dk_acc,
// dv_acc and the K, V copies for each of a unit's kv blocks, dk_acc and
// dv_acc with rows padded to Dp (D rounded up to the panel), dq_tile and
// the Q, dO copies as panels, Q and dO row-major too (padded to Dp), and
// per q row lse2, delta and ones [bq].
namespace {
int64_t padded_head_dim(int64_t D, const attn::FusedTileKernels& f) { return (D + f.panel - 1) / f.panel * f.panel; }

// The kv blocks of one backward unit: kFusedBackwardKvBlocks on the fused
// path where that still leaves at least 32 units (a shape rule, never the
// thread count: the grouping sets dQ's summation order), else 1 (the gemm
// path's tiles always run alone).
int64_t backward_kv_blocks(AttentionTilePath path, int64_t B, int64_t G, int64_t nk) {
  constexpr int64_t kMinUnits = 32;
  const int64_t nb = kFusedBackwardKvBlocks, forced = g_forced_backward_kv_blocks.load();
  if (!is_fused(path)) return 1;
  if (forced > 0) return forced;
  return B * G * ((nk + nb - 1) / nb) >= kMinUnits ? nb : 1;
}

int64_t backward_scratch_bytes(int64_t D, int64_t threads, AttentionTilePath path) {
  const int64_t b = kAttentionTile, nb = kFusedBackwardKvBlocks;
  if (!is_fused(path)) return threads * per_thread_scratch_bytes(2 * b * b + 3 * b * D, 4, D, path);
  const int64_t Dp = padded_head_dim(D, *attn::fused_tile_kernels());
  return threads * per_thread_scratch_bytes(2 * b * b + 2 * nb * b * Dp + b * D + 2 * b * Dp + 3 * b, 2 * nb + 2, D, path);
}
}  // namespace
int64_t attention_backward_scratch_bytes(int64_t D, int64_t threads, DType dtype) {
  return backward_scratch_bytes(D, threads, attention_tile_path(dtype));
}

namespace {

// A spin-wait hint (the wait for a dQ turn is usually shorter than a tile).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Geometry {
  int64_t B, Sq, Skv, H, G, D, group;
  int64_t bq, bk, nq, nk;  // tile sizes and counts
  float scale;             // softmax scale (natural units)
};

// fp32_only: dq, dk, dv (accumulated in fp32); q, k, v, o, dout may be bf16.
void check_view(const TensorView& t, const char* name, bool fp32_only = false) {
  check_shape(t.rank == 4, std::string("attention: ") + name + " must be rank 4");
  if (fp32_only) check_shape(t.dtype == DType::f32, std::string("attention: ") + name + " must be fp32");
  else check_shape(t.dtype == DType::f32 || t.dtype == DType::bf16,
                   std::string("attention: ") + name + " must be fp32 or bf16");
  check_shape(t.stride[3] == 1 || t.shape[3] <= 1,
              std::string("attention: the head dim of ") + name + " must be contiguous");
}

void check_same_shape(const TensorView& a, const TensorView& b, const char* name) {
  check_shape(a.shape == b.shape, std::string("attention: ") + name + " has shape " +
                                      b.shape_string() + ", expected " + a.shape_string());
}

Geometry geometry(const AttentionArgs& a) {
  check_view(a.q, "q");
  check_view(a.k, "k");
  check_view(a.v, "v");
  check_shape(a.k.dtype == a.q.dtype && a.v.dtype == a.q.dtype,
              "attention: q, k and v must have one dtype (all fp32 or all bf16)");
  Geometry g{};
  g.B = a.q.dim(0), g.Sq = a.q.dim(1), g.H = a.q.dim(2), g.D = a.q.dim(3);
  g.Skv = a.k.dim(1), g.G = a.k.dim(2);
  check_shape(a.k.dim(0) == g.B && a.k.dim(3) == g.D, "attention: k must be [B, Skv, G, D] with q's B and D");
  check_same_shape(a.k, a.v, "v");
  check_shape(g.G > 0 && g.H % g.G == 0, "attention: query heads (" + std::to_string(g.H) +
                                             ") must be a multiple of kv heads (" +
                                             std::to_string(g.G) + ")");
  check_shape(a.q_pos && a.kv_pos, "attention: positions are required");
  check_shape(!a.mask.same_segment || (a.q_seg && a.kv_seg),
              "attention: mask needs segment ids but none were given");
  g.group = g.H / g.G;
  g.scale = a.scale != 0.0f ? a.scale : static_cast<float>(1.0 / std::sqrt(double(g.D)));
  g.bq = g.bk = kAttentionTile;
  g.nq = (g.Sq + g.bq - 1) / g.bq, g.nk = (g.Skv + g.bk - 1) / g.bk;
  return g;
}

// Bounds of every q and kv block of every batch row; classifies tiles.
class TileMap {
 public:
  TileMap(const AttentionArgs& a, const Geometry& g) : mask_(a.mask) {
    const bool seg = a.mask.same_segment;
    for (int64_t b = 0; b < g.B; ++b) {
      q_.push_back(attn::block_bounds(a.q_pos + b * g.Sq, seg ? a.q_seg + b * g.Sq : nullptr,
                                      g.Sq, g.bq));
      kv_.push_back(attn::block_bounds(a.kv_pos + b * g.Skv, seg ? a.kv_seg + b * g.Skv : nullptr,
                                       g.Skv, g.bk));
    }
  }
  TileKind kind(int64_t b, int64_t i, int64_t j) const {
    return attn::classify_tile(mask_, q_[b][i], kv_[b][j]);
  }

 private:
  MaskSpec mask_;
  std::vector<std::vector<BlockBounds>> q_, kv_;  // [B][nq], [B][nk]
};

// A work unit: (batch, head, block: a group of q or kv blocks) with its
// number of non-empty tiles.
struct Unit {
  int64_t b, head, block, cost;
};

// Forward: head by head, so that the threads share one head's K, V in cache
// instead of streaming every head's from memory; heaviest first within a
// head, so that dynamic scheduling ends with small units.
void sort_for_locality(std::vector<Unit>& units) {
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) {
    if (x.b != y.b || x.head != y.head) return x.b != y.b ? x.b < y.b : x.head < y.head;
    return x.cost > y.cost;
  });
}

// Copies `rows` token rows of head h of a [B, S, heads, D] view, from token
// s0, into a contiguous [rows, D] tile, converting to the tile dtype T. The
// token rows of a view are heads * D elements apart, and at H * D * 4 = 4 KiB
// the tile's rows alias onto the same cache sets (measured at H = 8,
// S = 8192, 1 thread, fp32: 0.51 -> 0.73 of GEMM forward, 0.51 -> 0.68
// backward with the copies).
// Rows that far apart also defeat the hardware prefetcher (perf: the copies
// stalled on their loads, ~9% of the bf16 forward at S = 8192, 1 thread), so
// each row asks for the one kPrefetchRows ahead.
inline void prefetch_row_ahead(const TensorView& t, int64_t b, int64_t s0, int64_t h, int64_t r, int64_t rows,
                               int64_t D) {
  constexpr int64_t kPrefetchRows = 16, kLine = 64;
  if (r + kPrefetchRows >= rows) return;
  const char* ahead = element_ptr(t, {b, s0 + r + kPrefetchRows, h});
  for (int64_t x = 0; x < D * int64_t(dtype_size(t.dtype)); x += kLine) __builtin_prefetch(ahead + x);
}

template <class T>
void copy_rows(T* dst, const TensorView& t, int64_t b, int64_t s0, int64_t h, int64_t rows, int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    prefetch_row_ahead(t, b, s0, h, r, rows, D);
    if (t.dtype == DType::bf16) convert(t.at<bf16>({b, s0 + r, h}), dst + r * D, D);
    else convert(t.at<float>({b, s0 + r, h}), dst + r * D, D);
  }
}

// The tile products, on the tile dtype: C (fp32) = alpha op(A) op(B) + beta C.
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// An fp32 [rows, cols] tile (P or dS, row stride ld) as the operand of a
// product on tiles of type T: itself for fp32 tiles, rounded to bf16 into
// `buf` (same stride) for bf16 tiles.
const float* as_operand(const float* x, int64_t, int64_t, int64_t, float*) { return x; }
const bf16* as_operand(const float* x, int64_t rows, int64_t cols, int64_t ld, bf16* buf) {
  for (int64_t r = 0; r < rows; ++r) convert(x + r * ld, buf + r * ld, cols);
  return buf;
}

// Counts of the tiles a thread computed, by kind (AttentionStats).
struct TileCounts {
  int64_t partial = 0, full = 0;
};
#pragma omp declare reduction(+ : TileCounts : omp_out.partial += omp_in.partial, omp_out.full += omp_in.full)

// The scores tile s [rows, cols] (row stride bk) of q rows i0.. and kv
// columns j0.. of batch row b, in base 2: s = scale log2(e) Q K^T from the
// contiguous copies q [rows, D] and k [cols, D], the mask applied when the
// tile is partial (forbidden pairs -inf); counts the tile. The forward and
// the backward (which recomputes P) share it.
// Counts a computed tile by kind; when it is partial, sets the scores of
// the pairs the mask forbids to -inf: q rows i0..i0+rows, kv columns
// j0..j0+cols of batch row b, (r, c) at s[r * ld + c * col_stride].
void mask_scores(const AttentionArgs& a, const Geometry& g, TileKind kind, int64_t b, int64_t i0, int64_t rows,
                 int64_t j0, int64_t cols, float* s, int64_t ld, int64_t col_stride, TileCounts& counts) {
  if (kind != TileKind::partial) {
    ++counts.full;
    return;
  }
  ++counts.partial;
  const bool seg = a.mask.same_segment;
  attn::mask_tile(a.mask, s, rows, cols, ld, col_stride, a.q_pos + b * g.Sq + i0, a.kv_pos + b * g.Skv + j0,
                  seg ? a.q_seg + b * g.Sq + i0 : nullptr, seg ? a.kv_seg + b * g.Skv + j0 : nullptr);
}

template <class T>
void scores_tile(const AttentionArgs& a, const Geometry& g, TileKind kind, int64_t b, int64_t i0, int64_t rows,
                 int64_t j0, int64_t cols, const T* q, const T* k, float* s, TileCounts& counts) {
  tile_gemm(false, true, rows, cols, g.D, g.scale * kLog2e, q, g.D, k, g.D, 0.0f, s, g.bk);
  mask_scores(a, g, kind, b, i0, rows, j0, cols, s, g.bk, 1, counts);
}

// The fused path's panels of q rows (attention_fused.h): the panels of a q
// block of `rows` rows.
int64_t panels_of(int64_t rows, int64_t panel) { return (rows + panel - 1) / panel; }

// Copies `rows` token rows of head h of a [B, S, heads, D] view, from token
// s0, transposed into the fused path's panels qp [panels][D][panel],
// widened; the rows past `rows` of the last panel are zero. Row r also
// lands, widened, at rows_out + r * ld (ld = 0: one row's buffer).
void copy_rows_to_panels(float* qp, int64_t panel, const TensorView& t, int64_t b, int64_t s0, int64_t h,
                         int64_t rows, int64_t D, float* rows_out, int64_t ld) {
  const int64_t panels = panels_of(rows, panel);
  std::fill(qp + (panels - 1) * D * panel, qp + panels * D * panel, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    prefetch_row_ahead(t, b, s0, h, r, rows, D);
    float* row = rows_out + r * ld;
    load_f32(element_ptr(t, {b, s0 + r, h}), t.dtype, row, D);
    float* dst = qp + (r / panel) * D * panel + r % panel;
    for (int64_t d = 0; d < D; ++d) dst[d * panel] = row[d];
  }
}

// The mask of a partial tile on the fused path's panels of scores s
// (counted once).
void mask_panels(const attn::FusedTileKernels& f, const AttentionArgs& a, const Geometry& g, TileKind kind,
                 int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s, TileCounts& counts) {
  const int64_t s_panel = g.bk * f.panel;
  for (int64_t p = 0; p < panels_of(rows, f.panel); ++p) {
    const int64_t r0 = p * f.panel, p_rows = std::min(f.panel, rows - r0);
    TileCounts once;
    mask_scores(a, g, kind, b, i0 + r0, p_rows, j0, cols, s + p * s_panel, 1, f.panel, p == 0 ? counts : once);
  }
}

// One tile on the fused path: the scores, the mask (partial tiles), the
// online softmax and P V of a q block's panels qp, acc [panels][D][panel]
// against K, V [cols, D]; s holds the scores then P, panel after panel
// (bk x panel floats each).
void fused_tile(const attn::FusedTileKernels& f, const AttentionArgs& a, const Geometry& g, TileKind kind,
                int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, const float* qp, const float* k,
                const float* v, float* s, float* acc, float* m, float* l, float* alpha, TileCounts& counts) {
  const int64_t panels = panels_of(rows, f.panel), s_panel = g.bk * f.panel;
  f.scores(qp, panels, k, cols, g.D, g.scale * kLog2e, s, s_panel);
  mask_panels(f, a, g, kind, b, i0, rows, j0, cols, s, counts);
  f.softmax(s, panels, cols, s_panel, m, l, alpha);
  f.pv(s, panels, cols, s_panel, v, g.D, alpha, acc);
}

// One backward tile on the fused path (attention_fused.h): q rows i0..i0+rows
// (Q, dO as panels qp, dop and row-major qr, dor [rows][Dp]; lse2, delta
// per row, ones [bq]) against kv rows j0..j0+cols (K, V [cols][D]). Adds
// P^T dO to dv_acc and scale dS^T Q to dk_acc ([cols][Dp]), and scale dS K
// to dqp (panels); s and dp hold P and scale dS after it.
void fused_backward_tile(const attn::FusedTileKernels& f, const AttentionArgs& a, const Geometry& g,
                         TileKind kind, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t Dp,
                         const float* qp, const float* dop, const float* qr, const float* dor, const float* k,
                         const float* v, const float* lse2, const float* delta, const float* ones, float* s,
                         float* dp, float* dk_acc, float* dv_acc, float* dqp, TileCounts& counts) {
  const int64_t panels = panels_of(rows, f.panel), s_panel = g.bk * f.panel;
  f.scores(qp, panels, k, cols, g.D, g.scale * kLog2e, s, s_panel);  // S^T = K Q^T, base 2
  mask_panels(f, a, g, kind, b, i0, rows, j0, cols, s, counts);
  f.scores(dop, panels, v, cols, g.D, 1.0f, dp, s_panel);  // dP^T = V dO^T
  f.softmax_grad(s, dp, panels, cols, s_panel, lse2, delta, g.scale);
  f.panel_t_times(s, rows, cols, s_panel, dor, Dp, dv_acc);  // dV += P^T dO
  f.panel_t_times(dp, rows, cols, s_panel, qr, Dp, dk_acc);  // dK += scale dS^T Q
  f.pv(dp, panels, cols, s_panel, k, g.D, ones, dqp);  // dQ^T += scale K^T dS^T
}

void add_stats(AttentionStats* stats, const Geometry& g, const TileCounts& counts) {
  if (!stats) return;
  stats->blocks_total += g.B * g.H * g.nq * g.nk;
  stats->blocks_partial += counts.partial;
  stats->blocks_full += counts.full;
}

// T: the tile dtype (float, or bf16 on the native bf16 path).
// path: the tile path, read once by the caller (T = bf16 on bf16_native,
// else float); on a fused path Q, the scores and the output are kept as
// panels and the tiles run by the fused kernels (fused_tile).
template <class T>
void forward_fast(const AttentionArgs& a, const TensorView& o, float* lse, AttentionStats* stats,
                  AttentionTilePath path) {
  const attn::FusedTileKernels* fused = is_fused(path) ? attn::fused_tile_kernels() : nullptr;
  const Geometry g = geometry(a);
  check_view(o, "o");
  check_same_shape(a.q, o, "o");
  const TileMap map(a, g);

  // A unit is kForwardQBlocks consecutive q blocks of one head: each K, V
  // tile is copied once for all of them (the copies' reads of K, V were a
  // fifth of the forward's time per q block at S = 4096, H = 8, 1 thread).
  // Every q block still runs its kv blocks in order with the same
  // operations, so the result does not depend on the grouping.
  std::vector<Unit> units;
  const int64_t n_groups = (g.nq + kForwardQBlocks - 1) / kForwardQBlocks;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t grp = 0; grp < n_groups; ++grp) {
      int64_t cost = 0;
      for (int64_t i = grp * kForwardQBlocks; i < std::min(g.nq, (grp + 1) * kForwardQBlocks); ++i)
        for (int64_t j = 0; j < g.nk; ++j) cost += map.kind(b, i, j) != TileKind::empty;
      for (int64_t h = 0; h < g.H; ++h) units.push_back({b, h, grp, cost});
    }
  sort_for_locality(units);

  // Per thread: s [bq, bk], then per q block of a unit acc [bq, D], m, l
  // [bq]; then the Q copies of the unit's q blocks, K, V copies and (bf16
  // tiles) P or (fused) alpha [bq] (attention_forward_scratch_bytes).
  const int threads = omp_get_max_threads();
  const int64_t per_thread = forward_scratch_bytes(g.D, 1, path);
  Buffer scratch(MemCategory::scratch, "attention forward scratch",
                 forward_scratch_bytes(g.D, threads, path));
  const int64_t n_units = static_cast<int64_t>(units.size()), nb = kForwardQBlocks;
  TileCounts counts;

#pragma omp parallel reduction(+ : counts)
  {
    float* s = reinterpret_cast<float*>(scratch.as<char>() + per_thread * omp_get_thread_num());  // [bq, bk]
    float* acc_all = s + g.bq * g.bk;            // [nb, bq, D]
    float* m_all = acc_all + nb * g.bq * g.D;    // [nb, bq] running max (base 2)
    float* l_all = m_all + nb * g.bq;            // [nb, bq] running sum
    T* qc_all = reinterpret_cast<T*>(l_all + nb * g.bq);  // [nb, bq, D]
    T* kc = qc_all + nb * g.bq * g.D;                     // [bk, D]
    T* vc = kc + g.bk * g.D;                              // [bk, D]
    T* p_tile = vc + g.bk * g.D;  // [bq, bk] P as an operand (bf16 tiles only)
    float* alpha = reinterpret_cast<float*>(p_tile);  // [bq] (fused only; T is float there)
    std::vector<float> row(fused ? g.D : 0);          // one output row gathered from the panels
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n_units; ++u) {
      const Unit& unit = units[u];
      const int64_t b = unit.b, h = unit.head, kvh = h / g.group;
      const int64_t i_first = unit.block * nb, i_end = std::min(g.nq, i_first + nb);
      for (int64_t i = i_first; i < i_end; ++i) {
        const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
        // The fused path also runs the padding rows of the last panel (zero q rows, never stored).
        const int64_t run_rows = fused ? panels_of(rows, fused->panel) * fused->panel : rows;
        if (fused)
          copy_rows_to_panels(reinterpret_cast<float*>(qc_all) + x * g.bq * g.D, fused->panel, a.q, b, i0, h, rows, g.D,
                              row.data(), 0);
        else copy_rows(qc_all + x * g.bq * g.D, a.q, b, i0, h, rows, g.D);
        std::fill(acc_all + x * g.bq * g.D, acc_all + x * g.bq * g.D + run_rows * g.D, 0.0f);
        std::fill(m_all + x * g.bq, m_all + x * g.bq + run_rows, kNegInf);
        std::fill(l_all + x * g.bq, l_all + x * g.bq + run_rows, 0.0f);
      }
      for (int64_t j = 0; j < g.nk; ++j) {
        bool needed = false;
        for (int64_t i = i_first; i < i_end; ++i) needed = needed || map.kind(b, i, j) != TileKind::empty;
        if (!needed) continue;
        const int64_t j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        copy_rows(kc, a.k, b, j0, kvh, cols, g.D);
        copy_rows(vc, a.v, b, j0, kvh, cols, g.D);
        for (int64_t i = i_first; i < i_end; ++i) {
          const TileKind kind = map.kind(b, i, j);
          if (kind == TileKind::empty) continue;
          const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
          float* acc = acc_all + x * g.bq * g.D;
          float* m = m_all + x * g.bq;
          float* l = l_all + x * g.bq;
          if (fused) {
            fused_tile(*fused, a, g, kind, b, i0, rows, j0, cols, reinterpret_cast<const float*>(qc_all) + x * g.bq * g.D,
                       reinterpret_cast<const float*>(kc), reinterpret_cast<const float*>(vc), s, acc, m, l, alpha,
                       counts);
            continue;
          }
          scores_tile(a, g, kind, b, i0, rows, j0, cols, qc_all + x * g.bq * g.D, kc, s, counts);
          for (int64_t r = 0; r < rows; ++r) {
            float* sr = s + r * g.bk;
            const float row = attn::row_max(sr, cols);
            const float m_new = std::isnan(row) ? row : std::max(m[r], row);  // a NaN score stays NaN
            if (m_new == kNegInf) {  // nothing allowed in this row yet
              std::fill(sr, sr + cols, 0.0f);
              continue;
            }
            const float alpha = std::exp2(m[r] - m_new);  // 0 on the first allowed tile
            l[r] = l[r] * alpha + attn::exp2_shifted_inplace(sr, cols, m_new);
            if (alpha != 1.0f) attn::scale_row(acc + r * g.D, g.D, alpha);
            m[r] = m_new;
          }
          tile_gemm(false, false, rows, g.D, cols, 1.0f, as_operand(s, rows, cols, g.bk, p_tile), g.bk, vc, g.D,
                    1.0f, acc, g.D);
        }
      }
      for (int64_t i = i_first; i < i_end; ++i) {
        const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
        const float* m = m_all + x * g.bq;
        const float* l = l_all + x * g.bq;
        const float* acc = acc_all + x * g.bq * g.D;
        for (int64_t r = 0; r < rows; ++r) {
          float* out = fused ? row.data() : acc_all + (x * g.bq + r) * g.D;  // normalised in place, then stored in o's dtype
          if (fused)  // row r of the panels
            for (int64_t y = 0; y < g.D; ++y)
              out[y] = acc[((r / fused->panel) * g.D + y) * fused->panel + r % fused->panel];
          float* lse_r = lse + ((b * g.Sq + i0 + r) * g.H + h);
          if (l[r] != 0.0f) {  // also NaN (a NaN score): O and LSE NaN
            const float inv = 1.0f / l[r];
            for (int64_t y = 0; y < g.D; ++y) out[y] *= inv;
            *lse_r = (m[r] + std::log2(l[r])) * kLn2;
          } else {  // fully masked row
            std::fill(out, out + g.D, 0.0f);
            *lse_r = kNegInf;
          }
          store_f32(out, element_ptr(o, {b, i0 + r, h}), o.dtype, g.D);
        }
      }
    }
  }
  add_stats(stats, g, counts);
}

// One backward tile on oneDNN GEMMs: q rows i0..i0+rows (copies qi, doi
// [rows][D]; lse, delta of row 0, stride H) against kv rows j0..j0+cols
// (kj, vj [cols][D]). Adds P^T dO to dv_acc and scale dS^T Q to dk_acc
// ([cols][D]), and scale dS K to dq_tile [rows][D].
template <class T>
void backward_gemm_tile(const AttentionArgs& a, const Geometry& g, TileKind kind, int64_t b, int64_t i0,
                        int64_t rows, int64_t j0, int64_t cols, const T* qi, const T* doi, const T* kj,
                        const T* vj, const float* lse, const float* delta, float* s, float* dp, T* p_tile,
                        float* dk_acc, float* dv_acc, float* dq_tile, TileCounts& counts) {
  // P = exp(S - lse), in base 2.
  scores_tile(a, g, kind, b, i0, rows, j0, cols, qi, kj, s, counts);
  for (int64_t r = 0; r < rows; ++r) {
    const float l = lse[r * g.H];
    if (l == kNegInf) std::fill(s + r * g.bk, s + r * g.bk + cols, 0.0f);
    else attn::exp2_shifted_inplace(s + r * g.bk, cols, l * kLog2e);
  }
  // dV += P^T dO
  tile_gemm(true, false, cols, g.D, rows, 1.0f, as_operand(s, rows, cols, g.bk, p_tile), g.bk, doi, g.D, 1.0f,
            dv_acc, g.D);
  // dS = P * (dO V^T - delta)
  tile_gemm(false, true, rows, cols, g.D, 1.0f, doi, g.D, vj, g.D, 0.0f, dp, g.bk);
  for (int64_t r = 0; r < rows; ++r) attn::softmax_grad_row(s + r * g.bk, dp + r * g.bk, cols, delta[r * g.H]);
  const auto* ds = as_operand(dp, rows, cols, g.bk, p_tile);
  // dK += scale dS^T Q
  tile_gemm(true, false, cols, g.D, rows, g.scale, ds, g.bk, qi, g.D, 1.0f, dk_acc, g.D);
  // dQ += scale dS K
  tile_gemm(false, false, rows, g.D, cols, g.scale, ds, g.bk, kj, g.D, 1.0f, dq_tile, g.D);
}

template <class T>
void backward_fast(const AttentionArgs& a, const TensorView& dout, const float* lse,
                   const float* delta, const TensorView& dq, const TensorView& dk,
                   const TensorView& dv, AttentionStats* stats, AttentionTilePath path) {
  const attn::FusedTileKernels* fused = is_fused(path) ? attn::fused_tile_kernels() : nullptr;
  const Geometry g = geometry(a);
  check_view(dout, "dout");
  check_view(dq, "dq", true);
  check_view(dk, "dk", true);
  check_view(dv, "dv", true);
  check_same_shape(a.q, dout, "dout");
  check_same_shape(a.q, dq, "dq");
  check_same_shape(a.k, dk, "dk");
  check_same_shape(a.k, dv, "dv");
  const TileMap map(a, g);

  // A unit is nb consecutive kv blocks of one kv head (a group); the fused
  // path shares each Q, dO transposition and dQ sum among a group's blocks.
  const int64_t nb = backward_kv_blocks(path, g.B, g.G, g.nk), n_groups = (g.nk + nb - 1) / nb;
  auto group_has = [&](int64_t b, int64_t i, int64_t grp) {
    for (int64_t j = grp * nb; j < std::min(g.nk, (grp + 1) * nb); ++j)
      if (map.kind(b, i, j) != TileKind::empty) return true;
    return false;
  };
  std::vector<Unit> units;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t grp = 0; grp < n_groups; ++grp) {
      int64_t cost = 0;
      for (int64_t i = 0; i < g.nq; ++i)
        for (int64_t j = grp * nb; j < std::min(g.nk, (grp + 1) * nb); ++j) cost += map.kind(b, i, j) != TileKind::empty;
      if (cost == 0) continue;  // no gradient flows through these kv blocks
      for (int64_t kvh = 0; kvh < g.G; ++kvh) units.push_back({b, kvh, grp, cost});
    }
  // Head by head in group order: a q block's dQ sum of a group waits for the
  // previous group with a non-empty tile in its row (below), and every unit
  // claimed before this one comes earlier in this order, so the earliest
  // unfinished unit never waits and the schedule cannot deadlock. For causal
  // masks this is also heaviest first.
  std::stable_sort(units.begin(), units.end(), [](const Unit& x, const Unit& y) {
    if (x.b != y.b || x.head != y.head) return x.b != y.b ? x.b < y.b : x.head < y.head;
    return x.block < y.block;
  });

  // Per thread (attention_backward_scratch_bytes): s, dp [bq, bk]; per kv
  // block of a group dk_acc, dv_acc [bk, ld]; dq_tile [bq, D]; per kv block
  // K, V copies [bk, D]; Q, dO copies [bq, D]; (bf16 tiles) P or dS; (fused)
  // row-major Q, dO [bq, ld] and lse2, delta, ones [bq].
  const int threads = omp_get_max_threads();
  const int64_t per_thread = backward_scratch_bytes(g.D, 1, path);
  const int64_t ld = fused ? padded_head_dim(g.D, *fused) : g.D;  // row stride of dk_acc, dv_acc
  Buffer scratch(MemCategory::scratch, "attention backward scratch",
                 backward_scratch_bytes(g.D, threads, path));
  // dQ rows of one (batch, head, q block) receive sums from many units:
  // dq_last holds the group whose sum was added last (-1: none yet), and a
  // sum is added only right after the previous group with a non-empty tile
  // in its row, so dQ sums in group order whatever the threads' timing.
  const int64_t n_dq = g.B * g.H * g.nq;
  std::unique_ptr<std::atomic<int64_t>[]> dq_last(new std::atomic<int64_t>[n_dq]);
  for (int64_t x = 0; x < n_dq; ++x) dq_last[x].store(-1, std::memory_order_relaxed);
  const int64_t n_units = static_cast<int64_t>(units.size());
  // Units are claimed in list order (the deadlock argument above needs it;
  // an own counter rather than relying on how OpenMP hands out iterations).
  std::atomic<int64_t> next_unit{0};
  TileCounts counts;

#pragma omp parallel reduction(+ : counts)
  {
    float* s = reinterpret_cast<float*>(scratch.as<char>() + per_thread * omp_get_thread_num());  // [bq, bk]
    float* dp = s + g.bq * g.bk;                // [bq, bk]
    float* dk_all = dp + g.bq * g.bk;           // [nb, bk, ld]
    float* dv_all = dk_all + nb * g.bk * ld;    // [nb, bk, ld]
    float* dq_tile = dv_all + nb * g.bk * ld;   // [bq, D] (fused: panels)
    T* k_all = reinterpret_cast<T*>(dq_tile + g.bq * g.D);  // [nb, bk, D]
    T* v_all = k_all + nb * g.bk * g.D;                     // [nb, bk, D]
    T* qi = v_all + nb * g.bk * g.D;                        // [bq, D] (fused: panels)
    T* doi = qi + g.bq * g.D;                               // [bq, D] (fused: panels)
    T* p_tile = doi + g.bq * g.D;  // [bq, bk] P, then dS, as an operand (bf16 tiles only)
    // The fused path's (T = float) row-major Q, dO (padding columns zero) and per-row vectors.
    float* qr = fused ? reinterpret_cast<float*>(doi + g.bq * g.D) : nullptr;  // [bq, ld]
    float* dor = fused ? qr + g.bq * ld : nullptr;                             // [bq, ld]
    float* lse2 = fused ? dor + g.bq * ld : nullptr;                           // [bq]
    float* delta_i = fused ? lse2 + g.bq : nullptr;                            // [bq]
    float* ones = fused ? delta_i + g.bq : nullptr;                            // [bq]
    if (fused) {
      std::fill(qr, qr + 2 * g.bq * ld, 0.0f);
      std::fill(ones, ones + g.bq, 1.0f);
    }
    const char* carved_end = fused ? reinterpret_cast<const char*>(ones + g.bq)
                                   : reinterpret_cast<const char*>(p_tile + (std::is_same_v<T, bf16> ? g.bq * g.bk : 0));
    check_shape(carved_end <= scratch.as<char>() + per_thread * (omp_get_thread_num() + 1),
                "attention backward: the scratch layout outgrew backward_scratch_bytes (a bug)");
    // Which of a unit's kv blocks have a non-empty tile (the others are
    // neither copied nor added).
    std::vector<char> block_used(nb);
    for (int64_t u; (u = next_unit.fetch_add(1, std::memory_order_relaxed)) < n_units;) {
      const Unit& unit = units[u];
      const int64_t b = unit.b, kvh = unit.head, grp = unit.block;
      const int64_t j_first = grp * nb, j_end = std::min(g.nk, j_first + nb);
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        block_used[x] = false;
        for (int64_t i = 0; i < g.nq && !block_used[x]; ++i) block_used[x] = map.kind(b, i, j) != TileKind::empty;
        if (!block_used[x]) continue;
        copy_rows(k_all + x * g.bk * g.D, a.k, b, j0, kvh, cols, g.D);
        copy_rows(v_all + x * g.bk * g.D, a.v, b, j0, kvh, cols, g.D);
        std::fill(dk_all + x * g.bk * ld, dk_all + x * g.bk * ld + cols * ld, 0.0f);
        std::fill(dv_all + x * g.bk * ld, dv_all + x * g.bk * ld + cols * ld, 0.0f);
      }
      for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h)
        for (int64_t i = 0; i < g.nq; ++i) {
          if (!group_has(b, i, grp)) continue;
          const int64_t i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
          const int64_t row0 = (b * g.Sq + i0) * g.H + h;  // lse/delta index of row 0, stride H
          if (fused) {
            copy_rows_to_panels(reinterpret_cast<float*>(qi), fused->panel, a.q, b, i0, h, rows, g.D, qr, ld);
            copy_rows_to_panels(reinterpret_cast<float*>(doi), fused->panel, dout, b, i0, h, rows, g.D, dor, ld);
            const int64_t lanes = panels_of(rows, fused->panel) * fused->panel;
            for (int64_t r = 0; r < lanes; ++r) {  // padding lanes: P = 0, dS = 0
              const float l = r < rows ? lse[row0 + r * g.H] : kNegInf;
              lse2[r] = l == kNegInf ? std::numeric_limits<float>::infinity() : l * kLog2e;
              delta_i[r] = r < rows ? delta[row0 + r * g.H] : 0.0f;
            }
            std::fill(dq_tile, dq_tile + lanes * g.D, 0.0f);
          } else {
            copy_rows(qi, a.q, b, i0, h, rows, g.D);
            copy_rows(doi, dout, b, i0, h, rows, g.D);
            std::fill(dq_tile, dq_tile + rows * g.D, 0.0f);
          }
          for (int64_t j = j_first; j < j_end; ++j) {
            const TileKind kind = map.kind(b, i, j);
            if (kind == TileKind::empty) continue;
            const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
            const T* kj = k_all + x * g.bk * g.D;
            const T* vj = v_all + x * g.bk * g.D;
            if (fused)
              fused_backward_tile(*fused, a, g, kind, b, i0, rows, j0, cols, ld, reinterpret_cast<const float*>(qi),
                                  reinterpret_cast<const float*>(doi), qr, dor, reinterpret_cast<const float*>(kj),
                                  reinterpret_cast<const float*>(vj), lse2, delta_i, ones, s, dp,
                                  dk_all + x * g.bk * ld, dv_all + x * g.bk * ld, dq_tile, counts);
            else
              backward_gemm_tile(a, g, kind, b, i0, rows, j0, cols, qi, doi, kj, vj, lse + row0, delta + row0, s,
                                 dp, p_tile, dk_all + x * g.bk * ld, dv_all + x * g.bk * ld, dq_tile, counts);
          }
          // Wait for the previous group with a non-empty tile in row i
          // (usually grp - 1, claimed earlier and one unit ahead), add, pass
          // the turn on.
          int64_t prev = grp - 1;
          while (prev >= 0 && !group_has(b, i, prev)) --prev;
          std::atomic<int64_t>& last = dq_last[(b * g.H + h) * g.nq + i];
          for (int spins = 0; last.load(std::memory_order_acquire) != prev; ++spins) {
            if (spins < 64) cpu_relax();
            else std::this_thread::yield();  // oversubscribed: let the other thread run
          }
          for (int64_t r = 0; r < rows; ++r) {
            float* dst = dq.at<float>({b, i0 + r, h});
            if (fused) {  // row r of the panels
              const float* src = dq_tile + (r / fused->panel) * g.D * fused->panel + r % fused->panel;
              for (int64_t x = 0; x < g.D; ++x) dst[x] += src[x * fused->panel];
              continue;
            }
            const float* src = dq_tile + r * g.D;
            for (int64_t x = 0; x < g.D; ++x) dst[x] += src[x];
          }
          last.store(grp, std::memory_order_release);
        }
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        if (!block_used[x]) continue;
        for (int64_t c = 0; c < cols; ++c) {
          float* dkr = dk.at<float>({b, j0 + c, kvh});
          float* dvr = dv.at<float>({b, j0 + c, kvh});
          const float* dk_acc = dk_all + (x * g.bk + c) * ld;
          const float* dv_acc = dv_all + (x * g.bk + c) * ld;
          for (int64_t y = 0; y < g.D; ++y) {
            dkr[y] += dk_acc[y];
            dvr[y] += dv_acc[y];
          }
        }
      }
    }
  }
  add_stats(stats, g, counts);
}

}  // namespace

void attention_forward(const AttentionArgs& args, const TensorView& o, float* lse,
                       AttentionStats* stats) {
  if (args.impl == KernelImpl::reference) return attention_forward_reference(args, o, lse);
  const AttentionTilePath path = attention_tile_path(args.q.dtype);
  if (path == AttentionTilePath::bf16_native) return forward_fast<bf16>(args, o, lse, stats, path);
  forward_fast<float>(args, o, lse, stats, path);
}

void attention_backward(const AttentionArgs& args, const TensorView& dout, const float* lse,
                        const float* delta, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, AttentionStats* stats) {
  if (args.impl == KernelImpl::reference)
    return attention_backward_reference(args, dout, lse, delta, dq, dk, dv);
  const AttentionTilePath path = attention_tile_path(args.q.dtype);
  if (path == AttentionTilePath::bf16_native) return backward_fast<bf16>(args, dout, lse, delta, dq, dk, dv, stats, path);
  backward_fast<float>(args, dout, lse, delta, dq, dk, dv, stats, path);
}

int64_t attention_unmasked_pairs_blocked(const AttentionArgs& a) {
  const Geometry g = geometry(a);
  const TileMap map(a, g);
  const bool seg = a.mask.same_segment;
  int64_t pairs = 0;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < g.nq; ++i)
      for (int64_t j = 0; j < g.nk; ++j) {
        const int64_t i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
        const int64_t j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        const TileKind kind = map.kind(b, i, j);
        if (kind == TileKind::full) pairs += rows * cols;
        if (kind != TileKind::partial) continue;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const int64_t qi = b * g.Sq + i0 + r, kj = b * g.Skv + j0 + c;
            pairs += seg ? a.mask.allows(a.q_pos[qi], a.kv_pos[kj], a.q_seg[qi], a.kv_seg[kj])
                         : a.mask.allows(a.q_pos[qi], a.kv_pos[kj]);
          }
      }
  return pairs * g.H;
}

void attention_delta(const TensorView& o, const TensorView& dout, float* delta) {
  check_same_shape(o, dout, "dout");
  const int64_t B = o.dim(0), S = o.dim(1), H = o.dim(2), D = o.dim(3);
#pragma omp parallel
  {
    std::vector<float> oi(D), gi(D);  // one row of each, widened
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h) {
          load_f32(element_ptr(o, {b, s, h}), o.dtype, oi.data(), D);
          load_f32(element_ptr(dout, {b, s, h}), dout.dtype, gi.data(), D);
          float acc = 0.0f;
          for (int64_t x = 0; x < D; ++x) acc += oi[x] * gi[x];
          delta[(b * S + s) * H + h] = acc;
        }
  }
}

void attention_merge(const TensorView& o_a, float* lse_a, const TensorView& o_b,
                     const float* lse_b) {
  check_shape(o_a.dtype == DType::f32 && o_b.dtype == DType::f32, "attention_merge: o_a and o_b must be fp32");
  const int64_t B = o_a.dim(0), S = o_a.dim(1), H = o_a.dim(2), D = o_a.dim(3);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        int64_t r = (b * S + s) * H + h;
        float la = lse_a[r], lb = lse_b[r];
        if (lb == kNegInf) continue;
        float* oa = o_a.at<float>({b, s, h});
        const float* ob = o_b.at<float>({b, s, h});
        if (la == kNegInf) {
          for (int64_t x = 0; x < D; ++x) oa[x] = ob[x];
          lse_a[r] = lb;
          continue;
        }
        float m = std::max(la, lb);
        float l = m + std::log1p(std::exp(-std::abs(la - lb)));
        float wa = std::exp(la - l), wb = std::exp(lb - l);
        for (int64_t x = 0; x < D; ++x) oa[x] = wa * oa[x] + wb * ob[x];
        lse_a[r] = l;
      }
}

}  // namespace longctx
