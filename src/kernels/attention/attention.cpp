// Block-sparse flash attention on CPUs (the interface: attention.h).
//
// Every (q block, kv block) tile of a (batch, head) is classified from the
// bounds of its positions and segment ids before any FLOP: empty tiles are
// skipped, full tiles skip the elementwise mask. Tiles are copied out of the
// strided views (widened from bf16 unless multiplied natively), then
// multiplied with oneDNN GEMMs on the calling thread or run by the fused
// vector kernels (attention/fused/fused.h; attention.h says which path runs
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
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/timer.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/dot/dot.h"
#include "kernels/attention/fused/fused.h"
#include "kernels/attention/tiles.h"
#include "kernels/simd/convert.h"
#include "kernels/cpu/select.h"
#include "kernels/gemm.h"

namespace longctx {

using attn::BlockBounds;
using attn::TileKind;

namespace {

// q blocks per forward work unit, sharing each K, V tile copy (forward_fast).
constexpr int64_t kForwardQBlocks = 4;
// The fewest work units a grouping of blocks may leave (forward and backward
// units grow only while the threads still get enough of them).
constexpr int64_t kMinUnits = 32;

// kv blocks per backward work unit on the fused path (backward_fast): its
// tiles are quick enough that building a q block's panels and adding its dQ
// once per tile cost a third of its backward (S = 8192, D = 128, 1
// thread), so up to 4 kv blocks share them. The scratch is sized for 4.
constexpr int64_t kFusedBackwardKvBlocks = 4;
// The same on the bf16_dot path, whose tiles are faster still: units of 8
// kv blocks measured 5% faster than 4 at D = 64 (S = 16384, H = 8, G = 2,
// 1 and 2 threads on Zen 4), the same at D = 128. The scratch is sized for 8.
constexpr int64_t kDotBackwardKvBlocks = 8;
// kForwardQBlocks on the bf16_dot path, whose tiles are fast enough that
// reading K and V from memory showed (AMX Xeon, S = 8192, H = G = 8, D = 128,
// 1 thread): units of 8 q blocks ran the forward 8% faster than 4, 16 no
// faster than 8; the same at D = 64. Where that leaves fewer than 32 units
// (short chunks, few heads), kForwardQBlocks: the threads need the units.
constexpr int64_t kDotForwardQBlocks = 8;
// The bf16_dot forward takes up to this many consecutive non-empty kv tiles
// of a q block in one scores, softmax and P V call: P V's reduction runs over
// all their columns, so each accumulator tile is loaded and stored once per
// run, not once per 128 columns. Two measured 3% faster than one and than
// four (whose scores no longer stay in L2 between scores and softmax) at
// D = 128 on the AMX Xeon; the same at D = 64.
constexpr int64_t kDotKvRun = 2;

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
// The paths whose backward runs units of several kv blocks (backward_kv_blocks).
bool groups_kv_blocks(AttentionTilePath path) { return is_fused(path) || path == AttentionTilePath::bf16_dot; }


}  // namespace

AttentionTilePath attention_tile_path(DType dtype) { return current_kernels().attention_path(dtype); }

bool attention_path_rounds_p_and_ds(AttentionTilePath path) {
  return path == AttentionTilePath::bf16_native || path == AttentionTilePath::bf16_dot;
}

bool attention_fused_tiles_supported() { return cpu_kernel_set().fused != nullptr; }
bool attention_dot_tiles_supported() { return cpu_kernel_set().dot != nullptr; }

std::string attention_tile_path_name(AttentionTilePath path, const KernelSet& set) {
  const std::string fused =
      std::string("fused ") + (set.fused ? set.fused->isa : "(not on this CPU)") + " forward and backward";
  switch (path) {
    case AttentionTilePath::f32: return "fp32 tiles, gemm_f32";
    case AttentionTilePath::f32_fused: return "fp32 tiles, " + fused;
    case AttentionTilePath::bf16_widened: return "bf16 widened to fp32 tiles, gemm_f32";
    case AttentionTilePath::bf16_native: return "bf16 tiles, gemm_bf16 (P, dS rounded to bf16)";
    case AttentionTilePath::bf16_fused: return "bf16 widened to fp32 tiles, " + fused;
    case AttentionTilePath::bf16_dot:
      return std::string("bf16 tiles, fused ") + (set.dot ? set.dot->isa : "(no bf16 dot products on this CPU)") +
             " forward and backward (P, dS rounded to bf16)";
    case AttentionTilePath::automatic: return "automatic";
  }
  return "";
}

namespace {
// A set's paths must have their kernels (a test may pin a path the CPU lacks).
void check_path_runs(AttentionTilePath path, const KernelSet& set) {
  check_shape(!is_fused(path) || set.fused,
              "attention: a fused tile path needs a CPU with AVX2 and FMA (or AVX-512), and oneDNN's ISA not "
              "capped below it (ONEDNN_MAX_CPU_ISA)");
  check_shape(path != AttentionTilePath::bf16_dot || set.dot,
              "attention: the bf16_dot tile path needs a CPU with AVX512-BF16 or AMX-BF16 (this one has neither, "
              "or ONEDNN_MAX_CPU_ISA caps them), or a kernel set with a portable twin");
  check_shape(path != AttentionTilePath::automatic, "attention: a kernel set's path must be chosen (automatic)");
  check_shape(set.dot_forward_q_blocks >= 0 && set.dot_forward_q_blocks <= kDotForwardQBlocks,
              "attention: the bf16_dot forward's q blocks per unit must be 0 (automatic) to " +
                  std::to_string(kDotForwardQBlocks));
  // The kv blocks per unit matter only where the backward groups them.
  const int64_t most = path == AttentionTilePath::bf16_dot ? kDotBackwardKvBlocks : kFusedBackwardKvBlocks;
  check_shape(!groups_kv_blocks(path) || (set.backward_kv_blocks >= 0 && set.backward_kv_blocks <= most),
              "attention: the backward's kv blocks per unit must be 0 (automatic) to " + std::to_string(most) +
                  " on this path (the fused paths take at most " + std::to_string(kFusedBackwardKvBlocks) +
                  ", bf16_dot " + std::to_string(kDotBackwardKvBlocks) + ")");
}
}  // namespace

// Per thread, forward: fp32 s [bq, bk] scores then probabilities, and for
// each of the unit's kForwardQBlocks q blocks acc [bq, D], m and l [bq];
// contiguous copies of those q blocks' Q [bq, D], of K and V [bk, D]; on
// the fused path alpha [bq] (the output's rescale factors) after them.
namespace {
// Per thread, forward: fp32 s [bq, run] (run = kDotKvRun kv blocks), per q
// block of a unit acc [bq, D] (panels), m, l [bq], then alpha [bq]; bf16 Q
// panels per q block [bq, Dd], K rows [run, Dd], V packed per kv block of the
// run, P pairs [bq, run].
int64_t dot_forward_scratch_bytes(int64_t D, const attn::DotTileKernels& k) {
  const int64_t b = kAttentionTile, nb = kDotForwardQBlocks, run = kDotKvRun * b, Dd = attn::round_up(D, k.d_align);
  const int64_t floats = b * run + nb * (b * D + 2 * b) + b;
  const int64_t halves = nb * b * Dd + run * Dd + kDotKvRun * k.packed_elements(b, D) + b * run;
  return floats * int64_t(sizeof(float)) + halves * int64_t(sizeof(bf16));
}

// Per thread, backward: fp32 s, dp [bq, bk], per kv block of a unit dk_acc,
// dv_acc [bk, ld], dQ panels [bq, D], lse2, delta, ones [bq]; bf16 per kv
// block K, V rows [bk, Dd] and K packed, Q and dO panels [bq, Dd] and row
// pairs [bq, ld], P plain, dS plain and dS pairs [bq, bk].
int64_t dot_backward_scratch_bytes(int64_t D, const attn::DotTileKernels& k) {
  const int64_t b = kAttentionTile, nb = kDotBackwardKvBlocks, Dd = attn::round_up(D, k.d_align);
  const int64_t ld = attn::round_up(D, attn::kDotPanel);
  const int64_t floats = 2 * b * b + 2 * nb * b * ld + b * D + 3 * b;
  const int64_t halves = nb * (2 * b * Dd + k.packed_elements(b, D)) + 2 * b * Dd + 2 * b * ld + 3 * b * b;
  return floats * int64_t(sizeof(float)) + halves * int64_t(sizeof(bf16));
}

int64_t forward_scratch_bytes(int64_t D, int64_t threads, AttentionTilePath path) {
  const int64_t b = kAttentionTile, nb = kForwardQBlocks;
  const int64_t alpha = is_fused(path) ? b : 0;
  return threads * per_thread_scratch_bytes(b * b + nb * (b * D + 2 * b) + alpha, nb + 2, D, path);
}
}  // namespace
int64_t attention_forward_scratch_bytes(int64_t D, int64_t threads, DType dtype, const KernelSet& set) {
  if (!set.attention_tile_scratch) return 0;
  const AttentionTilePath path = set.attention_path(dtype);
  if (path == AttentionTilePath::bf16_dot) return threads * dot_forward_scratch_bytes(D, *set.dot);
  return forward_scratch_bytes(D, threads, path);
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
int64_t backward_kv_blocks(AttentionTilePath path, const KernelSet& set, int64_t B, int64_t G, int64_t nk) {
  if (!groups_kv_blocks(path)) return 1;
  const int64_t most = path == AttentionTilePath::bf16_dot ? kDotBackwardKvBlocks : kFusedBackwardKvBlocks;
  if (set.backward_kv_blocks > 0) return set.backward_kv_blocks;  // check_path_runs bounds it
  for (int64_t nb : {most, kFusedBackwardKvBlocks})  // the larger group that leaves enough units
    if (B * G * ((nk + nb - 1) / nb) >= kMinUnits) return nb;
  return 1;
}

int64_t backward_scratch_bytes(int64_t D, int64_t threads, AttentionTilePath path, const KernelSet& set) {
  const int64_t b = kAttentionTile, nb = kFusedBackwardKvBlocks;
  if (!is_fused(path)) return threads * per_thread_scratch_bytes(2 * b * b + 3 * b * D, 4, D, path);
  const int64_t Dp = padded_head_dim(D, *set.fused);
  return threads * per_thread_scratch_bytes(2 * b * b + 2 * nb * b * Dp + b * D + 2 * b * Dp + 3 * b, 2 * nb + 2, D, path);
}
}  // namespace
int64_t attention_backward_scratch_bytes(int64_t D, int64_t threads, DType dtype, const KernelSet& set) {
  if (!set.attention_tile_scratch) return 0;
  const AttentionTilePath path = set.attention_path(dtype);
  if (path == AttentionTilePath::bf16_dot) return threads * dot_backward_scratch_bytes(D, *set.dot);
  return backward_scratch_bytes(D, threads, path, set);
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

void check_backward_views(const AttentionArgs& a, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                          const TensorView& dv) {
  check_view(dout, "dout");
  check_view(dq, "dq", true);
  check_view(dk, "dk", true);
  check_view(dv, "dv", true);
  check_same_shape(a.q, dout, "dout");
  check_same_shape(a.q, dq, "dq");
  check_same_shape(a.k, dk, "dk");
  check_same_shape(a.k, dv, "dv");
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
  // The bf16_dot kernels scale the scores after the mask and take the max of
  // the unscaled scores (attention/dot/dot.h): both need scale > 0.
  check_shape(g.scale > 0.0f && std::isfinite(g.scale),
              "attention: scale must be positive and finite (got " + std::to_string(g.scale) + ")");
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

// The forward's units: nb consecutive q blocks of one head, in
// sort_for_locality's order.
std::vector<Unit> forward_units(const TileMap& map, const Geometry& g, int64_t nb) {
  std::vector<Unit> units;
  const int64_t n_groups = (g.nq + nb - 1) / nb;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t grp = 0; grp < n_groups; ++grp) {
      int64_t cost = 0;
      for (int64_t i = grp * nb; i < std::min(g.nq, (grp + 1) * nb); ++i)
        for (int64_t j = 0; j < g.nk; ++j) cost += map.kind(b, i, j) != TileKind::empty;
      for (int64_t h = 0; h < g.H; ++h) units.push_back({b, h, grp, cost});
    }
  sort_for_locality(units);
  return units;
}

// Whether q block i of batch row b has a non-empty tile among kv blocks [j_first, j_end).
bool row_has_tile(const TileMap& map, int64_t b, int64_t i, int64_t j_first, int64_t j_end) {
  for (int64_t j = j_first; j < j_end; ++j)
    if (map.kind(b, i, j) != TileKind::empty) return true;
  return false;
}

// Whether kv block j of batch row b has a non-empty tile among q blocks [i_first, i_end).
bool column_has_tile(const TileMap& map, int64_t b, int64_t i_first, int64_t i_end, int64_t j) {
  for (int64_t i = i_first; i < i_end; ++i)
    if (map.kind(b, i, j) != TileKind::empty) return true;
  return false;
}

// The backward's units: nb consecutive kv blocks (a group) of one kv head,
// those with a non-empty tile, in group order, the kv heads of a group side
// by side. A q block's dQ sum of a group waits for the previous group with a
// non-empty tile in its row (DqTurns), and every unit claimed before this
// one comes earlier in this order, so the earliest unfinished unit never
// waits and the schedule cannot deadlock. Units claimed together are mostly
// of different heads, which never wait for each other (head by head, the
// second thread trailed the first through every row: the backward ran 5%
// slower on 2 threads than on 1). For causal masks this is also heaviest first.
std::vector<Unit> backward_units(const TileMap& map, const Geometry& g, int64_t nb) {
  std::vector<Unit> units;
  const int64_t n_groups = (g.nk + nb - 1) / nb;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t grp = 0; grp < n_groups; ++grp) {
      int64_t cost = 0;
      for (int64_t i = 0; i < g.nq; ++i)
        for (int64_t j = grp * nb; j < std::min(g.nk, (grp + 1) * nb); ++j) cost += map.kind(b, i, j) != TileKind::empty;
      if (cost == 0) continue;  // no gradient flows through these kv blocks
      for (int64_t kvh = 0; kvh < g.G; ++kvh) units.push_back({b, kvh, grp, cost});
    }
  return units;
}

// dQ rows of one (batch, head, q block) receive sums from many backward
// units: each keeps the group whose sum was added last (-1: none yet), and
// a sum is added only right after the previous group with a non-empty tile
// in its row, so dQ sums in group order whatever the threads' timing.
class DqTurns {
 public:
  DqTurns(const TileMap& map, const Geometry& g, int64_t nb)
      : map_(map), g_(g), nb_(nb), last_(new std::atomic<int64_t>[g.B * g.H * g.nq]) {
    for (int64_t x = 0; x < g.B * g.H * g.nq; ++x) last_[x].store(-1, std::memory_order_relaxed);
  }
  // Runs add() in group grp's turn for q block i of (b, h), then passes the turn on.
  template <class Add>
  void in_turn(int64_t b, int64_t h, int64_t i, int64_t grp, Add add) {
    int64_t prev = grp - 1;  // usually claimed earlier and one unit ahead
    while (prev >= 0 && !row_has_tile(map_, b, i, prev * nb_, std::min(g_.nk, (prev + 1) * nb_))) --prev;
    std::atomic<int64_t>& last = last_[(b * g_.H + h) * g_.nq + i];
    for (int spins = 0; last.load(std::memory_order_acquire) != prev; ++spins) {
      if (spins < 64) cpu_relax();
      else std::this_thread::yield();  // oversubscribed: let the other thread run
    }
    add();
    last.store(grp, std::memory_order_release);
  }

 private:
  const TileMap& map_;
  const Geometry& g_;
  int64_t nb_;
  std::unique_ptr<std::atomic<int64_t>[]> last_;
};

// Adds the `rows` rows of panels x [panels][D][panel] (transposed) to rows
// i0.. of head h of the fp32 view out (dQ). Eight rows at a time, so that
// each read of x is eight neighbours (one row at a time read x 128 bytes
// apart, every element: 2.9% of the bf16 backward at D = 64 in perf).
void add_panel_rows(const TensorView& out, int64_t b, int64_t i0, int64_t h, int64_t rows, int64_t D, int64_t panel,
                    const float* x) {
  constexpr int64_t kGroup = 8;
  for (int64_t r0 = 0; r0 < rows; r0 += kGroup) {
    const int64_t n = std::min({kGroup, rows - r0, panel - r0 % panel});
    float* dst[kGroup];
    for (int64_t k = 0; k < n; ++k) dst[k] = out.at<float>({b, i0 + r0 + k, h});
    const float* src = x + (r0 / panel) * D * panel + r0 % panel;
    for (int64_t y = 0; y < D; ++y)
      for (int64_t k = 0; k < n; ++k) dst[k][y] += src[y * panel + k];
  }
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
// On the worker threads, with a set of their own: a tile is one piece (inside
// a parallel region), and bf16 tiles multiply natively (bf16_native: still
// widened where oneDNN has no bf16 matmul for this CPU, so its arithmetic,
// P and dS rounded to bf16, is tested on any CPU).
const KernelSet kTileProducts{};
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_f32_on(kTileProducts, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_bf16_on(kTileProducts, Bf16GemmPath::native, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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

// The fused path's panels of q rows (attention/fused/fused.h): the panels of a q
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
                 int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s, int64_t s_panel,
                 TileCounts& counts) {
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
  mask_panels(f, a, g, kind, b, i0, rows, j0, cols, s, s_panel, counts);
  f.softmax(s, panels, cols, s_panel, m, l, alpha);
  f.pv(s, panels, cols, s_panel, v, g.D, alpha, acc);
}

// One backward tile on the fused path (attention/fused/fused.h): q rows i0..i0+rows
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
  mask_panels(f, a, g, kind, b, i0, rows, j0, cols, s, s_panel, counts);
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

// The forward's start for one q block: running output 0, max -inf, sum 0 on `rows` rows.
void start_rows(float* acc, float* m, float* l, int64_t rows, int64_t D) {
  std::fill(acc, acc + rows * D, 0.0f);
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
}

// The forward's end for q rows i0..i0+rows of head h: O = acc / l stored
// in o's dtype, LSE = m + log2(l) in natural units (m, l per row; acc
// [rows][D] row-major, or panels [panels][D][panel] when panel > 0); a
// fully masked row (l = 0) gives O = 0 and LSE = -inf, a NaN l NaN both.
void store_forward_rows(const TensorView& o, float* lse, const Geometry& g, int64_t b, int64_t i0, int64_t h,
                        int64_t rows, int64_t panel, const float* m, const float* l, const float* acc, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kPrefetchRows < rows)
      prefetch_row<true>(element_ptr(o, {b, i0 + r + kPrefetchRows, h}), g.D * int64_t(dtype_size(o.dtype)));
    for (int64_t y = 0; y < g.D; ++y)
      out[y] = panel ? acc[((r / panel) * g.D + y) * panel + r % panel] : acc[r * g.D + y];
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

// Adds a backward unit's dK, dV accumulators [cols][ld] to kv rows j0.. of kv head kvh.
void add_kv_rows(const TensorView& dk, const TensorView& dv, int64_t b, int64_t j0, int64_t kvh, int64_t cols,
                 int64_t D, const float* dk_acc, const float* dv_acc, int64_t ld) {
  for (int64_t c = 0; c < cols; ++c) {
    float* dkr = dk.at<float>({b, j0 + c, kvh});
    float* dvr = dv.at<float>({b, j0 + c, kvh});
    for (int64_t y = 0; y < D; ++y) {
      dkr[y] += dk_acc[c * ld + y];
      dvr[y] += dv_acc[c * ld + y];
    }
  }
}

// T: the tile dtype (float, or bf16 on the native bf16 path).
// path: the tile path, read once by the caller (T = bf16 on bf16_native,
// else float); on a fused path Q, the scores and the output are kept as
// panels and the tiles run by the fused kernels (fused_tile).
template <class T>
void forward_fast(const AttentionArgs& a, const TensorView& o, float* lse, AttentionStats* stats,
                  AttentionTilePath path, const KernelSet& set) {
  const attn::FusedTileKernels* fused = is_fused(path) ? set.fused : nullptr;
  const Geometry g = geometry(a);
  check_view(o, "o");
  check_same_shape(a.q, o, "o");
  const TileMap map(a, g);

  // A unit is kForwardQBlocks consecutive q blocks of one head: each K, V
  // tile is copied once for all of them (the copies' reads of K, V were a
  // fifth of the forward's time per q block at S = 4096, H = 8, 1 thread).
  // Every q block still runs its kv blocks in order with the same
  // operations, so the result does not depend on the grouping.
  const std::vector<Unit> units = forward_units(map, g, kForwardQBlocks);

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
    std::vector<float> row(g.D);                      // one output row
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
        start_rows(acc_all + x * g.bq * g.D, m_all + x * g.bq, l_all + x * g.bq, run_rows, g.D);
      }
      for (int64_t j = 0; j < g.nk; ++j) {
        if (!column_has_tile(map, b, i_first, i_end, j)) continue;
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
        store_forward_rows(o, lse, g, b, i0, h, rows, fused ? fused->panel : 0, m_all + x * g.bq, l_all + x * g.bq,
                           acc_all + x * g.bq * g.D, row.data());
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
                   const TensorView& dv, AttentionStats* stats, AttentionTilePath path, const KernelSet& set) {
  const attn::FusedTileKernels* fused = is_fused(path) ? set.fused : nullptr;
  const Geometry g = geometry(a);
  check_backward_views(a, dout, dq, dk, dv);
  const TileMap map(a, g);

  // A unit is nb consecutive kv blocks of one kv head (a group); the fused
  // path shares each Q, dO transposition and dQ sum among a group's blocks.
  const int64_t nb = backward_kv_blocks(path, set, g.B, g.G, g.nk);
  const std::vector<Unit> units = backward_units(map, g, nb);

  // Per thread (attention_backward_scratch_bytes): s, dp [bq, bk]; per kv
  // block of a group dk_acc, dv_acc [bk, ld]; dq_tile [bq, D]; per kv block
  // K, V copies [bk, D]; Q, dO copies [bq, D]; (bf16 tiles) P or dS; (fused)
  // row-major Q, dO [bq, ld] and lse2, delta, ones [bq].
  const int threads = omp_get_max_threads();
  const int64_t per_thread = backward_scratch_bytes(g.D, 1, path, set);
  const int64_t ld = fused ? padded_head_dim(g.D, *fused) : g.D;  // row stride of dk_acc, dv_acc
  Buffer scratch(MemCategory::scratch, "attention backward scratch",
                 backward_scratch_bytes(g.D, threads, path, set));
  DqTurns dq_turns(map, g, nb);
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
        block_used[x] = column_has_tile(map, b, 0, g.nq, j);
        if (!block_used[x]) continue;
        copy_rows(k_all + x * g.bk * g.D, a.k, b, j0, kvh, cols, g.D);
        copy_rows(v_all + x * g.bk * g.D, a.v, b, j0, kvh, cols, g.D);
        std::fill(dk_all + x * g.bk * ld, dk_all + x * g.bk * ld + cols * ld, 0.0f);
        std::fill(dv_all + x * g.bk * ld, dv_all + x * g.bk * ld + cols * ld, 0.0f);
      }
      for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h)
        for (int64_t i = 0; i < g.nq; ++i) {
          if (!row_has_tile(map, b, i, j_first, j_end)) continue;
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
          dq_turns.in_turn(b, h, i, grp, [&] {
            if (fused) return add_panel_rows(dq, b, i0, h, rows, g.D, fused->panel, dq_tile);
            for (int64_t r = 0; r < rows; ++r) {
              float* dst = dq.at<float>({b, i0 + r, h});
              const float* src = dq_tile + r * g.D;
              for (int64_t x = 0; x < g.D; ++x) dst[x] += src[x];
            }
          });
        }
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        if (block_used[x]) add_kv_rows(dk, dv, b, j0, kvh, cols, g.D, dk_all + x * g.bk * ld, dv_all + x * g.bk * ld, ld);
      }
    }
  }
  add_stats(stats, g, counts);
}

// The bf16_dot path (attention/dot/dot.h): bf16 copies laid out for the CPU's
// bf16 dot products or tiles, the fp32 softmax of the fused kernels on the
// same panels, P and dS rounded to bf16 for their products.

// Rows s0.. of head h of a [B, S, heads, D] view: its first element and row stride.
const void* rows_at(const TensorView& t, int64_t b, int64_t s0, int64_t h) { return element_ptr(t, {b, s0, h}); }

void forward_dot(const AttentionArgs& a, const TensorView& o, float* lse, AttentionStats* stats,
                 const KernelSet& set) {
  const attn::DotTileKernels& k = *set.dot;
  const attn::FusedTileKernels& f = *k.fp32;
  constexpr int64_t P = attn::kDotPanel;
  const Geometry g = geometry(a);
  check_view(o, "o");
  check_same_shape(a.q, o, "o");
  const TileMap map(a, g);
  const int64_t most = kDotForwardQBlocks, forced = set.dot_forward_q_blocks;  // the scratch is sized for most
  const int64_t nb = forced > 0 ? forced : g.B * g.H * ((g.nq + most - 1) / most) >= kMinUnits ? most : kForwardQBlocks;
  const int64_t Dd = attn::round_up(g.D, k.d_align), s_panel = kDotKvRun * g.bk * P;
  const std::vector<Unit> units = forward_units(map, g, nb);
  const int64_t per_thread = dot_forward_scratch_bytes(g.D, k), v_packed = k.packed_elements(g.bk, g.D);
  Buffer scratch(MemCategory::scratch, "attention forward scratch", per_thread * omp_get_max_threads());
  const int64_t n_units = static_cast<int64_t>(units.size());
  TileCounts counts;

#pragma omp parallel reduction(+ : counts)
  {
    float* s = reinterpret_cast<float*>(scratch.as<char>() + per_thread * omp_get_thread_num());  // [bq, run]
    float* acc_all = s + g.bq * kDotKvRun * g.bk;  // [nb][panels][D][P]
    float* m_all = acc_all + nb * g.bq * g.D;      // [nb, bq]
    float* l_all = m_all + nb * g.bq;              // [nb, bq]
    float* alpha = l_all + nb * g.bq;              // [bq]
    bf16* qp_all = reinterpret_cast<bf16*>(alpha + g.bq);  // [nb][bq * Dd]
    bf16* kc = qp_all + nb * g.bq * Dd;                    // [run, Dd]
    bf16* vp = kc + kDotKvRun * g.bk * Dd;                 // [kDotKvRun][v_packed]
    bf16* p2 = vp + kDotKvRun * v_packed;                  // [bq * run]
    std::vector<float> row(g.D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t u = 0; u < n_units; ++u) {
      const Unit& unit = units[u];
      const int64_t b = unit.b, h = unit.head, kvh = h / g.group;
      const int64_t i_first = unit.block * nb, i_end = std::min(g.nq, i_first + nb);
      for (int64_t i = i_first; i < i_end; ++i) {
        const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
        const int64_t lanes = attn::round_up(rows, P);  // padding rows: zero q, never stored
        attn::dot_rows_to_panels(rows_at(a.q, b, i0, h), a.q.dtype, a.q.stride[1], rows, g.D, Dd, 0,
                                 qp_all + x * g.bq * Dd, nullptr);
        start_rows(acc_all + x * g.bq * g.D, m_all + x * g.bq, l_all + x * g.bq, lanes, g.D);
      }
      for (int64_t j_first = 0; j_first < g.nk; j_first += kDotKvRun) {
        const int64_t j_end = std::min(g.nk, j_first + kDotKvRun);
        // Each kv block at its place in the run's K rows and V packs (blocks no
        // q block of the unit reads are skipped; no run spans them).
        for (int64_t j = j_first; j < j_end; ++j) {
          if (!column_has_tile(map, b, i_first, i_end, j)) continue;
          const int64_t t = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
          attn::dot_rows(rows_at(a.k, b, j0, kvh), a.k.dtype, a.k.stride[1], cols, g.D, Dd, k.kv_align,
                         kc + t * g.bk * Dd);
          k.pack_kv(static_cast<const bf16*>(rows_at(a.v, b, j0, kvh)), a.v.stride[1], cols, g.D,
                    vp + t * v_packed);
        }
        for (int64_t i = i_first; i < i_end; ++i) {
          const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
          const int64_t panels = panels_of(rows, P);
          for (int64_t j = j_first, run_end; j < j_end; j = run_end) {  // runs of non-empty tiles
            run_end = j + 1;
            if (map.kind(b, i, j) == TileKind::empty) continue;
            while (run_end < j_end && map.kind(b, i, run_end) != TileKind::empty) ++run_end;
            const int64_t t = j - j_first, j0 = j * g.bk, cols = std::min(run_end * g.bk, g.Skv) - j0;
            bool masked = false;
            for (int64_t jj = j; jj < run_end; ++jj) masked |= map.kind(b, i, jj) == TileKind::partial;
            if (!masked && k.forward_run) {
              counts.full += run_end - j;
              k.forward_run(qp_all + x * g.bq * Dd, panels, kc + t * g.bk * Dd, cols, Dd, s, s_panel,
                            g.scale * kLog2e, k.kv_align, m_all + x * g.bq, l_all + x * g.bq, alpha, p2,
                            vp + t * v_packed, g.D, acc_all + x * g.bq * g.D);
              continue;
            }
            k.scores(qp_all + x * g.bq * Dd, panels, kc + t * g.bk * Dd, cols, Dd, s, s_panel);
            for (int64_t jj = j; jj < run_end; ++jj)
              mask_panels(f, a, g, map.kind(b, i, jj), b, i0, rows, jj * g.bk, std::min(g.bk, g.Skv - jj * g.bk),
                          s + (jj - j) * g.bk * P, s_panel, counts);
            k.softmax_to_pairs(s, panels, cols, s_panel, g.scale * kLog2e, k.kv_align, m_all + x * g.bq,
                               l_all + x * g.bq, alpha, p2);
            k.pv(p2, panels, cols, s_panel, vp + t * v_packed, g.D, alpha, acc_all + x * g.bq * g.D);
          }
        }
      }
      for (int64_t i = i_first; i < i_end; ++i) {
        const int64_t x = i - i_first, i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0);
        store_forward_rows(o, lse, g, b, i0, h, rows, P, m_all + x * g.bq, l_all + x * g.bq, acc_all + x * g.bq * g.D,
                           row.data());
      }
    }
  }
  add_stats(stats, g, counts);
}

void backward_dot(const AttentionArgs& a, const TensorView& dout, const float* lse, const float* delta,
                  const TensorView& dq, const TensorView& dk, const TensorView& dv, AttentionStats* stats,
                  const KernelSet& set) {
  const attn::DotTileKernels& k = *set.dot;
  const attn::FusedTileKernels& f = *k.fp32;
  constexpr int64_t P = attn::kDotPanel;
  const Geometry g = geometry(a);
  check_backward_views(a, dout, dq, dk, dv);
  const TileMap map(a, g);
  const int64_t nb = backward_kv_blocks(AttentionTilePath::bf16_dot, set, g.B, g.G, g.nk);
  const std::vector<Unit> units = backward_units(map, g, nb);
  DqTurns dq_turns(map, g, nb);
  const int64_t Dd = attn::round_up(g.D, k.d_align), ld = attn::round_up(g.D, P), s_panel = g.bk * P;
  const int64_t packed = k.packed_elements(g.bk, g.D);
  const int64_t per_thread = dot_backward_scratch_bytes(g.D, k);
  Buffer scratch(MemCategory::scratch, "attention backward scratch", per_thread * omp_get_max_threads());
  const int64_t n_units = static_cast<int64_t>(units.size());
  std::atomic<int64_t> next_unit{0};  // claimed in list order (backward_units says why)
  TileCounts counts;

#pragma omp parallel reduction(+ : counts)
  {
    float* s = reinterpret_cast<float*>(scratch.as<char>() + per_thread * omp_get_thread_num());  // [bq, bk]
    float* dp = s + g.bq * g.bk;               // [bq, bk] dP, then scale dS
    float* dk_all = dp + g.bq * g.bk;          // [nb][bk][ld]
    float* dv_all = dk_all + nb * g.bk * ld;   // [nb][bk][ld]
    float* dq_p = dv_all + nb * g.bk * ld;     // [panels][D][P]
    float* lse2 = dq_p + g.bq * g.D;           // [bq]
    float* delta_i = lse2 + g.bq;              // [bq]
    float* ones = delta_i + g.bq;              // [bq]
    bf16* k_rows = reinterpret_cast<bf16*>(ones + g.bq);  // [nb][bk * Dd]
    bf16* v_rows = k_rows + nb * g.bk * Dd;               // [nb][bk * Dd]
    bf16* k_packed = v_rows + nb * g.bk * Dd;             // [nb][packed]
    bf16* qp = k_packed + nb * packed;                    // [bq * Dd]
    bf16* dop = qp + g.bq * Dd;                           // [bq * Dd]
    bf16* qr2 = dop + g.bq * Dd;                          // [bq * ld]
    bf16* dor2 = qr2 + g.bq * ld;                         // [bq * ld]
    bf16* pa = dor2 + g.bq * ld;                          // [bq * bk] P
    bf16* dsa = pa + g.bq * g.bk;                         // [bq * bk] dS
    bf16* ds2 = dsa + g.bq * g.bk;                        // [bq * bk] dS pairs
    check_shape(reinterpret_cast<const char*>(ds2 + g.bq * g.bk) <=
                    scratch.as<char>() + per_thread * (omp_get_thread_num() + 1),
                "attention backward: the scratch layout outgrew dot_backward_scratch_bytes (a bug)");
    std::fill(ones, ones + g.bq, 1.0f);
    std::vector<char> block_used(nb);
    for (int64_t u; (u = next_unit.fetch_add(1, std::memory_order_relaxed)) < n_units;) {
      const Unit& unit = units[u];
      const int64_t b = unit.b, kvh = unit.head, grp = unit.block;
      const int64_t j_first = grp * nb, j_end = std::min(g.nk, j_first + nb);
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        block_used[x] = column_has_tile(map, b, 0, g.nq, j);
        if (!block_used[x]) continue;
        attn::dot_rows(rows_at(a.k, b, j0, kvh), a.k.dtype, a.k.stride[1], cols, g.D, Dd, k.kv_align,
                       k_rows + x * g.bk * Dd);
        attn::dot_rows(rows_at(a.v, b, j0, kvh), a.v.dtype, a.v.stride[1], cols, g.D, Dd, k.kv_align,
                       v_rows + x * g.bk * Dd);
        k.pack_kv(static_cast<const bf16*>(rows_at(a.k, b, j0, kvh)), a.k.stride[1], cols, g.D, k_packed + x * packed);
        std::fill(dk_all + x * g.bk * ld, dk_all + (x + 1) * g.bk * ld, 0.0f);
        std::fill(dv_all + x * g.bk * ld, dv_all + (x + 1) * g.bk * ld, 0.0f);
      }
      for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h)
        for (int64_t i = 0; i < g.nq; ++i) {
          if (!row_has_tile(map, b, i, j_first, j_end)) continue;
          const int64_t i0 = i * g.bq, rows = std::min(g.bq, g.Sq - i0), panels = panels_of(rows, P);
          const int64_t row0 = (b * g.Sq + i0) * g.H + h;  // lse/delta index of row 0, stride H
          attn::dot_rows_to_panels(rows_at(a.q, b, i0, h), a.q.dtype, a.q.stride[1], rows, g.D, Dd, ld, qp, qr2);
          attn::dot_rows_to_panels(rows_at(dout, b, i0, h), dout.dtype, dout.stride[1], rows, g.D, Dd, ld, dop, dor2);
          for (int64_t r = 0; r < panels * P; ++r) {  // padding lanes: P = 0, dS = 0
            const float l = r < rows ? lse[row0 + r * g.H] : kNegInf;
            lse2[r] = l == kNegInf ? std::numeric_limits<float>::infinity() : l * kLog2e;
            delta_i[r] = r < rows ? delta[row0 + r * g.H] : 0.0f;
          }
          std::fill(dq_p, dq_p + panels * P * g.D, 0.0f);
          for (int64_t j = j_first; j < j_end; ++j) {
            const TileKind kind = map.kind(b, i, j);
            if (kind == TileKind::empty) continue;
            const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
            k.scores(qp, panels, k_rows + x * g.bk * Dd, cols, Dd, s, s_panel);  // S^T = K Q^T, unscaled
            mask_panels(f, a, g, kind, b, i0, rows, j0, cols, s, s_panel, counts);
            k.scores(dop, panels, v_rows + x * g.bk * Dd, cols, Dd, dp, s_panel);  // dP^T = V dO^T
            k.softmax_grad_to_bf16(s, dp, panels, cols, s_panel, g.scale * kLog2e, lse2, delta_i, g.scale, k.kv_align,
                                   pa, ds2, dsa);
            k.panel_t_times(pa, rows, cols, s_panel, dor2, ld, dv_all + x * g.bk * ld);   // dV += P^T dO
            k.panel_t_times(dsa, rows, cols, s_panel, qr2, ld, dk_all + x * g.bk * ld);   // dK += scale dS^T Q
            k.pv(ds2, panels, cols, s_panel, k_packed + x * packed, g.D, ones, dq_p);      // dQ^T += scale K^T dS^T
          }
          dq_turns.in_turn(b, h, i, grp, [&] { add_panel_rows(dq, b, i0, h, rows, g.D, P, dq_p); });
        }
      for (int64_t j = j_first; j < j_end; ++j) {
        const int64_t x = j - j_first, j0 = j * g.bk, cols = std::min(g.bk, g.Skv - j0);
        if (block_used[x]) add_kv_rows(dk, dv, b, j0, kvh, cols, g.D, dk_all + x * g.bk * ld, dv_all + x * g.bk * ld, ld);
      }
    }
  }
  add_stats(stats, g, counts);
}

}  // namespace

void attention_forward(const AttentionArgs& args, const TensorView& o, float* lse, AttentionStats* stats) {
  Device& device = device_of(o);
  const int64_t D = args.q.dim(3);
  launch(
      KernelId::attention_forward, device, 0.0,
      [&](const KernelSet& set) {
        if (args.impl == KernelImpl::reference) return attention_forward_reference(args, o, lse);
        const AttentionTilePath path = set.attention_path(args.q.dtype);
        check_path_runs(path, set);
        if (path == AttentionTilePath::bf16_dot) return forward_dot(args, o, lse, stats, set);
        if (path == AttentionTilePath::bf16_native) return forward_fast<bf16>(args, o, lse, stats, path, set);
        forward_fast<float>(args, o, lse, stats, path, set);
      },
      [&] {  // the reference tracks nothing
        return args.impl == KernelImpl::reference
                   ? 0
                   : attention_forward_scratch_bytes(D, device.kernel_threads(), args.q.dtype, device.kernels());
      });
}

void attention_backward(const AttentionArgs& args, const TensorView& dout, const float* lse, const float* delta,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv, AttentionStats* stats) {
  Device& device = device_of(dq);
  const int64_t D = args.q.dim(3);
  launch(
      KernelId::attention_backward, device, 0.0,
      [&](const KernelSet& set) {
        if (args.impl == KernelImpl::reference)
          return attention_backward_reference(args, dout, lse, delta, dq, dk, dv);
        const AttentionTilePath path = set.attention_path(args.q.dtype);
        check_path_runs(path, set);
        if (path == AttentionTilePath::bf16_dot) return backward_dot(args, dout, lse, delta, dq, dk, dv, stats, set);
        if (path == AttentionTilePath::bf16_native)
          return backward_fast<bf16>(args, dout, lse, delta, dq, dk, dv, stats, path, set);
        backward_fast<float>(args, dout, lse, delta, dq, dk, dv, stats, path, set);
      },
      [&] {
        return args.impl == KernelImpl::reference
                   ? 0
                   : attention_backward_scratch_bytes(D, device.kernel_threads(), args.q.dtype, device.kernels());
      });
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

namespace {
void delta_rows(const TensorView& o, const TensorView& dout, float* delta) {
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
}  // namespace

void attention_delta(const TensorView& o, const TensorView& dout, float* delta) {
  check_same_shape(o, dout, "dout");
  launch(KernelId::attention_delta, device_of(delta), 0.0,
         [&](const KernelSet&) { delta_rows(o, dout, delta); });
}

namespace {
void merge_rows(const TensorView& o_a, float* lse_a, const TensorView& o_b, const float* lse_b) {
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
}  // namespace

void attention_merge(const TensorView& o_a, float* lse_a, const TensorView& o_b,
                     const float* lse_b) {
  check_shape(o_a.dtype == DType::f32 && o_b.dtype == DType::f32, "attention_merge: o_a and o_b must be fp32");
  launch(KernelId::attention_merge, device_of(lse_a), 0.0,
         [&](const KernelSet&) { merge_rows(o_a, lse_a, o_b, lse_b); });
}

}  // namespace longctx
