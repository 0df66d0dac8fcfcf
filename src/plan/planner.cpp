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

#include "cp/cp_attention.h"
#include "core/cp_strategy.h"
#include "kernels/attention.h"
#include "model/llama.h"
#include "model/offload.h"
#include "plan/mask_pairs.h"
#include "train/optimizer.h"

namespace longctx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1LL << 30));
  return buf;
}

// The chunk the memory ladder sets for a layer's token-wise parts: long
// enough that the GEMMs keep their rate, short enough that its transients
// are small next to a long sequence's attention operands.
constexpr int64_t kLadderTokenChunk = 4096;

// Policies from most to least memory; the planner escalates along it.
constexpr RematPolicy kRematLadder[] = {RematPolicy::none, RematPolicy::minimal, RematPolicy::save_context,
                                        RematPolicy::full};

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
  SaveSet save;
  OffloadTarget offload_target;
  LlamaConfig model;
  int64_t params_local;  // fp32 parameters of the tp rank (its flat vector)
  // FSDP (src/model/sharded_parameters.h): the shard group's size, this
  // device's shard of the flat vector (params_local when not sharded), the
  // ranks that hold the same shard (gradients summed there) and the ranks
  // that read other tokens (loss sums).
  int64_t fsdp, shards, shard, replicas, data_ranks;
  // One rank's block of the embedding, of a layer and of the head (parameter_units).
  int64_t embed_block, layer_block, head_block;
  // bf16 compute: weights rounded to their bf16 copy per step (the flat
  // vector once, or with FSDP each unit at each gather: the layers twice).
  int64_t rounded_weights;
  bool fsdp_over_context;
  StateTier optimizer_tier, parameter_tier;  // *_memory_host_offload, state_offload_target
  OffloadTarget state_target;
  // The largest chunk of the moments' piece and of the parameter shard
  // (core/state_store.h): a disk pass stages 2 of each.
  int64_t moment_chunk, param_chunk;
  // shard_optimizer_over_data (ZeRO-1) over the replicas: the piece of the
  // last replica (it also takes the remainder), which the device stands for.
  bool zero1;
  FlatPiece piece;
  int64_t threads;       // kernel threads per device (per-thread attention scratch)
  bool segments;         // packed documents: segment ids travel with K,V
};

// The rule the candidate breaks on these devices, or "": the config's own
// rules, called (validate_config), never restated here. The planner resolves
// the data axes from the devices (RunConfig::mesh_shape), and the data
// source is the trainer's to check.
std::string invalid_reason(const RunConfig& c, int64_t devices) {
  RunConfig k = c;
  const MeshShape mesh = c.mesh_shape(devices);
  k.dp = mesh.dp;
  k.fsdp = mesh.fsdp;
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

Shape make_shape(const RunConfig& c, int64_t devices, int64_t threads) {
  Shape s;
  s.threads = threads;
  s.strategy = c.strategy();
  s.B = c.per_device_batch_size;
  s.S = c.max_target_length;
  s.cp = c.cp;
  s.tp = c.tp;
  s.U = c.ulysses_degree();
  s.R = c.cp / s.U;
  s.devices = devices;
  // The mesh on these devices (src/core/mesh_shape.h owns its groups).
  const MeshShape mesh = c.mesh_shape(devices);
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
  s.params_local = parameters_per_tp_rank(m, c.tp);
  s.fsdp_over_context = c.fsdp_over_context;
  s.optimizer_tier = c.optimizer_tier();
  s.parameter_tier = c.parameter_tier();
  s.state_target = c.state_offload_target;
  s.shards = mesh.shard_group();
  s.shard = parameter_shard_elements(m, c.tp, s.shards);
  LlamaConfig one_layer = m;
  one_layer.num_layers = 1;
  const std::vector<ParameterUnit> units = parameter_units(one_layer, c.tp, s.shards);
  s.embed_block = units[0].block, s.layer_block = units[1].block, s.head_block = units[2].block;
  const int64_t tied = m.tie_embeddings ? 1 : 0;
  s.rounded_weights = s.shards == 1 ? s.shard
                                    : 2 * s.L * units[1].elements + (1 + tied) * units[0].elements + units[2].elements;
  s.replicas = mesh.replicas();
  s.data_ranks = mesh.data_ranks();
  s.segments = c.packing;
  s.zero1 = c.shard_optimizer_over_data && s.replicas > 1;
  s.piece = s.zero1 ? flat_piece(s.shard, static_cast<int>(s.replicas), static_cast<int>(s.replicas - 1))
                    : flat_piece(s.shard, 1, 0);
  const std::vector<ParameterUnit> all_units = parameter_units(m, c.tp, s.shards);
  s.moment_chunk = largest_state_chunk(all_units, int64_t(s.piece.begin), int64_t(s.piece.size));
  s.param_chunk = largest_state_chunk(all_units, 0, s.shard);
  return s;
}

std::vector<CommLine> comm_lines(const std::vector<CpTransfer>& transfers) {
  std::vector<CommLine> out;
  for (const CpTransfer& t : transfers)
    out.push_back({t.op, t.axis, t.what, t.calls, t.bytes_sent, t.bytes_received, t.hop_bytes, 0, 0});
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
  k.element_bytes = s.act;
  k.mask = s.mask;
  k.layout = s.layout;
  return k;
}

// ---- memory: what the engine allocates, from its own tables ----------------------------

void add_memory(StrategyPlan& p, MemCategory category, const std::string& name, int64_t bytes) {
  if (bytes > 0) p.memory.push_back({category, name, bytes});
}

// Items of activation a the offload tier holds per step (0: not offloaded).
int64_t offloaded_items(const Shape& s, Activation a) {
  const int point = offload_save_point(a);
  return point >= 0 && s.save.offload[point] ? offload_stored_items(a, s.L) : 0;
}

void plan_memory(const Shape& s, StrategyPlan& p) {
  const bool sharded = s.shards > 1;
  const std::string shard = sharded ? ", FSDP shard 1/" + str(s.shards) : "";
  // State the config keeps in the host pool or on disk instead.
  p.state_offload_target = s.state_target;
  auto add_state = [&](StateTier tier, MemCategory category, const std::string& name, int64_t bytes) {
    if (tier == StateTier::device) return add_memory(p, category, name, bytes);
    p.state_offload.push_back({name, bytes});
    p.state_offload_bytes += bytes;
  };
  add_state(s.parameter_tier, MemCategory::parameters, "model parameters (fp32" + shard + ")", s.shard * 4);
  if (!sharded)
    add_memory(p, MemCategory::parameters, "bf16 compute copy of the parameters", compute_weight_copy_bytes(s.shard, s.dtype));
  add_memory(p, MemCategory::gradients, "model gradients (fp32" + shard + ")", s.shard * 4);
  // The gathered units in use at the peak (the schedule of sharded_parameters.h).
  const auto gathered = gathered_peak_bytes(s.model, s.tp, s.shards, s.dtype, true);
  add_memory(p, MemCategory::parameters,
             std::string("FSDP gathered units in flight (fp32") + (s.dtype == DType::bf16 ? " + bf16 copy)" : ")"),
             gathered[0]);
  add_memory(p, MemCategory::gradients, "FSDP unit gradients before their reduce-scatter (fp32)", gathered[1]);
  add_state(s.optimizer_tier, MemCategory::optimizer,
            s.zero1 ? "AdamW moments (fp32), ZeRO-1 piece 1/" + str(s.replicas) + shard
                    : "AdamW first and second moments (fp32" + shard + ")",
            kAdamWMoments * int64_t(s.piece.size) * 4);
  // A disk pass (the optimizer step) streams each store on disk through 2 chunks.
  const int64_t staged = (s.optimizer_tier == StateTier::disk ? kAdamWMoments * s.moment_chunk : 0) +
                         (s.parameter_tier == StateTier::disk ? s.param_chunk : 0);
  add_memory(p, MemCategory::optimizer, "state streamed from disk by the update (2 chunks per store, fp32)", 2 * staged * 4);

  // The model's own activation table: per layer when the policy saves a
  // tensor, else one buffer every layer reuses; each in its own dtype.
  for (const ActivationBuffer& a : activation_table(s.model, s.tp, s.save, s.N, true, 0, s.dtype, s.sp, s.chunk))
    if (a.elements > 0)
      add_memory(p, MemCategory::activations,
                 std::string(a.name) + (a.copies > 1 ? " x" + str(a.copies) : "") +
                     (a.per_chunk ? " (one chunk of " + str(s.chunk) + " tokens)" : ""),
                 a.copies * a.bytes());

  // Transient communication buffers, never alive together: each attention
  // call's workspace, then (ZeRO-1) the trainer's gradient/parameter piece.
  const CpWorkspace ws = cp_attention_workspace(call_shape(s));
  const int64_t zero1_staging = s.zero1 ? int64_t(s.piece.block) * 4 : 0;
  if (zero1_staging > ws.bytes)
    add_memory(p, MemCategory::communication, "ZeRO-1 gradient/parameter piece (fp32, after backward)", zero1_staging);
  else
    add_memory(p, MemCategory::communication, "attention workspace (peak of one call): " + ws.what, ws.bytes);

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

// ---- communication time: transfers (CpCallTraffic, collectives per the src/comm counters) over links --

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

// One collective over a group of P ranks, `block` bytes per rank, per the
// counters' conventions; appended `calls` times.
void add_collective(StrategyPlan& p, const HardwareProfile& hw, CommOp op, MeshAxis axis, int64_t P, int64_t stride, const std::string& what,
                    int64_t block, int64_t calls) {
  if (P <= 1 || calls == 0 || block == 0) return;
  int64_t bytes = op == CommOp::all_reduce ? 2 * block * (P - 1) / P : block * (P - 1);
  Link link = link_for(hw, op, P, stride);
  CommLine c{op, axis, what, calls, bytes * calls, bytes * calls, 0, 0, 0};
  c.seconds = calls * (link.latency * double(P - 1) + double(bytes) / link.bandwidth);
  p.comm.push_back(c);
}

// Adds `calls` repetitions of one attention call's lines, with transfer times.
void add_attention_calls(const Shape& s, const HardwareProfile& hw, const std::vector<CommLine>& call,
                         int64_t calls, const std::string& pass, StrategyPlan& p) {
  for (const CommLine& c : call) {
    // Group sizes and rank strides per axis (src/comm/mesh.h rank order).
    int64_t P = c.axis == MeshAxis::ulysses ? s.U : c.axis == MeshAxis::ring ? s.R : s.cp;
    int64_t stride = c.axis == MeshAxis::ring ? s.tp * s.U : s.tp;
    Link link = link_for(hw, c.op, P, stride);
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

// Elements (of its operand; parameters for the optimizer) each elementwise
// kernel processes per device per step (the time model's count of the calls
// src/model/llama.cpp makes): per layer forward two norms, RoPE on q and k, two
// residual adds, SwiGLU; backward the norm and SwiGLU again (and the q/k/v
// norm, RoPE and the out_proj add when recomputed), SwiGLU's and both norms'
// gradients, RoPE's inverse, the attention norm once more; per step the
// embedding and its gradient (counted as adds), the final norm and the
// cross-entropy; per parameter the optimizer step. bf16 compute also rounds
// (convert): q/k/v and gate/up after their GEMMs (again when recomputed),
// per layer the gradient operands of backward's GEMMs (dL/dx twice, dO,
// dq/dk/dv), the loss chunk's dlogits, and the weights' bf16 copy.
std::vector<std::pair<std::string, double>> elementwise_elements(const Shape& s) {
  const double N = double(s.N), L = double(s.L), nd = double(s.Nr) * s.d;  // the residual stream's rows
  const double qkv = s.save.qkv ? 0 : 1, out = s.save.out_proj ? 0 : 1, mlpwi = s.save.mlpwi ? 0 : 1;
  return {{"rmsnorm_forward", nd * (L * (4 + qkv) + 1)},
          {"rmsnorm_backward", nd * (2 * L + 1)},
          {"rope", N * (s.Hl + s.Gl) * s.D * L * (2 + qkv)},
          {"residual_add", nd * (L * (2 + out) + 2)},
          {"swiglu_forward", N * s.Fl * 2 * L},
          {"swiglu_backward", N * s.Fl * L},
          {"cross_entropy", double(s.Nr) * s.V},
          {"optimizer", double(s.piece.size)},
          {"convert", N * L * (s.qkv_cols * (1 + qkv) + 2 * s.Fl * (1 + mlpwi) + 2 * s.d + s.Hl * s.D + s.qkv_cols) +
                          double(s.Nr) * s.V + double(s.rounded_weights)}};
}

void plan_time(const Shape& s, const HardwareProfile& hw, const AttentionWork& w, DType dtype,
               int64_t fwd_calls, StrategyPlan& p) {
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
  // each): the bytes each moves in the run's dtype over its rate.
  double memory_s = 0;
  for (const auto& [kernel, elements] : elementwise_elements(s)) {
    const ElementwiseKernel& k = elementwise_kernel(kernel);
    const double bytes = elements * double(k.bytes_per_element(dtype));
    if (bytes == 0) continue;  // not run in this dtype
    memory_s += bytes / hw.elementwise_bandwidth_of(kernel);
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
  const double uses = double(2 * s.L + 2);
  const double fsdp_hidden = std::min(gathers * (uses - 1) / uses, p.compute_seconds);
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
  if (state_bandwidth > 0) {
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
      {"rmsnorm_forward", 8, 4, "read x, write y"},
      {"rmsnorm_backward", 16, 14, "read x, dy and dx, write dx (accumulated; only x is bf16)"},
      {"rope", 8, 8, "rotate q and k in place (forward or inverse), fp32 in both dtypes"},
      {"residual_add", 12, 8, "read the residual and the fp32 GEMM output, write the residual"},
      {"swiglu_forward", 12, 6, "read gate and up, write the activation"},
      {"swiglu_backward", 20, 12, "read gate, up and the activation's fp32 gradient, write both gradients"},
      {"cross_entropy", 8, 8, "per logit: read it, write its gradient (fp32 in both dtypes)"},
      {"optimizer", 36, 36, "per parameter: zero the gradient (4), its norm (4), AdamW reads p, g, m, v "
                            "and writes p, m, v (28), all fp32"},
      {"convert", 0, 6, "bf16 only: round an fp32 GEMM output, gradient or weight to its bf16 copy "
                        "(read 4, write 2)"},
  };
  return k;
}

const ElementwiseKernel& elementwise_kernel(const std::string& name) {
  for (const ElementwiseKernel& k : elementwise_kernels())
    if (name == k.name) return k;
  throw ConfigError("unknown elementwise kernel '" + name + "'");
}

namespace {

int64_t device_memory(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  if (o.device_memory > 0) return o.device_memory;
  if (c.device_memory_budget > 0) return c.device_memory_budget;
  return hw.memory_bytes;
}

int64_t devices_of(const RunConfig& c, const PlanOptions& o) {
  if (o.devices > 0) return o.devices;
  // An axis at -1 (fill) counts as 1: the smallest mesh of this shape.
  return std::max<int64_t>(c.dp, 1) * std::max<int64_t>(c.fsdp, 1) * c.cp * c.tp;
}

// The strategy/factorization candidates at cp: (strategy, ulysses degree).
std::vector<std::pair<CpStrategy, int64_t>> candidates_at(int64_t cp) {
  std::vector<std::pair<CpStrategy, int64_t>> out;
  for (const CpStrategyInfo* s : cp_strategies())
    for (int64_t u : s->planner_ulysses_degrees(cp)) out.push_back({s->id, u});
  return out;
}

RunConfig with_candidate(const RunConfig& c, int64_t cp, CpStrategy strategy, int64_t U, RematPolicy remat) {
  RunConfig k = c;
  k.cp = cp;
  k.cp_strategy = strategy;
  k.cp_ulysses = cp_strategy_info(strategy).takes_usp_factor ? U : 1;
  k.remat_policy = remat;
  return k;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

StrategyPlan plan_strategy(const RunConfig& c, const HardwareProfile& profile, const PlanOptions& o) {
  // The kernel tables of the run's compute dtype (cpu-local measures bf16's
  // apart); every lookup below reads them.
  const HardwareProfile hw = profile.for_dtype(c.dtype);
  StrategyPlan p;
  p.strategy = c.strategy();
  p.cp = c.cp;
  p.tp = c.tp;
  p.ulysses = c.ulysses_degree();
  p.ring = c.cp / p.ulysses;
  p.remat_policy = c.remat_policy;
  const int64_t devices = devices_of(c, o);
  if (devices % (c.cp * c.tp) != 0)
    throw ConfigError(str(devices) + " devices are not divisible by ici_context_parallelism x "
                      "ici_tensor_parallelism = " + str(c.cp * c.tp));
  if (c.model.num_heads % c.tp != 0 || c.model.num_kv_heads % c.tp != 0 || c.model.mlp_dim % c.tp != 0)
    throw ConfigError("ici_tensor_parallelism=" + str(c.tp) +
                      " must divide the query heads, KV heads and base_mlp_dim");
  p.invalid_reason = invalid_reason(c, devices);
  p.device_memory = device_memory(c, hw, o);
  if (!p.invalid_reason.empty()) {
    p.valid = false;
    return p;
  }
  const Shape s = make_shape(c, devices, threads_of(c, &hw));
  p.dp = s.dp;
  p.fsdp = s.fsdp;
  plan_memory(s, p);
  // What train enforces: both budgets (the host pool only when one is set).
  p.fits = p.memory_total <= p.device_memory &&
           (c.host_memory_budget == 0 || host_pool_bytes(p) <= c.host_memory_budget);
  if (o.memory_only) return p;

  AttentionWork w = attention_work(s, hw);
  // Attention forward runs once per layer, again in backward when the policy
  // does not save the context; backward once per layer.
  const int64_t fwd_calls = s.L * (s.save.context ? 1 : 2);
  // The busiest cp rank (most bytes sent) stands for the device: ring ranks
  // skip different pieces under causal and windowed masks.
  std::vector<CommLine> fwd_call, bwd_call;
  int64_t busiest = -1;
  const CpCallTraffic traffic(call_shape(s));
  for (int64_t r = 0; r < s.cp; r += s.U) {  // ulysses ranks of one ring position move the same
    std::vector<CommLine> f = comm_lines(traffic.transfers(false, r)),
                          b = comm_lines(traffic.transfers(true, r));
    int64_t bytes = 0;
    for (const CommLine& l : f) bytes += l.bytes_sent * fwd_calls;
    for (const CommLine& l : b) bytes += l.bytes_sent * s.L;
    if (bytes > busiest) busiest = bytes, fwd_call = f, bwd_call = b;
    if (s.R == 1 || cp_strategy_info(s.strategy).gathers_kv) break;  // no ring steps: every rank the same
  }
  add_attention_calls(s, hw, fwd_call, fwd_calls, "attention forward", p);
  add_attention_calls(s, hw, bwd_call, s.L, "attention backward", p);
  // Row-parallel outputs (o, down) are all-reduced over tp in forward, the
  // column-parallel input gradients (q/k/v, gate/up) in backward; out_proj
  // again when the policy recomputes it. Sequence parallelism reduce-scatters
  // them instead (src/model/llama.cpp) and all-gathers the normed input
  // before each column-parallel GEMM (forward 2 per layer, backward 2, q/k/v
  // once more when recomputed) and the residual gradient before each
  // row-parallel backward GEMM (2 per layer).
  const int64_t tp_calls = s.L * (4 + (s.save.out_proj ? 0 : 1));
  if (s.sp) {
    add_collective(p, hw, CommOp::reduce_scatter, MeshAxis::tp, s.tp, 1, "layer outputs and input gradients (fp32)",
                   s.Nr * s.d * 4, tp_calls);
    add_collective(p, hw, CommOp::all_gather, MeshAxis::tp, s.tp, 1, "normed layer inputs", s.Nr * s.d * s.act,
                   s.L * (4 + (s.save.qkv ? 0 : 1)));
    add_collective(p, hw, CommOp::all_gather, MeshAxis::tp, s.tp, 1, "residual gradients (fp32)", s.Nr * s.d * 4, 2 * s.L);
    add_collective(p, hw, CommOp::all_reduce, MeshAxis::tp, s.tp, 1, "loss sum (fp64)", 8, 1);
    // Gradients of the tp-replicated parameters (norms, embedding, LM head),
    // one call each; a line per tensor size.
    std::map<int64_t, int64_t> calls_by_elements;
    for (const ParameterSpec& t : parameter_table(s.model))
      if (t.split == TpSplit::none) ++calls_by_elements[t.local_elements(s.tp)];
    // FSDP reduces them per use: the tied embedding twice (loss head, embedding backward).
    if (s.shards > 1 && s.model.tie_embeddings) ++calls_by_elements[s.model.vocab_size * s.d];
    for (const auto& [elements, calls] : calls_by_elements)
      add_collective(p, hw, CommOp::all_reduce, MeshAxis::tp, s.tp, 1,
                     "gradients of tp-replicated parameters of " + str(elements) + " elements (fp32)", elements * 4,
                     calls);
  } else {
    add_collective(p, hw, CommOp::all_reduce, MeshAxis::tp, s.tp, 1, "layer outputs and input gradients", s.N * s.d * 4,
                   tp_calls);
  }
  // FSDP (src/model/sharded_parameters.h): every unit's blocks all-gathered
  // before its use (forward: the embedding, each layer, the head, and the
  // embedding again for a tied LM head; backward: each layer again) and its
  // gradients reduce-scattered after (the head, each layer, the embedding,
  // and the embedding's loss-head part too when tied).
  if (s.shards > 1) {
    const int64_t embed = s.embed_block * 4, layer = s.layer_block * 4, head = s.head_block * 4;
    const int64_t tied = s.model.tie_embeddings ? 1 : 0;
    const int64_t span = s.fsdp_over_context ? s.tp : s.tp * s.cp;  // rank stride of the group
    add_collective(p, hw, CommOp::all_gather, MeshAxis::shards, s.shards, span, "layer weights (fp32)", layer, 2 * s.L);
    add_collective(p, hw, CommOp::all_gather, MeshAxis::shards, s.shards, span, "embedding weights (fp32)", embed, 1 + tied);
    add_collective(p, hw, CommOp::all_gather, MeshAxis::shards, s.shards, span, "head weights (fp32)", head, 1);
    add_collective(p, hw, CommOp::reduce_scatter, MeshAxis::shards, s.shards, span, "layer gradients (fp32)", layer, s.L);
    add_collective(p, hw, CommOp::reduce_scatter, MeshAxis::shards, s.shards, span, "embedding gradients (fp32)", embed, 1 + tied);
    add_collective(p, hw, CommOp::reduce_scatter, MeshAxis::shards, s.shards, span, "head gradients (fp32)", head, 1);
    add_collective(p, hw, CommOp::all_reduce, MeshAxis::shards, s.shards, span, "gradient norm pieces (fp64)", 8, 1);
  }
  // Gradients are summed over every rank holding the same shard (the
  // replicas): all-reduced, or (ZeRO-1) reduce-scattered in equal blocks, the
  // remainder all-reduced, and the updated parameter pieces all-gathered the same way.
  const int64_t rstride = s.devices / std::max<int64_t>(s.replicas, 1);
  if (s.zero1) {
    add_collective(p, hw, CommOp::reduce_scatter, MeshAxis::replicas, s.replicas, rstride, "gradient pieces (fp32)", int64_t(s.piece.block) * 4, 1);
    add_collective(p, hw, CommOp::all_reduce, MeshAxis::replicas, s.replicas, rstride, "gradient tail (fp32)", int64_t(s.piece.tail) * 4, 1);
    add_collective(p, hw, CommOp::all_gather, MeshAxis::replicas, s.replicas, rstride, "updated parameter pieces (fp32)",
                   int64_t(s.piece.block) * 4, 1);
    add_collective(p, hw, CommOp::all_gather, MeshAxis::replicas, s.replicas, rstride, "updated parameter tail (fp32)",
                   int64_t(s.piece.tail) * 4, 1);
  } else {
    add_collective(p, hw, CommOp::all_reduce, MeshAxis::replicas, s.replicas, rstride, "gradients (fp32)", s.shard * 4, 1);
  }
  // The trainer's small reductions (src/train/trainer.cpp, optimizer.cpp):
  // loss and weight sums over every data rank, the squared gradient norm over
  // tp (and first over the replicas' pieces with ZeRO-1).
  add_collective(p, hw, CommOp::all_reduce, MeshAxis::data, s.data_ranks, s.tp, "loss sums (2 x fp64)", 16, 1);
  if (s.zero1) add_collective(p, hw, CommOp::all_reduce, MeshAxis::replicas, s.replicas, rstride, "gradient norm pieces (fp64)", 8, 1);
  add_collective(p, hw, CommOp::all_reduce, MeshAxis::tp, s.tp, 1, "gradient norm (fp64)", 8, 1);
  for (const CommLine& line : p.comm) p.comm_bytes_sent += line.bytes_sent;
  plan_time(s, hw, w, c.dtype, fwd_calls, p);
  return p;
}

namespace {

std::vector<StrategyPlan> plans_at(const RunConfig& c, const HardwareProfile& hw,
                                   const PlanOptions& o, int64_t cp, RematPolicy remat) {
  std::vector<StrategyPlan> out;
  for (const auto& [strategy, U] : candidates_at(cp))
    out.push_back(plan_strategy(with_candidate(c, cp, strategy, U, remat), hw, o));
  return out;
}

// One line, in the users' terms, on why `best` won among `plans`.
std::string reason_for(const RunConfig& c, const StrategyPlan& best,
                       const std::vector<StrategyPlan>& plans) {
  const int64_t G = c.model.num_kv_heads / c.tp, H = c.model.num_heads / c.tp;
  // By what the strategies do (core/cp_strategy.h), not by name: the gathering one,
  // the all-to-all over all of cp, a split of cp, and a ring.
  auto find = [&](auto&& is) -> const StrategyPlan* {
    for (const StrategyPlan& p : plans)
      if (is(p)) return &p;
    return nullptr;
  };
  auto gathers = [](const StrategyPlan& p) { return cp_strategy_info(p.strategy).gathers_kv; };
  auto a2a_over_cp = [&](const StrategyPlan& p) { return !gathers(p) && p.ulysses == p.cp && p.cp > 1; };
  const StrategyPlan* ag = find(gathers);
  const StrategyPlan* ul = find(a2a_over_cp);
  std::string why;
  if (best.cp == 1) {
    why = "cp=1: the whole sequence fits on one device, no context parallelism needed";
  } else if (gathers(best)) {
    why = std::string(name_of(best.strategy)) + ": the gathered K,V fit in memory (" + gib(double(best.memory_total)) + " of " +
          gib(double(best.device_memory)) + ") and it is the fastest here";
  } else if (a2a_over_cp(best)) {
    why = std::string(name_of(best.strategy)) + ": " + str(G) + " KV heads allow an all-to-all over all cp=" + str(best.cp) +
          " ranks, moving less than ring" + (ag && !ag->fits ? " (gathered K,V do not fit)" : "");
  } else if (best.ulysses > 1) {
    why = cp_strategy_label(best.strategy, best.cp, best.ulysses) + ": ulysses limited by KV heads (" +
          str(G) + " per tp rank), so an all-to-all over " + str(best.ulysses) +
          " (>= 2 KV heads each way) and a ring over " + str(best.ring);
  } else {
    const bool heads_block = ul && !ul->valid;
    const std::string name = name_of(best.strategy);
    why = heads_block ? name + ": heads (" + str(H) + " query, " + str(G) + " KV per tp rank) do not divide cp=" +
                            str(best.cp) + ", and the ring hides its transfers behind compute"
                      : name + ": fastest here, its K,V transfers hide behind compute";
    if (ag && !ag->fits && ag->valid) why += "; gathered K,V would not fit";
  }
  why += " (" + fmt_seconds(best.step_seconds) + "/step, MFU " +
         std::to_string(static_cast<int>(std::lround(best.mfu * 100))) + "%)";
  return why;
}

// Candidate cp sizes: the configured one when the mesh is pinned, else every
// divisor of devices / tp (dp or fsdp, whichever is -1, fills the rest).
std::vector<int64_t> cp_sizes(const RunConfig& c, int64_t devices) {
  if (c.dp != -1 && c.fsdp != -1) return {c.cp};
  std::vector<int64_t> out;
  for (int64_t cp = 1; cp <= devices / c.tp; ++cp)
    if ((devices / c.tp) % cp == 0 && devices % c.tp == 0) out.push_back(cp);
  return out;
}

}  // namespace

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
  plan_memory(make_shape(c, c.dp * c.fsdp * c.cp * c.tp, threads), p);
  if (host_offload_bytes) *host_offload_bytes = host_pool_bytes(p);
  return p.memory_total;
}

int64_t host_pool_bytes(const StrategyPlan& p) {
  return (p.offload_target == OffloadTarget::host ? p.offload_bytes : 0) +
         (p.state_offload_target == OffloadTarget::host ? p.state_offload_bytes : 0);
}

LongestLength longest_length(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o, int64_t granule) {
  if (granule < 1) throw ConfigError("the length granule must be >= 1 (got " + str(granule) + ")");
  if (!c.cp_strategy)
    throw ConfigError("the longest length is searched for one strategy: set context_parallel_strategy (all_gather, "
                      "ulysses, ring or usp), not auto");
  LongestLength r;
  r.granule = granule;
  auto at = [&](int64_t multiple) {
    RunConfig k = c;
    k.max_target_length = multiple * granule;
    return plan_strategy(k, hw, o);
  };
  r.plan = r.next = at(1);
  // The length rules are divisibility rules: a granule that keeps them keeps them at every multiple.
  if (!r.plan.valid)
    throw ConfigError("granule " + str(granule) + " breaks a length rule: " + r.plan.invalid_reason +
                      "; choose a granule that satisfies it");
  if (!r.plan.fits) return r;
  // fits(lo), not fits(hi): double, then bisect.
  int64_t lo = 1, hi = 2;
  constexpr int64_t kMaxTokens = int64_t{1} << 50;  // far beyond any device: memory does not grow?
  while (at(hi).fits) {
    lo = hi;
    if (hi > kMaxTokens / granule / 2)
      throw ConfigError("more than 2^50 tokens fit in " + str(r.plan.device_memory) + " bytes: nothing to search");
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (at(mid).fits ? lo : hi) = mid;
  }
  r.length = lo * granule;
  r.plan = at(lo);
  r.next = at(lo + 1);
  return r;
}

std::vector<CommLine> attention_call_comm(const RunConfig& c, bool backward, int64_t cp_rank) {
  const Shape s = make_shape(c, c.cp * c.tp, threads_of(c, nullptr));
  return comm_lines(CpCallTraffic(call_shape(s)).transfers(backward, cp_rank));
}

namespace {

// One rung of the memory ladder: a lever added to the ones before it.
struct Rung {
  std::string what;  // "key=value ...", as a user would set it
  std::string why;   // what it saves
  RunConfig config;
  int heavier = 0;   // remat policies past the asked one (0: the asked policy)
};

// The levers in the reference's order for tight memory (MaxText): shard
// first (ZeRO-1, then FSDP: the dp ranks and the cp ranks shard the
// parameters; then sequence parallelism over tp), then move state off the
// device (the saved activations, the optimizer
// state, then the layer inputs, then the parameters), and recompute last: at each
// heavier remat policy, every lever above with the tensors it still saves
// offloaded. Each rung keeps the rungs before it.
std::vector<Rung> memory_ladder(const RunConfig& c, const HardwareProfile& hw, bool heavier_remat) {
  std::vector<Rung> ladder{{"", "", c}};
  int heavier = 0;
  auto add = [&](const std::string& what, const std::string& why, const std::function<void(RunConfig&)>& f) {
    RunConfig k = ladder.back().config;
    f(k);
    ladder.push_back({what, why, k, heavier});
  };
  if (!c.shard_optimizer_over_data)
    add("shard_optimizer_over_data=true", "AdamW moments sharded over the replicas (ZeRO-1)",
        [](RunConfig& k) { k.shard_optimizer_over_data = true; });
  if (c.dp > 1 || (c.cp > 1 && !c.fsdp_over_context) || c.dp == -1)
    add("ici_fsdp_parallelism=" + std::string(c.dp == -1 ? "-1" : str(c.dp * c.fsdp)) +
            " ici_data_parallelism=1 fsdp_over_context=true",
        "parameters, gradients and moments sharded over the dp and cp ranks (FSDP)", [](RunConfig& k) {
          k.fsdp = k.dp == -1 ? -1 : k.dp * k.fsdp;
          k.dp = 1;
          k.fsdp_over_context = true;
        });
  if (c.tp > 1 && !c.tp_sequence_parallel)
    add("tensor_sequence_parallelism=true", "layer inputs and norms sharded over tp",
        [](RunConfig& k) { k.tp_sequence_parallel = true; });
  // Chunking moves no bytes and recomputes nothing (the GEMMs only get
  // shorter), so it comes before any offload; it saves nothing when a
  // rank's tokens fit one chunk.
  if (c.layer_token_chunk == 0 &&
      c.per_device_batch_size * c.max_target_length > kLadderTokenChunk * std::max<int64_t>(c.cp, 1))
    add("layer_token_chunk=" + str(kLadderTokenChunk),
        "a layer's norms, projections and SwiGLU computed " + str(kLadderTokenChunk) +
            " tokens at a time: their transients stop growing with the sequence",
        [](RunConfig& k) { k.layer_token_chunk = kLadderTokenChunk; });
  const bool host_link = hw.host_link_bandwidth > 0;
  const bool host = host_link || c.offload_target == OffloadTarget::disk;
  std::vector<RematPolicy> remats{c.remat_policy};
  bool past = false;
  for (RematPolicy r : kRematLadder) {
    if (past && heavier_remat) remats.push_back(r);
    past = past || c.remat_policy == r;
  }
  for (size_t i = 0; i < remats.size(); ++i) {
    heavier = static_cast<int>(i);
    if (i > 0)
      add(std::string("remat_policy=") + name_of(remats[i]), "recomputes more in backward", [&](RunConfig& k) {
        k.remat_policy = remats[i];
        k.remat_custom_offload = {};
      });
    if (!host || remats[i] == RematPolicy::custom) continue;
    // Offload what this policy saves, one named tensor at a time, largest
    // first (MaxText's recipes offload some tensors and keep others), then
    // the layer inputs. Each rung is the custom policy a user would write.
    const SaveSet saved = save_set_for(remats[i]);
    const CustomSave keep{true, saved.qkv, saved.context, saved.out_proj, saved.mlpwi, false};
    auto offload_rung = [&](const CustomOffload& offloaded, const std::string& why) {
      RunConfig k = ladder.back().config;
      k.remat_policy = RematPolicy::custom;
      k.remat_custom_save = keep;
      k.remat_custom_offload = offloaded;
      k.offload_target = c.offload_target;
      ladder.push_back({"remat_policy=custom " + remat_custom_keys(k) + " offload_target=" + name_of(c.offload_target),
                        why, k, heavier});
    };
    const LlamaConfig& m = c.model;
    const int64_t tp = std::max<int64_t>(c.tp, 1);
    const std::pair<SavePoint, int64_t> per_token[] = {  // elements per token (SaveSet's shapes)
        {SavePoint::qkv_proj, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tp},
        {SavePoint::context, m.num_heads * m.head_dim / tp},
        {SavePoint::out_proj, 2 * m.d_model},
        {SavePoint::mlpwi, 2 * m.mlp_dim / tp}};
    std::vector<std::pair<int64_t, SavePoint>> largest_first;
    for (const auto& [point, elements] : per_token)
      if (keep[static_cast<int>(point)]) largest_first.push_back({elements, point});
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    CustomOffload offloaded{};
    for (const auto& [elements, point] : largest_first) {
      offloaded[static_cast<int>(point)] = true;
      offload_rung(offloaded, std::string(name_of(point)) + " moved off the device between forward and backward");
    }
    if (i == 0 && host_link && !c.optimizer_memory_host_offload)
      add("optimizer_memory_host_offload=true", "AdamW moments in host memory",
          [](RunConfig& k) { k.optimizer_memory_host_offload = true; });
    offloaded[static_cast<int>(SavePoint::decoder_layer_input)] = true;
    offload_rung(offloaded, "layer inputs moved off the device too");
    const RunConfig& now = ladder.back().config;
    if (i == 0 && host_link && !c.parameter_memory_host_offload && (now.fsdp == -1 || now.mesh_shape().shard_group() > 1))
      add("parameter_memory_host_offload=true", "FSDP parameter shards in host memory",
          [](RunConfig& k) { k.parameter_memory_host_offload = true; });
  }
  return ladder;
}

}  // namespace

namespace {

// Whether the user chose `key` (a config file of theirs or the command
// line), rather than leaving it at the defaults (the key table, configs/base.yml).
bool user_set(const RunConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  if (it == c.sources.end() || it->second == "default") return false;
  return std::filesystem::path(it->second).filename() != "base.yml";
}

// Rungs the search tries past the first at which a plan fits.
constexpr int kMoreRungs = 2;

// One plan the search found to fit: the config to run, its prediction, the
// memory levers it needed (with why), and its place in MaxText's order
// (100 x the remat policy's place, plus the rung: the levers it added), which breaks ties.
struct Found {
  RunConfig config;
  StrategyPlan plan;
  std::string levers;
  int order = 0;
  bool heavier_remat = false;  // a remat policy heavier than the user's
};

// The winner: among the plans within 1% (the model's resolution) of the
// fastest (tokens per second per device: a step's tokens grow with dp as cp
// shrinks), the one with the fewest levers in MaxText's order, then the
// smallest tp, then the smallest cp. Moved to the front; the rest follow by speed.
void rank_found(std::vector<Found>& found) {
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.plan.tokens_per_second > b.plan.tokens_per_second; });
  const double fastest = found.front().plan.tokens_per_second;
  size_t best = 0;
  for (size_t i = 1; i < found.size() && found[i].plan.tokens_per_second * 1.01 >= fastest; ++i)
    if (std::tuple(found[i].order, found[i].plan.tp, found[i].plan.cp) <
        std::tuple(found[best].order, found[best].plan.tp, found[best].plan.cp))
      best = i;
  std::rotate(found.begin(), found.begin() + best, found.begin() + best + 1);
}

std::string alternative_line(const Found& f) {
  return cp_strategy_label(f.plan.strategy, f.plan.cp, f.plan.ulysses) + " cp=" + str(f.plan.cp) + ", remat " +
         name_of(f.plan.remat_policy) +
         (f.order % 100 == 0 ? "" : ", " + std::to_string(f.order % 100) + " lever(s)") +
         ": " + std::to_string(std::lround(f.plan.tokens_per_second)) + " tokens/s/device, MFU " +
         std::to_string(static_cast<int>(std::lround(f.plan.mfu * 100))) + "%, " + gib(double(f.plan.memory_total));
}

// Candidate tp sizes: the configured one when the user set it or the mesh is
// pinned, else every tp that divides the heads, KV heads, MLP width and
// devices and stays within a node (tp's per-layer collectives need its links).
std::vector<int64_t> tp_sizes(const RunConfig& c, int64_t devices, const HardwareProfile& hw) {
  if (user_set(c, "ici_tensor_parallelism") || (c.dp != -1 && c.fsdp != -1)) return {c.tp};
  const LlamaConfig& m = c.model;
  std::vector<int64_t> out;
  for (int64_t tp = 1; tp <= devices && (hw.devices_per_node <= 0 || tp <= hw.devices_per_node); tp *= 2)
    if (m.num_heads % tp == 0 && m.num_kv_heads % tp == 0 && m.mlp_dim % tp == 0 && devices % tp == 0)
      out.push_back(tp);
  return out;
}

}  // namespace

// The search: every tp and remat policy the user left open (lightest first), and
// for each its memory ladder without heavier remat; at every candidate cp,
// each strategy with the first rung at which it fits (memory only: cheap),
// then its full prediction. The fastest wins.
PlanRecommendation recommend(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  const int64_t devices = devices_of(c, o);
  PlanOptions opts = o, memory = o;
  opts.devices = memory.devices = devices;
  memory.memory_only = true;
  std::vector<RematPolicy> policies{c.remat_policy};
  const bool remat_open = !user_set(c, "remat_policy") && c.remat_policy != RematPolicy::custom;
  if (remat_open) policies.assign(std::begin(kRematLadder), std::end(kRematLadder));
  std::vector<Found> found;
  for (int64_t tp : tp_sizes(c, devices, hw))
  for (size_t pi = 0; pi < policies.size(); ++pi) {
    RunConfig base = c;
    base.tp = tp;
    base.remat_policy = policies[pi];
    const std::vector<Rung> ladder = memory_ladder(base, hw, !remat_open);
    for (int64_t cp : cp_sizes(base, devices)) {
      std::vector<std::pair<CpStrategy, int64_t>> variants = candidates_at(cp);
      if (cp == 1) variants.resize(1);  // no context parallelism: every strategy is the same run
      // Rungs each variant may still try: the first that fits and the next
      // kMoreRungs (a lever can pay for itself: FSDP's reduce-scatter moves
      // less than the all-reduce of full gradients).
      std::vector<int> left(variants.size(), kMoreRungs + 1);
      std::string added;
      for (size_t r = 0; r < ladder.size(); ++r) {
        if (!ladder[r].what.empty()) added += "; " + ladder[r].what + " (" + ladder[r].why + ")";
        const RunConfig& k = ladder[r].config;
        for (size_t v = 0; v < variants.size(); ++v) {
          // A heavier remat than the user's only where nothing lighter fits.
          if (left[v] == 0 || (left[v] <= kMoreRungs && ladder[r].heavier > 0)) continue;
          const RunConfig run = with_candidate(k, cp, variants[v].first, variants[v].second, k.remat_policy);
          const StrategyPlan m = plan_strategy(run, hw, memory);
          if (!m.valid) left[v] = 0;
          if (!m.valid || !m.fits) continue;
          --left[v];
          found.push_back({run, plan_strategy(run, hw, opts), added.empty() ? "" : added.substr(2),
                           static_cast<int>(pi * 100 + r), ladder[r].heavier > 0});
        }
        if (std::all_of(left.begin(), left.end(), [](int n) { return n == 0; })) break;
      }
    }
  }
  if (found.empty()) {
    PlanRecommendation none;
    none.reason = "nothing fits on " + str(devices) + " devices with tp=" + str(c.tp) +
                  " at any cp, with every memory lever (ZeRO-1, FSDP over dp and cp, sequence parallelism, "
                  "offload of activations, optimizer state, layer inputs and parameters, " +
                  (remat_open ? std::string("every remat policy") : "heavier remat policies") +
                  "): raise ici_tensor_parallelism, add devices or shorten max_target_length";
    return none;
  }
  // The user's remat policy wherever it fits at all: heavier ones only when it does not.
  if (std::any_of(found.begin(), found.end(), [](const Found& f) { return !f.heavier_remat; }))
    std::erase_if(found, [](const Found& f) { return f.heavier_remat; });
  rank_found(found);
  const Found& best = found.front();
  PlanRecommendation r;
  r.found = true;
  r.strategy = best.plan.strategy;
  r.cp = best.plan.cp;
  r.tp = best.plan.tp;
  r.ulysses = best.plan.ulysses;
  r.remat_policy = best.config.remat_policy;
  r.shard_optimizer_over_data = best.config.shard_optimizer_over_data;
  r.config = best.config;
  r.levers = best.levers;
  r.plan = best.plan;
  r.reason = reason_for(best.config, best.plan, plans_at(best.config, hw, opts, best.plan.cp, best.config.remat_policy));
  r.reason = "the fastest of " + str(int64_t(found.size())) + " plans that fit" +
             (remat_open ? " (every remat policy, cp, strategy and the memory levers each needs)" : "") + "; " +
             r.reason;
  if (!best.levers.empty()) r.reason += "; it needs the memory levers listed apart (MaxText's order)";
  for (size_t i = 1; i < found.size() && r.runners_up.size() < 2; ++i) r.runners_up.push_back(alternative_line(found[i]));
  return r;
}

PlanReport make_plan(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  PlanReport report;
  report.hardware = hw.name;
  report.devices = devices_of(c, o);
  PlanOptions opts = o;
  opts.devices = report.devices;
  report.candidates = plans_at(c, hw, opts, c.cp, c.remat_policy);
  // Advice for what does not fit: sharding the optimizer, the lightest remat,
  // then the smallest larger cp.
  for (StrategyPlan& p : report.candidates) {
    if (!p.valid || p.fits) continue;
    if (!c.shard_optimizer_over_data) {
      RunConfig k = with_candidate(c, p.cp, p.strategy, p.ulysses, c.remat_policy);
      k.shard_optimizer_over_data = true;
      StrategyPlan q = plan_strategy(k, hw, opts);
      if (q.valid && q.fits) {
        p.advice = "fits with shard_optimizer_over_data=true";
        continue;
      }
    }
    for (RematPolicy remat : kRematLadder) {
      StrategyPlan q = plan_strategy(with_candidate(c, p.cp, p.strategy, p.ulysses, remat), hw, opts);
      if (q.valid && q.fits) {
        p.advice = "fits with remat_policy=" + std::string(name_of(remat));
        break;
      }
    }
    if (!p.advice.empty()) continue;
    for (int64_t cp = p.cp * 2; cp * c.tp <= report.devices; cp *= 2) {
      int64_t U = cp_strategy_info(p.strategy).takes_usp_factor ? p.ulysses : 1;
      StrategyPlan q = plan_strategy(with_candidate(c, cp, p.strategy, U, c.remat_policy), hw, opts);
      if (q.valid && q.fits) {
        p.advice = "fits with ici_context_parallelism=" + str(cp);
        break;
      }
    }
    if (p.advice.empty())
      p.advice = c.shard_optimizer_over_data
                     ? "does not fit with any remat policy or larger cp"
                     : "does not fit with shard_optimizer_over_data, any remat policy or larger cp";
  }
  report.recommendation = recommend(c, hw, opts);
  return report;
}

}  // namespace longctx
