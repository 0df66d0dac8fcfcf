// ranks: 1 2 4 8
// Every mesh (dp, cp, tp) in {1,2} x {1,2,4} x {1,2} whose product is the
// world size, and every CP strategy, trains like one rank: loss and gradient
// norm at step 1 within 1e-5 relative, loss after 5 more steps within 1e-4.
// The reference runs on each rank alone (Mesh::single(): no MPI involved).
// Packed synthetic documents (segment masks), zigzag layout, causal.
// The same with shard_optimizer_over_data (ZeRO-1) on a model whose parameter
// count leaves a tail on the last replica; its optimizer memory is 1/R of
// the unsharded one; and sharded checkpoints resume bit-exactly on the same
// mesh, and on another mesh or without sharding within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "core/memory.h"
#include "train/trainer.h"
#include "train_run.h"

using namespace longctx;
using longctx::test::RunResult;
using longctx::test::rel;
using longctx::test::shared_temp_dir;

namespace {

constexpr int kSteps = 6;

std::map<std::string, ConfigValue> tiny_values(int64_t dp, int64_t cp, int64_t tp, const std::string& strategy,
                                               int64_t ulysses) {
  const int64_t global_batch = 2;
  return {{"base_emb_dim", int64_t(32)},       {"base_num_query_heads", int64_t(4)},
          {"base_num_kv_heads", int64_t(2)},   {"head_dim", int64_t(16)},
          {"base_mlp_dim", int64_t(64)},       {"base_num_decoder_layers", int64_t(2)},
          {"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(32)},
          {"per_device_batch_size", global_batch / dp},
          {"ici_data_parallelism", dp},        {"ici_context_parallelism", cp},
          {"ici_tensor_parallelism", tp},      {"ici_context_usp_ulysses_parallelism", ulysses},
          {"context_parallel_strategy", strategy},
          {"steps", int64_t(kSteps)},          {"learning_rate", 1e-2},
          {"warmup_steps_fraction", 0.0},      {"gradient_clipping_threshold", 0.5},
          {"peak_tflops_per_device", 1.0},     {"enable_checkpointing", false},
          {"metrics_file", std::string("/dev/null")}, {"num_threads", int64_t(1)}};
}

// d_model 33: the flat parameter count (42603 at tp=1, 29931 at tp=2) is odd,
// so every replica count here leaves a tail for the last piece.
std::map<std::string, ConfigValue> sharded_values(int64_t dp, int64_t cp, int64_t tp, const std::string& strategy,
                                                  int64_t ulysses, bool shard = true) {
  auto v = tiny_values(dp, cp, tp, strategy, ulysses);
  v["base_emb_dim"] = int64_t(33);
  v["shard_optimizer_over_data"] = shard;
  return v;
}

RunResult train(const RunConfig& c, const Mesh& mesh) { return test::train(c, mesh, kSteps); }

using ValuesFor = std::function<std::map<std::string, ConfigValue>(int64_t dp, int64_t cp, int64_t tp,
                                                                     const std::string& strategy, int64_t ulysses)>;

// Every (dp, cp, tp) in {1,2} x {1,2,4} x {1,2} that fills the world, with
// every strategy at cp > 1: loss and gradient norm at step 0 equal the
// one-rank run within 1e-5, the loss after kSteps within 1e-4.
// tolerance: relative, for the step-0 loss and gradient norm; the loss after
// kSteps gets 10x.
void expect_every_mesh_matches_one_rank(const ValuesFor& values, const std::string& label,
                                        double tolerance = 1e-5) {
  int world = 1;
  world = comm_world_size();
  RunConfig single = config_from_values(values(1, 1, 1, "all_gather", 1));
  validate_config(single, 1);
  const RunResult ref = train(single, Mesh::single());
  ASSERT_GT(ref.grad_norm0, 0.5);  // clipping is active at step 1

  int meshes = 0;
  for (int64_t dp : {1, 2})
    for (int64_t cp : {1, 2, 4})
      for (int64_t tp : {1, 2}) {
        if (dp * cp * tp != world) continue;
        std::vector<std::pair<std::string, int64_t>> strategies = {{"all_gather", 1}};
        if (cp > 1) strategies = {{"all_gather", 1}, {"ulysses", 1}, {"ring", 1}, {"usp", 2}};
        for (const auto& [strategy, ulysses] : strategies) {
          RunConfig c = config_from_values(values(dp, cp, tp, strategy, ulysses));
          const std::string what = label + "dp=" + std::to_string(dp) + " cp=" + std::to_string(cp) +
                                   " tp=" + std::to_string(tp) + " " + strategy;
          try {
            validate_config(c, world);
          } catch (const ConfigError& e) {  // e.g. ulysses degree 4 > 2 heads per tp rank
            continue;
          }
          Mesh mesh(c.mesh_shape());
          const RunResult got = train(c, mesh);
          EXPECT_LT(rel(got.loss0, ref.loss0), tolerance) << what << ": " << got.loss0 << " vs " << ref.loss0;
          EXPECT_LT(rel(got.grad_norm0, ref.grad_norm0), tolerance)
              << what << ": " << got.grad_norm0 << " vs " << ref.grad_norm0;
          EXPECT_LT(rel(got.loss_last, ref.loss_last), 10 * tolerance)
              << what << ": " << got.loss_last << " vs " << ref.loss_last;
          if (tolerance > 1e-5)
            std::printf("%s: loss0 %.1e, gnorm0 %.1e, loss%d %.1e\n", what.c_str(), rel(got.loss0, ref.loss0),
                        rel(got.grad_norm0, ref.grad_norm0), kSteps, rel(got.loss_last, ref.loss_last));
          ++meshes;
        }
      }
  EXPECT_GT(meshes, 0);
}

}  // namespace

TEST(TrainParallel, EveryMeshAndStrategyMatchesOneRank) {
  expect_every_mesh_matches_one_rank(tiny_values, "");
}

// dtype: bfloat16 on every mesh against one bf16 rank. The meshes add
// partial sums (tp reductions, attention merges over kv shards) in another
// fp32 order, so a bf16 rounding that follows such a sum may land one unit
// (u = 2^-8 relative) away from the one-rank run's; the loss and gradient
// norm, averages over many such elements, move by a small fraction of u.
// Tolerance u / 4 (~1e-3): a strategy that drops or duplicates a piece, or
// sends K/V/dK/dV in a wrong precision, is off by far more.
TEST(TrainParallel, EveryMeshAndStrategyMatchesOneRankInBf16) {
  expect_every_mesh_matches_one_rank(
      [](int64_t dp, int64_t cp, int64_t tp, const std::string& strategy, int64_t ulysses) {
        auto v = tiny_values(dp, cp, tp, strategy, ulysses);
        v["dtype"] = std::string("bfloat16");
        return v;
      },
      "bf16 ", 1.0 / 256 / 4);
}

TEST(TrainParallel, ConfigErrorsAreRaisedOnEveryRankBeforeWork) {
  int world = 1;
  world = comm_world_size();
  RunConfig c = config_from_values(tiny_values(1, world * 2, 1, "ring", 1));
  EXPECT_THROW(validate_config(c, world), ConfigError);  // mesh product != world: every rank agrees
}

TEST(TrainParallel, CheckpointFromAShardedMeshResumesOnOneRank) {
  int world = 1, rank = 0;
  world = comm_world_size();
  rank = comm_world_rank();
  const std::filesystem::path dir = shared_temp_dir("longctx_reshard_");

  RunConfig single = config_from_values(tiny_values(1, 1, 1, "all_gather", 1));
  validate_config(single, 1);
  std::vector<double> straight;
  {
    const Mesh t_mesh = Mesh::single();
    Trainer t(single, t_mesh);
    for (int i = 0; i < kSteps; ++i) straight.push_back(t.train_step().loss);
  }
  // First half on cp x tp (TP shards gathered into the checkpoint).
  const int64_t tp = world % 2 == 0 ? 2 : 1, cp = world / tp;
  auto values = tiny_values(1, cp, tp, "ring", 1);
  values["checkpoint_dir"] = dir.string();
  RunConfig sharded = config_from_values(values);
  validate_config(sharded, world);
  {
    Mesh mesh(sharded.mesh_shape());
    Trainer t(sharded, mesh);
    for (int i = 0; i < kSteps / 2; ++i) t.train_step();
    t.save();
  }
  // Second half on one rank, on every rank.
  auto one = tiny_values(1, 1, 1, "all_gather", 1);
  one["checkpoint_dir"] = dir.string();
  RunConfig resumed_config = config_from_values(one);
  validate_config(resumed_config, 1);
  const Mesh resumed_mesh = Mesh::single();
  Trainer resumed(resumed_config, resumed_mesh);
  ASSERT_NE(resumed.resume(), "");
  EXPECT_EQ(resumed.step(), kSteps / 2);
  for (int i = kSteps / 2; i < kSteps; ++i) {
    double loss = resumed.train_step().loss;
    EXPECT_LT(rel(loss, straight[i]), 1e-4) << "step " << i << ": " << loss << " vs " << straight[i];
  }
  Communicator::world("barrier").barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

TEST(TrainParallel, ShardedOptimizerMatchesOneRankOnEveryMesh) {
  expect_every_mesh_matches_one_rank(
      [](int64_t dp, int64_t cp, int64_t tp, const std::string& strategy, int64_t ulysses) {
        return sharded_values(dp, cp, tp, strategy, ulysses);
      },
      "ZeRO-1 ");
}

TEST(TrainParallel, ShardedOptimizerMemoryIsOneReplicaShare) {
  int world = 1;
  world = comm_world_size();
  const int64_t tp = world % 2 == 0 ? 2 : 1, cp = world / tp;
  size_t unsharded = 0, sharded = 0;
  for (bool shard : {false, true}) {
    RunConfig c = config_from_values(sharded_values(1, cp, tp, "ring", 1, shard));
    validate_config(c, world);
    Mesh mesh(c.mesh_shape());
    const size_t before = MemoryTracker::global().current(MemCategory::optimizer);
    Trainer t(c, mesh);
    t.train_step();
    const size_t bytes = MemoryTracker::global().current(MemCategory::optimizer) - before;
    (shard ? sharded : unsharded) = bytes;
    if (shard) {
      const size_t n = t.model().flat_parameters().size();
      const int R = mesh.replicas().size();
      EXPECT_EQ(t.optimizer().sharded(), R > 1);
      EXPECT_EQ(bytes, 8 * flat_piece(n, R, mesh.replicas().rank()).size);
      // Every element of the flat vector is owned exactly once.
      int64_t owned = static_cast<int64_t>(t.optimizer().piece().size);
      mesh.replicas().all_reduce_sum(&owned, 1);
      EXPECT_EQ(owned, static_cast<int64_t>(n));
    }
  }
  const size_t R = static_cast<size_t>(cp);  // dp = 1: the replicas are the cp ranks
  EXPECT_GT(sharded, 0u);
  // 1/R of the unsharded moments, up to the tail of fewer than R elements (8 bytes each).
  EXPECT_LE(sharded * R, unsharded + 8 * R * (R - 1)) << sharded << " x " << R << " vs " << unsharded;
  EXPECT_GE(sharded * R + 8 * R * (R - 1), unsharded) << sharded << " x " << R << " vs " << unsharded;
  if (R > 1) {
    EXPECT_LT(sharded, unsharded / R + 8 * R);
  }
}

TEST(TrainParallel, ShardedCheckpointResumesOnTheSameMeshAnotherMeshAndUnsharded) {
  int world = 1, rank = 0;
  world = comm_world_size();
  rank = comm_world_rank();
  const std::filesystem::path dir = shared_temp_dir("longctx_zero1_");
  constexpr int kHalf = 5;
  auto with_dir = [&](std::map<std::string, ConfigValue> v) {
    v["checkpoint_dir"] = dir.string();
    v["steps"] = int64_t(2 * kHalf);
    return v;
  };
  // A: every rank on cp (ring), sharded over cp.
  RunConfig a = config_from_values(with_dir(sharded_values(1, world, 1, "ring", 1)));
  validate_config(a, world);
  std::vector<double> straight;
  std::vector<float> final_straight;
  {
    Mesh mesh(a.mesh_shape());
    Trainer t(a, mesh);
    for (int i = 0; i < 2 * kHalf; ++i) straight.push_back(t.train_step().loss);
    auto p = t.model().flat_parameters();
    final_straight.assign(p.begin(), p.end());
  }
  {
    Mesh mesh(a.mesh_shape());
    Trainer t(a, mesh);
    for (int i = 0; i < kHalf; ++i) EXPECT_EQ(t.train_step().loss, straight[i]) << "step " << i;
    t.save();
  }
  // Same mesh and sharding: bit for bit.
  {
    Mesh mesh(a.mesh_shape());
    Trainer t(a, mesh);
    ASSERT_NE(t.resume(), "");
    EXPECT_EQ(t.step(), kHalf);
    for (int i = kHalf; i < 2 * kHalf; ++i) EXPECT_EQ(t.train_step().loss, straight[i]) << "same mesh, step " << i;
    auto p = t.model().flat_parameters();
    EXPECT_TRUE(std::equal(p.begin(), p.end(), final_straight.begin(), final_straight.end()));
  }
  // B: another mesh (tp = 2 when it divides the world; dp = 2 otherwise), still sharded.
  {
    const int64_t tp = world % 2 == 0 ? 2 : 1, dp = world / tp >= 2 ? 2 : 1, cp = world / (tp * dp);
    RunConfig b = config_from_values(with_dir(sharded_values(dp, cp, tp, "all_gather", 1)));
    validate_config(b, world);
    Mesh mesh(b.mesh_shape());
    Trainer t(b, mesh);
    ASSERT_NE(t.resume(), "");
    EXPECT_EQ(t.step(), kHalf);
    for (int i = kHalf; i < 2 * kHalf; ++i) {
      const double loss = t.train_step().loss;
      EXPECT_LT(rel(loss, straight[i]), 1e-5) << "other mesh, step " << i << ": " << loss << " vs " << straight[i];
    }
  }
  // C: one rank, sharding off (on every rank).
  {
    RunConfig one = config_from_values(with_dir(sharded_values(1, 1, 1, "all_gather", 1, false)));
    validate_config(one, 1);
    const Mesh t_mesh = Mesh::single();
    Trainer t(one, t_mesh);
    ASSERT_NE(t.resume(), "");
    EXPECT_EQ(t.step(), kHalf);
    for (int i = kHalf; i < 2 * kHalf; ++i) {
      const double loss = t.train_step().loss;
      EXPECT_LT(rel(loss, straight[i]), 1e-5) << "one rank unsharded, step " << i << ": " << loss << " vs " << straight[i];
    }
  }
  Communicator::world("barrier").barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}
