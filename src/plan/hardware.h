#pragma once
// What the planner knows about a device and its interconnect. Datasheet
// profiles live in configs/hardware/<name>.yml with the source of every
// number; `cpu-local` is measured on this machine by `longctx plan --measure`.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/tensor.h"
#include "core/vocabulary.h"
#include "kernels/cpu/select.h"

namespace longctx {

// The kernel rate tables `plan --measure` takes on this machine (cpu-local),
// one set per compute dtype: the kernels run at other rates on bf16
// activations (the GEMM's operands, the attention tiles, the bytes each
// elementwise kernel moves). Empty tables fall back to the profile's scalars.
struct KernelTables {
  // GEMM efficiency by projection width: a projection [tokens, in] -> [tokens,
  // out], forward and both gradients, with its activations coming from memory
  // as they do in a training step (narrow layers stream more bytes per FLOP).
  // The planner looks it up at the harmonic mean 2 in out / (in + out).
  // Empty = matmul_efficiency everywhere.
  std::map<int64_t, double> matmul_efficiency_per_width;
  // Attention efficiency per head dim (the kernel's rate depends on it).
  // Empty = attention_efficiency for every head dim.
  std::map<int64_t, double> attention_efficiency_per_head_dim;
  // The forward pass alone (4 D FLOPs per pair), per head dim: the kernel's
  // forward and backward run at different rates, and remat repeats only the
  // forward. Empty = the same as attention_efficiency_at.
  std::map<int64_t, double> attention_forward_efficiency_per_head_dim;
  // What a partial tile costs in full ones, per mask kind and head dim (see
  // attention_block below).
  std::map<std::string, std::map<int64_t, double>> attention_partial_tile_cost;
  // bytes/s of each elementwise kernel, bytes counted as the planner counts
  // them for this dtype (elementwise_kernels() in planner.h). A kernel
  // missing from the table uses elementwise_bandwidth, and that, when 0,
  // memory_bandwidth.
  std::map<std::string, double> elementwise_bandwidth_per_kernel;
};

// The tables above at the top level are those of fp32 runs (and of every
// dtype when there is no `bf16` section); cpu-local profiles carry bf16 runs'
// own tables in `bf16` (YAML: a nested `bf16:` section with the same keys).
// Datasheet profiles have none: their efficiencies (h100 and h200: GEMM
// and attention tables measured on an H200) apply to bf16 already.
struct HardwareProfile : KernelTables {
  std::string name;
  std::string description;
  // Whose kernels a plan counts (YAML `kernels`): `cpu`, this host's (a
  // measured cpu-local profile: the attention's per-thread tile scratch), or
  // `accelerator`, a GPU's or TPU's fused kernels (the datasheet profiles:
  // tiles on chip, no scratch in device memory). A plan never asks the
  // planning host's own CPU for an accelerator's kernels.
  KernelTarget kernels = KernelTarget::cpu;
  // What the devices are (YAML `platform`: cpu, gpu or tpu): what a
  // framework's settings depend on (plan --emit, src/plan/emit.h).
  Platform platform = Platform::cpu;

  // Compute, per device. A dtype whose peak is 0 is not supported.
  double peak_flops_bf16 = 0;  // FLOP/s (dense matmul)
  double peak_flops_fp32 = 0;
  // Fractions of the peak that GEMMs and the attention kernel reach in
  // practice: 1 for a measured GEMM peak, assumptions for datasheet peaks.
  double matmul_efficiency = 1.0;
  double attention_efficiency = 0.5;
  double matmul_efficiency_at(double width) const;
  // CPU ranks: OpenMP threads per rank the numbers were measured with (the
  // attention kernel keeps per-thread scratch). 1 for accelerators.
  int64_t threads_per_device = 1;

  // Memory, per device.
  int64_t memory_bytes = 0;
  double memory_bandwidth = 0;  // bytes/s, streaming (informative; fallback below)
  // bytes/s the elementwise kernels (norms, RoPE, SwiGLU, residual adds,
  // cross-entropy, the optimizer step) move where
  // elementwise_bandwidth_per_kernel has no rate (cpu-local measures each:
  // their rates differ several-fold, e.g. a kernel bound by arithmetic rather
  // than by memory); 0 = memory_bandwidth.
  double elementwise_bandwidth = 0;
  double elementwise_bandwidth_of(const std::string& kernel) const;

  // Interconnect. Groups of at most devices_per_node devices use the fast
  // (intra-node) numbers, larger groups the inter-node ones.
  std::string topology;
  int64_t devices_per_node = 1;
  double link_bandwidth = 0;   // bytes/s per link, one direction (informative)
  int64_t links_per_device = 0;
  // 1: the devices sit on a torus (TPU ICI) and the ring's positions along
  // one of its rings: a message to the rank k positions away crosses
  // min(k, R - k) links and shares each with the other ranks' messages of
  // that step, so the planner times the ring's sends by bytes x hops. 0: a
  // switch (NVSwitch, one host), where distance costs nothing.
  int64_t torus = 0;
  double p2p_bandwidth = 0;         // bytes/s of one send + recv pair (ring step)
  double collective_bandwidth = 0;  // bytes/s per device for all-gather / reduce-scatter / all-reduce
  double all_to_all_bandwidth = 0;  // bytes/s per device for all-to-all
  double latency = 0;               // seconds per message / collective step
  double inter_node_bandwidth = 0;  // bytes/s per device across nodes (0: one node only), send + recv pairs
  double inter_node_latency = 0;
  // Collectives across nodes, bytes/s per device in the counters'
  // conventions, where measured (0: inter_node_bandwidth). Over TCP an
  // all-reduce ran at half the rate of a two-way exchange of the same bytes.
  double inter_node_all_reduce_bandwidth = 0;
  double inter_node_collective_bandwidth = 0;  // all-gather, reduce-scatter
  double inter_node_all_to_all_bandwidth = 0;

  // Offload tiers of saved activations (src/model/offload.h), bytes/s one
  // way per device: device <-> host memory, and to/from the disk the spill
  // files are on. 0 = unknown (the planner then counts no time for moves).
  double host_link_bandwidth = 0;
  double disk_bandwidth = 0;

  // attention_efficiency_per_head_dim interpolated (log head dim), clamped
  // to its ends; attention_efficiency when it is empty.
  double attention_efficiency_at(int64_t head_dim) const;
  double attention_forward_efficiency_at(int64_t head_dim) const;
  // The kernel computes whole attention_block x attention_block tiles of
  // (q, kv) pairs (cpu-local: the CPU kernel's 128): time then follows the
  // tiles it computes, not the unmasked pairs, and the efficiencies above are
  // per pair of a full tile. A partial tile (the mask cuts it) is also masked
  // element by element, at a cost that depends on the mask (a comparison for
  // causal and local, a division for chunked): it costs
  // attention_partial_tile_cost[mask kind][head dim] full tiles.
  // 0 = time follows the unmasked pairs (datasheet profiles).
  int64_t attention_block = 0;
  // Interpolated over the head dim; 1 when the kind was not measured.
  double attention_partial_tile_cost_at(const std::string& mask_kind, int64_t head_dim) const;
  // A kernel call's fixed costs per query row and per key row (a flash
  // kernel's pipeline fill and drain, the softmax finalisation and the
  // output write per query block, the dK/dV write per key block), in pairs:
  // a call of q query and k key tokens costs its work (pairs or tiles) plus
  // attention_half_rate_tokens x (q + k) / 2 pairs. On a full mask with
  // q = k = c the rate is attention_efficiency x c / (c + this): the chunk
  // at which the kernel runs at half its peak rate. The ring cuts the
  // sequence into chunks of S / ring, so each step pays it again. 0 = no
  // fall-off (cpu-local: its per-call costs are measured in the tile rates).
  double attention_half_rate_tokens = 0;

  // field name -> where its number comes from (URL, measurement, assumption).
  std::map<std::string, std::string> sources;

  double peak_flops(DType dtype) const;  // ConfigError when the dtype has no peak

  // bf16 runs' kernel tables (cpu-local), each a fraction of peak_flops_bf16
  // or bytes/s as the planner counts bf16 bytes; absent = the tables above.
  std::optional<KernelTables> bf16;
  // The profile a run in `dtype` is planned on: the tables of that dtype in
  // place of the top-level ones (and no `bf16` left), so that every lookup
  // stays the same. The planner calls it once per plan.
  HardwareProfile for_dtype(DType dtype) const;
  // Why a `dtype` plan on this profile would use rates taken in another
  // dtype: a measured profile (its tables filled) without a bf16 section,
  // written before plan --measure took bf16 tables. "" when none.
  std::string dtype_tables_warning(DType dtype) const;
};

// Loads configs/hardware/<name>.yml (name may also be a path to a .yml file).
// `search_dir` defaults to the configs/hardware directory of the source tree.
HardwareProfile load_hardware_profile(const std::string& name_or_path,
                                      const std::string& search_dir = "");
void save_hardware_profile(const HardwareProfile& profile, const std::string& path);
// The configs/hardware directory this build was configured from.
std::string default_hardware_dir();
// A path of the repository (e.g. "scripts/plot_eval.py"): under the current
// directory, else under the executable's directory or one above it;
// `relative` itself when none exists.
std::string find_in_repository(const std::string& relative);

}  // namespace longctx
