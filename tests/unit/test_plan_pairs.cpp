// The planner's closed-form pair counts against a naive count over every
// (q, kv) pair, on small shapes that are not multiples of anything; its tile
// counts against the attention kernel's own classification and counters.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/tiles.h"
#include "plan/mask_pairs.h"

namespace longctx {
namespace {

int64_t naive_pairs(const std::vector<PositionRange>& q, const std::vector<PositionRange>& kv,
                    const MaskSpec& mask) {
  int64_t pairs = 0;
  for (const auto& a : q)
    for (int64_t i = a.begin; i < a.end; ++i)
      for (const auto& b : kv)
        for (int64_t j = b.begin; j < b.end; ++j) pairs += mask.allows(i, j);
  return pairs;
}

std::vector<MaskSpec> masks() {
  return {MaskSpec::full(),       MaskSpec::causal(),    MaskSpec::local(0, 0),
          MaskSpec::local(6, 0),  MaskSpec::local(3, 5), MaskSpec::local(1000, 1000),
          MaskSpec::chunked(1),   MaskSpec::chunked(7),  MaskSpec::chunked(64)};
}

TEST(PlanPairs, RandomRangesMatchNaiveCount) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> pos(0, 90);
  for (const MaskSpec& mask : masks())
    for (int trial = 0; trial < 300; ++trial) {
      int64_t a = pos(rng), b = pos(rng), c = pos(rng), d = pos(rng);
      std::vector<PositionRange> q{{std::min(a, b), std::max(a, b)}};
      std::vector<PositionRange> kv{{std::min(c, d), std::max(c, d)}};
      ASSERT_EQ(count_unmasked_pairs(q, kv, mask), naive_pairs(q, kv, mask))
          << mask.to_string() << " q [" << q[0].begin << "," << q[0].end << ") kv ["
          << kv[0].begin << "," << kv[0].end << ")";
    }
}

TEST(PlanPairs, LayoutsPartitionTheSequenceAndCountEveryShardPair) {
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (int64_t parts : {1, 2, 3, 4})
      for (const MaskSpec& mask : masks()) {
        const int64_t S = 2 * parts * 11;
        std::vector<int> seen(S, 0);
        std::vector<PositionRange> all{{0, S}};
        int64_t sum = 0;
        for (int64_t i = 0; i < parts; ++i) {
          auto qi = layout_ranges(layout, S, parts, i);
          for (const auto& r : qi)
            for (int64_t p = r.begin; p < r.end; ++p) seen[p]++;
          for (int64_t j = 0; j < parts; ++j) {
            auto kj = layout_ranges(layout, S, parts, j);
            int64_t n = count_unmasked_pairs(qi, kj, mask);
            ASSERT_EQ(n, naive_pairs(qi, kj, mask)) << name_of(layout) << " " << parts;
            sum += n;
          }
        }
        for (int v : seen) ASSERT_EQ(v, 1);
        EXPECT_EQ(sum, naive_pairs(all, all, mask));
      }
}

TEST(PlanPairs, ZigzagBalancesCausalPairsExactly) {
  // Each zigzag rank holds chunks i and 2P-1-i: the same number of causal pairs.
  const int64_t S = 4096, P = 8;
  std::vector<PositionRange> all{{0, S}};
  for (int64_t i = 0; i < P; ++i)
    EXPECT_EQ(count_unmasked_pairs(layout_ranges(LayoutKind::zigzag, S, P, i), all,
                                   MaskSpec::causal()) * P,
              S * (S + 1) / 2);
}

TEST(PlanPairs, FourteenMillionTokensCountInClosedForm) {
  const int64_t S = 14LL << 20;
  std::vector<PositionRange> all{{0, S}};
  EXPECT_EQ(count_unmasked_pairs(all, all, MaskSpec::causal()), S * (S + 1) / 2);
  EXPECT_EQ(count_unmasked_pairs(all, all, MaskSpec::full()), S * S);
  // Window W (left W-1): every row but the first W-1 sees W keys.
  const int64_t W = 4096;
  EXPECT_EQ(count_unmasked_pairs(all, all, MaskSpec::local(W - 1, 0)),
            (S - (W - 1)) * W + (W - 1) * W / 2);
  const int64_t C = 8192;  // S is a multiple of C
  EXPECT_EQ(count_unmasked_pairs(all, all, MaskSpec::chunked(C)), (S / C) * C * (C + 1) / 2);
}

// Every (q block, kv block) tile classified by the kernel's own rule, each
// range cut into blocks from its start: pairs in full and partial tiles.
TilePairs naive_tiles(const std::vector<PositionRange>& q, const std::vector<PositionRange>& kv,
                      const MaskSpec& mask, int64_t block) {
  auto blocks = [&](const std::vector<PositionRange>& ranges) {
    std::vector<std::pair<attn::BlockBounds, int64_t>> out;  // bounds, rows
    for (const PositionRange& r : ranges)
      for (int64_t b = r.begin; b < r.end; b += block) {
        const int64_t e = std::min(r.end, b + block);
        out.push_back({{b, e - 1, 0, 0}, e - b});
      }
    return out;
  };
  TilePairs t;
  for (const auto& [qb, rows] : blocks(q))
    for (const auto& [kb, cols] : blocks(kv)) {
      const attn::TileKind kind = attn::classify_tile(mask, qb, kb);
      if (kind == attn::TileKind::full) t.full += rows * cols;
      if (kind == attn::TileKind::partial) t.partial += rows * cols;
    }
  return t;
}

TEST(PlanPairs, TilesMatchTheKernelsClassification) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> pos(0, 120), len(0, 40), count(1, 3);
  for (const MaskSpec& mask : masks())
    for (int64_t block : {1, 3, 8, 16})
      for (int trial = 0; trial < 60; ++trial) {
        auto ranges = [&] {  // 1 to 3 ranges, sometimes adjacent (merged when their blocks line up)
          std::vector<PositionRange> r;
          for (int64_t i = 0, n = count(rng); i < n; ++i) {
            const int64_t b = i > 0 && trial % 2 ? r.back().end : pos(rng);
            r.push_back({b, b + (i + 1 < n && trial % 3 == 0 ? block * len(rng) / 4 : len(rng))});
          }
          return r;
        };
        const std::vector<PositionRange> q = ranges(), kv = ranges();
        const TilePairs got = count_tile_pairs(q, kv, mask, block), want = naive_tiles(q, kv, mask, block);
        ASSERT_EQ(got.full, want.full) << mask.to_string() << " block " << block << " trial " << trial;
        ASSERT_EQ(got.partial, want.partial) << mask.to_string() << " block " << block << " trial " << trial;
        // Every unmasked pair lies in a computed tile.
        ASSERT_LE(count_unmasked_pairs(q, kv, mask), got.full + got.partial);
      }
}

// The tiles the kernel reports computing (AttentionStats) for every rank's
// queries against the K,V gathered in rank order, zigzag and contiguous.
TEST(PlanPairs, TilesMatchTheKernelsCounters) {
  const int64_t block = kAttentionTile;
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (int64_t parts : {1, 2, 3})
      for (const MaskSpec& mask : {MaskSpec::full(), MaskSpec::causal(), MaskSpec::local(2 * block - 1, 0),
                                   MaskSpec::local(block + 9, 0), MaskSpec::chunked(3 * block)}) {
        const int64_t S = 2 * parts * 2 * block, D = 8;
        std::vector<PositionRange> gathered;
        for (int64_t i = 0; i < parts; ++i)
          for (const PositionRange& r : layout_ranges(layout, S, parts, i)) gathered.push_back(r);
        std::vector<int64_t> kv_pos;
        for (const PositionRange& r : gathered)
          for (int64_t p = r.begin; p < r.end; ++p) kv_pos.push_back(p);
        std::vector<float> k(S * D, 0.1f), v(S * D, 0.1f);
        for (int64_t i = 0; i < parts; ++i) {
          const std::vector<PositionRange> mine = layout_ranges(layout, S, parts, i);
          std::vector<int64_t> q_pos;
          for (const PositionRange& r : mine)
            for (int64_t p = r.begin; p < r.end; ++p) q_pos.push_back(p);
          const int64_t Sq = static_cast<int64_t>(q_pos.size());
          std::vector<float> q(Sq * D, 0.1f), o(Sq * D), lse(Sq);
          AttentionArgs a;
          a.q = TensorView(q.data(), DType::f32, {1, Sq, 1, D});
          a.k = TensorView(k.data(), DType::f32, {1, S, 1, D});
          a.v = TensorView(v.data(), DType::f32, {1, S, 1, D});
          a.q_pos = q_pos.data();
          a.kv_pos = kv_pos.data();
          a.mask = mask;
          AttentionStats stats;
          attention_forward(a, TensorView(o.data(), DType::f32, {1, Sq, 1, D}), lse.data(), &stats);
          const TilePairs t = count_tile_pairs(mine, gathered, mask, block);
          EXPECT_EQ(t.full, stats.blocks_full * block * block) << name_of(layout) << " " << parts << " "
                                                               << mask.to_string() << " rank " << i;
          EXPECT_EQ(t.partial, stats.blocks_partial * block * block)
              << name_of(layout) << " " << parts << " " << mask.to_string() << " rank " << i;
        }
      }
}

TEST(PlanPairs, FourteenMillionTokensCountTilesQuickly) {
  // Whole runs that are entirely full or empty are not walked block by block.
  const int64_t S = 14LL << 20, B = 128, n = S / B;
  std::vector<PositionRange> all{{0, S}};
  const TilePairs causal = count_tile_pairs(all, all, MaskSpec::causal(), B);
  EXPECT_EQ(causal.partial, n * B * B);
  EXPECT_EQ(causal.full, n * (n - 1) / 2 * B * B);
}

TEST(PlanPairs, LayoutThatDoesNotDivideIsAConfigError) {
  EXPECT_THROW(layout_ranges(LayoutKind::contiguous, 10, 3, 0), ConfigError);
  EXPECT_THROW(layout_ranges(LayoutKind::zigzag, 12, 4, 0), ConfigError);
  EXPECT_THROW(parse_enum<LayoutKind>("striped"), ConfigError);
}

}  // namespace
}  // namespace longctx
