#pragma once
// The planner: predicts, for one run configuration on one hardware profile,
// the memory, communication, FLOPs and step time of every context-parallel
// strategy (and every ulysses x ring factorization for usp), and recommends
// one. `longctx plan` prints it; `train` with context_parallel_strategy=auto
// calls recommend(). One plan: planner.cpp (plan_strategy); the search over
// plans and the report: search.cpp (recommend, make_plan).
//
// It reads the same RunConfig as train (src/core/config.h) and counts by
// running (src/plan/step_count.h): the engine's own step, on a meta device
// over a counting mesh, gives the device memory (each category's peak and
// the buffers live at it, from the meta device's tracker), every
// collective in the src/comm counters' conventions, and the kernels' work;
// each attention call's bytes come from running it alone (src/cp,
// count_cp_call). Only the tiers outside device memory (offloaded
// activations, host or disk state) are sized from the stores' own
// functions. Tests compare memory and bytes with real steps, exactly.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/kernel_set.h"
#include "core/memory.h"
#include "core/mesh_shape.h"
#include "plan/hardware.h"

namespace longctx {

// One memory line per device: buffers of one name live at their
// category's peak (communication and scratch: at the transients' peak),
// counted in MemoryTracker category `category`.
struct MemoryLine {
  MemCategory category = MemCategory::activations;
  std::string name;  // the buffers' name and count, e.g. "x (layer input) x33"
  int64_t bytes = 0;
};

// What a tier outside device memory (host or disk) holds.
struct OffloadLine {
  std::string name;
  int64_t bytes = 0;
};

// One communication line per device per step, on the communicator of
// `axis` (src/core/mesh_shape.h: shards is the FSDP group, replicas the
// gradient reduction's, data the loss sums'); bytes follow the counters'
// conventions in src/comm/communicator.h.
struct CommLine {
  CommOp op = CommOp::send;
  MeshAxis axis = MeshAxis::cp;
  std::string what;  // e.g. "K,V forward"
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  // Ring sends: bytes x links crossed (CommOpCounters::hop_bytes); on a torus
  // profile their time follows this instead of bytes_sent.
  int64_t hop_bytes = 0;
  double seconds = 0;         // predicted transfer time
  double hidden_seconds = 0;  // of which overlapped with compute
};

// The prediction for one strategy and factorization at one mesh.
struct StrategyPlan {
  CpStrategy strategy{};
  int64_t dp = 1, fsdp = 1, cp = 1, ulysses = 1, ring = 1, tp = 1;
  RematPolicy remat_policy = RematPolicy::full;
  bool valid = true;
  std::string invalid_reason;  // the rule this factorization breaks

  std::vector<MemoryLine> memory;
  // Peak bytes per device: the sum of the lines, as if every category
  // peaked at once (at least the real step's peak of all together).
  int64_t memory_total = 0;
  int64_t device_memory = 0;  // what the device has (or the configured budget)
  bool fits = false;

  std::vector<CommLine> comm;
  int64_t comm_bytes_sent = 0;

  // Saved activations offloaded (remat_policy custom, a point set to
  // `offload`; src/model/offload.h): what the offload_target tier holds (not
  // in memory_total, which is device memory), the bytes moved per step
  // (written after a layer's forward, read before its backward), their time
  // at the tier's bandwidth (0 when the profile has none) and how much of it
  // hides behind the compute of the layer it overlaps.
  OffloadTarget offload_target = OffloadTarget::host;
  std::vector<OffloadLine> offload_memory;  // in offload_target
  int64_t offload_bytes = 0;
  int64_t offload_moved_bytes = 0;
  double offload_bandwidth = 0;  // bytes/s of the tier (hw host_link_bandwidth or disk_bandwidth)
  double offload_seconds = 0;
  double offload_hidden_seconds = 0;
  // optimizer_memory_host_offload / parameter_memory_host_offload: the
  // moments and the FSDP parameter shard in the state_offload_target (host
  // memory or disk, not in memory_total; a disk pass's staging is device
  // memory, in `memory`), the bytes moved per step over the host link or
  // to disk (moments in and out for the update; each gathered unit's block
  // in, the updated shard out), and that time (host parameters' hidden
  // behind compute like the FSDP all-gathers; the moments', and on disk the
  // parameters' reads, exposed).
  OffloadTarget state_offload_target = OffloadTarget::host;
  std::vector<OffloadLine> state_offload;  // in state_offload_target
  int64_t state_offload_bytes = 0;
  int64_t state_offload_moved_bytes = 0;
  double state_offload_bandwidth = 0;  // 0: the profile has none (time not counted)
  double state_offload_seconds = 0, state_offload_hidden_seconds = 0;

  // Per device per step.
  double model_flops = 0;     // 6 N tokens + attention (what MFU counts)
  double hardware_flops = 0;  // model_flops + rematerialisation
  int64_t attention_pairs = 0;       // unmasked (q, kv) pairs x heads x batch, this device (max)
  double load_imbalance = 1.0;       // max / mean pairs over the cp ranks

  double compute_seconds = 0;       // matmul + attention + elementwise
  double matmul_seconds = 0;        // projections, LM head and their gradients (remat included)
  double attention_seconds = 0;     // the attention kernel (critical path over ring steps; its tiles when tiled)
  double elementwise_seconds = 0;   // norms, RoPE, SwiGLU, residuals, cross-entropy, optimizer step
  double comm_seconds = 0;          // all transfers
  double hidden_comm_seconds = 0;   // overlapped with compute
  double step_seconds = 0;          // compute + exposed communication and offload moves
  double tokens_per_second = 0;     // per device
  double mfu = 0;                   // model_flops / step_seconds / peak

  std::string advice;  // when it does not fit: which remat policy or cp would
};

struct PlanRecommendation {
  bool found = false;
  CpStrategy strategy{};
  int64_t cp = 1, ulysses = 1, tp = 1;
  RematPolicy remat_policy = RematPolicy::full;
  bool shard_optimizer_over_data = false;  // ZeRO-1, when it is needed to fit or faster
  // The run to start: the config with the strategy, cp and every memory lever applied.
  RunConfig config;
  std::string levers;  // the levers added to the config, with why ("" = none)
  std::string reason;  // one line, in the users' terms
  StrategyPlan plan;
  std::vector<std::string> runners_up;  // the next fastest plans that fit, one line each
  // With PlanOptions::framework: how much faster longctx's own best plan
  // is than this one, and what the framework lacks for it ("" = it runs
  // longctx's own best, or one within 1% of it).
  std::string framework_gap;
};

struct PlanOptions {
  int64_t devices = 0;        // total devices; 0 = dp * cp * tp from the config
  int64_t device_memory = 0;  // bytes; 0 = the profile's (or device_memory_budget if set)
  bool memory_only = false;   // plan_strategy stops after memory and fits (the search's check per rung)
  // recommend() only plans this framework runs on the profile's platform
  // (framework_refusal, src/plan/emit.h), with the gap to longctx's own best.
  std::optional<Framework> framework;
};

struct PlanReport {
  std::string hardware;
  int64_t devices = 0;
  std::vector<StrategyPlan> candidates;  // every strategy x factorization at the config's cp
  PlanRecommendation recommendation;
};

// Every strategy (and usp factorization) at the config's mesh, plus the recommendation.
PlanReport make_plan(const RunConfig& config, const HardwareProfile& hw, const PlanOptions& options);

// The prediction for exactly the strategy, ulysses degree and remat policy in `config`.
StrategyPlan plan_strategy(const RunConfig& config, const HardwareProfile& hw,
                           const PlanOptions& options);

// The elementwise kernels the step time counts, with the bytes each moves per
// element of its operand in each compute dtype (src/kernels/ops.cpp, as
// src/model/llama.cpp calls them: with dtype bfloat16 the saved activations
// and GEMM operands are bf16, gradients, GEMM outputs, RoPE's operand and
// the logits stay fp32; the optimizer: per parameter, src/train). 0 bytes: the
// kernel does not run in that dtype. `plan --measure` times these kernels in
// both dtypes and divides these bytes, so the two cannot drift.
struct ElementwiseKernel {
  KernelId id;
  const char* name() const { return kernel_name(id); }
  int64_t bytes_fp32, bytes_bf16;
  const char* what;
  int64_t bytes_per_element(DType dtype) const { return dtype == DType::bf16 ? bytes_bf16 : bytes_fp32; }
};
const std::vector<ElementwiseKernel>& elementwise_kernels();
const ElementwiseKernel& elementwise_kernel(KernelId id);  // ConfigError if it is not priced

// Communication of ONE context-parallel attention call (forward, or backward
// when `backward`) on cp rank `cp_rank`, by operation, exactly as the
// src/comm counters count it (byte formulas in src/cp/cp_attention.h).
// Assumes positions 0..S-1 laid out by the config's layout (no packing
// resets); with packed documents ring skips depend on the data.
std::vector<CommLine> attention_call_comm(const RunConfig& config, bool backward, int64_t cp_rank);

// Peak bytes per device that exactly this (validated) run allocates: the
// memory plan_strategy reports, which needs no hardware profile. `threads`:
// kernel threads per rank (per-thread attention scratch). host_offload_bytes
// (optional): the host offload pool's bytes (offload_target host), which are
// not device memory.
int64_t predicted_memory_bytes(const RunConfig& config, int64_t threads, int64_t* host_offload_bytes = nullptr);

// The longest max_target_length, a multiple of `granule`, at which exactly
// this configuration (its strategy, mesh, remat policy and memory levers)
// fits: plan_strategy's memory within the device memory (options, else
// device_memory_budget, else the profile's) and the host pool within
// host_memory_budget when set. Memory grows with the length, so a doubling
// then a bisection over multiples of the granule finds it. ConfigError when
// the granule breaks a length rule (cp, zigzag, sequence parallelism).
struct LongestLength {
  int64_t granule = 0;
  int64_t length = 0;  // 0: not even one granule fits
  StrategyPlan plan;   // at `length` (at one granule when nothing fits)
  StrategyPlan next;   // at length + granule: does not fit
};
LongestLength longest_length(const RunConfig& config, const HardwareProfile& hw, const PlanOptions& options,
                             int64_t granule);

// Bytes of the host pool a plan uses: offloaded activations (offload_target
// host) and host-resident optimizer state and parameters.
int64_t host_pool_bytes(const StrategyPlan& plan);

// The devices a plan is for: PlanOptions::devices, else the config's mesh
// (an axis at -1, fill, counts as 1).
int64_t plan_devices(const RunConfig& config, const PlanOptions& options);

// The recommended configuration: the fastest predicted plan that fits.
// The search keeps what the user set (model, batch, length, devices, a
// remat_policy, context_parallel_strategy (not auto, with its usp factor
// when set) or ici_tensor_parallelism of theirs, a pinned mesh) and tries
// every tp left open (within a node), every remat policy left open
// (lightest first), every cp (when ici_data_parallelism or
// ici_fsdp_parallelism is -1), every strategy and usp split, each with the
// fewest memory levers that make it fit, added in MaxText's order
// (planner.cpp memory_ladder): ZeRO-1, FSDP over the dp and cp ranks,
// sequence parallelism, token chunks, offload of the saved activations, the
// optimizer state, the layer inputs, the parameters (and, when the user set
// the remat policy, heavier ones last). Plans within 1% of each other are
// equally fast: the one with fewer levers wins, then the smaller cp.
PlanRecommendation recommend(const RunConfig& config, const HardwareProfile& hw,
                             const PlanOptions& options = {});

}  // namespace longctx
