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
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "cp/cp_attention.h"
#include "kernels/attention.h"
#include "model/llama_config.h"

namespace longctx {

class Mesh;  // src/comm/mesh.h

// What each decoder layer keeps from forward for backward; the rest is
// recomputed (MaxText's remat_policy names).
//   none          save everything below (fastest, most memory)
//   minimal       save the matmul outputs: qkv_proj, out_proj, mlpwi, mlpwo
//   save_context  save the attention output and its LSE only
//   full          save nothing but the layer input (least memory)
//   custom        the per-tensor choice in ModelOptions::custom_save
enum class RematPolicy { none, minimal, save_context, full, custom };
RematPolicy parse_remat_policy(const std::string& name);  // ConfigError on unknown names
const char* remat_policy_name(RematPolicy p);

// Index into ModelOptions::custom_save (and the names MaxText uses).
enum class SavePoint { decoder_layer_input, qkv_proj, context, out_proj, mlpwi, mlpwo };
constexpr int kNumSavePoints = 6;
const char* save_point_name(SavePoint p);

struct ModelOptions {
  RematPolicy remat = RematPolicy::full;
  // true = save, false = recompute; used only when remat == custom.
  // decoder_layer_input must be true (the layer input is the recompute
  // boundary). mlpwo is accepted for MaxText compatibility but changes
  // nothing here: the MLP output only feeds the next layer's input, which is
  // always kept.
  std::array<bool, kNumSavePoints> custom_save{true, false, false, false, false, false};
  // Attention mask over global positions (causal, sliding window, chunked).
  // When a Batch carries segment ids, same_segment is AND-ed in.
  MaskSpec mask = MaskSpec::causal();
  CpStrategy cp_strategy = CpStrategy::all_gather;
  CpOptions cp_options;
  // nullptr: one rank (no cp, no tp). Must outlive the model.
  const Mesh* mesh = nullptr;
  KernelImpl impl = KernelImpl::fast;  // attention kernel: fast or float64 reference
  // Rows of logits computed at once by the loss; 0 = automatic (a chunk of
  // rows x vocab stays under 64 MiB). Full-sequence logits never exist.
  int64_t loss_chunk_rows = 0;
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
  double tp_comm = 0.0;      // tensor-parallel all-reduces
  double total() const { return matmul + attention + loss + elementwise + tp_comm; }
};

// How a full tensor is cut over the tp ranks.
enum class TpSplit {
  none,  // replicated: every tp rank holds the full tensor
  dim0,  // rows (output features): column-parallel layers
  dim1,  // columns (input features): row-parallel layers
};

// A parameter (or its gradient): this rank's shard as a contiguous view into
// the model's flat buffer, with what a checkpoint needs to gather/scatter it.
struct NamedTensor {
  std::string name;              // Hugging Face name, e.g. model.layers.0.self_attn.q_proj.weight
  TensorView local;              // this rank's shard, contiguous, [rows, cols] or [n]
  std::array<int64_t, 2> full_shape{};  // unsharded shape (rank from local.rank)
  TpSplit split = TpSplit::none;
  int64_t split_offset = 0;      // first row (dim0) or column (dim1) of the shard in the full tensor
};

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

  // Same order and names in both; views into flat_parameters()/flat_gradients().
  const std::vector<NamedTensor>& parameters() const { return params_; }
  const std::vector<NamedTensor>& gradients() const { return grads_; }
  // Every local parameter / gradient in one contiguous fp32 array, for the
  // optimizer and a single gradient all-reduce.
  std::span<float> flat_parameters() const;
  std::span<float> flat_gradients() const;

  // Deterministic and independent of the mesh: element i of each FULL tensor
  // is a function of (seed, name, i) only. Linear weights ~ N(0, 0.02), norm
  // weights = 1.
  void init(uint64_t seed);
  void zero_gradients();

  // Forward and backward over the batch; gradients of grad_scale * loss_sum
  // are ACCUMULATED into gradients(). Returns this rank's loss sums.
  LossStats forward_backward(const Batch& batch, float grad_scale = 1.0f);
  // Loss only (evaluation); no gradients, no saved activations.
  LossStats forward(const Batch& batch);

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
