// ranks: 1 2 4
// Tensor parallelism: with tp = world size, every rank's parameter and
// gradient shard equals the matching slice of a single-rank model (same
// seed), and the loss equals the single-rank loss.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <random>
#include <vector>

#include "comm/mesh.h"
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
  MPI_Comm_size(MPI_COMM_WORLD, &world);
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

  for (RematPolicy remat : {RematPolicy::none, RematPolicy::full}) {
    ModelOptions single_opt;
    single_opt.remat = remat;
    single_opt.impl = KernelImpl::reference;
    ModelOptions tp_opt = single_opt;
    tp_opt.mesh = &mesh;
    LlamaModel single(c, single_opt, 21), sharded(c, tp_opt, 21);
    // Initialisation does not depend on the mesh.
    EXPECT_EQ(shard_error(sharded.parameters(), single.parameters()), 0.0);

    const float scale = 1.0f / (B * S);
    const LossStats ls = single.forward_backward(batch, scale);
    const LossStats lt = sharded.forward_backward(batch, scale);
    EXPECT_NEAR(lt.loss_sum, ls.loss_sum, 1e-5 * ls.loss_sum) << remat_policy_name(remat);
    EXPECT_EQ(lt.weight_sum, ls.weight_sum);
    EXPECT_LT(shard_error(sharded.gradients(), single.gradients()), 1e-5)
        << remat_policy_name(remat);

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
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world == 1) GTEST_SKIP() << "needs tp > 1";
  Mesh mesh(1, 1, 1, world);
  LlamaConfig c = tp_config();
  c.num_kv_heads = 1;
  c.num_heads = 3;
  ModelOptions o;
  o.mesh = &mesh;
  EXPECT_THROW(LlamaModel(c, o), ConfigError);
}
