#pragma once
// The model shape and its parameter table, shared by the model (which
// allocates from the table), the config checks and the planner. Key names
// follow MaxText's configs (base_emb_dim, base_num_query_heads, ...).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace longctx {

struct LlamaConfig {
  int64_t vocab_size = 259;         // vocab_size (byte-level: 256 bytes + BOS, EOS, PAD)
  int64_t d_model = 256;            // base_emb_dim
  int64_t num_heads = 4;            // base_num_query_heads
  int64_t num_kv_heads = 2;         // base_num_kv_heads
  int64_t head_dim = 64;            // head_dim
  int64_t mlp_dim = 768;            // base_mlp_dim
  int64_t num_layers = 2;           // base_num_decoder_layers
  double rope_theta = 500000.0;     // rope_max_timescale
  bool rope_llama3_scaling = false; // rope_use_scaling (Llama 3.1 frequency scaling)
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  double norm_eps = 1e-5;           // normalization_layer_epsilon
  bool tie_embeddings = false;      // logits_via_embedding

  // Every parameter, unsharded (for 6 * N * tokens FLOPs).
  int64_t num_parameters() const;
};

// How a full tensor is cut over the tp ranks (Megatron).
enum class TpSplit {
  none,  // replicated: every tp rank holds the full tensor
  dim0,  // rows (output features): column-parallel layers
  dim1,  // columns (input features): row-parallel layers
};

// One parameter tensor: Hugging Face name, full shape ([rows] when cols == 0).
struct ParameterSpec {
  std::string name;
  int64_t rows = 0, cols = 0;
  TpSplit split = TpSplit::none;
  // This tp rank's shard: [rows / tp, cols] (dim0) or [rows, cols / tp] (dim1).
  std::array<int64_t, 2> local_shape(int64_t tp) const;
  int64_t local_elements(int64_t tp) const;
};

// The parameter table in Hugging Face order: the embedding, per layer the
// attention norm, q, k, v (adjacent: one fused GEMM), o, the MLP norm, gate
// and up (adjacent), down; the final norm; the LM head unless tied.
std::vector<ParameterSpec> parameter_table(const LlamaConfig& config);

// Parameters one tp rank holds: the length of the model's flat vector.
int64_t parameters_per_tp_rank(const LlamaConfig& config, int64_t tp);

// FSDP's units: what is gathered at once. The tp rank's flat vector (table
// order) is cut into the embedding, each layer, and the head (the final norm,
// plus the LM head unless tied). Over a shard group of R ranks each unit is
// cut into R blocks of ceil(elements / R) (the last one zero-padded), and
// rank r keeps block r of every unit, in unit order: its shard. R = 1 gives
// the flat vector itself (block = elements).
struct ParameterUnit {
  int first_param = 0, num_params = 0;  // in parameter_table order
  int64_t begin = 0, elements = 0;      // in the tp rank's flat vector
  int64_t block = 0;                    // ceil(elements / R): one rank's part
  int64_t shard_begin = 0;              // where this rank's block starts in its shard
};
std::vector<ParameterUnit> parameter_units(const LlamaConfig& config, int64_t tp, int64_t shards);
// Elements of one rank's shard: the sum of the units' blocks (without
// enumerating the layers, like parameters_per_tp_rank).
int64_t parameter_shard_elements(const LlamaConfig& config, int64_t tp, int64_t shards);

}  // namespace longctx
