// The planner's closed-form pair counts against a naive count over every
// (q, kv) pair, on small shapes that are not multiples of anything.
#include <gtest/gtest.h>

#include <random>
#include <vector>

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
  for (SeqLayout layout : {SeqLayout::contiguous, SeqLayout::zigzag})
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
            ASSERT_EQ(n, naive_pairs(qi, kj, mask)) << seq_layout_name(layout) << " " << parts;
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
    EXPECT_EQ(count_unmasked_pairs(layout_ranges(SeqLayout::zigzag, S, P, i), all,
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

TEST(PlanPairs, LayoutThatDoesNotDivideIsAConfigError) {
  EXPECT_THROW(layout_ranges(SeqLayout::contiguous, 10, 3, 0), ConfigError);
  EXPECT_THROW(layout_ranges(SeqLayout::zigzag, 12, 4, 0), ConfigError);
  EXPECT_THROW(parse_seq_layout("striped"), ConfigError);
}

}  // namespace
}  // namespace longctx
