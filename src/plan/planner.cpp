#include "plan/planner.h"

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <tuple>

#include "core/cp_strategy.h"
#include "cp/cp_attention.h"
#include "kernels/attention/attention.h"
#include "model/llama.h"
#include "model/offload.h"
#include "plan/mask_pairs.h"
#include "plan/step_count.h"
#include "train/optimizer.h"

namespace longctx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Everything the formulas need, derived once from the config.
struct Shape {
  CpStrategy strategy;
  int64_t B, S, dp, cp, U, R, tp, devices;
  int64_t d, V, D, L, Hl, Gl, Fl, qkv_cols;
  int64_t N;      // tokens per device: B * S / cp
  bool sp;        // tensor_sequence_parallelism
  int64_t Nr;     // rows of the residual stream per device: N / tp with sp, else N
  int64_t chunk;  // layer_token_chunk
  int64_t act;    // bytes per activation element
  DType dtype;    // the compute dtype (activations, GEMM operands)
  MaskSpec mask;
  LayoutKind layout;
  MeshShape mesh;  // on these devices: its groups' sizes (src/core/mesh_shape.h)
  SaveSet save;
  OffloadTarget offload_target;
  LlamaConfig model;
  // FSDP (src/model/sharded_parameters.h): the shard group's size, this
  // device's shard of the tp rank's flat vector (all of it when not sharded) and
  // the ranks that hold the same shard (gradients summed there).
  int64_t fsdp, shards, shard, replicas;
  // One rank's block of the embedding and of a layer (parameter_units).
  int64_t embed_block, layer_block;
  bool fsdp_over_context;
  StateTier optimizer_tier, parameter_tier;  // *_memory_host_offload, state_offload_target
  OffloadTarget state_target;
  // shard_optimizer_over_data (ZeRO-1) over the replicas: the piece of the
  // last replica (it also takes the remainder), which the device stands for.
  bool zero1;
  FlatPiece piece;
  int64_t threads;       // kernel threads per device (per-thread attention scratch)
  KernelTarget kernels;  // whose kernels the counted step stands for (HardwareProfile::kernels)
  bool segments;         // packed documents: segment ids travel with K,V
};

// The rule the candidate breaks on these devices, or "": the config's own
// rules, called (validate_config, which resolves the data axes on the
// devices), never restated here. The data source is the trainer's to check.
std::string invalid_reason(const RunConfig& c, int64_t devices) {
  RunConfig k = c;
  k.dataset_type = DatasetType::synthetic;
  try {
    validate_config(k, devices);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// OpenMP threads per rank: the config's num_threads, else the profile's.
int64_t threads_of(const RunConfig& c, const HardwareProfile* hw) {
  if (c.num_threads > 0) return c.num_threads;
  return hw && hw->threads_per_device > 0 ? hw->threads_per_device : 1;
}

Shape make_shape(const RunConfig& c, int64_t devices, int64_t threads, KernelTarget kernels = KernelTarget::cpu) {
  Shape s;
  s.threads = threads;
  s.kernels = kernels;
  s.strategy = c.strategy();
  s.B = c.per_device_batch_size;
  s.S = c.max_target_length;
  s.cp = c.cp;
  s.tp = c.tp;
  s.U = c.ulysses_degree();
  s.R = c.cp / s.U;
  s.devices = devices;
  // The mesh on these devices (src/core/mesh_shape.h owns its groups).
  const MeshShape mesh = s.mesh = c.mesh_shape(devices);
  s.fsdp = mesh.fsdp;
  s.dp = mesh.dp;
  const LlamaConfig& m = c.model;
  s.model = m;
  s.d = m.d_model;
  s.V = m.vocab_size;
  s.D = m.head_dim;
  s.L = m.num_layers;
  s.Hl = m.num_heads / c.tp;
  s.Gl = m.num_kv_heads / c.tp;
  s.Fl = m.mlp_dim / c.tp;
  s.qkv_cols = (s.Hl + 2 * s.Gl) * s.D;
  s.N = s.B * s.S / s.cp;
  s.sp = c.tp_sequence_parallel;
  s.Nr = s.sp ? s.N / s.tp : s.N;
  s.chunk = c.layer_token_chunk;
  s.act = static_cast<int64_t>(dtype_size(c.dtype));
  s.dtype = c.dtype;
  s.mask = c.mask();
  s.layout = c.layout();
  s.save = c.save_set();
  s.offload_target = c.offload_target;
  s.fsdp_over_context = c.fsdp_over_context;
  s.optimizer_tier = c.optimizer_tier();
  s.parameter_tier = c.parameter_tier();
  s.state_target = c.state_offload_target;
  s.shards = mesh.shard_group();
  s.shard = parameter_shard_elements(m, c.tp, s.shards);
  LlamaConfig one_layer = m;
  one_layer.num_layers = 1;
  const std::vector<ParameterUnit> units = parameter_units(one_layer, c.tp, s.shards);
  s.embed_block = units[0].block, s.layer_block = units[1].block;
  s.replicas = mesh.replicas();
  s.segments = c.packing;
  s.zero1 = c.shard_optimizer_over_data && s.replicas > 1;
  s.piece = s.zero1 ? flat_piece(s.shard, static_cast<int>(s.replicas), static_cast<int>(s.replicas - 1))
                    : flat_piece(s.shard, 1, 0);
  return s;
}

// One pass of one attention call on one cp rank, as counted (count_cp_call):
// a line per axis and operation.
std::vector<CommLine> comm_lines(const CpCallCount& call, bool backward) {
  std::vector<CommLine> out;
  for (MeshAxis axis : {MeshAxis::cp, MeshAxis::ulysses, MeshAxis::ring})
    for (int i = 0; i < kNumCommOps; ++i) {
      const CommOp op = static_cast<CommOp>(i);
      const CommOpCounters& k = call.comm[backward ? 1 : 0][static_cast<size_t>(axis)][op];
      if (k.bytes_sent + k.bytes_received > 0)
        out.push_back({op, axis, std::string(comm_op_name(op)) + "s over " + mesh_axis_name(axis) + " (counted)",
                       k.calls, k.bytes_sent, k.bytes_received, k.hop_bytes, 0, 0});
    }
  return out;
}

// One attention call of this device as the strategies see it.
CpCallShape call_shape(const Shape& s) {
  CpCallShape k;
  k.strategy = s.strategy;
  k.cp = s.cp;
  k.ulysses = s.U;
  k.B = s.B;
  k.L = s.S / s.cp;
  k.H = s.Hl;
  k.G = s.Gl;
  k.D = s.D;
  k.segments = s.segments;
  k.threads = s.threads;
  k.kernels = s.kernels;
  k.element_bytes = s.act;
  k.mask = s.mask;
  k.layout = s.layout;
  return k;
}

// ---- memory: what the counted step held at its peaks ------------------------------------

// Items of activation a the offload tier holds per step (0: not offloaded).
int64_t offloaded_items(const Shape& s, Activation a) {
  const int point = offload_save_point(a);
  return point >= 0 && s.save.offload[point] ? offload_stored_items(a, s.L) : 0;
}

// Device memory is the counted step's (count_step, on the meta device's
// tracker): each category's peak, with the buffers live at it, and the
// transients' (communication and scratch) peak together. The total adds
// them, as if every category peaked at once: the real step's peak of all
// together is at most that (the loss head's transients peak apart from
// the saved activations). The tiers outside device memory hold nothing in
// a counted step (core/offload_store.h); their lines are the stores' sizes.
void plan_memory(const RunConfig& c, const Shape& s, StrategyPlan& p) {
  const StepCount counted = count_step(c, s.devices, s.threads, s.kernels, static_cast<int>(s.devices - 1));
  auto add_memory = [&](const LiveBuffers& b) {
    if (b.bytes > 0)
      p.memory.push_back({b.category, b.name + (b.count > 1 ? " x" + str(b.count) : ""), int64_t(b.bytes)});
  };
  for (MemCategory category :
       {MemCategory::parameters, MemCategory::gradients, MemCategory::optimizer, MemCategory::activations})
    for (const LiveBuffers& b : counted.at_peak[static_cast<int>(category)]) add_memory(b);
  for (const LiveBuffers& b : counted.transient_at_peak) add_memory(b);

  const std::string shard = s.shards > 1 ? ", FSDP shard 1/" + str(s.shards) : "";
  p.state_offload_target = s.state_target;
  auto add_state = [&](StateTier tier, const std::string& name, int64_t bytes) {
    if (tier == StateTier::device) return;
    p.state_offload.push_back({name, bytes});
    p.state_offload_bytes += bytes;
  };
  add_state(s.parameter_tier, "model parameters (fp32" + shard + ")", s.shard * 4);
  add_state(s.optimizer_tier,
            s.zero1 ? "AdamW moments (fp32), ZeRO-1 piece 1/" + str(s.replicas) + shard
                    : "AdamW first and second moments (fp32" + shard + ")",
            kAdamWMoments * int64_t(s.piece.size) * 4);
  for (const MemoryLine& m : p.memory) p.memory_total += m.bytes;

  p.offload_target = s.offload_target;
  const auto table = activation_table(s.model, s.tp, s.save, s.N, true, 0, s.dtype, s.sp, s.chunk);
  for (int i = 0; i < kNumActivations; ++i) {
    const int64_t items = offloaded_items(s, static_cast<Activation>(i));
    if (items == 0) continue;
    p.offload_memory.push_back({std::string(table[i].name) + " x" + str(items),
                                items * table[i].bytes()});
    p.offload_bytes += items * table[i].bytes();
  }
  p.offload_moved_bytes = 2 * p.offload_bytes;  // each item written once and read once
}

// Offload moves (src/model/offload.h): item l of each offloaded tensor is
// written while layer l + 1 runs forward and read while layer l + 1 runs
// backward, so each layer's moves hide behind one layer's forward (taken as
// 1/3 of its compute) or backward (2/3); the rest is exposed. On a CPU the
// mover shares memory bandwidth with compute, which this does not count.
void plan_offload_time(const Shape& s, const HardwareProfile& hw, StrategyPlan& p) {
  p.offload_bandwidth = s.offload_target == OffloadTarget::host ? hw.host_link_bandwidth : hw.disk_bandwidth;
  if (p.offload_bytes == 0 || p.offload_bandwidth <= 0) return;
  const auto table = activation_table(s.model, s.tp, s.save, s.N, true, 0, s.dtype, s.sp, s.chunk);
  const double layer_seconds = p.compute_seconds / double(s.L);
  for (int64_t l = 0; l < s.L; ++l) {
    int64_t bytes = 0;  // of layer l's items
    for (int i = 0; i < kNumActivations; ++i)
      if (l < offloaded_items(s, static_cast<Activation>(i))) bytes += table[i].bytes();
    const double move = double(bytes) / p.offload_bandwidth;
    p.offload_seconds += 2 * move;
    p.offload_hidden_seconds += std::min(move, layer_seconds / 3) + std::min(move, 2 * layer_seconds / 3);
  }
}

// ---- FLOPs, pair and tile counts ------------------------------------------------------

struct AttentionWork {
  // pairs[t][i]: unmasked pairs x heads x batch of ring rank i at ring step t
  // (step 0 is the local shard). Without a ring, one step.
  std::vector<std::vector<int64_t>> pairs;
  // work[t][i]: the pairs the kernel computes for them (see kernel_work).
  std::vector<std::vector<double>> work;
  int64_t max_pairs = 0;  // per device, summed over steps, on the busiest rank
  double mean_pairs = 0;
};

int64_t tokens_in(std::span<const PositionRange> ranges) {
  int64_t n = 0;
  for (const PositionRange& r : ranges) n += r.size();
  return n;
}

// What the kernel computes for q tokens against kv tokens, in pairs: the
// unmasked pairs, or for a tiled kernel every pair of its non-empty tiles,
// those of partial tiles at their cost; plus the call's fixed costs per
// query and key row (attention_half_rate_tokens), which make short chunks
// slower per pair. A call with nothing unmasked is skipped by the engine.
double kernel_work(std::span<const PositionRange> q, std::span<const PositionRange> kv,
                   const MaskSpec& mask, const HardwareProfile& hw, int64_t head_dim, int64_t pairs) {
  if (pairs == 0) return 0.0;
  const double rows = hw.attention_half_rate_tokens * double(tokens_in(q) + tokens_in(kv)) / 2;
  if (hw.attention_block <= 0) return double(pairs) + rows;
  const TilePairs t = count_tile_pairs(q, kv, mask, hw.attention_block);
  return double(t.full) + hw.attention_partial_tile_cost_at(name_of(mask.kind), head_dim) * double(t.partial) +
         rows;
}

AttentionWork attention_work(const Shape& s, const HardwareProfile& hw) {
  AttentionWork w;
  // One kernel call of q against kv tokens, `heads` (batch rows x heads) times.
  auto call = [&](std::span<const PositionRange> q, std::span<const PositionRange> kv, int64_t heads) {
    const int64_t pairs = count_unmasked_pairs(q, kv, s.mask);
    return std::pair{pairs * heads, kernel_work(q, kv, s.mask, hw, s.D, pairs) * double(heads)};
  };
  auto add_step = [&](const std::vector<std::pair<int64_t, double>>& per_rank) {
    w.pairs.emplace_back();
    w.work.emplace_back();
    for (const auto& [pairs, work] : per_rank) w.pairs.back().push_back(pairs), w.work.back().push_back(work);
  };
  if (cp_strategy_info(s.strategy).gathers_kv || s.cp == 1) {
    // Local queries against the K,V gathered in rank order.
    std::vector<PositionRange> gathered;
    for (int64_t i = 0; i < s.cp; ++i)
      for (const PositionRange& r : layout_ranges(s.layout, s.S, s.cp, i)) gathered.push_back(r);
    std::vector<std::pair<int64_t, double>> per(s.cp);
    for (int64_t i = 0; i < s.cp; ++i) per[i] = call(layout_ranges(s.layout, s.S, s.cp, i), gathered, s.B * s.Hl);
    add_step(per);
  } else {  // ulysses, ring, usp: ring rank i holds the tokens of its U ulysses ranks, H / U heads
    // (ulysses: one ring rank, the whole sequence). Ring steps assume the
    // chunks start on tile boundaries (512-token chunks).
    const int64_t heads = s.B * s.Hl / s.U;
    std::vector<std::vector<PositionRange>> ranges(s.R);
    for (int64_t i = 0; i < s.R; ++i)
      ranges[i] = s.R == 1 ? std::vector<PositionRange>{{0, s.S}} : layout_ranges(s.layout, s.S, s.R, i);
    for (int64_t t = 0; t < s.R; ++t) {
      std::vector<std::pair<int64_t, double>> per(s.R);
      for (int64_t i = 0; i < s.R; ++i) per[i] = call(ranges[i], ranges[(i - t + s.R) % s.R], heads);
      add_step(per);
    }
  }
  const int64_t ranks = static_cast<int64_t>(w.pairs[0].size());
  std::vector<int64_t> total(ranks, 0);
  for (const auto& step : w.pairs)
    for (int64_t i = 0; i < ranks; ++i) total[i] += step[i];
  w.max_pairs = *std::max_element(total.begin(), total.end());
  double sum = 0;
  for (int64_t v : total) sum += double(v);
  w.mean_pairs = sum / double(ranks);
  return w;
}

// One projection [rows, in] -> [rows, out] on this device, in `count`
// layers: a forward, a weight and an input gradient GEMM of 2 rows in out
// FLOPs each, and the forward again when the remat policy recomputes it.
// rows: the N tokens, or for the LM head the residual stream's Nr.
struct Projection {
  int64_t in, out, count;
  bool recomputed;
  int64_t rows;
};

std::vector<Projection> projections(const Shape& s) {
  return {{s.d, s.qkv_cols, s.L, !s.save.qkv, s.N},
          {s.Hl * s.D, s.d, s.L, !s.save.out_proj, s.N},
          {s.d, 2 * s.Fl, s.L, !s.save.mlpwi, s.N},
          {s.Fl, s.d, s.L, false, s.N},
          {s.d, s.V, 1, false, s.Nr}};  // LM head
}

// ---- communication time: what the step and its attention calls were counted to move, over links ----------

struct Link {
  double bandwidth, latency;
};

// A group of `size` devices whose members are `stride` apart in rank order.
Link link_for(const HardwareProfile& hw, CommOp op, int64_t size, int64_t stride) {
  bool inter = size * stride > hw.devices_per_node && hw.inter_node_bandwidth > 0;
  if (inter) {
    const double measured = op == CommOp::all_reduce ? hw.inter_node_all_reduce_bandwidth
                            : op == CommOp::all_to_all ? hw.inter_node_all_to_all_bandwidth
                            : (op == CommOp::all_gather || op == CommOp::reduce_scatter) ? hw.inter_node_collective_bandwidth
                                                                             : 0.0;
    return {measured > 0 ? measured : hw.inter_node_bandwidth, hw.inter_node_latency};
  }
  double bw = op == CommOp::all_to_all ? hw.all_to_all_bandwidth
              : (op == CommOp::send || op == CommOp::recv) ? hw.p2p_bandwidth
                                               : hw.collective_bandwidth;
  return {bw, hw.latency};
}

// The rank stride of the groups of `axis` (src/core/mesh_shape.h rank order),
// for link_for: tp peers are neighbours; a group of the others spans
// size x stride ranks.
int64_t group_stride(const Shape& s, MeshAxis axis) {
  switch (axis) {
    case MeshAxis::world: case MeshAxis::tp: return 1;
    case MeshAxis::cp: case MeshAxis::ulysses: case MeshAxis::data: return s.tp;
    case MeshAxis::ring: return s.tp * s.U;
    case MeshAxis::shards: return s.fsdp_over_context ? s.tp : s.tp * s.cp;
    case MeshAxis::replicas: return s.devices / std::max<int64_t>(s.replicas, 1);
    case MeshAxis::dp: return s.devices / std::max<int64_t>(s.dp, 1);
  }
  return 1;
}

// The step's collectives outside the attention, as the engine issued them
// (count_step: per axis and operation, in the counters' conventions), timed
// over the links of their groups: calls x (P - 1) latencies plus the bytes.
void add_counted_collectives(const Shape& s, const HardwareProfile& hw, const StepCount& counted, StrategyPlan& p) {
  for (MeshAxis axis : kMeshAxes) {
    if (axis == MeshAxis::cp || axis == MeshAxis::ulysses || axis == MeshAxis::ring) continue;  // the attention's
    const int64_t P = s.mesh.group_size(axis);
    for (int i = 0; i < kNumCommOps; ++i) {
      const CommOp op = static_cast<CommOp>(i);
      const CommOpCounters& k = counted[axis][op];
      if (P <= 1 || k.bytes_sent + k.bytes_received == 0) continue;
      const Link link = link_for(hw, op, P, group_stride(s, axis));
      CommLine c{op, axis, "the step's " + std::string(comm_op_name(op)) + "s over " + mesh_axis_name(axis) + " (counted)",
                 k.calls, k.bytes_sent, k.bytes_received, 0, 0, 0};
      c.seconds = double(k.calls) * link.latency * double(P - 1) + double(k.bytes_sent) / link.bandwidth;
      p.comm.push_back(c);
    }
  }
}

// Adds `calls` repetitions of one attention call's lines, with transfer times.
void add_attention_calls(const Shape& s, const HardwareProfile& hw, const std::vector<CommLine>& call,
                         int64_t calls, const std::string& pass, StrategyPlan& p) {
  for (const CommLine& c : call) {
    const int64_t P = s.mesh.group_size(c.axis);
    const Link link = link_for(hw, c.op, P, group_stride(s, c.axis));
    CommLine line = c;
    line.what = pass + ": " + c.what;
    line.calls = c.calls * calls;
    line.bytes_sent = c.bytes_sent * calls;
    line.bytes_received = c.bytes_received * calls;
    line.hop_bytes = c.hop_bytes * calls;
    // On a torus a ring send crosses one link per position it skips, sharing
    // each with that step's other messages: its time follows bytes x hops.
    int64_t bytes = hw.torus && c.hop_bytes > 0 ? c.hop_bytes : std::max(c.bytes_sent, c.bytes_received);
    int64_t messages = c.op == CommOp::send || c.op == CommOp::recv ? c.calls : c.calls * (P - 1);
    // A send and its matching recv are one transfer: time it on the send line.
    line.seconds = c.op == CommOp::recv ? 0.0
                                  : calls * (link.latency * double(messages) + double(bytes) / link.bandwidth);
    p.comm.push_back(line);
  }
}

// ---- time -----------------------------------------------------------------------------

void plan_time(const Shape& s, const HardwareProfile& hw, const AttentionWork& w, const StepCount& counted,
               DType dtype, int64_t fwd_calls, StrategyPlan& p) {
  const double peak = hw.peak_flops(dtype);
  const double at_rate = peak * hw.attention_efficiency_at(s.D);
  const double tokens = double(s.N);
  // Each projection at the GEMM rate of its width (harmonic mean of in and
  // out: how many bytes its activations stream per FLOP).
  double mm_model = 0, mm_remat = 0, matmul_s = 0;
  for (const Projection& j : projections(s)) {
    // Model FLOPs count every token (MFU's definition); the device computes `rows`.
    mm_model += 3 * 2.0 * tokens * double(j.in) * double(j.out) * double(j.count);
    const double gemm = 2.0 * double(j.rows) * double(j.in) * double(j.out) * double(j.count);
    mm_remat += j.recomputed ? gemm : 0;
    const double width = 2.0 * double(j.in) * double(j.out) / double(j.in + j.out);
    matmul_s += (j.recomputed ? 4 : 3) * gemm / (peak * hw.matmul_efficiency_at(width));
  }
  // Per pair: forward 4 D (QK^T, PV), backward 10 D (recompute S, dV, dP, dQ, dK).
  const double fwd_pair = 4.0 * s.D, bwd_pair = 10.0 * s.D;
  const double pairs = double(w.max_pairs) * s.L;  // over all layers
  p.attention_pairs = w.max_pairs * s.L;
  p.load_imbalance = w.mean_pairs > 0 ? double(w.max_pairs) / w.mean_pairs : 1.0;
  p.model_flops = mm_model + 3.0 * fwd_pair * pairs;  // attention as 3x forward (MaxText)
  p.hardware_flops = mm_model + mm_remat + (fwd_pair * fwd_calls / s.L + bwd_pair) * pairs;

  // Elementwise kernels are bound by memory (or, measured, by whatever binds
  // each): the bytes each moves in the run's dtype over its rate, for the
  // elements the step's kernels were asked for (count_step).
  double memory_s = 0;
  for (const ElementwiseKernel& k : elementwise_kernels()) {
    const double bytes = counted.kernels[static_cast<std::size_t>(k.id)] * double(k.bytes_per_element(dtype));
    if (bytes == 0) continue;  // not run in this dtype (gemm: priced per projection above)
    memory_s += bytes / hw.elementwise_bandwidth_of(k.name());
  }

  double attention_s = 0;
  for (const CommLine& c : p.comm) p.comm_seconds += c.seconds;
  // Ring steps overlap the next shard's transfer with this step's compute;
  // a step takes the longer of the two on the slowest rank.
  double hidden = 0;
  double ring_comm_total = 0;
  for (const CommLine& c : p.comm)
    if (c.axis == MeshAxis::ring) ring_comm_total += c.seconds;
  // Forward at its own rate (remat repeats it); backward is the rest of the
  // measured forward + backward time per pair the kernel computes.
  const double fwd_rate = peak * hw.attention_forward_efficiency_at(s.D);
  const double fwd_seconds = fwd_pair / fwd_rate;
  const double bwd_seconds = std::max((fwd_pair + bwd_pair) / at_rate - fwd_seconds, bwd_pair / peak);
  const double per_pair = fwd_seconds * fwd_calls + bwd_seconds * s.L;
  if (s.R > 1 && !cp_strategy_info(s.strategy).gathers_kv && ring_comm_total > 0) {
    // Each piece travels while the previous one computes (the first during
    // the local shard), so transfers hide behind all but the last step.
    double last = 0;
    for (const std::vector<double>& step : w.work) {
      const double busiest = *std::max_element(step.begin(), step.end());
      attention_s += busiest * per_pair;
      if (busiest > 0) last = busiest * per_pair;
    }
    hidden = std::min(ring_comm_total, attention_s - last);
  } else {
    std::vector<double> total(w.work[0].size(), 0.0);
    for (const std::vector<double>& step : w.work)
      for (size_t i = 0; i < step.size(); ++i) total[i] += step[i];
    attention_s = *std::max_element(total.begin(), total.end()) * per_pair;
  }
  p.matmul_seconds = matmul_s;
  p.attention_seconds = attention_s;
  p.elementwise_seconds = memory_s;
  p.compute_seconds = matmul_s + memory_s + attention_s;
  // FSDP: each unit's all-gather is prefetched behind the previous use's
  // compute, all but the first (the embedding's); reduce-scatters block.
  double gathers = 0;
  for (const CommLine& c : p.comm)
    if (c.axis == MeshAxis::shards && c.op == CommOp::all_gather) gathers += c.seconds;
  const double uses = double(counted[MeshAxis::shards][CommOp::all_gather].calls);
  const double fsdp_hidden = uses > 0 ? std::min(gathers * (uses - 1) / uses, p.compute_seconds) : 0.0;
  for (CommLine& c : p.comm) {
    if (c.axis == MeshAxis::ring && ring_comm_total > 0) c.hidden_seconds = c.seconds * hidden / ring_comm_total;
    if (c.axis == MeshAxis::shards && c.op == CommOp::all_gather && gathers > 0) c.hidden_seconds = c.seconds * fsdp_hidden / gathers;
  }
  hidden += fsdp_hidden;
  p.hidden_comm_seconds = hidden;
  // Offloaded state: over the host link (a device backend's moves; on this
  // CPU backend the host pool is RAM and nothing moves) or to disk.
  const bool disk = s.state_target == OffloadTarget::disk;
  const double state_bandwidth = disk ? hw.disk_bandwidth : hw.host_link_bandwidth;
  p.state_offload_bandwidth = state_bandwidth;
  // The bytes whatever the profile knows; their time where it has the bandwidth.
  const int64_t moments = s.optimizer_tier != StateTier::device ? 2 * kAdamWMoments * int64_t(s.piece.size) * 4 : 0;
  // Parameters: every unit's block in for the forward, each layer's again
  // for the backward (and the tied embedding's for the loss head), read
  // with the unit's prefetch (hidden like the all-gathers); the updated
  // shard out (a device backend's host copy: hidden too; on disk the
  // update reads the shard in and writes it out, exposed).
  int64_t gather_reads = 0, update = 0;
  if (s.parameter_tier != StateTier::device) {
    gather_reads = (s.shard + s.L * s.layer_block + (s.model.tie_embeddings ? s.embed_block : 0)) * 4;
    update = (disk ? 2 : 1) * s.shard * 4;
  }
  const int64_t hidden_bytes = gather_reads + (disk ? 0 : update);
  p.state_offload_moved_bytes = moments + gather_reads + update;
  if (state_bandwidth > 0) {
    p.state_offload_seconds = double(p.state_offload_moved_bytes) / state_bandwidth;
    p.state_offload_hidden_seconds = std::min(double(hidden_bytes) / state_bandwidth, p.compute_seconds);
  }
  plan_offload_time(s, hw, p);
  p.step_seconds = p.compute_seconds + p.comm_seconds - hidden + p.offload_seconds - p.offload_hidden_seconds +
                   p.state_offload_seconds - p.state_offload_hidden_seconds;
  p.tokens_per_second = tokens / double(s.tp) / p.step_seconds;  // a tp group's N tokens over its tp devices
  p.mfu = p.model_flops / p.step_seconds / peak;
}

}  // namespace

const std::vector<ElementwiseKernel>& elementwise_kernels() {
  // bf16: x, y, gate, up and the activations are bf16 (2 bytes), dy, dx, the
  // GEMM outputs the kernels read (out_proj and MLP partial sums, the
  // activation's gradient) fp32 (4).
  static const std::vector<ElementwiseKernel> k = {
      {KernelId::rmsnorm_forward, 8, 4, "read x, write y"},
      {KernelId::rmsnorm_backward, 16, 14, "read x, dy and dx, write dx (accumulated; only x is bf16)"},
      {KernelId::rope, 8, 8, "rotate q and k in place (forward or inverse), fp32 in both dtypes"},
      {KernelId::residual_add, 12, 8, "read the residual and the fp32 GEMM output, write the residual"},
      {KernelId::swiglu_forward, 12, 6, "read gate and up, write the activation"},
      {KernelId::swiglu_backward, 20, 12, "read gate, up and the activation's fp32 gradient, write both gradients"},
      {KernelId::cross_entropy, 8, 8, "per logit: read it, write its gradient (fp32 in both dtypes)"},
      {KernelId::optimizer, 36, 36, "per parameter: zero the gradient (4), its norm (4), AdamW reads p, g, m, v "
                            "and writes p, m, v (28), all fp32"},
      {KernelId::convert, 0, 6, "bf16 only: round an fp32 GEMM output, gradient or weight to its bf16 copy "
                        "(read 4, write 2)"},
  };
  return k;
}

const ElementwiseKernel& elementwise_kernel(KernelId id) {
  for (const ElementwiseKernel& k : elementwise_kernels())
    if (k.id == id) return k;
  throw ConfigError(std::string("the planner prices no elementwise kernel '") + kernel_name(id) + "'");
}

namespace {

int64_t device_memory(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  if (o.device_memory > 0) return o.device_memory;
  if (c.device_memory_budget > 0) return c.device_memory_budget;
  return hw.memory_bytes;
}

}  // namespace

int64_t plan_devices(const RunConfig& c, const PlanOptions& o) {
  if (o.devices > 0) return o.devices;
  // An axis at -1 (fill) counts as 1: the smallest mesh of this shape.
  return std::max<int64_t>(c.dp, 1) * std::max<int64_t>(c.fsdp, 1) * c.cp * c.tp;
}

StrategyPlan plan_strategy(const RunConfig& c, const HardwareProfile& profile, const PlanOptions& o) {
  StrategyPlan p;
  p.strategy = c.strategy();
  p.cp = c.cp;
  p.tp = c.tp;
  p.ulysses = c.ulysses_degree();
  p.ring = c.cp / p.ulysses;
  p.remat_policy = c.remat_policy;
  const int64_t devices = plan_devices(c, o);
  if (c.model.num_heads % c.tp != 0 || c.model.num_kv_heads % c.tp != 0 || c.model.mlp_dim % c.tp != 0)
    throw ConfigError("ici_tensor_parallelism=" + str(c.tp) +
                      " must divide the query heads, KV heads and base_mlp_dim");
  p.invalid_reason = invalid_reason(c, devices);
  p.device_memory = device_memory(c, profile, o);
  if (!p.invalid_reason.empty()) {
    p.valid = false;
    return p;
  }
  const Shape s = make_shape(c, devices, threads_of(c, &profile), profile.kernels);
  p.dp = s.dp;
  p.fsdp = s.fsdp;
  plan_memory(c, s, p);
  // What train enforces: both budgets (the host pool only when one is set).
  p.fits = p.memory_total <= p.device_memory &&
           (c.host_memory_budget == 0 || host_pool_bytes(p) <= c.host_memory_budget);
  if (o.memory_only) return p;

  // The kernel tables of the run's compute dtype (cpu-local measures bf16's
  // apart); every lookup below reads them.
  const HardwareProfile hw = profile.for_dtype(c.dtype);
  AttentionWork w = attention_work(s, hw);
  // Attention forward runs once per layer, again in backward when the policy
  // does not save the context; backward once per layer.
  const int64_t fwd_calls = s.L * (s.save.context ? 1 : 2);
  // The busiest cp rank (most bytes sent) stands for the device: ring ranks
  // skip different pieces under causal and windowed masks.
  std::vector<CommLine> fwd_call, bwd_call;
  int64_t busiest = -1;
  for (int64_t r = 0; r < s.cp; r += s.U) {  // ulysses ranks of one ring position move the same
    const CpCallCount& call = count_cp_call(call_shape(s), r);
    std::vector<CommLine> f = comm_lines(call, false), b = comm_lines(call, true);
    int64_t bytes = 0;
    for (const CommLine& l : f) bytes += l.bytes_sent * fwd_calls;
    for (const CommLine& l : b) bytes += l.bytes_sent * s.L;
    if (bytes > busiest) busiest = bytes, fwd_call = f, bwd_call = b;
    if (s.R == 1 || cp_strategy_info(s.strategy).gathers_kv) break;  // no ring steps: every rank the same
  }
  add_attention_calls(s, hw, fwd_call, fwd_calls, "attention forward", p);
  add_attention_calls(s, hw, bwd_call, s.L, "attention backward", p);
  const StepCount counted = count_step(c, devices, s.threads, s.kernels, static_cast<int>(devices - 1));
  add_counted_collectives(s, hw, counted, p);
  for (const CommLine& line : p.comm) p.comm_bytes_sent += line.bytes_sent;
  plan_time(s, hw, w, counted, c.dtype, fwd_calls, p);
  return p;
}


int64_t predicted_memory_bytes(const RunConfig& c, int64_t threads, int64_t* host_offload_bytes) {
  // Sizes the engine could not even count in 64 bits are refused first (in
  // double precision): the residual streams alone of one rank's tokens.
  const double tokens = double(c.per_device_batch_size) * double(c.max_target_length) / double(c.cp);
  const double streams = tokens * double(c.model.d_model) * double(c.model.num_layers + 1) * 4.0;
  if (!(streams < 0x1p62))
    throw ConfigError("the run needs more than 4 EiB per rank (" + str(c.per_device_batch_size) + " x " +
                      str(c.max_target_length) + " tokens over cp=" + str(c.cp) +
                      "): lower max_target_length or per_device_batch_size, or raise ici_context_parallelism");
  StrategyPlan p;
  plan_memory(c, make_shape(c, c.dp * c.fsdp * c.cp * c.tp, threads), p);
  if (host_offload_bytes) *host_offload_bytes = host_pool_bytes(p);
  return p.memory_total;
}

int64_t host_pool_bytes(const StrategyPlan& p) {
  return (p.offload_target == OffloadTarget::host ? p.offload_bytes : 0) +
         (p.state_offload_target == OffloadTarget::host ? p.state_offload_bytes : 0);
}

std::vector<CommLine> attention_call_comm(const RunConfig& c, bool backward, int64_t cp_rank) {
  const Shape s = make_shape(c, c.cp * c.tp, threads_of(c, nullptr));
  return comm_lines(count_cp_call(call_shape(s), cp_rank), backward);
}

}  // namespace longctx
