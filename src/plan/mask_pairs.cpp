#include "plan/mask_pairs.h"

#include <algorithm>

#include "core/error.h"
#include "cp/layout.h"

namespace longctx {

std::vector<PositionRange> layout_ranges(LayoutKind layout, int64_t seq_len, int64_t parts,
                                         int64_t index) {
  const int64_t pieces = layout == LayoutKind::zigzag ? 2 * parts : parts;
  if (seq_len % pieces != 0)
    throw ConfigError(std::string(name_of(layout)) + " layout: " + std::to_string(pieces) +
                      " pieces must divide the sequence length " + std::to_string(seq_len));
  // The layout itself is ring_shard_index (src/cp/layout.h): a rank's tokens
  // are one run of positions (contiguous) or two (zigzag).
  const int64_t runs = pieces / parts, run = seq_len / pieces;
  std::vector<PositionRange> out;
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t begin = ring_shard_index(layout, seq_len, parts, index, r * run);
    out.push_back({begin, begin + run});
  }
  return out;
}

namespace {

// sum over integers x < X of clamp(x, 0, n).
int64_t clamped_prefix_sum(int64_t X, int64_t n) {
  if (X <= 0) return 0;
  if (X <= n + 1) return X * (X - 1) / 2;
  return n * (n + 1) / 2 + (X - n - 1) * n;
}

// Pairs with kv - q <= t, q in [a, b), kv in [c, d). For each q the allowed
// kv are [c, min(d - 1, q + t)], i.e. clamp(q + t - c + 1, 0, d - c) of them.
int64_t pairs_with_offset_at_most(PositionRange q, PositionRange kv, int64_t t) {
  const int64_t n = kv.size();
  if (q.size() <= 0 || n <= 0) return 0;
  // Clamp t so that the arithmetic below cannot overflow for "infinite" windows.
  t = std::clamp(t, kv.begin - q.end, kv.end - q.begin);
  return clamped_prefix_sum(q.end + t - kv.begin + 1, n) -
         clamped_prefix_sum(q.begin + t - kv.begin + 1, n);
}

// Pairs with lo <= kv - q <= hi.
int64_t pairs_in_band(PositionRange q, PositionRange kv, int64_t lo, int64_t hi) {
  if (lo > hi) return 0;
  return pairs_with_offset_at_most(q, kv, hi) - pairs_with_offset_at_most(q, kv, lo - 1);
}

PositionRange intersect(PositionRange r, int64_t begin, int64_t end) {
  return {std::max(r.begin, begin), std::min(r.end, end)};
}

}  // namespace

int64_t count_unmasked_pairs(PositionRange q, PositionRange kv, const MaskSpec& mask) {
  if (q.size() <= 0 || kv.size() <= 0) return 0;
  switch (mask.kind) {
    case MaskSpec::Kind::full: return q.size() * kv.size();
    case MaskSpec::Kind::causal: return pairs_with_offset_at_most(q, kv, 0);
    case MaskSpec::Kind::local: return pairs_in_band(q, kv, -mask.left, mask.right);
    case MaskSpec::Kind::chunked: {
      // Causal inside each chunk both ranges touch: at most S / chunk chunks.
      const int64_t C = mask.chunk;
      int64_t first = std::max(q.begin, kv.begin) / C;
      int64_t last = (std::min(q.end, kv.end) - 1) / C;
      int64_t pairs = 0;
      for (int64_t k = first; k <= last; ++k)
        pairs += pairs_with_offset_at_most(intersect(q, k * C, (k + 1) * C),
                                           intersect(kv, k * C, (k + 1) * C), 0);
      return pairs;
    }
  }
  return 0;
}

int64_t count_unmasked_pairs(std::span<const PositionRange> q, std::span<const PositionRange> kv,
                             const MaskSpec& mask) {
  int64_t pairs = 0;
  for (const PositionRange& a : q)
    for (const PositionRange& b : kv) pairs += count_unmasked_pairs(a, b, mask);
  return pairs;
}

namespace {

int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b < 0); }  // b > 0
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// m blocks of w positions from c: block j holds positions [c + j w, c + j w + w - 1].
struct BlockRun {
  int64_t c, m, w;
};

// The ranges as runs of equal blocks: a range's whole blocks, then its tail.
// Contiguous neighbours whose blocks line up are merged first (zigzag's two
// halves on one rank, a shard's ring chunks): the blocks are the same.
std::vector<BlockRun> block_runs(std::span<const PositionRange> ranges, int64_t block) {
  std::vector<PositionRange> merged;
  for (const PositionRange& r : ranges) {
    if (r.size() <= 0) continue;
    if (!merged.empty() && merged.back().end == r.begin && merged.back().size() % block == 0)
      merged.back().end = r.end;
    else
      merged.push_back(r);
  }
  std::vector<BlockRun> runs;
  for (const PositionRange& r : merged) {
    const int64_t whole = r.size() / block, tail = r.size() % block;
    if (whole > 0) runs.push_back({r.begin, whole, block});
    if (tail > 0) runs.push_back({r.begin + whole * block, 1, tail});
  }
  return runs;
}

// The blocks j in [lo, hi] of one run meeting bounds on their lowest
// position c + j w and highest c + j w + w - 1. Bounds are monotone in j.
struct Blocks {
  const BlockRun& r;
  int64_t lo, hi;
  explicit Blocks(const BlockRun& run) : r(run), lo(0), hi(run.m - 1) {}
  void low_at_least(int64_t x) { lo = std::max(lo, ceil_div(x - r.c, r.w)); }
  void low_at_most(int64_t x) { hi = std::min(hi, floor_div(x - r.c, r.w)); }
  void high_at_least(int64_t x) { lo = std::max(lo, ceil_div(x - r.c - r.w + 1, r.w)); }
  void high_at_most(int64_t x) { hi = std::min(hi, floor_div(x - r.c - r.w + 1, r.w)); }
  int64_t count() const { return std::max<int64_t>(0, hi - lo + 1); }
};

// How many blocks of `kv` are non-empty and how many full against the q
// block with positions [a, e], by the conditions of attn::classify_tile.
std::pair<int64_t, int64_t> classify_blocks(const MaskSpec& mask, int64_t a, int64_t e, const BlockRun& kv) {
  Blocks any(kv), full(kv);
  switch (mask.kind) {
    case MaskSpec::Kind::full: break;
    case MaskSpec::Kind::causal:
      any.low_at_most(e);
      full.high_at_most(a);
      break;
    case MaskSpec::Kind::local:
      any.high_at_least(a - mask.left);
      any.low_at_most(e + mask.right);
      full.low_at_least(e - mask.left);
      full.high_at_most(a + mask.right);
      break;
    case MaskSpec::Kind::chunked: {
      const int64_t C = mask.chunk, chunk_start = a / C * C;
      any.low_at_most(e);
      any.high_at_least(chunk_start);
      if (a / C == e / C) {  // full tiles sit inside the q block's chunk, at or below it
        full.low_at_least(chunk_start);
        full.high_at_most(a);
      } else {
        full.hi = -1;
      }
      break;
    }
  }
  full.lo = std::max(full.lo, any.lo);
  full.hi = std::min(full.hi, any.hi);
  return {any.count(), full.count()};
}

}  // namespace

TilePairs count_tile_pairs(std::span<const PositionRange> q, std::span<const PositionRange> kv,
                           const MaskSpec& mask, int64_t block) {
  TilePairs out;
  const std::vector<BlockRun> kv_runs = block_runs(kv, block);
  for (const BlockRun& qr : block_runs(q, block))
    for (const BlockRun& kr : kv_runs) {
      const int64_t area = qr.w * kr.w;
      // Both runs as one block each: when that is empty (or full) so is every
      // tile between them (the conditions hold for any blocks inside), which
      // leaves only the runs along the mask's edges to walk block by block.
      const auto [any, full] =
          classify_blocks(mask, qr.c, qr.c + qr.m * qr.w - 1, BlockRun{kr.c, 1, kr.m * kr.w});
      if (any == 0) continue;
      if (full == 1) {
        out.full += qr.m * kr.m * area;
        continue;
      }
      for (int64_t i = 0; i < qr.m; ++i) {
        const int64_t a = qr.c + i * qr.w;  // this q block holds positions [a, a + w - 1]
        const auto [n_any, n_full] = classify_blocks(mask, a, a + qr.w - 1, kr);
        out.full += n_full * area;
        out.partial += (n_any - n_full) * area;
      }
    }
  return out;
}

}  // namespace longctx
