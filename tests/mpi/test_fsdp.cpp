// ranks: 2 4 8
// FSDP (ici_fsdp_parallelism, fsdp_over_context) trains like one rank: every
// mesh dp x fsdp x cp x tp of this world size with fsdp > 1 or parameters
// sharded over cp, every CP strategy, with and without sequence parallelism
// and tied embeddings: step-1 loss and gradient norm within 1e-5 relative,
// the loss after 5 more steps within 1e-4 (the reference runs on each rank
// alone, Mesh::single(), on the same global batch). d_model 33 makes every
// unit's size odd, so blocks are padded.
// Memory: each rank's parameter and gradient peaks are its shard (1/R of the
// unsharded flat vector, up to padding) plus the gathered units, counted here
// from the unit sizes and the schedule written out by hand; the optimizer's
// moments are 1/R. Checkpoints written sharded resume bit-exactly on the same
// mesh and within 1e-5 unsharded on one rank.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/memory.h"
#include "plan/planner.h"
#include "train/trainer.h"
#include "train_run.h"

using namespace longctx;
using longctx::test::rel;

namespace {

constexpr int kSteps = 6;
constexpr int64_t kGlobalBatch = 8;

struct MeshCase {
  int64_t dp = 1, fsdp = 1, cp = 1, tp = 1;
  bool over_context = false;
  std::string strategy = "all_gather";
  int64_t ulysses = 1;
  bool sequence_parallel = false;
  std::string text() const {
    return "dp=" + std::to_string(dp) + " fsdp=" + std::to_string(fsdp) + " cp=" + std::to_string(cp) +
           (over_context ? " (over context)" : "") + " tp=" + std::to_string(tp) + (sequence_parallel ? " sp" : "") +
           " " + strategy;
  }
};

std::map<std::string, ConfigValue> values(const MeshCase& m, bool tied = false, const std::string& dtype = "float32") {
  return {{"base_emb_dim", int64_t(33)},       {"base_num_query_heads", int64_t(4)},
          {"base_num_kv_heads", int64_t(2)},   {"head_dim", int64_t(16)},
          {"base_mlp_dim", int64_t(64)},       {"base_num_decoder_layers", int64_t(2)},
          {"logits_via_embedding", tied},      {"dtype", dtype},
          {"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(32)},
          {"per_device_batch_size", kGlobalBatch / (m.dp * m.fsdp)},
          {"ici_data_parallelism", m.dp},      {"ici_fsdp_parallelism", m.fsdp},
          {"fsdp_over_context", m.over_context},
          {"ici_context_parallelism", m.cp},   {"ici_tensor_parallelism", m.tp},
          {"ici_context_usp_ulysses_parallelism", m.ulysses},
          {"tensor_sequence_parallelism", m.sequence_parallel},
          {"context_parallel_strategy", m.strategy},
          {"steps", int64_t(kSteps)},          {"learning_rate", 1e-2},
          {"warmup_steps_fraction", 0.0},      {"gradient_clipping_threshold", 0.5},
          {"peak_tflops_per_device", 1.0},     {"enable_checkpointing", false},
          {"metrics_file", std::string("/dev/null")}, {"num_threads", int64_t(1)}};
}

// Every mesh of this world size whose parameters are sharded (fsdp > 1, or
// fsdp_over_context with cp > 1), each strategy at cp > 1 (or the ring only),
// sequence parallelism at tp > 1.
std::vector<MeshCase> sharded_meshes(int world, bool every_strategy) {
  std::vector<MeshCase> out;
  for (int64_t dp : {1, 2})
    for (int64_t fsdp : {1, 2, 4, 8})
      for (int64_t cp : {1, 2, 4})
        for (int64_t tp : {1, 2}) {
          if (dp * fsdp * cp * tp != world) continue;
          for (bool over : {false, true}) {
            if (over && cp == 1) continue;
            if (fsdp * (over ? cp : 1) == 1) continue;
            std::vector<std::pair<std::string, int64_t>> strategies = {{"all_gather", 1}};
            if (cp > 1 && every_strategy) strategies = {{"all_gather", 1}, {"ulysses", 1}, {"ring", 1}, {"usp", 2}};
            if (cp > 1 && !every_strategy) strategies = {{"ring", 1}};
            for (const auto& [strategy, ulysses] : strategies)
              for (bool sp : {false, true}) {
                if (sp && tp == 1) continue;
                out.push_back({dp, fsdp, cp, tp, over, strategy, ulysses, sp});
              }
          }
        }
  return out;
}

void expect_every_sharded_mesh_matches_one_rank(bool tied, const std::string& dtype, double tolerance,
                                                bool every_strategy) {
  const int world = comm_world_size();
  RunConfig single = config_from_values(values(MeshCase{}, tied, dtype));
  validate_config(single, 1);
  const test::RunResult ref = test::train(single, Mesh::single(), kSteps);
  ASSERT_GT(ref.grad_norm0, 0.5);  // clipping is active at step 1
  int meshes = 0;
  for (const MeshCase& m : sharded_meshes(world, every_strategy)) {
    RunConfig c = config_from_values(values(m, tied, dtype));
    try {
      validate_config(c, world);
    } catch (const ConfigError&) {  // e.g. a ulysses degree above the heads per tp rank
      continue;
    }
    Mesh mesh(c.mesh_shape());
    const test::RunResult got = test::train(c, mesh, kSteps);
    const std::string what = m.text() + (tied ? " tied" : "") + " " + dtype;
    EXPECT_LT(rel(got.loss0, ref.loss0), tolerance) << what << ": " << got.loss0 << " vs " << ref.loss0;
    EXPECT_LT(rel(got.grad_norm0, ref.grad_norm0), tolerance) << what << ": " << got.grad_norm0 << " vs "
                                                               << ref.grad_norm0;
    EXPECT_LT(rel(got.loss_last, ref.loss_last), 10 * tolerance) << what << ": " << got.loss_last << " vs "
                                                                  << ref.loss_last;
    ++meshes;
  }
  EXPECT_GT(meshes, 0);
}

}  // namespace

TEST(Fsdp, EveryShardedMeshAndStrategyMatchesOneRank) {
  expect_every_sharded_mesh_matches_one_rank(false, "float32", 1e-5, true);
}

// The tied LM head: the embedding's unit is gathered for the loss head and
// its gradients reduce-scattered twice (loss head, embedding backward).
TEST(Fsdp, TiedEmbeddingsMatchOneRank) { expect_every_sharded_mesh_matches_one_rank(true, "float32", 1e-5, false); }

// bf16: the gathered units are rounded to bf16 exactly as the unsharded copy
// is, so only the reduction order differs (TrainParallel's bf16 bound, u / 4).
TEST(Fsdp, Bf16MatchesOneRank) {
  expect_every_sharded_mesh_matches_one_rank(false, "bfloat16", 1.0 / 256 / 4, false);
}

TEST(Fsdp, WithZero1OverTheReplicasMatchesOneRank) {
  const int world = comm_world_size();
  if (world < 4) GTEST_SKIP() << "needs dp = 2 and fsdp = 2";
  RunConfig single = config_from_values(values(MeshCase{}));
  validate_config(single, 1);
  const test::RunResult ref = test::train(single, Mesh::single(), kSteps);
  MeshCase m{2, world / 2, 1, 1};
  auto v = values(m);
  v["shard_optimizer_over_data"] = true;
  RunConfig c = config_from_values(v);
  validate_config(c, world);
  Mesh mesh(c.mesh_shape());
  const test::RunResult got = test::train(c, mesh, kSteps);
  EXPECT_LT(rel(got.loss0, ref.loss0), 1e-5);
  EXPECT_LT(rel(got.grad_norm0, ref.grad_norm0), 1e-5);
  EXPECT_LT(rel(got.loss_last, ref.loss_last), 1e-4);
}

// Per-rank peaks: the shard plus the units in flight, computed here from the
// parameter table and the schedule of src/model/sharded_parameters.h written
// out by hand (fp32, untied, 2 layers, training):
//   forward:  embedding + layer 0 (prefetch), layer 0 + layer 1, layer 1 + head
//   backward: head + layer 1, layer 1 + layer 0, layer 0; gradients one unit at a time.
TEST(Fsdp, ParameterGradientAndOptimizerPeaksAreTheShardPlusTheGatheredUnits) {
  const int world = comm_world_size();
  MeshCase m{1, world, 1, 1};
  RunConfig c = config_from_values(values(m));
  validate_config(c, world);
  const LlamaConfig& model = c.model;
  const int64_t R = world;
  // Unit sizes from the parameter table, independently of parameter_units().
  int64_t embed = 0, layer = 0, head = 0;
  for (const ParameterSpec& s : parameter_table(model)) {
    const int64_t n = s.rows * (s.cols == 0 ? 1 : s.cols);
    if (s.name.rfind("model.layers.0.", 0) == 0) layer += n;
    else if (s.name == "model.embed_tokens.weight") embed += n;
    else if (s.name.rfind("model.layers.", 0) != 0) head += n;
  }
  auto padded = [&](int64_t n) { return (n + R - 1) / R * R; };  // a unit gathered: R equal blocks
  const int64_t shard = (padded(embed) + 2 * padded(layer) + padded(head)) / R;
  const int64_t gathered_params =
      std::max({padded(embed) + padded(layer), 2 * padded(layer), padded(layer) + padded(head)});
  const int64_t gathered_grads = std::max({padded(embed), padded(layer), padded(head)});
  const int64_t unsharded = model.num_parameters();

  MemoryTracker& t = MemoryTracker::global();
  const size_t p0 = t.current(MemCategory::parameters), g0 = t.current(MemCategory::gradients),
               o0 = t.current(MemCategory::optimizer);
  t.reset_peaks();
  Mesh mesh(c.mesh_shape());
  Trainer trainer(c, mesh);
  trainer.train_step();
  trainer.train_step();
  EXPECT_EQ(static_cast<int64_t>(t.peak(MemCategory::parameters) - p0), 4 * (shard + gathered_params));
  EXPECT_EQ(static_cast<int64_t>(t.peak(MemCategory::gradients) - g0), 4 * (shard + gathered_grads));
  EXPECT_EQ(static_cast<int64_t>(t.current(MemCategory::optimizer) - o0), 8 * shard);
  // 1/R of the unsharded vector, up to less than one element of padding per unit and rank.
  EXPECT_GE(shard * R, unsharded);
  EXPECT_LT(shard * R, unsharded + 4 * R);
  EXPECT_EQ(static_cast<int64_t>(trainer.model().flat_parameters().size()), shard);
}

TEST(Fsdp, ShardedCheckpointResumesOnTheSameMeshAndUnshardedOnOneRank) {
  const int world = comm_world_size(), rank = comm_world_rank();
  const std::filesystem::path dir = test::shared_temp_dir("longctx_fsdp_");
  constexpr int kHalf = 3;
  auto with_dir = [&](std::map<std::string, ConfigValue> v) {
    v["checkpoint_dir"] = dir.string();
    v["steps"] = int64_t(2 * kHalf);
    return v;
  };
  const int64_t cp = world >= 4 ? 2 : 1;
  MeshCase m{1, world / cp, cp, 1, cp > 1, "ring"};
  RunConfig a = config_from_values(with_dir(values(m)));
  validate_config(a, world);
  // The sharded save and its same-mesh resume keep the parameter shard and
  // the moments on disk (state_offload_target): a checkpoint is the same.
  auto on_disk = values(m);
  on_disk["optimizer_memory_host_offload"] = true;
  on_disk["parameter_memory_host_offload"] = true;
  on_disk["state_offload_target"] = std::string("disk");
  on_disk["offload_dir"] = (dir / ("spill-" + std::to_string(rank))).string();
  RunConfig a_disk = config_from_values(with_dir(on_disk));
  validate_config(a_disk, world);
  std::vector<double> straight;
  {
    Mesh mesh(a.mesh_shape());
    Trainer t(a, mesh);
    for (int i = 0; i < 2 * kHalf; ++i) straight.push_back(t.train_step().loss);
  }
  {
    Mesh mesh(a_disk.mesh_shape());
    Trainer t(a_disk, mesh);
    for (int i = 0; i < kHalf; ++i) t.train_step();
    t.save();
  }
  {  // same mesh: bit for bit
    Mesh mesh(a_disk.mesh_shape());
    Trainer t(a_disk, mesh);
    ASSERT_NE(t.resume(), "");
    for (int i = kHalf; i < 2 * kHalf; ++i) EXPECT_EQ(t.train_step().loss, straight[i]) << "same mesh, step " << i;
  }
  {  // one rank, unsharded
    RunConfig one = config_from_values(with_dir(values(MeshCase{})));
    validate_config(one, 1);
    const Mesh single = Mesh::single();
    Trainer t(one, single);
    ASSERT_NE(t.resume(), "");
    for (int i = kHalf; i < 2 * kHalf; ++i) {
      const double loss = t.train_step().loss;
      EXPECT_LT(rel(loss, straight[i]), 1e-5) << "one rank, step " << i << ": " << loss << " vs " << straight[i];
    }
  }
  Communicator::world("barrier").barrier();
  if (rank == 0) std::filesystem::remove_all(dir);
}

// optimizer_memory_host_offload and parameter_memory_host_offload: under a
// device budget that the plain FSDP run breaks (OutOfMemoryError on every
// rank), the run with the moments and the parameter shard in the host pool,
// and again on disk (state_offload_target), trains with bit-identical
// losses (same mesh, 1 thread), its device holds no moments and only the
// gathered units of parameters (on disk, the update's staged chunks too),
// and the planner predicts those device and host/disk bytes exactly.
TEST(Fsdp, OptimizerAndParameterOffloadToHostOrDiskFitABudgetThePlainRunBreaks) {
  const int world = comm_world_size();
  MeshCase m{1, world, 1, 1};
  RunConfig plain = config_from_values(values(m));
  validate_config(plain, world);
  MemoryTracker& t = MemoryTracker::global();
  int64_t optimizer_peak = 0;
  auto losses = [&](const RunConfig& c, int64_t* device_peak, int64_t* params_peak, int64_t* optimizer_now) {
    Mesh mesh(c.mesh_shape());
    const size_t before = t.current_total(), p0 = t.current(MemCategory::parameters),
                 o0 = t.current(MemCategory::optimizer);
    t.reset_peaks();
    std::vector<double> out;
    Trainer trainer(c, mesh);
    for (int i = 0; i < kSteps; ++i) out.push_back(trainer.train_step().loss);
    if (device_peak) *device_peak = int64_t(t.peak_total() - before);
    if (params_peak) *params_peak = int64_t(t.peak(MemCategory::parameters) - p0);
    if (optimizer_now) *optimizer_now = int64_t(t.current(MemCategory::optimizer) - o0);
    optimizer_peak = int64_t(t.peak(MemCategory::optimizer) - o0);
    return out;
  };
  int64_t plain_peak = 0;
  const std::vector<double> reference = losses(plain, &plain_peak, nullptr, nullptr);
  // What the two levers take off the device: the moments and the parameter shard.
  const int64_t shard_bytes = 4 * parameter_shard_elements(plain.model, 1, world);
  const int64_t budget = int64_t(t.current_total()) + plain_peak - shard_bytes;  // below the plain run's peak
  const std::filesystem::path spill = test::shared_temp_dir("longctx_fsdp_spill_");
  auto with = [&](bool offload, const std::string& target) {
    auto v = values(m);
    v["device_memory_budget"] = budget;
    v["optimizer_memory_host_offload"] = offload;
    v["parameter_memory_host_offload"] = offload;
    v["state_offload_target"] = target;
    v["offload_dir"] = (spill / std::to_string(comm_world_rank())).string();
    RunConfig c = config_from_values(v);
    validate_config(c, world);
    return c;
  };
  EXPECT_THROW(losses(with(false, "host"), nullptr, nullptr, nullptr), OutOfMemoryError);
  for (const std::string target : {"host", "disk"}) {
    const RunConfig offloaded = with(true, target);
    int64_t params_peak = 0, optimizer_now = -1;
    const std::vector<double> got = losses(offloaded, nullptr, &params_peak, &optimizer_now);
    EXPECT_EQ(got, reference) << target;
    EXPECT_EQ(optimizer_now, 0) << target;
    HardwareProfile hw;  // memory does not depend on the rates
    hw.peak_flops_fp32 = hw.memory_bandwidth = hw.collective_bandwidth = hw.p2p_bandwidth = 1e12;
    hw.all_to_all_bandwidth = hw.host_link_bandwidth = hw.disk_bandwidth = 1e12;
    hw.memory_bytes = int64_t{1} << 40;
    const StrategyPlan plan = plan_strategy(offloaded, hw, PlanOptions{});
    int64_t predicted_params = 0, predicted_optimizer = 0;
    for (const MemoryLine& l : plan.memory) {
      if (l.category == MemCategory::parameters) predicted_params += l.bytes;
      if (l.category == MemCategory::optimizer) predicted_optimizer += l.bytes;
    }
    EXPECT_EQ(params_peak, predicted_params) << target;
    EXPECT_EQ(optimizer_peak, predicted_optimizer) << target;
    if (target == "disk") {
      EXPECT_GT(optimizer_peak, 0) << "the update's staged chunks";
    }
    EXPECT_EQ(plan.state_offload_bytes, shard_bytes + 8 * parameter_shard_elements(plain.model, 1, world)) << target;
    EXPECT_EQ(name_of(plan.state_offload_target), target);
  }
  Communicator::world("barrier").barrier();
  if (comm_world_rank() == 0) std::filesystem::remove_all(spill);
  MemoryTracker::global().set_budget(0);
}
