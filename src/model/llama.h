#pragma once
// The Llama 3 decoder: parameters (tensor-parallel shards with Hugging Face
// names), forward, backward with rematerialisation policies, and a chunked
// cross-entropy loss. The trainer (src/train) codes against this header only.
//
// One step for a rank:
//   model.zero_gradients();
//   LossStats s = model.forward_backward(batch, 1.0f / global_tokens);
//   all-reduce flat_gradients() over the ranks that hold the same shard
//   (dp x cp, NOT tp: TP reductions happen inside the model), clip, AdamW.
//
// Layer math (x is the residual stream [N, d_model], N = B * S_local):
//   h1 = rmsnorm(x) ; qkv = h1 Wqkv^T ; rope(q, k) ; ctx = attention(q, k, v)
//   x2 = x + ctx Wo^T ; h2 = rmsnorm(x2) ; gu = h2 Wgu^T ; y = x2 + swiglu(gu) Wdown^T
// Tensor parallelism is Megatron's: q/k/v/gate/up split by output rows
// (column-parallel), o/down split by input columns (row-parallel, outputs
// all-reduced over tp); heads and KV heads are split over tp.
// With sequence_parallel (Megatron's sequence parallelism) tp rank r keeps
// only rows [r N/tp, (r+1) N/tp) of the residual stream, the norms and their
// gradients: the normed input is all-gathered over tp before the
// column-parallel GEMMs (q/k/v, gate/up) and the row-parallel outputs (o,
// down) are reduce-scattered instead of all-reduced; backward mirrors it.
// Gradients of the tp-replicated parameters (norms, embedding, LM head) are
// then partial sums over the tp ranks' rows and are all-reduced over tp.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "cp/cp_attention.h"
#include "kernels/attention/attention.h"
#include "core/model_shape.h"
#include "model/sharded_parameters.h"

namespace longctx {

class Mesh;  // src/comm/mesh.h

struct ModelOptions {
  RematPolicy remat = RematPolicy::full;
  // Used only when remat == custom (core/vocabulary.h).
  CustomSave custom_save = kDefaultCustomSave;
  // Used only when remat == custom: the saved tensors kept off the device
  // between forward and backward, and where (src/model/offload.h).
  CustomOffload custom_offload{};
  OffloadTarget offload_target = OffloadTarget::host;
  std::string offload_dir;  // disk spill files
  // Attention mask over global positions (causal, sliding window, chunked).
  // When a Batch carries segment ids, same_segment is AND-ed in.
  MaskSpec mask = MaskSpec::causal();
  CpStrategy cp_strategy{};
  CpOptions cp_options;
  // Must outlive the model; nullptr: the model uses Mesh::single() (one rank).
  const Mesh* mesh = nullptr;
  KernelImpl impl = KernelImpl::fast;  // attention kernel: fast or float64 reference
  // Activations and matmul inputs (config `dtype`). bf16: every GEMM reads
  // bf16 operands (a bf16 copy of the weights, made at each forward from the
  // fp32 masters) and accumulates in fp32; which tensors stay fp32 and why is
  // in activation_table() and the README's "Precision". f32: all fp32.
  DType dtype = DType::f32;
  // Rows of logits computed at once by the loss; 0 = automatic (a chunk of
  // rows x vocab stays under 64 MiB). Full-sequence logits never exist.
  int64_t loss_chunk_rows = 0;
  // Megatron's sequence parallelism over tp (config tensor_sequence_parallelism):
  // needs tp > 1 and B * S_local divisible by tp.
  bool sequence_parallel = false;
  // Tokens whose norms, projections, SwiGLU and residual adds (and their
  // gradients) a layer computes at once (config layer_token_chunk); 0 = all
  // the local tokens. Only the attention's operands and outputs (q, k, v,
  // context and their gradients), the layer inputs and dL/dx then scale with
  // the sequence. With sequence_parallel a chunk is layer_token_chunk / tp
  // rows of each tp rank, gathered into layer_token_chunk GEMM rows.
  int64_t layer_token_chunk = 0;
  // parameter_memory_host_offload: the FSDP parameter shard in the host pool
  // or on disk (spill files in offload_dir).
  StateTier parameter_tier = StateTier::device;
};

// One micro-batch of this rank's tokens. All arrays are [B, S_local],
// row-major, and must stay valid during the call.
struct Batch {
  int64_t batch = 0;
  int64_t seq_local = 0;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  const int64_t* positions = nullptr;    // GLOBAL positions (RoPE, masks)
  const int32_t* segments = nullptr;     // document ids, or nullptr (no document mask)
  const float* loss_weights = nullptr;   // per-token loss weight (0 = padding), or nullptr (all 1)
};

// Local (this rank's) sums; the trainer reduces them over dp x cp.
struct LossStats {
  double loss_sum = 0.0;    // sum of weight * cross-entropy (nats)
  double weight_sum = 0.0;  // sum of weights (tokens counted)
};

// Where the last forward/backward spent its wall-clock seconds (recomputation
// included), for benchmarks and profiling.
struct StepProfile {
  double matmul = 0.0;       // q/k/v, o, gate/up, down projections and their gradients
  double attention = 0.0;    // the CP attention (kernel and its communication)
  double loss = 0.0;         // final norm, LM head, cross-entropy and their gradients
  double elementwise = 0.0;  // embedding, norms, RoPE, SwiGLU, residual adds
  double tp_comm = 0.0;      // tensor-parallel all-reduces (all-gathers, reduce-scatters)
  double total() const { return matmul + attention + loss + elementwise + tp_comm; }
};

// A parameter (or its gradient): this tp rank's shard, with what a checkpoint
// needs to gather/scatter it. `local` is a view into the model's flat buffer
// when the parameters are not FSDP-sharded (shards() == 1); sharded, its data
// is null (the shape stays) and the values are reached through unshard().
struct NamedTensor {
  std::string name;              // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  TensorView local;              // this rank's shard, contiguous, [rows, cols] or [n]
  std::array<int64_t, 2> full_shape{};  // unsharded shape (rank from local.rank)
  TpSplit split = TpSplit::none;
  int64_t split_offset = 0;      // first row (dim0) or column (dim1) of the shard in the full tensor
  int64_t offset = 0;            // where `local` starts in the tp rank's flat vector
};

// The activation buffers one forward/backward allocates for `tokens` local
// tokens (B * S_local) of this tp rank: what the remat policy trades against
// compute. The model allocates exactly these (each `copies` times, one per
// layer when saved, a few staging slots when offloaded: src/model/offload.h);
// the planner counts them as a counted step allocates them
// (src/plan/step_count.h). With sequence parallelism the rows
// marked N_r are N / tp (this rank's tokens), else N. With
// layer_token_chunk the buffers of the layer's token-wise parts hold one
// chunk's rows (per_chunk) unless the policy saves them.
enum class Activation {
  x,            // residual stream, one per layer + 1       [N_r, d]
  qkv,          // q, k (after RoPE), v                      [N, (H+2G) D / tp]
  context,      // attention output                          [N, H D / tp]
  context_lse,  // its log-sum-exp                           [N, H / tp]
  out_proj,     // residual after attention                  [N_r, d]
  mlpwi,        // gate | up                                 [N, 2 F / tp]
  normed,       // rmsnorm output, h1 or h2                  [N_r, d]
  mlp_act,      // SwiGLU output, then its gradient          [N, F / tp]
  rope_cos, rope_sin,                                     // [N, D / 2]
  d_resid, d_normed, d_context, d_qkv,                    // backward only; d_resid, d_normed [N_r, d];
                                                          // d_context (dO) in the compute dtype
  loss_hidden, loss_d_hidden, loss_logits,                // one chunk of rows (of N_r)
  // Sequence parallelism only: transients of the tp collectives.
  normed_gathered,  // normed of all N rows, the column-parallel GEMMs' operand   [N, d]
  tp_partial,       // fp32 [N, d] partial sums over tp before their reduce-scatter,
                    // and the all-gathered residual gradient
  // bf16 only: fp32 GEMM outputs before they are rounded (or reduced over
  // tp), and bf16 copies of fp32 gradients that feed GEMMs.
  matmul_out,      // [N, max(qkv, 2 F / tp, d)] fp32
  grad_operand,    // [N, max(qkv, d)] bf16: dL/dx, then dL/dqkv
  loss_d_logits,   // one chunk of rows x vocab, bf16
};
constexpr int kNumActivations = 22;
struct ActivationBuffer {
  const char* name;
  int64_t elements = 0;  // elements of one copy (0: not allocated)
  int64_t copies = 1;
  DType dtype = DType::f32;
  bool per_chunk = false;  // rows of one chunk of tokens (ModelOptions::layer_token_chunk), not all
  int64_t bytes() const { return elements * static_cast<int64_t>(dtype_size(dtype)); }
};
// loss_chunk_rows: ModelOptions::loss_chunk_rows (0 = automatic).
// dtype: ModelOptions::dtype. sequence_parallel: ModelOptions::sequence_parallel.
// layer_token_chunk: ModelOptions::layer_token_chunk.
std::array<ActivationBuffer, kNumActivations> activation_table(const LlamaConfig& config, int64_t tp,
                                                               const SaveSet& save, int64_t tokens,
                                                               bool training, int64_t loss_chunk_rows = 0,
                                                               DType dtype = DType::f32,
                                                               bool sequence_parallel = false,
                                                               int64_t layer_token_chunk = 0);

class LlamaModel {
 public:
  // Allocates parameters and gradients (tracked), checks the config against
  // the mesh (heads, KV heads and mlp_dim divisible by tp; ConfigError), and
  // calls init(seed).
  LlamaModel(const LlamaConfig& config, const ModelOptions& options, uint64_t seed = 0);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }

  // Same order and names in both (parameter_table order); views into
  // flat_parameters()/flat_gradients() when shards() == 1.
  const std::vector<NamedTensor>& parameters() const { return params_; }
  const std::vector<NamedTensor>& gradients() const { return grads_; }
  // This rank's parameters / gradients in one contiguous fp32 array, for the
  // optimizer and a single gradient all-reduce: the tp rank's flat vector,
  // or with FSDP its shard (model/sharded_parameters.h; padding included).
  // flat_parameters() is for parameters resident on the device or host
  // (state_offload_target disk has none: Error); parameter_store() for any.
  std::span<float> flat_parameters() const;
  StateStore& parameter_store() const;
  std::span<float> flat_gradients() const;
  // Ranks the parameters are sharded over (Mesh::shards(); 1 = not sharded).
  int64_t shards() const;
  int64_t tp() const;  // the tensor-parallel degree of the mesh
  // Where each parameter lies in flat_parameters().
  std::vector<ShardSegment> shard_segments() const;
  // A vector in flat_parameters()' layout (parameters, gradients, moments)
  // as the tp rank's full flat vector (NamedTensor::offset), collective over
  // the shard group; and back (local).
  std::vector<float> unshard(std::span<const float> shard) const;
  void reshard(std::span<const float> flat, std::span<float> shard) const;
  // The tp rank's full flat parameter vector into this rank's parameter store.
  void load_flat_parameters(std::span<const float> flat);

  // Deterministic and independent of the mesh: element i of each FULL tensor
  // is a function of (seed, name, i) only. Linear weights ~ N(0, 0.02), norm
  // weights = 1.
  void init(uint64_t seed);
  void zero_gradients();

  // Forward and backward over the batch; gradients of grad_scale * loss_sum
  // are ACCUMULATED into gradients(). Returns this rank's loss sums.
  LossStats forward_backward(const Batch& batch, float grad_scale = 1.0f);
  // Loss only (evaluation); no gradients, no saved activations.
  // token_losses (optional, [B * S_local] like the batch): each token's
  // weighted cross-entropy, for losses by position (train/eval.h).
  LossStats forward(const Batch& batch, double* token_losses = nullptr);

  // Bytes of activation buffers (saved tensors + scratch) the last
  // forward/backward needed: what the remat policy trades against compute.
  size_t peak_activation_bytes() const;
  const StepProfile& last_step_profile() const;

  struct Impl;  // defined in llama.cpp

 private:
  LlamaConfig config_;
  ModelOptions options_;
  std::vector<NamedTensor> params_, grads_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace longctx
