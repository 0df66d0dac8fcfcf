#pragma once
// Exact counts of unmasked (q, kv) pairs between ranges of global positions,
// in closed form: the planner needs them for 14M-token sequences, where the
// naive O(S^2) attention_unmasked_pairs would take hours.
//
// Counts ignore same_segment (document boundaries are data, unknown to the
// planner), so for packed documents they are an upper bound.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"  // MaskSpec (header-only use: the mask vocabulary)

namespace longctx {

// Global positions [begin, end).
struct PositionRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// How a sequence of S tokens is cut over `parts` ranks (src/cp/layout.h):
// contiguous: rank i holds [i S/parts, (i+1) S/parts);
// zigzag: 2 * parts chunks, rank i holds chunks i and 2 parts - 1 - i.

// The position ranges rank `index` of `parts` holds. ConfigError when parts
// does not divide seq_len (2 * parts for zigzag).
std::vector<PositionRange> layout_ranges(LayoutKind layout, int64_t seq_len, int64_t parts,
                                         int64_t index);

// Pairs (q, kv) with q in `q`, kv in `kv` that the mask allows (per batch
// row and head).
int64_t count_unmasked_pairs(PositionRange q, PositionRange kv, const MaskSpec& mask);
int64_t count_unmasked_pairs(std::span<const PositionRange> q, std::span<const PositionRange> kv,
                             const MaskSpec& mask);

// What a block-sparse kernel computes for q tokens `q` against kv tokens
// `kv` (each list in the kernel's token order) with tiles of block x block
// tokens: the pairs inside its full tiles and inside its partial ones (the
// mask cuts them; every pair of a non-empty tile is computed). Tiles are
// classified from their blocks' position bounds exactly as the attention
// kernel does (src/kernels/attention/tiles.h). Each range is cut into blocks
// from its own start, which is the kernel's blocking whenever every range but
// the last of a list is a multiple of `block` long (S / (2 cp) tokens, ring
// chunks of 512); otherwise a block straddling two ranges counts as two.
// O(q blocks x kv ranges), no per-pair work.
struct TilePairs {
  int64_t full = 0, partial = 0;
};
TilePairs count_tile_pairs(std::span<const PositionRange> q, std::span<const PositionRange> kv,
                           const MaskSpec& mask, int64_t block);

}  // namespace longctx
