#pragma once
// How the tokens of one sequence are split over the cp = ulysses x ring ranks
// (the README's "Context parallelism"). A layout is data, not a code path: it only decides
// which sequence index each local token has; every strategy is exact for any
// layout because global positions and segment ids travel with the tokens.
//
//   contiguous  cp rank c holds sequence indices [c*S/cp, (c+1)*S/cp).
//   zigzag      the sequence is cut into 2*R chunks (R = ring = cp/ulysses);
//               ring rank i holds chunks i and 2R-1-i (balances causal masks);
//               the U ulysses ranks of ring rank i split those S/R tokens into
//               U consecutive pieces (cp_rank = ring_rank * U + ulysses_rank,
//               see src/comm/mesh.h).
//
// Requirements (ConfigError otherwise): cp divides S; zigzag also needs 2*R
// to divide S.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention/attention.h"

namespace longctx {


// The sequence index of token i (0 <= i < S / ring) of ring rank `ring_rank`
// of `ring`: the one definition of both layouts (the requirements above are
// checked by CpLayout).
int64_t ring_shard_index(LayoutKind kind, int64_t seq_len, int64_t ring, int64_t ring_rank, int64_t i);

class CpLayout {
 public:
  CpLayout(LayoutKind kind, int64_t seq_len, int cp, int ulysses = 1);

  LayoutKind kind() const { return kind_; }
  int64_t seq_len() const { return seq_len_; }
  int cp() const { return cp_; }
  int64_t local_len() const { return seq_len_ / cp_; }

  // Sequence indices (0..S-1) held by cp rank c, in local order. [S_local]
  const std::vector<int64_t>& token_indices(int cp_rank) const { return indices_[cp_rank]; }

  // local[b, i, :] = global[b, token_indices(c)[i], :], `row` elements per token.
  // global [B, S, row], local [B, S_local, row]. Used for token ids, positions,
  // segment ids, and (in tests) activations.
  template <typename T>
  void shard(int cp_rank, const T* global, T* local, int64_t batch, int64_t row = 1) const {
    const auto& idx = indices_[cp_rank];
    const int64_t L = local_len();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < row; ++x)
          local[(b * L + i) * row + x] = global[(b * seq_len_ + idx[i]) * row + x];
  }
  // The inverse: writes rank c's tokens back into the global array.
  template <typename T>
  void unshard(int cp_rank, const T* local, T* global, int64_t batch, int64_t row = 1) const {
    const auto& idx = indices_[cp_rank];
    const int64_t L = local_len();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < row; ++x)
          global[(b * seq_len_ + idx[i]) * row + x] = local[(b * L + i) * row + x];
  }

 private:
  LayoutKind kind_;
  int64_t seq_len_;
  int cp_;
  std::vector<std::vector<int64_t>> indices_;  // [cp][S_local]
};

// Unmasked (q, kv) pairs per cp rank for ONE head: the rank's query tokens
// against the whole sequence. pos/seg: [B, S] global (seg may be null unless
// mask.same_segment). O(S log S).
std::vector<int64_t> unmasked_pairs_per_rank(const CpLayout& layout, const MaskSpec& mask,
                                             const int64_t* pos, const int32_t* seg,
                                             int64_t batch);

// Load imbalance: max / mean of unmasked_pairs_per_rank (1.0 is perfect).
double load_imbalance(const CpLayout& layout, const MaskSpec& mask, const int64_t* pos,
                      const int32_t* seg, int64_t batch);

}  // namespace longctx
