#include "core/model_shape.h"

#include "core/checked.h"

namespace longctx {

std::array<int64_t, 2> ParameterSpec::local_shape(int64_t tp) const {
  return {split == TpSplit::dim0 ? rows / tp : rows, split == TpSplit::dim1 ? cols / tp : cols};
}

int64_t ParameterSpec::local_elements(int64_t tp) const {
  const auto [r, c] = local_shape(tp);
  return checked_mul(r, c == 0 ? 1 : c, "the elements of parameter '" + name + "' (rows * cols)");
}

std::vector<ParameterSpec> parameter_table(const LlamaConfig& c) {
  const int64_t H = c.num_heads, G = c.num_kv_heads, D = c.head_dim, F = c.mlp_dim, d = c.d_model;
  std::vector<ParameterSpec> specs;
  specs.push_back({"model.embed_tokens.weight", c.vocab_size, d, TpSplit::none});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", d, 0, TpSplit::none});
    specs.push_back({p + "self_attn.q_proj.weight", H * D, d, TpSplit::dim0});
    specs.push_back({p + "self_attn.k_proj.weight", G * D, d, TpSplit::dim0});
    specs.push_back({p + "self_attn.v_proj.weight", G * D, d, TpSplit::dim0});
    specs.push_back({p + "self_attn.o_proj.weight", d, H * D, TpSplit::dim1});
    specs.push_back({p + "post_attention_layernorm.weight", d, 0, TpSplit::none});
    specs.push_back({p + "mlp.gate_proj.weight", F, d, TpSplit::dim0});
    specs.push_back({p + "mlp.up_proj.weight", F, d, TpSplit::dim0});
    specs.push_back({p + "mlp.down_proj.weight", d, F, TpSplit::dim1});
  }
  specs.push_back({"model.norm.weight", d, 0, TpSplit::none});
  if (!c.tie_embeddings) specs.push_back({"lm_head.weight", c.vocab_size, d, TpSplit::none});
  return specs;
}

int64_t parameters_per_tp_rank(const LlamaConfig& c, int64_t tp) {
  // Layers are alike: count the table without layers and one layer, then
  // multiply (base_num_decoder_layers comes from the config: 10^15 layers is
  // an overflow error, not a 10^15-entry table). Every sum and product checked.
  auto count = [&](int64_t layers) {
    LlamaConfig one = c;
    one.num_layers = layers;
    int64_t n = 0;
    for (const ParameterSpec& s : parameter_table(one)) n = checked_add(n, s.local_elements(tp), "the parameter count");
    return n;
  };
  const int64_t outer = count(0), layer = count(1) - outer;
  return checked_add(outer, checked_mul(layer, c.num_layers, "the parameter count (per layer * base_num_decoder_layers)"),
                     "the parameter count");
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::vector<ParameterUnit> parameter_units(const LlamaConfig& c, int64_t tp, int64_t shards) {
  // Layers are alike: the table of a one-layer model sizes the embedding's,
  // a layer's and the head's units (no table of every layer's names).
  LlamaConfig one = c;
  one.num_layers = 1;
  const std::vector<ParameterSpec> specs = parameter_table(one);
  constexpr int kPerLayer = 9;  // parameter_table: norm, q, k, v, o, norm, gate, up, down
  auto elements = [&](int first, int count) {
    int64_t n = 0;
    for (int i = first; i < first + count; ++i) n += specs[static_cast<size_t>(i)].local_elements(tp);
    return n;
  };
  const int head_params = c.tie_embeddings ? 1 : 2;
  const int64_t embed = elements(0, 1), layer = elements(1, kPerLayer), head = elements(1 + kPerLayer, head_params);
  std::vector<ParameterUnit> units;
  auto add = [&](int first, int count, int64_t n) {
    ParameterUnit u;
    u.first_param = first;
    u.num_params = count;
    u.begin = units.empty() ? 0 : units.back().begin + units.back().elements;
    u.elements = n;
    u.block = ceil_div(n, shards);
    u.shard_begin = units.empty() ? 0 : units.back().shard_begin + units.back().block;
    units.push_back(u);
  };
  add(0, 1, embed);
  for (int64_t l = 0; l < c.num_layers; ++l) add(1 + static_cast<int>(l) * kPerLayer, kPerLayer, layer);
  add(1 + static_cast<int>(c.num_layers) * kPerLayer, head_params, head);
  return units;
}

int64_t parameter_shard_elements(const LlamaConfig& c, int64_t tp, int64_t shards) {
  LlamaConfig one = c;
  one.num_layers = 1;
  const std::vector<ParameterUnit> u = parameter_units(one, tp, shards);
  return checked_add(u[0].block + u[2].block, checked_mul(u[1].block, c.num_layers, "the shard's layer elements"),
                     "the shard's elements");
}

int64_t LlamaConfig::num_parameters() const { return parameters_per_tp_rank(*this, 1); }

}  // namespace longctx
