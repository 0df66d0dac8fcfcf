// ranks: 1 2 4
// Tensor and context parallelism: every rank's parameter and gradient shard
// equals the matching slice of a single-rank model (same seed), and the loss
// equals the single-rank loss, for tp = world size, and for every (cp, tp)
// factorisation of the world with each CP strategy and layout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "comm/mesh.h"
#include "cp/layout.h"
#include "model/llama.h"

using namespace longctx;

namespace {

LlamaConfig tp_config() {
  LlamaConfig c;
  c.vocab_size = 13;
  c.d_model = 16;
  c.num_heads = 8;
  c.num_kv_heads = 4;  // divisible by tp = 4
  c.head_dim = 6;
  c.mlp_dim = 24;
  c.num_layers = 2;
  c.rope_theta = 1000.0;
  return c;
}

// Element (r, k) of the shard of `p` in the full tensor `full` ([rows, cols] or [n]).
float full_value(const NamedTensor& p, const float* full, int64_t r, int64_t k) {
  if (p.local.rank == 1) return full[r];
  const int64_t cols = p.full_shape[1];
  const int64_t fr = p.split == TpSplit::dim0 ? p.split_offset + r : r;
  const int64_t fk = p.split == TpSplit::dim1 ? p.split_offset + k : k;
  return full[fr * cols + fk];
}

// max |shard - slice of full| / max |slice|, over every tensor.
double shard_error(const std::vector<NamedTensor>& shards, const std::vector<NamedTensor>& full) {
  double num = 0.0, den = 1e-30;
  for (size_t t = 0; t < shards.size(); ++t) {
    const NamedTensor& p = shards[t];
    EXPECT_EQ(p.name, full[t].name);
    const int64_t rows = p.local.dim(0), cols = p.local.rank == 1 ? 1 : p.local.dim(1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) {
        const double want = full_value(p, full[t].local.f32(), r, k);
        num = std::max(num, std::abs(p.local.f32()[r * cols + k] - want));
        den = std::max(den, std::abs(want));
      }
  }
  return num / den;
}

}  // namespace

TEST(ModelTp, ShardsAndLossEqualSingleRank) {
  int world = 1;
  world = comm_world_size();
  Mesh mesh(1, 1, 1, world);
  const LlamaConfig c = tp_config();

  const int64_t B = 2, S = 9;
  std::mt19937 gen(11);  // same data on every rank (tp ranks see the same tokens)
  std::vector<int32_t> tokens(B * S), targets(B * S);
  std::vector<int64_t> positions(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    tokens[i] = static_cast<int32_t>(gen() % c.vocab_size);
    targets[i] = static_cast<int32_t>(gen() % c.vocab_size);
    positions[i] = i % S;
  }
  Batch batch{B, S, tokens.data(), targets.data(), positions.data(), nullptr, nullptr};

  // The last: the tp ranks in token chunks (of 4 of the 18 rows; their
  // all-reduces per chunk) against one rank without.
  for (auto [remat, chunk] : {std::pair{RematPolicy::none, 0}, {RematPolicy::full, 0}, {RematPolicy::minimal, 4}}) {
    ModelOptions single_opt;
    single_opt.remat = remat;
    single_opt.impl = KernelImpl::reference;
    ModelOptions tp_opt = single_opt;
    tp_opt.mesh = &mesh;
    tp_opt.layer_token_chunk = chunk;
    LlamaModel single(c, single_opt, 21), sharded(c, tp_opt, 21);
    // Initialisation does not depend on the mesh.
    EXPECT_EQ(shard_error(sharded.parameters(), single.parameters()), 0.0);

    const float scale = 1.0f / (B * S);
    const LossStats ls = single.forward_backward(batch, scale);
    const LossStats lt = sharded.forward_backward(batch, scale);
    EXPECT_NEAR(lt.loss_sum, ls.loss_sum, 1e-5 * ls.loss_sum) << name_of(remat);
    EXPECT_EQ(lt.weight_sum, ls.weight_sum);
    EXPECT_LT(shard_error(sharded.gradients(), single.gradients()), 1e-5)
        << name_of(remat);

    // Gradient norm over the mesh: sharded tensors summed over tp, replicated ones once.
    double ss_single = 0.0, ss_local = 0.0;
    for (float g : single.flat_gradients()) ss_single += static_cast<double>(g) * g;
    for (const NamedTensor& g : sharded.gradients()) {
      double ss = 0.0;
      for (int64_t i = 0; i < g.local.numel(); ++i) ss += static_cast<double>(g.local.f32()[i]) * g.local.f32()[i];
      ss_local += g.split == TpSplit::none ? ss / world : ss;
    }
    mesh.tp().all_reduce_sum(&ss_local, 1);
    EXPECT_NEAR(std::sqrt(ss_local), std::sqrt(ss_single), 1e-5 * std::sqrt(ss_single));
  }
}

TEST(ModelTp, RejectsHeadsNotDivisibleByTp) {
  int world = 1;
  world = comm_world_size();
  if (world == 1) GTEST_SKIP() << "needs tp > 1";
  Mesh mesh(1, 1, 1, world);
  LlamaConfig c = tp_config();
  c.num_kv_heads = 1;
  c.num_heads = 3;
  ModelOptions o;
  o.mesh = &mesh;
  EXPECT_THROW(LlamaModel(c, o), ConfigError);
}

TEST(ModelCp, EveryStrategyAndFactorisationEqualsSingleRank) {
  int world = 1;
  world = comm_world_size();
  const LlamaConfig c = tp_config();
  const int64_t B = 2, S = 16;
  std::mt19937 gen(12);
  std::vector<int32_t> tokens(B * S), targets(B * S), segments(B * S);
  std::vector<int64_t> positions(B * S);
  std::vector<float> weights(B * S);
  for (int64_t i = 0; i < B * S; ++i) {
    tokens[i] = static_cast<int32_t>(gen() % c.vocab_size);
    targets[i] = static_cast<int32_t>(gen() % c.vocab_size);
    positions[i] = i % S;
    segments[i] = (i % S) < 5 ? 0 : 1;  // two documents per row, the first short
    weights[i] = (i % 7 == 3) ? 0.0f : 1.0f;
  }
  ModelOptions single_opt;
  single_opt.remat = RematPolicy::full;  // backward recomputes attention: the strategy runs twice
  single_opt.impl = KernelImpl::reference;
  LlamaModel single(c, single_opt, 31);
  const Batch full_batch{B, S, tokens.data(), targets.data(), positions.data(), segments.data(),
                         weights.data()};
  const LossStats ls = single.forward_backward(full_batch, 1.0f);

  struct Case { int cp, ulysses, tp; CpStrategy strategy; LayoutKind layout; };
  std::vector<Case> cases;
  for (int cp = 1; cp <= world; cp *= 2) {
    const int tp = world / cp;
    for (CpStrategy st : {CpStrategy::all_gather, CpStrategy::ulysses, CpStrategy::ring,
                          CpStrategy::usp}) {
      if (cp == 1 && st != CpStrategy::all_gather) continue;  // cp = 1 is the kernel for all
      if (st == CpStrategy::usp && cp < 4) continue;          // usp needs ulysses x ring >= 2 x 2
      const int ulysses = st == CpStrategy::usp ? 2 : 1;
      for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag})
        cases.push_back({cp, ulysses, tp, st, layout});
    }
  }
  for (const Case& k : cases) {
    const std::string name = std::string(name_of(k.strategy)) + " cp=" +
                             std::to_string(k.cp) + " tp=" + std::to_string(k.tp) + " " +
                             name_of(k.layout);
    Mesh mesh(1, k.cp, k.ulysses, k.tp);
    ModelOptions opt = single_opt;
    opt.mesh = &mesh;
    opt.cp_strategy = k.strategy;
    LlamaModel sharded(c, opt, 31);
    const CpLayout layout(k.layout, S, k.cp, k.ulysses);
    const int64_t L = layout.local_len();
    std::vector<int32_t> tok(B * L), tgt(B * L), seg(B * L);
    std::vector<int64_t> pos(B * L);
    std::vector<float> w(B * L);
    const int r = mesh.cp_rank();
    layout.shard(r, tokens.data(), tok.data(), B);
    layout.shard(r, targets.data(), tgt.data(), B);
    layout.shard(r, segments.data(), seg.data(), B);
    layout.shard(r, positions.data(), pos.data(), B);
    layout.shard(r, weights.data(), w.data(), B);
    LossStats lt = sharded.forward_backward(
        Batch{B, L, tok.data(), tgt.data(), pos.data(), seg.data(), w.data()}, 1.0f);
    // The trainer's reduction over the ranks that hold the same shard.
    double sums[2] = {lt.loss_sum, lt.weight_sum};
    mesh.replicas().all_reduce_sum(sums, 2);
    auto g = sharded.flat_gradients();
    mesh.replicas().all_reduce_sum(g.data(), g.size());
    EXPECT_NEAR(sums[0], ls.loss_sum, 1e-5 * ls.loss_sum) << name;
    EXPECT_EQ(sums[1], ls.weight_sum) << name;
    EXPECT_LT(shard_error(sharded.gradients(), single.gradients()), 1e-5) << name;
  }
}
