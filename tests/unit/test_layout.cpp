// Layouts: which sequence indices each cp rank holds, shard/unshard, the
// divisibility rules, and load imbalance counted against a brute-force scan.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "core/error.h"
#include "cp/layout.h"

namespace longctx {
namespace {

TEST(Layout, ContiguousAndZigzagIndices) {
  CpLayout c(LayoutKind::contiguous, 16, 4);
  EXPECT_EQ(c.token_indices(1), (std::vector<int64_t>{4, 5, 6, 7}));
  CpLayout z(LayoutKind::zigzag, 16, 4);  // 8 chunks of 2: rank i holds chunks i and 7-i
  EXPECT_EQ(z.token_indices(0), (std::vector<int64_t>{0, 1, 14, 15}));
  EXPECT_EQ(z.token_indices(3), (std::vector<int64_t>{6, 7, 8, 9}));
  // usp: ulysses=2 x ring=2; ring rank 1 holds chunks 1 and 2 of 4, split over 2 ulysses ranks.
  CpLayout u(LayoutKind::zigzag, 16, 4, 2);
  EXPECT_EQ(u.token_indices(2), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(u.token_indices(3), (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(u.token_indices(1), (std::vector<int64_t>{12, 13, 14, 15}));
}

TEST(Layout, EveryTokenExactlyOnce) {
  for (LayoutKind k : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (int cp : {1, 2, 3, 4, 8})
      for (int u = 1; u <= cp; ++u) {
        if (cp % u) continue;
        const int64_t S = 48 * cp;
        CpLayout l(k, S, cp, u);
        std::set<int64_t> seen;
        for (int r = 0; r < cp; ++r)
          for (int64_t i : l.token_indices(r)) EXPECT_TRUE(seen.insert(i).second);
        EXPECT_EQ(static_cast<int64_t>(seen.size()), S);
      }
}

TEST(Layout, ShardUnshardRoundTrip) {
  CpLayout l(LayoutKind::zigzag, 24, 3);
  const int64_t B = 2, row = 3;
  std::vector<float> global(B * 24 * row), back(global.size(), -1.f);
  std::iota(global.begin(), global.end(), 0.f);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> local(B * l.local_len() * row);
    l.shard(r, global.data(), local.data(), B, row);
    EXPECT_EQ(local[row], global[l.token_indices(r)[1] * row]);
    l.unshard(r, local.data(), back.data(), B, row);
  }
  EXPECT_EQ(back, global);
}

TEST(Layout, RulesNameTheSizes) {
  EXPECT_THROW(CpLayout(LayoutKind::contiguous, 30, 4), ConfigError);
  try {
    CpLayout(LayoutKind::zigzag, 12, 4);  // 4 divides 12, 2*4 does not
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("2 x ring (8)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_enum<LayoutKind>("striped"), ConfigError);
}

TEST(Layout, UnmaskedPairsMatchBruteForce) {
  const int64_t S = 40, B = 2;
  std::vector<int64_t> pos(B * S);
  std::vector<int32_t> seg(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      seg[b * S + i] = static_cast<int32_t>(i / (7 + b));
      pos[b * S + i] = i % (7 + b);  // restarting per document
    }
  for (const char* m : {"full", "causal", "local:5", "local:2:3", "chunked:6", "causal+segments"})
    for (LayoutKind k : {LayoutKind::contiguous, LayoutKind::zigzag}) {
      MaskSpec mask = MaskSpec::parse(m);
      CpLayout l(k, S, 4);
      auto pairs = unmasked_pairs_per_rank(l, mask, pos.data(), seg.data(), B);
      for (int r = 0; r < 4; ++r) {
        int64_t brute = 0;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i : l.token_indices(r))
            for (int64_t j = 0; j < S; ++j)
              brute += mask.allows(pos[b * S + i], pos[b * S + j], seg[b * S + i], seg[b * S + j]);
        EXPECT_EQ(pairs[r], brute) << m << " " << name_of(k) << " rank " << r;
      }
    }
}

TEST(Layout, ZigzagBalancesCausal) {
  const int64_t S = 1024;
  std::vector<int64_t> pos(S);
  std::iota(pos.begin(), pos.end(), 0);
  const MaskSpec causal = MaskSpec::causal();
  const double contiguous = load_imbalance(CpLayout(LayoutKind::contiguous, S, 4), causal, pos.data(), nullptr, 1);
  const double zigzag = load_imbalance(CpLayout(LayoutKind::zigzag, S, 4), causal, pos.data(), nullptr, 1);
  EXPECT_NEAR(contiguous, 7.0 / 4.0, 0.01);  // the last rank sees 7/8 of the sequence on average, the mean is 1/2
  EXPECT_NEAR(zigzag, 1.0, 0.001);
}

}  // namespace
}  // namespace longctx
