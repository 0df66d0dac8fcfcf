#include "plan/emit.h"

#include <sstream>
#include <vector>

#include "core/cp_strategy.h"
#include "core/error.h"

namespace longctx {

EmitFormat parse_emit_format(const std::string& name) {
  if (name == "maxtext") return EmitFormat::maxtext;
  if (name == "megatron") return EmitFormat::megatron;
  throw ConfigError("plan --emit: '" + name + "' is not a format (maxtext|megatron)");
}

namespace {

// What every framework lacks the same way: the notes both emitters add.
std::vector<std::string> common_gaps(const RunConfig& c, const char* framework) {
  const std::string f = framework;
  const CpStrategyInfo& s = cp_strategy_info(c.strategy());
  const int64_t a2a = s.ulysses_degree(c.cp, c.cp_ulysses), kv_heads = c.model.num_kv_heads / c.tp;
  std::vector<std::string> out;
  if (a2a > kv_heads)
    out.push_back("the all-to-all degree " + std::to_string(a2a) + " exceeds the " + std::to_string(kv_heads) +
                  " KV heads per tp rank: longctx replicates KV heads across the extra ranks; " + f +
                  "'s all-to-all splits heads and needs them divisible by the degree");
  if (s.ring_steps(c.cp, c.cp_ulysses) && (c.attention_type == MaskKind::local || c.attention_type == MaskKind::chunked))
    out.push_back("longctx's ring sends only the K,V chunks the " + std::string(name_of(c.attention_type)) +
                  " mask reaches (sparse ring); " + f + "'s ring exchanges every chunk: its step is slower than predicted");
  if (c.layer_token_chunk > 0)
    out.push_back("layer_token_chunk=" + std::to_string(c.layer_token_chunk) + " (norms, projections and SwiGLU in "
                  "token chunks) has no " + f + " setting: its activation peak is higher than predicted");
  if (c.offload_target == OffloadTarget::disk && c.save_set().offload != SaveSet{}.offload)
    out.push_back("offload_target=disk: " + f + " offloads activations to host memory only");
  if (c.state_offload_target == OffloadTarget::disk &&
      (c.optimizer_memory_host_offload || c.parameter_memory_host_offload))
    out.push_back("state_offload_target=disk: " + f + " offloads optimizer state and parameters to host memory only");
  return out;
}

const char* maxtext_attention_type(MaskKind k) {
  switch (k) {
    case MaskKind::full: return "full";
    case MaskKind::causal: return "global";
    case MaskKind::local: return "local_sliding";
    case MaskKind::chunked: return "chunk";
  }
  return "global";
}

std::string maxtext(const RunConfig& c) {
  std::ostringstream o;
  const SaveSet save = c.save_set();
  auto q = [](const std::string& v) { return "'" + v + "'"; };
  o << "# MaxText settings (keys of src/maxtext/configs/base.yml)\n";
  o << "ici_data_parallelism: " << c.dp << "\n";
  o << "ici_fsdp_parallelism: " << c.fsdp << "\n";
  o << "ici_context_parallelism: " << c.cp << "\n";
  o << "ici_context_usp_ulysses_parallelism: " << c.cp_ulysses << "\n";
  o << "ici_tensor_parallelism: " << c.tp << "\n";
  o << "context_parallel_strategy: " << q(name_of(c.strategy())) << "\n";
  o << "context_parallel_load_balance: " << (c.cp_load_balance ? "true" : "false") << "\n";
  o << "max_target_length: " << c.max_target_length << "\n";
  o << "per_device_batch_size: " << c.per_device_batch_size << "\n";
  o << "dtype: " << q(name_of(c.dtype)) << "\n";
  o << "weight_dtype: 'float32'\n";
  o << "attention_type: " << q(maxtext_attention_type(c.attention_type)) << "\n";
  if (c.attention_type == MaskKind::local) o << "sliding_window_size: " << c.sliding_window_size << "\n";
  if (c.attention_type == MaskKind::chunked) o << "chunk_attn_window_size: " << c.chunk_attn_window_size << "\n";
  if (c.remat_policy == RematPolicy::full) {
    o << "remat_policy: 'full'\n";
  } else {
    // MaxText's custom policy names the same tensors: exactly what this policy saves or offloads.
    o << "remat_policy: 'custom'  # longctx's " << name_of(c.remat_policy) << "\n";
    auto choice = [&](bool saved, SavePoint p) {
      return q(!saved ? "remat" : save.offload[static_cast<int>(p)] ? "offload" : "device");
    };
    o << "decoder_layer_input: " << choice(true, SavePoint::decoder_layer_input) << "\n";
    o << "qkv_proj: " << choice(save.qkv, SavePoint::qkv_proj) << "\n";
    o << "context: " << choice(save.context, SavePoint::context) << "\n";
    o << "out_proj: " << choice(save.out_proj, SavePoint::out_proj) << "\n";
    o << "mlpwi: " << choice(save.mlpwi, SavePoint::mlpwi) << "\n";
    o << "mlpwo: 'remat'\n";
  }
  o << "optimizer_memory_host_offload: " << (c.optimizer_memory_host_offload ? "true" : "false") << "\n";
  o << "parameter_memory_host_offload: " << (c.parameter_memory_host_offload ? "true" : "false") << "\n";
  o << "shard_optimizer_over_data: " << (c.shard_optimizer_over_data ? "true" : "false") << "\n";
  std::vector<std::string> gaps = common_gaps(c, "MaxText");
  if (c.tp_sequence_parallel)
    gaps.push_back("tensor_sequence_parallelism (the residual stream split over the tp ranks): MaxText's "
                   "ici_tensor_sequence_parallelism is a mesh axis of its own, not this; left at 1");
  if (c.fsdp_over_context)
    gaps.push_back("fsdp_over_context (parameters sharded over fsdp x cp): MaxText shards them over its fsdp axes "
                   "only; set ici_fsdp_parallelism to cover the cp ranks instead");
  for (const std::string& g : gaps) o << "# not expressible: " << g << "\n";
  return o.str();
}

std::string megatron(const RunConfig& c, int64_t devices) {
  std::ostringstream o;
  const CpStrategyInfo& s = cp_strategy_info(c.strategy());
  const SaveSet save = c.save_set();
  const int64_t data_ranks = devices / (c.cp * c.tp), L = c.model.num_layers;
  std::vector<std::string> gaps = common_gaps(c, "Megatron-Core");
  o << "# Megatron-Core flags (pretrain_gpt.py; megatron/training/arguments.py and the dataclasses it\n"
    << "# generates flags from); data parallel size = devices / (tp x cp) = " << data_ranks << "\n";
  o << "--tensor-model-parallel-size " << c.tp << "\n";
  if (c.tp_sequence_parallel) o << "--sequence-parallel\n";
  o << "--context-parallel-size " << c.cp << "\n";
  if (c.cp > 1) {
    const int64_t a2a = s.ulysses_degree(c.cp, c.cp_ulysses);
    if (s.gathers_kv) o << "--cp-comm-type allgather\n";
    else if (s.takes_usp_factor)
      o << "--cp-comm-type a2a+p2p\n--hierarchical-context-parallel-sizes " << a2a << " " << c.cp / a2a << "\n";
    else if (a2a == c.cp) o << "--cp-comm-type a2a\n";
    else o << "--cp-comm-type p2p\n";
    if (!c.cp_load_balance)
      gaps.push_back("context_parallel_load_balance=false (contiguous shards): Megatron-Core always splits the "
                     "sequence into 2 x cp chunks, zigzag");
  }
  o << "--seq-length " << c.max_target_length << "\n--max-position-embeddings " << c.max_target_length << "\n";
  o << "--micro-batch-size " << c.per_device_batch_size << "\n";
  o << "--global-batch-size " << c.per_device_batch_size * data_ranks << "\n";
  if (c.dtype == DType::bf16) o << "--bf16\n";
  if (c.shard_optimizer_over_data) o << "--use-distributed-optimizer\n";
  if (c.fsdp > 1 || c.fsdp_over_context) {
    o << "--use-megatron-fsdp\n--data-parallel-sharding-strategy optim_grads_params\n";
    if (c.dp > 1)
      gaps.push_back("dp=" + std::to_string(c.dp) + " x fsdp=" + std::to_string(c.fsdp) + " (replicas of FSDP "
                     "shards): Megatron-FSDP shards over every data-parallel rank unless its hybrid mode is set up");
  }
  if (c.remat_policy == RematPolicy::full) {
    o << "--recompute-granularity full\n--recompute-method uniform\n--recompute-num-layers 1\n";
  } else if (!save.qkv || !save.context || !save.out_proj || !save.mlpwi) {
    // Megatron recomputes by module; longctx by named tensor: the modules whose outputs this policy drops.
    std::string modules = !save.context ? "core_attn" : "";
    if (!save.mlpwi) modules += std::string(modules.empty() ? "" : " ") + "mlp";
    if (!modules.empty()) o << "--recompute-granularity selective\n--recompute-modules " << modules << "\n";
    if (!save.qkv || !save.out_proj)
      gaps.push_back(std::string("longctx's ") + name_of(c.remat_policy) + " recomputes the " +
                     (!save.qkv ? "q,k,v projections" : "attention output projection") +
                     "; Megatron-Core's selective recompute has no module for it (it saves them)");
  }
  if (save.offload != SaveSet{}.offload) {
    o << "--cpu-offloading\n--cpu-offloading-num-layers " << L - 1 << "\n--cpu-offloading-activations\n";
    gaps.push_back("longctx offloads the named tensors the policy marks `offload`; Megatron-Core offloads each "
                   "layer's activations whole");
  }
  if (c.optimizer_memory_host_offload) o << "--optimizer-cpu-offload\n";
  if (c.parameter_memory_host_offload) {
    o << "--cpu-offloading-weights\n";
    gaps.push_back("parameter_memory_host_offload (FSDP shards in host memory, gathered per unit): Megatron-Core's "
                   "--cpu-offloading-weights offloads per layer");
  }
  for (const std::string& g : gaps) o << "# not expressible: " << g << "\n";
  return o.str();
}

}  // namespace

std::string emit_settings(const RunConfig& config, int64_t devices, EmitFormat format) {
  RunConfig c = config;  // an axis at -1 takes the devices the others leave
  const MeshShape mesh = c.mesh_shape(devices);
  c.dp = mesh.dp, c.fsdp = mesh.fsdp;
  return format == EmitFormat::maxtext ? maxtext(c) : megatron(c, devices);
}

}  // namespace longctx
