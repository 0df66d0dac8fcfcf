#include "cp/layout.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace longctx {

int64_t ring_shard_index(LayoutKind kind, int64_t seq_len, int64_t ring, int64_t ring_rank, int64_t i) {
  if (kind == LayoutKind::contiguous) return ring_rank * (seq_len / ring) + i;
  const int64_t chunk = seq_len / (2 * ring);  // zigzag: chunks ring_rank and 2 ring - 1 - ring_rank
  return i < chunk ? ring_rank * chunk + i : (2 * ring - 1 - ring_rank) * chunk + (i - chunk);
}

CpLayout::CpLayout(LayoutKind kind, int64_t seq_len, int cp, int ulysses)
    : kind_(kind), seq_len_(seq_len), cp_(cp) {
  if (cp < 1 || ulysses < 1 || cp % ulysses != 0)
    throw ConfigError("layout: ulysses (" + std::to_string(ulysses) + ") must divide cp (" +
                      std::to_string(cp) + ")");
  if (seq_len < 1 || seq_len % cp != 0)
    throw ConfigError("layout: the context parallelism cp (" + std::to_string(cp) +
                      ") must divide the sequence length (" + std::to_string(seq_len) + ")");
  const int R = cp / ulysses;
  if (kind == LayoutKind::zigzag && seq_len % (2 * R) != 0)
    throw ConfigError("zigzag layout: 2 x ring (" + std::to_string(2 * R) +
                      ") must divide the sequence length (" + std::to_string(seq_len) + ")");
  indices_.resize(cp);
  const int64_t L = seq_len / cp;
  for (int ring = 0; ring < R; ++ring) {
    // The S/R sequence indices of this ring rank, in order.
    std::vector<int64_t> shard;
    for (int64_t i = 0; i < seq_len / R; ++i) shard.push_back(ring_shard_index(kind, seq_len, R, ring, i));
    for (int u = 0; u < ulysses; ++u)
      indices_[ring * ulysses + u].assign(shard.begin() + u * L, shard.begin() + (u + 1) * L);
  }
}

std::vector<int64_t> unmasked_pairs_per_rank(const CpLayout& layout, const MaskSpec& mask,
                                             const int64_t* pos, const int32_t* seg,
                                             int64_t batch) {
  const int64_t S = layout.seq_len();
  const bool by_segment = mask.same_segment;
  if (by_segment && !seg) throw ShapeError("unmasked_pairs_per_rank: mask needs segment ids");
  std::vector<int64_t> pairs(layout.cp(), 0);
  for (int64_t b = 0; b < batch; ++b) {
    // Sorted kv positions per segment (one group without segment masking).
    std::map<int32_t, std::vector<int64_t>> groups;
    for (int64_t j = 0; j < S; ++j) groups[by_segment ? seg[b * S + j] : 0].push_back(pos[b * S + j]);
    for (auto& [id, v] : groups) std::sort(v.begin(), v.end());
    auto count_in = [](const std::vector<int64_t>& v, int64_t lo, int64_t hi) -> int64_t {
      if (lo > hi) return 0;
      return std::upper_bound(v.begin(), v.end(), hi) - std::lower_bound(v.begin(), v.end(), lo);
    };
    for (int c = 0; c < layout.cp(); ++c)
      for (int64_t i : layout.token_indices(c)) {
        const int64_t p = pos[b * S + i];
        const auto& v = groups[by_segment ? seg[b * S + i] : 0];
        const int64_t lo_all = INT64_MIN / 2, hi_all = INT64_MAX / 2;
        switch (mask.kind) {
          case MaskSpec::Kind::full: pairs[c] += count_in(v, lo_all, hi_all); break;
          case MaskSpec::Kind::causal: pairs[c] += count_in(v, lo_all, p); break;
          case MaskSpec::Kind::local: pairs[c] += count_in(v, p - mask.left, p + mask.right); break;
          case MaskSpec::Kind::chunked:  // positions are >= 0: the chunk starts at p - p % chunk
            pairs[c] += count_in(v, p - p % mask.chunk, p);
            break;
        }
      }
  }
  return pairs;
}

double load_imbalance(const CpLayout& layout, const MaskSpec& mask, const int64_t* pos,
                      const int32_t* seg, int64_t batch) {
  auto pairs = unmasked_pairs_per_rank(layout, mask, pos, seg, batch);
  int64_t mx = 0, sum = 0;
  for (int64_t p : pairs) {
    mx = std::max(mx, p);
    sum += p;
  }
  if (sum == 0) return 1.0;
  return static_cast<double>(mx) * layout.cp() / static_cast<double>(sum);
}

}  // namespace longctx
