// ranks: 1 2 4 8
// Every strategy x layout x mask x GQA shape on the job's ranks: o, lse, dq,
// dk, dv of every rank equal the float64 single-rank reference over the whole
// sequence (max abs error / max abs reference <= 2e-5). At 8 ranks, the error
// is also at most twice the error of 2-rank groups on the same data
// (mesh dp=4 x cp=2), floored at 1e-6 because fp32 rounding of a 2-rank run
// can be exactly 0.
// In bf16 (q, k, v, o, dout bf16), every strategy, mask and GQA shape
// (check_all_bf16) matches the single-rank bf16 kernel within the bounds
// derived in src/cp/cp_selfcheck.cpp (err <= 1 means within them).
#include <gtest/gtest.h>

#include <algorithm>

#include "pinned_kernels.h"
#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "cp/cp_selfcheck.h"

namespace longctx {
namespace {

constexpr double kTolerance = 2e-5;

int world_size() {
  int n = 1;
  n = comm_world_size();
  return n;
}

struct Gqa {
  int64_t heads, kv_heads;
  const char* what;
};

// H = G; H = 4G; ulysses degree > G (G = 1 < U for U >= 2).
const Gqa kGqa[] = {{8, 8, "H=G"}, {8, 2, "H=4G"}, {8, 1, "G=1"}};
const char* kMasks[] = {"full", "causal", "local:5", "chunked:8", "causal+segments"};

CpCheckCase make_case(CpStrategy s, LayoutKind layout, const std::string& mask, const Gqa& g,
                      int cp) {
  CpCheckCase c;
  c.strategy = s;
  c.layout = layout;
  c.mask = MaskSpec::parse(mask);
  c.batch = 2;
  c.seq_len = std::max(32, 8 * cp);
  c.heads = g.heads;
  c.kv_heads = g.kv_heads;
  c.head_dim = 8;
  c.seed = 7;
  c.options.ring_chunk_tokens = 3;  // several chunks per shard, uneven ones too
  return c;
}

void check_all(CpStrategy s, int ulysses) {
  const int N = world_size();
  Mesh mesh(1, N, ulysses, 1);
  std::unique_ptr<Mesh> pairs;  // dp = N/2 groups of cp = 2, for the 8-vs-2 error growth check
  if (N == 8) pairs = std::make_unique<Mesh>(N / 2, 2, cp_strategy_info(s).takes_usp_factor ? 2 : 1, 1);
  for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag})
    for (const char* mask : kMasks)
      for (const Gqa& g : kGqa) {
        CpCheckCase c = make_case(s, layout, mask, g, N);
        SCOPED_TRACE(std::string(name_of(s)) + " ulysses=" + std::to_string(ulysses) +
                     " " + name_of(layout) + " " + mask + " " + g.what);
        CpCheckResult r = check_cp_strategy(mesh, c);
        EXPECT_LE(r.err_o, kTolerance);
        EXPECT_LE(r.err_lse, kTolerance);
        EXPECT_LE(r.err_dq, kTolerance);
        EXPECT_LE(r.err_dk, kTolerance);
        EXPECT_LE(r.err_dv, kTolerance);
        if (pairs) {
          CpCheckResult r2 = check_cp_strategy(*pairs, c);
          EXPECT_LE(r.max_error(), 2 * std::max(r2.max_error(), 1e-6));
        }
      }
}

// Each mask and GQA shape once, layouts alternating (both layouts meet every
// mask and shape across the two loops), on the widened path; the native and
// fused paths' own arithmetic is the kernel's (test_attention), so one GQA
// shape shows their bounds hold through the strategies (fused and dot where
// the CPU has their kernels). Kept cheap for 8 ranks.
void check_all_bf16(CpStrategy s, int ulysses) {
  Mesh mesh(1, world_size(), ulysses, 1);
  std::vector<AttentionTilePath> paths = {AttentionTilePath::bf16_widened, AttentionTilePath::bf16_native};
  if (attention_fused_tiles_supported()) paths.push_back(AttentionTilePath::bf16_fused);
  if (attention_dot_tiles_supported()) paths.push_back(AttentionTilePath::bf16_dot);
  for (AttentionTilePath path : paths) {
    const PinnedKernels pinned(KernelPin{path});
    int n = 0;
    for (const char* mask : kMasks)
      for (const Gqa& g : kGqa) {
        const LayoutKind layout = n++ % 2 ? LayoutKind::zigzag : LayoutKind::contiguous;
        if (path != AttentionTilePath::bf16_widened && std::string(g.what) != "H=4G") continue;
        CpCheckCase c = make_case(s, layout, mask, g, world_size());
        c.dtype = DType::bf16;
        SCOPED_TRACE(std::string("bf16 ") + name_of(s) + " ulysses=" + std::to_string(ulysses) + " " +
                     name_of(layout) + " " + mask + " " + g.what + " " + attention_tile_path_name(path));
        CpCheckResult r = check_cp_strategy(mesh, c);
        EXPECT_LE(r.err_o, 1.0);
        EXPECT_LE(r.err_lse, 1.0);
        EXPECT_LE(r.err_dq, 1.0);
        EXPECT_LE(r.err_dk, 1.0);
        EXPECT_LE(r.err_dv, 1.0);
      }
  }
}

// The usp factors a strategy runs at on every rank of this world: the
// splits the planner tries (usp at (ulysses, ring) = (2, 2) on 4 ranks, (2,
// 4) and (4, 2) on 8), or none; the other strategies take none (1).
std::vector<int64_t> usp_factors(const CpStrategyInfo& s) {
  return s.takes_usp_factor ? s.planner_ulysses_degrees(world_size()) : std::vector<int64_t>{1};
}

// Every registered strategy (core/cp_strategy.h): a new one is held to the
// float64 reference here without a new test.
TEST(CpAttention, EveryRegisteredStrategy) {
  ASSERT_EQ(cp_strategies().size(), EnumNames<CpStrategy>::names.size());  // every named strategy has its descriptor
  for (const CpStrategyInfo* s : cp_strategies())
    for (int64_t u : usp_factors(*s)) check_all(s->id, static_cast<int>(u));
}

TEST(CpAttentionBf16, EveryRegisteredStrategy) {
  for (const CpStrategyInfo* s : cp_strategies())
    for (int64_t u : usp_factors(*s)) check_all_bf16(s->id, static_cast<int>(u));
}

}  // namespace
}  // namespace longctx
