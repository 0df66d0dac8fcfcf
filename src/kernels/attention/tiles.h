#pragma once
// Tile classification and the vectorised row operations of the block-sparse
// flash-attention kernel (attention.cpp). Internal to src/kernels.
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.h"

namespace longctx::attn {

enum class TileKind : uint8_t { empty, partial, full };

// Bounds of the positions and segment ids inside one block of rows. The
// classification only trusts these bounds, so it is right for any position
// permutation (zigzag, striped), merely conservative when a block is not a
// contiguous range.
struct BlockBounds {
  int64_t pos_lo, pos_hi;
  int32_t seg_lo, seg_hi;
};

// Bounds of every block of `block` rows of one batch row: positions [n], segments [n] or null.
std::vector<BlockBounds> block_bounds(const int64_t* pos, const int32_t* seg, int64_t n,
                                      int64_t block);

// empty: no pair of the tile is allowed (provably); full: every pair is
// allowed (provably); partial otherwise.
TileKind classify_tile(const MaskSpec& mask, const BlockBounds& q, const BlockBounds& kv);

// Sets s[r * ld + c * col_stride] = -inf for every pair (q row r, kv column
// c) of the tile the mask forbids (col_stride 1: s [rows, cols] row-major;
// the fused kernels' transposed panels use ld 1).
// q_pos/q_seg [rows], kv_pos/kv_seg [cols] (segs may be null).
void mask_tile(const MaskSpec& mask, float* s, int64_t rows, int64_t cols, int64_t ld, int64_t col_stride,
               const int64_t* q_pos, const int64_t* kv_pos, const int32_t* q_seg,
               const int32_t* kv_seg);

// 2^x for n floats in place; x < -126 (and -inf) gives exactly 0, NaN NaN.
// Returns the sum of the results (the softmax denominator).
float exp2_shifted_inplace(float* x, int64_t n, float shift);  // x = 2^(x - shift)
float row_max(const float* x, int64_t n);                     // -inf when n == 0, NaN if any is
void scale_row(float* x, int64_t n, float factor);            // x *= factor
// ds = p * (dp - delta), in place over dp.
void softmax_grad_row(const float* p, float* dp, int64_t n, float delta);

}  // namespace longctx::attn
