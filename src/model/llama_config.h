#pragma once
// The model shape, shared by the model, the config loader and the planner.
// Key names follow MaxText's configs (base_emb_dim, base_num_query_heads, ...).
#include <cstdint>
#include <string>

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

  // Parameter count (for 6 * N * tokens FLOPs and the planner).
  int64_t num_parameters() const {
    int64_t attn = d_model * num_heads * head_dim * 2 + d_model * num_kv_heads * head_dim * 2;
    int64_t mlp = 3 * d_model * mlp_dim;
    int64_t layer = attn + mlp + 2 * d_model;
    int64_t embed = vocab_size * d_model;
    return embed + num_layers * layer + d_model + (tie_embeddings ? 0 : embed);
  }
};

}  // namespace longctx
