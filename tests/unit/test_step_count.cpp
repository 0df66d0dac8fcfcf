// count_step (src/plan/step_count.h): one training step run on a meta device
// over a counting mesh. Its collectives are held against real steps by
// tests/mpi/test_plan_memory.cpp; here its kernel counts are held against
// the calls the model documents (src/model/llama.h, the layer math), derived
// independently by hand from the shapes, its counted loops
// (for_each_alike) against running every iteration, and its memory peaks
// (the planner's memory) against the engine's sizing tables.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/device.h"
#include "core/model_shape.h"
#include "core/state_store.h"
#include "cp/cp_attention.h"
#include "model/llama.h"
#include "model/sharded_parameters.h"
#include "plan_profile.h"
#include "plan/planner.h"
#include "plan/step_count.h"
#include "train/optimizer.h"

namespace longctx {
namespace {

RunConfig tiny(const std::string& dtype, const std::string& remat, int64_t tp, int64_t seq) {
  RunConfig c = config_from_values({{"base_emb_dim", int64_t(48)},
                                    {"base_num_query_heads", int64_t(4)},
                                    {"base_num_kv_heads", int64_t(2)},
                                    {"head_dim", int64_t(12)},
                                    {"base_mlp_dim", int64_t(80)},
                                    {"base_num_decoder_layers", int64_t(3)},
                                    {"vocab_size", int64_t(300)},
                                    {"max_target_length", seq},
                                    {"per_device_batch_size", int64_t(2)},
                                    {"ici_tensor_parallelism", tp},
                                    {"ici_context_parallelism", int64_t(1)},
                                    {"remat_policy", remat},
                                    {"dtype", dtype}});
  return c;
}

// The model's calls per step (no token chunks, no sequence parallelism), by
// hand from the layer math: per layer forward two norms, RoPE on q and k,
// two residual adds, SwiGLU; backward the norm and SwiGLU again (q/k/v's norm,
// RoPE and the out_proj add again when the policy recomputes them), SwiGLU's
// and both norms' gradients, RoPE's inverse, the attention norm once more;
// per step the embedding and its gradient (priced as adds), the final norm,
// the cross-entropy; per parameter the optimizer. bf16 also rounds q/k/v and
// gate/up after their GEMMs (again when recomputed), the gradient operands of
// backward's GEMMs (dL/dx twice, dO, dq/dk/dv), the loss's dlogits, the weights.
std::map<std::string, double> expected_kernels(const RunConfig& c) {
  const LlamaConfig& m = c.model;
  const double N = double(c.per_device_batch_size * c.max_target_length), L = double(m.num_layers), d = double(m.d_model);
  const double Hl = double(m.num_heads / c.tp), Gl = double(m.num_kv_heads / c.tp), D = double(m.head_dim);
  const double Fl = double(m.mlp_dim / c.tp), V = double(m.vocab_size), qkv_cols = (Hl + 2 * Gl) * D;
  const SaveSet save = c.save_set();
  const double qkv = save.qkv ? 0 : 1, out = save.out_proj ? 0 : 1, mlpwi = save.mlpwi ? 0 : 1;
  const double params = double(parameters_per_tp_rank(m, c.tp));
  std::map<std::string, double> k = {
      {"rmsnorm_forward", N * d * (L * (4 + qkv) + 1)},
      {"rmsnorm_backward", N * d * (2 * L + 1)},
      {"rope", N * (Hl + Gl) * D * L * (2 + qkv)},
      {"residual_add", N * d * (L * (2 + out) + 2)},
      {"swiglu_forward", N * Fl * 2 * L},
      {"swiglu_backward", N * Fl * L},
      {"cross_entropy", N * V},
      {"optimizer", params}};
  if (c.dtype == DType::bf16)
    k["convert"] = N * L * (qkv_cols * (1 + qkv) + 2 * Fl * (1 + mlpwi) + 2 * d + Hl * D + qkv_cols) + N * V + params;
  // GEMMs: each projection [N, in] -> [N, out] forward, its weight and input
  // gradients, and the forward again when recomputed; the LM head once.
  auto projection = [&](double in, double o, double recomputed) { return 2 * N * in * o * (3 + recomputed); };
  k["gemm"] = L * (projection(d, qkv_cols, qkv) + projection(Hl * D, d, out) + projection(d, 2 * Fl, mlpwi) +
                   projection(Fl, d, 0)) +
              projection(d, V, 0);
  return k;
}

// The ops a counted step asked for, by name (those it counted anything of).
std::map<std::string, double> named(const StepCount& step) {
  std::map<std::string, double> out;
  for (size_t i = 0; i < kNumKernels; ++i)
    if (step.kernels[i] != 0) out[kKernelNames[i]] = step.kernels[i];
  return out;
}

TEST(StepCount, KernelCountsEqualTheModelsDocumentedCalls) {
  for (const char* dtype : {"float32", "bfloat16"})
    for (const char* remat : {"full", "none", "minimal", "save_context"})
      for (int64_t tp : {1, 2}) {
        const RunConfig c = tiny(dtype, remat, tp, 40);
        const std::map<std::string, double> counted = named(count_step(c, tp, 1, KernelTarget::cpu, 0));
        const std::map<std::string, double> want = expected_kernels(c);
        EXPECT_EQ(counted.size(), want.size()) << dtype << " " << remat << " tp=" << tp;
        for (const auto& [kernel, amount] : want) {
          ASSERT_TRUE(counted.count(kernel)) << kernel << " " << dtype << " " << remat << " tp=" << tp;
          EXPECT_EQ(counted.at(kernel), amount) << kernel << " " << dtype << " " << remat << " tp=" << tp;
        }
      }
}

// Token chunks and the loss head's row chunks run one iteration counted n
// times on a meta device: the same totals as the whole sequence at once
// (what each elementwise kernel and GEMM touches does not depend on how the
// rows are cut), and the tp collectives n times as many calls, the same bytes.
TEST(StepCount, CountedChunksAddUpToTheWholeSequence) {
  for (int64_t chunk : {7, 16, 40}) {
    RunConfig whole = tiny("bfloat16", "full", 2, 40), chunked = whole;
    chunked.layer_token_chunk = chunk;
    whole.tp_sequence_parallel = chunked.tp_sequence_parallel = true;
    const StepCount a = count_step(whole, 2, 1, KernelTarget::cpu, 1), b = count_step(chunked, 2, 1, KernelTarget::cpu, 1);
    for (size_t k = 0; k < kNumKernels; ++k) EXPECT_EQ(b.kernels[k], a.kernels[k]) << kKernelNames[k] << " chunk " << chunk;
    for (CommOp op : {CommOp::all_gather, CommOp::reduce_scatter, CommOp::all_reduce})
      EXPECT_EQ(a[MeshAxis::tp][op].bytes_sent, b[MeshAxis::tp][op].bytes_sent) << comm_op_name(op) << " chunk " << chunk;
    EXPECT_GT(b[MeshAxis::tp][CommOp::all_gather].calls, a[MeshAxis::tp][CommOp::all_gather].calls) << chunk;
  }
}

TEST(StepCount, CountRepeatMultipliesKernelsAndCollectivesAndNests) {
  const std::unique_ptr<Device> meta = Device::make_meta(1, counting_kernel_set(KernelTarget::cpu));
  const DeviceScope on_meta(*meta);
  MeshShape shape;
  shape.tp = 4;
  const Mesh mesh = Mesh::counting(shape, 1);
  const Buffer out(MemCategory::scratch, "out", 64);
  int runs = 0;
  std::vector<int64_t> outer, inner;  // the iterations that ran: the first and the last
  for_each_alike(3, [&](int64_t i) {
    outer.push_back(i);
    ++runs;
    for_each_alike(5, [&](int64_t j) {
      if (i == 0) inner.push_back(j);
      ++runs;
      int ran = 0;
      launch(KernelId::residual_add, device_of(out.data()), 2.0, [&](const KernelSet&) { ++ran; });
      EXPECT_EQ(ran, 0);  // counted, never run
      double x = 0;
      mesh.tp().all_reduce_sum(&x, 1);
    });
  });
  EXPECT_EQ(outer, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(inner, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(runs, 2 * (1 + 2));
  EXPECT_EQ(count_repeat(), 1);
  EXPECT_EQ(meta->counted()[size_t(KernelId::residual_add)], 2.0 * 15);
  EXPECT_EQ(mesh.tp().counters()[CommOp::all_reduce].calls, 15);
  EXPECT_EQ(mesh.tp().counters()[CommOp::all_reduce].bytes_sent, 15 * (2 * 8 * 3 / 4));
  // On the CPU every iteration runs.
  const DeviceScope on_cpu(Device::cpu());
  int cpu_runs = 0;
  for_each_alike(4, [&](int64_t i) { EXPECT_EQ(i, cpu_runs++); });
  EXPECT_EQ(cpu_runs, 4);
}

// The device memory the engine's sizing tables give, per category: what
// the planner summed before it counted by running, kept here as an
// independent reference at planner scale, where no real step can run in a
// test (tests/mpi/test_plan_memory.cpp holds the planner against real steps
// at small scale).
struct Sized {
  int64_t parameters = 0, gradients = 0, optimizer = 0, activations = 0, transients = 0;
};
Sized sized_from_tables(const RunConfig& c, int64_t devices) {
  const MeshShape mesh = c.mesh_shape(devices);
  const LlamaConfig& m = c.model;
  const int64_t shards = mesh.shard_group(), replicas = mesh.replicas();
  const int64_t shard = parameter_shard_elements(m, c.tp, shards);
  const bool zero1 = c.shard_optimizer_over_data && replicas > 1;
  const FlatPiece piece = zero1 ? flat_piece(shard, int(replicas), int(replicas - 1)) : flat_piece(shard, 1, 0);
  const std::array<int64_t, 2> gathered = gathered_peak_bytes(m, c.tp, shards, c.dtype, true);
  const std::vector<ParameterUnit> units = parameter_units(m, c.tp, shards);
  const bool params_on_device = c.parameter_tier() == StateTier::device;
  const bool moments_on_device = c.optimizer_tier() == StateTier::device;
  Sized s;
  s.parameters = (params_on_device ? shard * 4 : 0) + (shards == 1 ? compute_weight_copy_bytes(shard, c.dtype) : 0) +
                 gathered[0];
  s.gradients = shard * 4 + gathered[1];
  // A disk pass streams each store through 2 chunks (core/state_store.h): the moments' two and the parameters'.
  const int64_t staged =
      (c.optimizer_tier() == StateTier::disk ? 2 * largest_state_chunk(units, int64_t(piece.begin), int64_t(piece.size)) : 0) +
      (c.parameter_tier() == StateTier::disk ? largest_state_chunk(units, 0, shard) : 0);
  s.optimizer = (moments_on_device ? 2 * int64_t(piece.size) * 4 : 0) + 2 * staged * 4;
  const int64_t tokens = c.per_device_batch_size * c.max_target_length / c.cp;
  for (const ActivationBuffer& a : activation_table(m, c.tp, c.save_set(), tokens, true, 0, c.dtype,
                                                    c.tp_sequence_parallel, c.layer_token_chunk))
    s.activations += a.elements > 0 ? a.copies * a.bytes() : 0;
  CpCallShape call;
  call.strategy = c.strategy();
  call.cp = c.cp;
  call.ulysses = c.ulysses_degree();
  call.B = c.per_device_batch_size;
  call.L = c.max_target_length / c.cp;
  call.H = m.num_heads / c.tp;
  call.G = m.num_kv_heads / c.tp;
  call.D = m.head_dim;
  call.segments = c.packing;
  call.threads = 1;
  call.element_bytes = int64_t(dtype_size(c.dtype));
  call.mask = c.mask();
  call.layout = c.layout();
  s.transients = std::max(cp_attention_workspace(call).bytes, zero1 ? int64_t(piece.block) * 4 : 0);
  return s;
}

// The counted step's memory at planner scale equals the engine's sizing
// tables in every category (and its transients, communication and scratch
// together, the larger of one attention call's workspace and the ZeRO-1
// piece), and the sum of those peaks, the planner's total, is the counted
// peak of all together or at most 1% above it (where the loss head's
// transients peak apart from the rest). Every strategy, with FSDP (the
// counted prefetch holds its unit as the real one does), ZeRO-1, sequence
// parallelism, token chunks, tied embeddings, packing, both dtypes, every
// remat policy, and the offload tiers: saved activations and state on the
// host or on disk keep only their staging on the device.
TEST(StepCount, CountedMemoryPeaksAreTheEnginesTablesAtPlannerScale) {
  struct Case {
    const char* strategy;
    int64_t cp, ulysses, tp, dp, fsdp;
    bool over_context, zero1, sp, tied, packing;
    int64_t chunk;
    const char* remat;
    const char* dtype;
    int64_t seq;
    int64_t vocab = 1000;  // 32000: the head's unit larger than a layer's (FSDP prefetches it last)
    // Offload: state to "host" or "disk" ("": none), and the saved activations' tier ("": none).
    const char* state = "";
    const char* activations = "";
  };
  const Case cases[] = {
      {"ring", 4, 1, 2, 1, 1, false, false, false, false, false, 0, "full", "bfloat16", 4096},
      {"all_gather", 2, 1, 1, 2, 1, false, true, false, false, true, 0, "none", "float32", 2048},
      {"ulysses", 4, 1, 2, 1, 1, false, false, true, false, false, 0, "save_context", "bfloat16", 4096},
      {"usp", 4, 2, 1, 1, 2, true, true, false, false, false, 0, "minimal", "bfloat16", 8192},
      {"ring", 2, 1, 2, 1, 2, false, false, true, true, false, 512, "full", "bfloat16", 8192},
      {"all_gather", 1, 1, 1, 1, 4, false, false, false, true, false, 0, "none", "float32", 1024},
      {"all_gather", 1, 1, 1, 1, 4, false, false, false, false, true, 0, "full", "bfloat16", 1024},
      {"ring", 8, 1, 1, 1, 1, false, false, false, false, false, 0, "none", "bfloat16", 16384},
      {"usp", 8, 4, 2, 1, 1, false, false, true, false, false, 1000, "save_context", "float32", 16000},
      {"ulysses", 2, 1, 1, 2, 2, true, true, false, false, true, 300, "minimal", "float32", 3000},
      {"ring", 2, 1, 1, 1, 4, false, false, false, false, false, 0, "full", "bfloat16", 2048, 32000},
      {"all_gather", 1, 1, 2, 1, 2, false, false, true, true, false, 0, "none", "float32", 1024, 32000},
      {"ring", 2, 1, 1, 2, 2, false, true, false, false, false, 0, "custom", "bfloat16", 4096, 1000, "host", "host"},
      {"all_gather", 1, 1, 1, 2, 2, false, false, false, false, false, 0, "custom", "float32", 2048, 1000, "disk", "disk"},
      {"ulysses", 2, 1, 1, 1, 2, true, false, false, false, false, 500, "none", "bfloat16", 4000, 32000, "disk", ""},
  };
  for (const Case& k : cases) {
    std::map<std::string, ConfigValue> values = {
        {"base_emb_dim", int64_t(256)}, {"base_num_query_heads", int64_t(8)}, {"base_num_kv_heads", int64_t(4)},
        {"head_dim", int64_t(32)}, {"base_mlp_dim", int64_t(512)}, {"base_num_decoder_layers", int64_t(5)},
        {"vocab_size", k.vocab}, {"max_target_length", k.seq}, {"per_device_batch_size", int64_t(1)},
        {"ici_data_parallelism", k.dp}, {"ici_context_parallelism", k.cp}, {"ici_tensor_parallelism", k.tp},
        {"ici_context_usp_ulysses_parallelism", k.ulysses}, {"context_parallel_strategy", std::string(k.strategy)},
        {"remat_policy", std::string(k.remat)}, {"dtype", std::string(k.dtype)}, {"shard_optimizer_over_data", k.zero1},
        {"tensor_sequence_parallelism", k.sp}, {"ici_fsdp_parallelism", k.fsdp}, {"fsdp_over_context", k.over_context},
        {"logits_via_embedding", k.tied}, {"packing", k.packing}, {"layer_token_chunk", k.chunk},
        {"num_threads", int64_t(1)}, {"offload_dir", std::string("/nonexistent/never-made")}};
    if (*k.state) {
      values["optimizer_memory_host_offload"] = true;
      values["parameter_memory_host_offload"] = true;
      values["state_offload_target"] = std::string(k.state);
    }
    if (*k.activations) {  // the layer inputs and three of the four saved points offloaded, context recomputed
      for (const char* point : {"decoder_layer_input", "qkv_proj", "out_proj", "mlpwi"}) values[point] = std::string("offload");
      values["context"] = std::string("remat");
      values["offload_target"] = std::string(k.activations);
    }
    const RunConfig c = config_from_values(values);
    const int64_t devices = k.dp * k.fsdp * k.cp * k.tp;
    const std::string what = std::string(k.strategy) + " cp=" + std::to_string(k.cp) + " tp=" + std::to_string(k.tp) +
                             " dp=" + std::to_string(k.dp) + " fsdp=" + std::to_string(k.fsdp) + " " + k.remat + " " +
                             k.dtype + " state " + k.state + " activations " + k.activations;
    const StepCount counted = count_step(c, devices, 1, KernelTarget::cpu, static_cast<int>(devices - 1));  // the last: ZeRO-1's tail
    const Sized sized = sized_from_tables(c, devices);
    auto peak = [&](MemCategory category) { return counted.peaks[static_cast<int>(category)]; };
    EXPECT_EQ(peak(MemCategory::parameters), sized.parameters) << what;
    EXPECT_EQ(peak(MemCategory::gradients), sized.gradients) << what;
    EXPECT_EQ(peak(MemCategory::optimizer), sized.optimizer) << what;
    EXPECT_EQ(peak(MemCategory::activations), sized.activations) << what;
    EXPECT_EQ(counted.transient_peak, sized.transients) << what;
    // The buffers live at each peak add up to it.
    for (int i = 0; i < kNumMemCategories; ++i) {
      int64_t live = 0;
      for (const LiveBuffers& b : counted.at_peak[i]) live += int64_t(b.bytes);
      if (i != static_cast<int>(MemCategory::host_offload)) {
        EXPECT_EQ(live, counted.peaks[i]) << what << " " << i;
      }
    }
    int64_t live = 0;
    for (const LiveBuffers& b : counted.transient_at_peak) live += int64_t(b.bytes);
    EXPECT_EQ(live, counted.transient_peak) << what;
    // The planner's total adds the peaks; together they peak lower where the
    // loss head's transients (a large vocabulary) come apart from the rest,
    // and, with state on disk, where the update's disk staging comes after
    // the backward's FSDP units are gone (7-17% here).
    const int64_t total = sized.parameters + sized.gradients + sized.optimizer + sized.activations + sized.transients;
    EXPECT_EQ(plan_strategy(c, test::plan_test_profile("test"), PlanOptions{}).memory_total, total) << what;
    EXPECT_LE(counted.peak_total, total) << what;
    if (std::string(k.state) != "disk") {
      EXPECT_GE(double(counted.peak_total), 0.99 * double(total)) << what;
    }
  }
}

}  // namespace
}  // namespace longctx
