// ranks: 1 2 4 8
// The planner against real training steps (src/train Trainer, tiny model):
// - predicted peak memory per device within 10% of the MemoryTracker's
//   measured peak on every rank, for every strategy valid at this world size,
//   several sequence lengths, batch sizes and remat policies;
// - the trainer's reductions: predicted all-reduce bytes over the replicas
//   (gradients, loss sums) and over tp (layer outputs, input gradients,
//   gradient norm) equal the communicators' counters exactly;
// - with shard_optimizer_over_data (ZeRO-1): the same, plus the replicas'
//   reduce-scatter and all-gather bytes exactly, and the optimizer memory
//   exactly on the last replica (the busiest: it owns the tail);
// - with layer_token_chunk: the activation peak exactly, below the same
//   run's without chunks;
// - with tensor_sequence_parallelism: the tp all-gather and reduce-scatter
//   bytes exactly, the tracker's activation peak exactly, and the saved layer
//   inputs 1/tp of the same run's without it;
// - one attention call of each strategy, fp32 and bf16: the tracked peak
//   equals cp_attention_workspace exactly;
// - FSDP (fsdp > 1 or fsdp_over_context): the parameter, gradient and
//   optimizer peaks and the activation peak exactly, the shard group's
//   all-gather, reduce-scatter and all-reduce bytes and the replicas' and
//   data ranks' bytes exactly.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstdio>

#include "comm/mesh.h"
#include "core/memory.h"
#include "cp/cp_attention.h"
#include "cp/layout.h"
#include "plan/planner.h"
#include "train/trainer.h"

using namespace longctx;

namespace {

constexpr int kSteps = 2;

struct Case {
  std::string strategy;
  int64_t dp, cp, ulysses, tp;
  int64_t seq, batch;
  std::string remat;
  bool packing;
  bool shard = false;
  int64_t d_model = 32;
  std::string dtype = "float32";
  bool sequence_parallel = false;
  int64_t fsdp = 1;
  bool over_context = false;  // fsdp_over_context
  bool tied = false;          // logits_via_embedding
  int64_t chunk = 0;          // layer_token_chunk
};

std::string describe(const Case& k) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s dp=%lld cp=%lld (U=%lld) tp=%lld S=%lld B=%lld remat=%s%s",
                k.strategy.c_str(), (long long)k.dp, (long long)k.cp, (long long)k.ulysses,
                (long long)k.tp, (long long)k.seq, (long long)k.batch, k.remat.c_str(),
                k.packing ? " packed" : "");
  std::string out = buf;
  if (k.shard) out += " ZeRO-1 d=" + std::to_string(k.d_model);
  if (k.dtype != "float32") out += " " + k.dtype;
  if (k.sequence_parallel) out += " seq-parallel";
  if (k.fsdp > 1 || k.over_context) out += " fsdp=" + std::to_string(k.fsdp) + (k.over_context ? " over cp" : "");
  if (k.tied) out += " tied";
  if (k.chunk > 0) out += " chunk=" + std::to_string(k.chunk);
  return out;
}

RunConfig config_for(const Case& k) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", k.d_model},         {"base_num_query_heads", int64_t(4)},
      {"base_num_kv_heads", int64_t(2)},   {"head_dim", int64_t(16)},
      {"base_mlp_dim", int64_t(64)},       {"base_num_decoder_layers", int64_t(2)},
      {"dataset_type", std::string("synthetic")}, {"packing", k.packing},
      {"max_target_length", k.seq},        {"per_device_batch_size", k.batch},
      {"ici_data_parallelism", k.dp},      {"ici_context_parallelism", k.cp},
      {"ici_tensor_parallelism", k.tp},    {"ici_context_usp_ulysses_parallelism", k.ulysses},
      {"context_parallel_strategy", k.strategy}, {"context_parallel_load_balance", true},
      {"remat_policy", k.remat},           {"steps", int64_t(kSteps)},
      {"peak_tflops_per_device", 1.0},     {"enable_checkpointing", false},
      {"metrics_file", std::string("/dev/null")}, {"num_threads", int64_t(1)},
      {"shard_optimizer_over_data", k.shard}, {"dtype", k.dtype},
      {"tensor_sequence_parallelism", k.sequence_parallel},
      {"ici_fsdp_parallelism", k.fsdp},    {"fsdp_over_context", k.over_context},
      {"logits_via_embedding", k.tied},    {"layer_token_chunk", k.chunk}};
  return config_from_values(v);
}

// The planner only needs the profile for time; memory and bytes do not depend on it.
HardwareProfile any_profile() {
  HardwareProfile h;
  h.name = "test";
  h.peak_flops_fp32 = h.peak_flops_bf16 = 1e10;
  h.memory_bytes = int64_t{1} << 34;
  h.memory_bandwidth = h.p2p_bandwidth = h.collective_bandwidth = h.all_to_all_bandwidth = 1e9;
  h.devices_per_node = 64;
  h.threads_per_device = 1;
  return h;
}

std::vector<Case> cases(int world) {
  std::vector<Case> out;
  const char* remats[] = {"full", "none", "save_context", "minimal"};
  int i = 0;
  // Pure cp over the whole world, every strategy.
  for (int64_t seq : {256, 1024})
    for (const char* strategy : {"all_gather", "ulysses", "ring", "usp"}) {
      if (world == 1 && std::string(strategy) != "all_gather") continue;
      int64_t U = std::string(strategy) == "usp" ? 2 : 1;
      if (std::string(strategy) == "usp" && world < 4) continue;  // usp 2x1 is ulysses
      if (std::string(strategy) == "ulysses" && world > 4) continue;  // 4 query heads
      out.push_back({strategy, 1, world, U, 1, seq, 1, remats[i++ % 4], false});
    }
  // Batch of two (token reorders hold two copies), packed documents (segments travel).
  for (const char* strategy : {"all_gather", "ring", "usp"}) {
    if (world == 1 && std::string(strategy) != "all_gather") continue;
    if (std::string(strategy) == "usp" && world < 4) continue;
    out.push_back({strategy, 1, world, std::string(strategy) == "usp" ? 2 : 1, 1, 512, 2,
                   remats[i++ % 4], true});
  }
  // Tensor and data parallelism: the tp all-reduces and the replicas' reduction.
  if (world == 2) out.push_back({"all_gather", 1, 1, 1, 2, 512, 1, "full", false});
  if (world == 4) out.push_back({"ring", 1, 2, 1, 2, 512, 1, "minimal", false});
  if (world == 8) out.push_back({"ulysses", 2, 2, 1, 2, 512, 1, "none", false});
  if (world == 8) out.push_back({"usp", 1, 4, 2, 2, 1024, 1, "save_context", true});
  if (world == 4) out.push_back({"all_gather", 2, 2, 1, 1, 512, 1, "full", false});
  // ZeRO-1: pure cp, dp x cp, with tp; d_model 33 leaves a tail on the last
  // replica (odd parameter counts), 32 none.
  out.push_back({"all_gather", 1, world, 1, 1, 256, 1, "full", false, true, 33});
  if (world >= 2) out.push_back({"ring", 1, world, 1, 1, 512, 1, "none", false, true, 32});
  if (world == 4) out.push_back({"ring", 2, 1, 1, 2, 512, 1, "full", false, true, 33});
  if (world == 8) out.push_back({"usp", 2, 2, 2, 2, 512, 1, "minimal", true, true, 33});
  if (world == 8) out.push_back({"ulysses", 2, 4, 1, 1, 256, 1, "save_context", false, true, 33});
  // bf16: activations in two dtypes, the weight copy, K/V sent in bf16.
  out.push_back({world == 1 ? "all_gather" : "ring", 1, world, 1, 1, 512, 1, "none", true, false, 32, "bfloat16"});
  if (world >= 2)
    out.push_back({"all_gather", 1, world / 2, 1, 2, 256, 2, "full", false, world >= 4, 32, "bfloat16"});
  if (world >= 4) out.push_back({"usp", 1, world, 2, 1, 512, 1, "minimal", false, false, 32, "bfloat16"});
  // Sequence parallelism over tp = 2, with cp, dp, ZeRO-1, bf16 and several remat policies.
  if (world == 2) out.push_back({"all_gather", 1, 1, 1, 2, 512, 1, "none", false, false, 32, "float32", true});
  if (world == 4) out.push_back({"ring", 1, 2, 1, 2, 512, 1, "minimal", true, false, 32, "float32", true});
  if (world == 4) out.push_back({"ring", 2, 1, 1, 2, 256, 1, "full", false, true, 33, "float32", true});
  if (world == 8) out.push_back({"usp", 1, 4, 2, 2, 1024, 1, "save_context", true, false, 32, "float32", true});
  if (world >= 2)
    out.push_back({"all_gather", 1, world / 2, 1, 2, 256, 2, "full", false, false, 32, "bfloat16", true});
  // Token chunks (sizes that divide nothing), every remat policy, fp32 and
  // bf16, with cp, tp, dp and a batch of two.
  out.push_back({world == 1 ? "all_gather" : "ring", 1, world, 1, 1, 1024, 1, "full", false, false, 32, "float32",
                 false, 1, false, false, 100});
  out.push_back({"all_gather", 1, world, 1, 1, 512, 2, "minimal", true, false, 32, "bfloat16", false, 1, false, false, 77});
  if (world >= 2)
    out.push_back({"all_gather", 1, world / 2, 1, 2, 512, 1, "none", false, false, 32, "float32", false, 1, false, false, 50});
  if (world >= 4)
    out.push_back({"ulysses", 2, world / 2, 1, 1, 512, 1, "save_context", false, false, 32, "bfloat16", false, 1, false,
                   false, 33});
  // ... and with sequence parallelism: tp pieces per chunk (odd: 77 / 2 = 38 rows per rank).
  if (world >= 2)
    out.push_back({"ring", 1, world / 2, 1, 2, 512, 1, "none", true, false, 32, "float32", true, 1, false, false, 77});
  if (world >= 4)
    out.push_back({"all_gather", 2, world / 4, 1, 2, 512, 2, "full", false, false, 32, "bfloat16", true, 1, false,
                   false, 100});
  return out;
}

int64_t predicted_bytes(const StrategyPlan& p, CommOp op, MeshAxis axis) {
  int64_t bytes = 0;
  for (const CommLine& l : p.comm)
    if (l.op == op && l.axis == axis) bytes += l.bytes_sent;
  return bytes;
}

int64_t predicted_all_reduce(const StrategyPlan& p, MeshAxis axis) { return predicted_bytes(p, CommOp::all_reduce, axis); }

int64_t predicted_memory(const StrategyPlan& p, MemCategory category) {
  int64_t bytes = 0;
  for (const MemoryLine& m : p.memory)
    if (m.category == category) bytes += m.bytes;
  return bytes;
}

// Bytes of the memory line whose name starts with `name`.
int64_t memory_line(const StrategyPlan& p, const std::string& name) {
  for (const MemoryLine& m : p.memory)
    if (m.name.rfind(name, 0) == 0) return m.bytes;
  return 0;
}

}  // namespace

TEST(PlanMemory, PredictedPeakAndTrainerReductionsMatchRealSteps) {
  int world = 1, rank = 0;
  world = comm_world_size();
  rank = comm_world_rank();
  int ran = 0;
  for (const Case& k : cases(world)) {
    const std::string what = describe(k);
    RunConfig c = config_for(k);
    validate_config(c, world);  // a case that breaks a rule is a bug in this test
    const StrategyPlan plan = plan_strategy(c, any_profile(), PlanOptions{});
    ASSERT_TRUE(plan.valid) << what << ": " << plan.invalid_reason;

    Mesh mesh(c.mesh_shape());
    const size_t before = MemoryTracker::global().current_total();
    MemoryTracker::global().reset_peaks();
    const size_t activations_before = MemoryTracker::global().current(MemCategory::activations);
    int64_t replicas = 0, data_ranks = 0, tp = 0, rs = 0, ag = 0, tp_rs = 0, tp_ag = 0;
    int64_t optimizer_bytes = 0, parameter_bytes = 0;
    bool last_replica = false;
    {
      Trainer trainer(c, mesh);
      optimizer_bytes = int64_t(MemoryTracker::global().current(MemCategory::optimizer));
      parameter_bytes = int64_t(MemoryTracker::global().current(MemCategory::parameters));
      last_replica = mesh.replicas().rank() + 1 == mesh.replicas().size();
      mesh.reset_counters();
      for (int s = 0; s < kSteps; ++s) trainer.train_step();
      // Gradients over the replicas, loss sums over every data rank.
      replicas = mesh.replicas().counters()[CommOp::all_reduce].bytes_sent;
      data_ranks = mesh.data().counters()[CommOp::all_reduce].bytes_sent;
      rs = mesh.replicas().counters()[CommOp::reduce_scatter].bytes_sent;
      ag = mesh.replicas().counters()[CommOp::all_gather].bytes_sent;
      tp = mesh.tp().counters()[CommOp::all_reduce].bytes_sent;
      tp_rs = mesh.tp().counters()[CommOp::reduce_scatter].bytes_sent;
      tp_ag = mesh.tp().counters()[CommOp::all_gather].bytes_sent;
    }
    const int64_t activations = int64_t(MemoryTracker::global().peak(MemCategory::activations) - activations_before);
    const double measured = double(MemoryTracker::global().peak_total() - before);
    const double predicted = double(plan.memory_total);
    const double err = (predicted - measured) / measured;
    if (rank == 0)
      std::printf("  %-62s measured %9.0f  predicted %9.0f bytes  %+6.2f%%\n", what.c_str(), measured,
                  predicted, 100 * err);
    EXPECT_LE(std::fabs(err), 0.10) << what << " rank " << rank << ": measured peak " << measured
                                    << " bytes, predicted " << predicted;
    EXPECT_EQ(replicas, kSteps * predicted_all_reduce(plan, MeshAxis::replicas)) << what << " rank " << rank;
    EXPECT_EQ(data_ranks, kSteps * predicted_all_reduce(plan, MeshAxis::data)) << what << " rank " << rank;
    EXPECT_EQ(tp, kSteps * predicted_all_reduce(plan, MeshAxis::tp)) << what << " rank " << rank;
    EXPECT_EQ(rs, kSteps * predicted_bytes(plan, CommOp::reduce_scatter, MeshAxis::replicas)) << what << " rank " << rank;
    EXPECT_EQ(ag, kSteps * predicted_bytes(plan, CommOp::all_gather, MeshAxis::replicas)) << what << " rank " << rank;
    EXPECT_EQ(tp_rs, kSteps * predicted_bytes(plan, CommOp::reduce_scatter, MeshAxis::tp)) << what << " rank " << rank;
    EXPECT_EQ(tp_ag, kSteps * predicted_bytes(plan, CommOp::all_gather, MeshAxis::tp)) << what << " rank " << rank;
    EXPECT_EQ(activations, predicted_memory(plan, MemCategory::activations)) << what << " rank " << rank;
    if (k.chunk > 0) {  // the chunk's transients replace the whole sequence's
      RunConfig whole = c;
      whole.layer_token_chunk = 0;
      EXPECT_LT(activations, predicted_memory(plan_strategy(whole, any_profile(), PlanOptions{}), MemCategory::activations))
          << what;
    }
    if (k.sequence_parallel) {
      EXPECT_GT(tp_rs, 0) << what;
      EXPECT_GT(tp_ag, 0) << what;
      // The saved layer inputs: 1/tp of the same run's without sequence parallelism.
      RunConfig plain = c;
      plain.tp_sequence_parallel = false;
      const StrategyPlan without = plan_strategy(plain, any_profile(), PlanOptions{});
      EXPECT_EQ(memory_line(plan, "x (layer input)") * k.tp, memory_line(without, "x (layer input)")) << what;
      EXPECT_GT(memory_line(plan, "x (layer input)"), 0) << what;
    }
    if (k.shard && k.dp * k.cp > 1) {
      EXPECT_GT(rs, 0) << what;
    }
    EXPECT_EQ(parameter_bytes, predicted_memory(plan, MemCategory::parameters)) << what << " rank " << rank;
    // Moments: exact on the busiest replica (the tail's owner), less by the tail elsewhere.
    if (last_replica || !k.shard)
      EXPECT_EQ(optimizer_bytes, predicted_memory(plan, MemCategory::optimizer)) << what << " rank " << rank;
    else
      EXPECT_LE(optimizer_bytes, predicted_memory(plan, MemCategory::optimizer)) << what << " rank " << rank;
    ++ran;
  }
  EXPECT_GT(ran, 0);
}

RunConfig c_plain(RunConfig c) {
  c.shard_optimizer_over_data = false;
  return c;
}

TEST(PlanMemory, ZeroOneShrinksTheMomentsAndIsRecommendedWhereItFitsOrPays) {
  // A pure planner check (no ranks needed): 8 devices, cp = 8, tp = 1.
  Case k{"ring", 1, 8, 1, 1, 512, 1, "full", false, false, 33};
  RunConfig c = config_for(k);
  PlanOptions o;
  o.devices = 8;
  HardwareProfile hw = any_profile();
  const StrategyPlan plain = plan_strategy(c, hw, o);
  c.shard_optimizer_over_data = true;
  const StrategyPlan zero = plan_strategy(c, hw, o);
  const int64_t n = predicted_memory(plain, MemCategory::parameters) / 4;
  ASSERT_EQ(n % 8, 3);  // a tail on the last replica
  EXPECT_EQ(predicted_memory(plain, MemCategory::optimizer), 8 * n);
  EXPECT_EQ(predicted_memory(zero, MemCategory::optimizer), 8 * (n / 8 + n % 8));
  EXPECT_EQ(predicted_bytes(zero, CommOp::reduce_scatter, MeshAxis::replicas), 4 * (n / 8) * 7);
  EXPECT_EQ(predicted_bytes(zero, CommOp::all_gather, MeshAxis::replicas), 4 * (n / 8) * 7 + 4 * (n % 8) * 7);
  EXPECT_EQ(predicted_bytes(plain, CommOp::reduce_scatter, MeshAxis::replicas), 0);
  EXPECT_LT(zero.memory_total, plain.memory_total);

  // A device between the two: only ZeRO-1 fits, and the planner says so.
  c.shard_optimizer_over_data = false;
  hw.memory_bytes = (zero.memory_total + plain.memory_total) / 2;
  PlanRecommendation r = recommend(c, hw, o);
  ASSERT_TRUE(r.found) << r.reason;
  EXPECT_TRUE(r.shard_optimizer_over_data);
  EXPECT_NE(r.levers.find("shard_optimizer_over_data=true"), std::string::npos) << r.levers;
  PlanReport report = make_plan(c, hw, o);
  bool advised = false;
  for (const StrategyPlan& p : report.candidates)
    advised = advised || p.advice == "fits with shard_optimizer_over_data=true";
  EXPECT_TRUE(advised);
  // Room for everything: levers (ZeRO-1 and the FSDP after it) only where the
  // planner finds them faster than the plain run (they update 1/replicas of
  // the moments; FSDP reduce-scatters instead of all-reducing), by more than 1%.
  hw.memory_bytes = plain.memory_total * 2;
  const StrategyPlan plain_fits = plan_strategy(c_plain(c), hw, o);
  ASSERT_TRUE(plain_fits.fits);
  const PlanRecommendation roomy = recommend(c_plain(c), hw, o);
  ASSERT_TRUE(roomy.found) << roomy.reason;
  EXPECT_GE(roomy.plan.tokens_per_second, 0.99 * plain_fits.tokens_per_second);
  if (!roomy.levers.empty()) {
    EXPECT_GT(roomy.plan.tokens_per_second, 1.01 * plain_fits.tokens_per_second) << roomy.levers;
  }
}

// One CpAttention forward + backward of each strategy valid at this world
// size, in fp32 and bf16, with and without segments: the tracked peak of the
// call (communication and scratch) equals cp_attention_workspace exactly.
TEST(PlanMemory, AttentionCallWorkspaceIsExactInFp32AndBf16) {
  const int world = comm_world_size();
  const int64_t B = 2, L = 40, H = 4, G = 2, D = 16, S = L * world;
  struct Strategy {
    CpStrategy strategy;
    int ulysses;
  };
  std::vector<Strategy> strategies = {{CpStrategy::all_gather, 1}, {CpStrategy::ring, 1}};
  if (H % world == 0) strategies.push_back({CpStrategy::ulysses, world});
  if (world >= 4) strategies.push_back({CpStrategy::usp, 2});
  for (const Strategy& st : strategies)
    for (DType dtype : {DType::f32, DType::bf16})
      for (bool segments : {false, true}) {
        const std::string what = std::string(name_of(st.strategy)) + " " + name_of(dtype) +
                                 (segments ? " segments" : "");
        Mesh mesh(1, world, st.ulysses, 1);
        CpLayout layout(LayoutKind::contiguous, S, world, st.ulysses);
        std::vector<int64_t> global_pos(B * S), pos(B * L);
        std::vector<int32_t> global_seg(B * S), seg(B * L);
        for (int64_t i = 0; i < B * S; ++i) global_pos[i] = i % S, global_seg[i] = int32_t(i % S / 24);
        layout.shard(mesh.cp_rank(), global_pos.data(), pos.data(), B);
        layout.shard(mesh.cp_rank(), global_seg.data(), seg.data(), B);
        const size_t e = dtype_size(dtype);
        std::vector<char> q(B * L * H * D * e), k(B * L * G * D * e), v(k.size()), o(q.size()), dout(q.size());
        for (auto* t : {&q, &k, &v, &dout})  // any finite values (0x3f3f: about 0.75 in bf16 and fp32)
          std::fill(t->begin(), t->end(), char(0x3f));
        std::vector<float> lse(B * L * H), dq(B * L * H * D), dk(B * L * G * D), dv(dk.size());
        AttentionArgs a;
        a.q = TensorView(q.data(), dtype, {B, L, H, D});
        a.k = TensorView(k.data(), dtype, {B, L, G, D});
        a.v = TensorView(v.data(), dtype, {B, L, G, D});
        a.q_pos = a.kv_pos = pos.data();
        a.q_seg = a.kv_seg = seg.data();
        a.mask = segments ? MaskSpec::parse("causal+segments") : MaskSpec::causal();
        CpOptions options;
        options.ring_chunk_tokens = 8;
        auto attention = make_cp_attention(st.strategy, mesh, options);

        const size_t before = MemoryTracker::global().current_total();
        MemoryTracker::global().reset_peaks();
        const TensorView o_v(o.data(), dtype, {B, L, H, D});
        attention->forward(a, o_v, lse.data());
        attention->backward(a, o_v, lse.data(), TensorView(dout.data(), dtype, {B, L, H, D}),
                            TensorView(dq.data(), DType::f32, {B, L, H, D}),
                            TensorView(dk.data(), DType::f32, {B, L, G, D}),
                            TensorView(dv.data(), DType::f32, {B, L, G, D}));
        const int64_t measured = int64_t(MemoryTracker::global().peak_total() - before);

        CpCallShape shape;
        shape.strategy = st.strategy;
        shape.cp = world;
        shape.ulysses = st.ulysses;
        shape.B = B, shape.L = L, shape.H = H, shape.G = G, shape.D = D;
        shape.segments = segments;
        shape.threads = omp_get_max_threads();
        shape.ring_chunk_tokens = options.ring_chunk_tokens;
        shape.element_bytes = int64_t(e);
        shape.mask = a.mask;
        EXPECT_EQ(measured, cp_attention_workspace(shape).bytes) << what << " rank " << mesh.cp_rank();
      }
}

TEST(PlanMemory, FsdpPeaksAndBytesMatchRealStepsExactly) {
  const int world = comm_world_size(), rank = comm_world_rank();
  if (world == 1) GTEST_SKIP() << "FSDP needs a shard group of 2 or more ranks";
  // {strategy, dp, cp, U, tp, seq, batch, remat, packing, ZeRO-1, d_model, dtype, sp, fsdp, over cp, tied}
  std::vector<Case> fsdp_cases;
  fsdp_cases.push_back({"all_gather", 1, 1, 1, 1, 256, 1, "full", false, false, 33, "float32", false, world});
  if (world >= 2)
    fsdp_cases.push_back({"ring", 1, 2, 1, 1, 256, 1, "none", true, false, 33, "bfloat16", false, world / 2, true});
  if (world >= 4) {
    fsdp_cases.push_back({"ulysses", 1, 2, 1, 1, 256, 1, "minimal", false, false, 32, "float32", false, world / 2,
                          true, true});
    fsdp_cases.push_back({"all_gather", 2, 1, 1, 1, 256, 1, "full", false, true, 33, "float32", false, world / 2,
                          false, true});
  }
  if (world == 8)
    fsdp_cases.push_back({"ring", 1, 2, 1, 2, 256, 2, "save_context", false, false, 32, "float32", true, 2, true});
  for (const Case& k : fsdp_cases) {
    const std::string what = describe(k);
    RunConfig c = config_for(k);
    validate_config(c, world);
    const StrategyPlan plan = plan_strategy(c, any_profile(), PlanOptions{});
    ASSERT_TRUE(plan.valid) << what << ": " << plan.invalid_reason;
    Mesh mesh(c.mesh_shape());
    MemoryTracker& t = MemoryTracker::global();
    const size_t p0 = t.current(MemCategory::parameters), g0 = t.current(MemCategory::gradients),
                 o0 = t.current(MemCategory::optimizer), a0 = t.current(MemCategory::activations);
    t.reset_peaks();
    int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
    CommCounters shards, replicas, data;
    bool last_replica = false;
    {
      Trainer trainer(c, mesh);
      mesh.reset_counters();
      for (int s = 0; s < kSteps; ++s) trainer.train_step();
      params = int64_t(t.peak(MemCategory::parameters) - p0);
      grads = int64_t(t.peak(MemCategory::gradients) - g0);
      optimizer = int64_t(t.current(MemCategory::optimizer) - o0);
      activations = int64_t(t.peak(MemCategory::activations) - a0);
      shards = mesh.shards().counters();
      replicas = mesh.replicas().counters();
      data = mesh.data().counters();
      last_replica = mesh.replicas().rank() + 1 == mesh.replicas().size();
    }
    if (rank == 0)
      std::printf("  %-70s parameters %lld gradients %lld optimizer %lld bytes\n", what.c_str(), (long long)params,
                  (long long)grads, (long long)optimizer);
    EXPECT_EQ(params, predicted_memory(plan, MemCategory::parameters)) << what << " rank " << rank;
    EXPECT_EQ(grads, predicted_memory(plan, MemCategory::gradients)) << what << " rank " << rank;
    if (last_replica) {
      EXPECT_EQ(optimizer, predicted_memory(plan, MemCategory::optimizer)) << what << " rank " << rank;
    }
    EXPECT_EQ(activations, predicted_memory(plan, MemCategory::activations)) << what << " rank " << rank;
    for (CommOp op : {CommOp::all_gather, CommOp::reduce_scatter, CommOp::all_reduce})
      EXPECT_EQ(shards[op].bytes_sent, kSteps * predicted_bytes(plan, op, MeshAxis::shards))
          << what << " rank " << rank << " " << comm_op_name(op);
    EXPECT_GT(shards[CommOp::all_gather].bytes_sent, 0) << what;
    EXPECT_EQ(replicas[CommOp::all_reduce].bytes_sent, kSteps * predicted_all_reduce(plan, MeshAxis::replicas))
        << what << " rank " << rank;
    EXPECT_EQ(data[CommOp::all_reduce].bytes_sent, kSteps * predicted_all_reduce(plan, MeshAxis::data))
        << what << " rank " << rank;
    EXPECT_EQ(replicas[CommOp::reduce_scatter].bytes_sent, kSteps * predicted_bytes(plan, CommOp::reduce_scatter, MeshAxis::replicas))
        << what << " rank " << rank;
  }
}
