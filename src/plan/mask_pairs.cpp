#include "plan/mask_pairs.h"

#include <algorithm>

#include "core/error.h"

namespace longctx {

SeqLayout parse_seq_layout(const std::string& name) {
  if (name == "contiguous") return SeqLayout::contiguous;
  if (name == "zigzag") return SeqLayout::zigzag;
  throw ConfigError("unknown layout '" + name + "': expected contiguous or zigzag");
}

const char* seq_layout_name(SeqLayout layout) {
  return layout == SeqLayout::contiguous ? "contiguous" : "zigzag";
}

std::vector<PositionRange> layout_ranges(SeqLayout layout, int64_t seq_len, int64_t parts,
                                         int64_t index) {
  if (layout == SeqLayout::contiguous) {
    if (seq_len % parts != 0)
      throw ConfigError("contiguous layout: " + std::to_string(parts) +
                        " ranks must divide the sequence length " + std::to_string(seq_len));
    int64_t n = seq_len / parts;
    return {{index * n, (index + 1) * n}};
  }
  if (seq_len % (2 * parts) != 0)
    throw ConfigError("zigzag layout: 2 x " + std::to_string(parts) +
                      " chunks must divide the sequence length " + std::to_string(seq_len));
  int64_t c = seq_len / (2 * parts);
  int64_t j = 2 * parts - 1 - index;
  return {{index * c, (index + 1) * c}, {j * c, (j + 1) * c}};
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

}  // namespace longctx
