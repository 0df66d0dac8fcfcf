#include "plan/emit.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/cp_strategy.h"
#include "core/error.h"

namespace longctx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// A number as YAML (PyYAML: a float needs a dot) and argparse read it back
// exactly: integers as integers, else the shortest decimal that round-trips.
std::string decimal(double v) {
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    return buf;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::stod(buf) == v) break;
  }
  std::string out = buf;
  if (out.find('.') == std::string::npos && out.find('e') != std::string::npos) out.insert(out.find('e'), ".0");
  return out;
}

struct Mesh {
  int64_t a2a;      // the all-to-all (head split) degree
  int64_t ring;     // cp / a2a: the ranks K,V circulate over (or are gathered from)
  int64_t slices;   // dp x fsdp: the data-parallel slices a global batch is split over
};
Mesh mesh_of(const RunConfig& c, int64_t devices) {
  const CpStrategyInfo& s = cp_strategy_info(c.strategy());
  const int64_t a2a = s.ulysses_degree(c.cp, c.cp_ulysses);
  return {a2a, c.cp / a2a, devices / (c.cp * c.tp)};
}

bool offloads_activations(const RunConfig& c) { return c.save_set().offload != SaveSet{}.offload; }

// ---- what each framework refuses ----------------------------------------------------

// Levers no framework has: every one changes what a device holds, so a plan
// with it would not fit as predicted.
void common_refusals(const RunConfig& c, const char* f, std::vector<std::string>& out) {
  if (c.layer_token_chunk > 0)
    out.push_back(std::string(f) + " has no token-chunked layers (layer_token_chunk=" + str(c.layer_token_chunk) + ")");
  if (c.offload_target == OffloadTarget::disk && offloads_activations(c))
    out.push_back(std::string(f) + " offloads activations to host memory only (offload_target=disk)");
  if (c.state_offload_target == OffloadTarget::disk &&
      (c.optimizer_memory_host_offload || c.parameter_memory_host_offload))
    out.push_back(std::string(f) + " offloads optimizer state and parameters to host memory only "
                  "(state_offload_target=disk)");
}

// MaxText 0.2.5, src/maxtext/configs/types.py (the context-parallel checks of
// MaxTextConfig: ring needs a GPU or TPU and, on TPU, Tokamax's splash kernel
// with global attention, length % cp^2 == 0 and an even cp when load-balanced;
// ulysses and usp are TPU-only, global attention only, the all-to-all degree
// dividing the query and KV heads).
std::vector<std::string> maxtext_refusals(const RunConfig& c, int64_t devices, Platform p) {
  std::vector<std::string> out;
  common_refusals(c, "MaxText", out);
  const Mesh m = mesh_of(c, devices);
  const CpStrategy s = c.strategy();
  const std::string name = name_of(s);
  if (c.cp > 1 && s != CpStrategy::all_gather) {
    if (p == Platform::cpu)
      out.push_back("MaxText runs " + name + " context parallelism on GPU or TPU only");
    else if (p == Platform::gpu && s != CpStrategy::ring)
      out.push_back("MaxText runs " + name + " context parallelism on TPU only (GPU: all_gather or ring)");
    else if (p == Platform::tpu) {
      if (c.attention_type != MaskKind::causal)
        out.push_back("MaxText's TPU " + name + " attention takes global (causal) attention only, not " +
                      name_of(c.attention_type));
      if (s == CpStrategy::ring && c.max_target_length % (c.cp * c.cp) != 0)
        out.push_back("MaxText's TPU ring needs max_target_length divisible by cp^2 = " + str(c.cp * c.cp));
      if (c.cp_load_balance && m.ring > 1 && m.ring % 2 != 0)
        out.push_back("MaxText's TPU ring load balancing needs an even ring size (" + str(m.ring) + ")");
      if (m.a2a > 1 && (c.model.num_kv_heads % m.a2a != 0 || c.model.num_heads % m.a2a != 0))
        out.push_back("MaxText's " + name + " needs the all-to-all degree " + str(m.a2a) + " to divide the " +
                      str(c.model.num_heads) + " query and " + str(c.model.num_kv_heads) + " KV heads");
    }
  }
  if (c.tp > 1 && c.tp_sequence_parallel)
    out.push_back("MaxText has no sequence parallelism within the tensor axis (tensor_sequence_parallelism); "
                  "its tensor_sequence axis is a mesh axis of its own");
  return out;
}

// Megatron-Core 0.19.2: GPUs only; causal attention with an optional window
// (--window-size), no chunked attention; the all-to-all splits each tp
// rank's KV heads; fine-grained activation offloading offloads the inputs of
// named modules (transformer_config.py: attn_norm, core_attn, attn_proj,
// mlp_norm, ...: none for a dense MLP's SwiGLU input); no parameter offload.
std::vector<std::string> megatron_refusals(const RunConfig& c, int64_t devices, Platform p) {
  std::vector<std::string> out;
  common_refusals(c, "Megatron-Core", out);
  if (p != Platform::gpu) out.push_back("Megatron-Core runs on NVIDIA GPUs only");
  if (c.attention_type == MaskKind::chunked) out.push_back("Megatron-Core has no chunked attention");
  if (c.attention_type == MaskKind::full) out.push_back("Megatron-Core's GPT model is causal (attention_type=full)");
  const Mesh m = mesh_of(c, devices);
  const int64_t kv_per_tp = c.model.num_kv_heads / c.tp;
  if (m.a2a > 1 && kv_per_tp % m.a2a != 0)
    out.push_back("Megatron-Core's all-to-all splits the " + str(kv_per_tp) + " KV heads of each tp rank: the degree " +
                  str(m.a2a) + " must divide them");
  const SaveSet save = c.save_set();
  if (save.offloaded(SavePoint::mlpwi))
    out.push_back("Megatron-Core's fine-grained offloading has no module whose input is a dense MLP's gate/up "
                  "output (mlpwi offloaded)");
  if (c.parameter_memory_host_offload)
    out.push_back("Megatron-Core has no setting that keeps parameters in host memory");
  // Megatron recomputes by module (core_attn, mlp): what longctx's policy drops must be one of them.
  if (c.remat_policy != RematPolicy::full && (!save.qkv || !save.out_proj))
    out.push_back(std::string("Megatron-Core's selective recompute has no module for the ") +
                  (!save.qkv ? "q,k,v projections" : "attention output projection") + " that remat_policy=" +
                  name_of(c.remat_policy) + " recomputes (it would keep them: more memory than planned)");
  return out;
}

// TorchTitan 0.3.0: the llama3 model configs (8B, 70B, 405B); context
// parallelism is PyTorch's (torch.distributed.tensor.experimental
// _context_parallel, whose default rotate method all-gathers K,V, and
// TorchTitan 0.3.0 has no setting for it); FSDP2 over the data-shard and cp
// ranks; activation checkpointing full or none (its selective mode is
// per-op, not longctx's named tensors); CPU offload of parameters,
// gradients and optimizer state together.
struct TitanModel {
  const char* config;
  int64_t d_model, layers, heads, kv_heads, mlp_dim, vocab;
};
constexpr TitanModel kTitanModels[] = {{"llama3_8b", 4096, 32, 32, 8, 14336, 128256},
                                       {"llama3_70b", 8192, 80, 64, 8, 28672, 128256},
                                       {"llama3_405b", 16384, 126, 128, 8, 53248, 128256}};
const TitanModel* titan_model(const LlamaConfig& m) {
  for (const TitanModel& t : kTitanModels)
    if (m.d_model == t.d_model && m.num_layers == t.layers && m.num_heads == t.heads &&
        m.num_kv_heads == t.kv_heads && m.mlp_dim == t.mlp_dim && m.vocab_size == t.vocab)
      return &t;
  return nullptr;
}

std::vector<std::string> torchtitan_refusals(const RunConfig& c, Platform p) {
  std::vector<std::string> out;
  common_refusals(c, "TorchTitan", out);
  if (p != Platform::gpu) out.push_back("TorchTitan's context parallelism runs on GPUs only");
  if (!titan_model(c.model))
    out.push_back("TorchTitan's llama3 configs are 8B, 70B and 405B; this model's shape is none of them");
  if (c.attention_type != MaskKind::causal)
    out.push_back(std::string("TorchTitan's llama3 attention is causal only, not ") + name_of(c.attention_type));
  if (c.cp > 1 && c.strategy() != CpStrategy::all_gather)
    out.push_back(std::string("TorchTitan 0.3.0 runs PyTorch's context parallelism, which all-gathers K,V "
                              "(all_gather); it has no setting for ") + name_of(c.strategy()));
  if (c.remat_policy != RematPolicy::full && c.remat_policy != RematPolicy::none)
    out.push_back(std::string("TorchTitan checkpoints activations fully or not at all (its selective mode is per "
                              "op): remat_policy=") + name_of(c.remat_policy));
  if (offloads_activations(c)) out.push_back("TorchTitan has no activation offload");
  if (c.optimizer_memory_host_offload != c.parameter_memory_host_offload)
    out.push_back("TorchTitan offloads parameters, gradients and optimizer state together "
                  "(training.enable_cpu_offload), not one of them");
  if (c.shard_optimizer_over_data && c.fsdp <= 1 && c.dp > 1)
    out.push_back("TorchTitan shards optimizer state only with FSDP (data_parallel_shard_degree), "
                  "not over replicas (ZeRO-1)");
  if (c.tp > 1 && !c.tp_sequence_parallel)
    out.push_back("TorchTitan's tensor parallelism always shards the sequence (enable_sequence_parallel); "
                  "the plan without it is not what it runs");
  return out;
}

std::vector<std::string> refusals(const RunConfig& c, int64_t devices, Platform p, Framework f) {
  switch (f) {
    case Framework::maxtext: return maxtext_refusals(c, devices, p);
    case Framework::megatron: return megatron_refusals(c, devices, p);
    case Framework::torchtitan: return torchtitan_refusals(c, p);
  }
  return {};
}

// What a framework runs differently without changing memory or batch.
std::vector<std::string> slower_notes(const RunConfig& c, const char* f) {
  std::vector<std::string> out;
  const CpStrategyInfo& s = cp_strategy_info(c.strategy());
  if (s.ring_steps(c.cp, c.cp_ulysses) && (c.attention_type == MaskKind::local || c.attention_type == MaskKind::chunked))
    out.push_back("longctx's ring sends only the K,V chunks the " + std::string(name_of(c.attention_type)) +
                  " mask reaches (sparse ring); " + f + "'s ring exchanges every chunk: its step is slower than predicted");
  return out;
}

// ---- the settings -------------------------------------------------------------------

std::string maxtext(const RunConfig& c, int64_t devices, Platform p) {
  std::ostringstream o;
  const LlamaConfig& md = c.model;
  const Mesh m = mesh_of(c, devices);
  const CpStrategy s = c.strategy();
  auto q = [](const std::string& v) { return "'" + v + "'"; };
  auto yes = [](bool b) { return b ? "true" : "false"; };
  o << "# MaxText 0.2.5 settings over its configs/base.yml (a YAML file with these keys, or key=value arguments)\n";
  o << "run_name: 'longctx-plan'\n";
  o << "hardware: " << q(name_of(p)) << "\n";
  // The model by its shape, not by name: the planned shape is the one that runs.
  o << "model_name: 'default'\ndecoder_block: 'llama2'\n";
  o << "base_emb_dim: " << md.d_model << "\nbase_num_query_heads: " << md.num_heads
    << "\nbase_num_kv_heads: " << md.num_kv_heads << "\nhead_dim: " << md.head_dim << "\nbase_mlp_dim: " << md.mlp_dim
    << "\nbase_num_decoder_layers: " << md.num_layers << "\nvocab_size: " << md.vocab_size << "\n";
  o << "mlp_activations: ['silu', 'linear']\nenable_dropout: false\n";
  o << "logits_via_embedding: " << yes(md.tie_embeddings) << "\n";
  o << "normalization_layer_epsilon: " << decimal(md.norm_eps) << "\n";
  o << "rope_max_timescale: " << decimal(md.rope_theta) << "\n";
  o << "rope_type: " << q(md.rope_llama3_scaling ? "llama3.1" : "default") << "\n";
  // The mesh: one slice, every axis given (ici_fsdp_parallelism defaults to -1).
  o << "ici_data_parallelism: " << c.dp << "\nici_fsdp_parallelism: " << c.fsdp << "\n";
  o << "ici_context_parallelism: " << (s == CpStrategy::usp ? m.ring : c.cp) << "\n";
  o << "ici_context_usp_ulysses_parallelism: " << (s == CpStrategy::usp ? m.a2a : 1) << "\n";
  o << "ici_tensor_parallelism: " << c.tp << "\n";
  o << "context_parallel_strategy: " << q(name_of(s)) << "\n";
  o << "context_parallel_load_balance: " << yes(c.cp_load_balance && s != CpStrategy::ulysses) << "\n";
  // MaxText's global batch is per_device_batch_size x every device (cp and tp included).
  o << "max_target_length: " << c.max_target_length << "\n";
  o << "per_device_batch_size: " << decimal(double(c.per_device_batch_size * m.slices) / double(devices)) << "\n";
  o << "packing: " << yes(c.packing) << "\n";
  if (p == Platform::gpu && c.packing)  // TransformerEngine's packed attention needs a cap on documents per sequence
    o << "max_segments_per_seq: " << std::max<int64_t>(1, c.max_target_length / 512)
      << "  # documents per sequence, at most: raise it for documents shorter than 512 tokens\n";
  o << "dtype: " << q(name_of(c.dtype)) << "\nweight_dtype: 'float32'\n";
  if (p == Platform::tpu) {
    o << "attention: 'flash'\n";
    if (c.cp > 1 && s != CpStrategy::all_gather) o << "use_tokamax_splash: true\n";
  } else {
    o << "attention: " << q(p == Platform::gpu ? "cudnn_flash_te" : "dot_product") << "\n";
  }
  switch (c.attention_type) {
    case MaskKind::full: o << "attention_type: 'full'\n"; break;
    case MaskKind::causal: o << "attention_type: 'global'\n"; break;
    case MaskKind::local:
      o << "attention_type: 'local_sliding'\nsliding_window_size: " << c.sliding_window_size << "\n";
      break;
    case MaskKind::chunked:
      o << "attention_type: 'chunk'\nchunk_attn_window_size: " << c.chunk_attn_window_size << "\n";
      break;
  }
  if (c.remat_policy == RematPolicy::full) {
    o << "remat_policy: 'full'\n";
  } else {
    // MaxText's custom policy by its tensor names: what this policy saves, offloads or recomputes.
    const SaveSet save = c.save_set();
    o << "remat_policy: 'custom'  # longctx's " << name_of(c.remat_policy) << "\n";
    auto choice = [&](bool saved, SavePoint point) {
      return q(!saved ? "remat" : save.offloaded(point) ? "offload" : "device");
    };
    o << "decoder_layer_input: " << choice(true, SavePoint::decoder_layer_input) << "\n";
    for (const char* k : {"query_proj", "key_proj", "value_proj"}) o << k << ": " << choice(save.qkv, SavePoint::qkv_proj) << "\n";
    o << "context: " << choice(save.context, SavePoint::context) << "\n";
    o << "out_proj: " << choice(save.out_proj, SavePoint::out_proj) << "\n";
    for (const char* k : {"mlpwi_0", "mlpwi_1"}) o << k << ": " << choice(save.mlpwi, SavePoint::mlpwi) << "\n";
    o << "mlpwo: 'remat'\n";
  }
  o << "optimizer_memory_host_offload: " << yes(c.optimizer_memory_host_offload) << "\n";
  o << "parameter_memory_host_offload: " << yes(c.parameter_memory_host_offload) << "\n";
  // With FSDP the moments are sharded already; MaxText refuses ZeRO-1 beside it.
  o << "shard_optimizer_over_data: " << yes(c.shard_optimizer_over_data && c.fsdp <= 1) << "\n";
  for (const std::string& n : slower_notes(c, "MaxText")) o << "# note: " << n << "\n";
  return o.str();
}

std::string megatron(const RunConfig& c, int64_t devices) {
  std::ostringstream o;
  const LlamaConfig& md = c.model;
  const Mesh m = mesh_of(c, devices);
  const CpStrategyInfo& s = cp_strategy_info(c.strategy());
  const SaveSet save = c.save_set();
  const bool fsdp = c.fsdp > 1 || c.fsdp_over_context;
  std::vector<std::string> notes = slower_notes(c, "Megatron-Core");
  o << "# Megatron-Core 0.19.2: pretrain_gpt.py's environment and flags; data parallel size = devices / (tp x cp) = "
    << m.slices << "\n";
  o << "# add your data and tokenizer (--data-path, --tokenizer-type, --tokenizer-model) and the optimizer's\n";
  // Tensor or context parallelism overlaps its communication only with one
  // connection per device (arguments.py asserts it before Blackwell); FSDP
  // asserts the opposite and only warns about tp and cp.
  if ((c.tp > 1 || c.cp > 1) && !fsdp) o << "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
  o << "--num-layers " << md.num_layers << "\n--hidden-size " << md.d_model << "\n--ffn-hidden-size " << md.mlp_dim
    << "\n--num-attention-heads " << md.num_heads << "\n--group-query-attention\n--num-query-groups " << md.num_kv_heads
    << "\n--kv-channels " << md.head_dim << "\n";
  o << "--swiglu\n--normalization RMSNorm\n--norm-epsilon " << decimal(md.norm_eps)
    << "\n--disable-bias-linear\n--position-embedding-type rope\n--rotary-base " << static_cast<int64_t>(md.rope_theta) << "\n";
  if (md.rope_llama3_scaling) o << "--use-rope-scaling\n";
  if (!md.tie_embeddings) o << "--untie-embeddings-and-output-weights\n";
  o << "--vocab-size " << md.vocab_size << "\n";
  o << "--seq-length " << c.max_target_length << "\n--max-position-embeddings " << c.max_target_length << "\n";
  o << "--micro-batch-size " << c.per_device_batch_size << "\n";
  o << "--global-batch-size " << c.per_device_batch_size * m.slices << "\n";
  if (c.dtype == DType::bf16) o << "--bf16\n";
  if (c.attention_type == MaskKind::local) o << "--window-size " << c.sliding_window_size - 1 << ",0\n";
  o << "--tensor-model-parallel-size " << c.tp << "\n";
  if (c.tp > 1 && c.tp_sequence_parallel) o << "--sequence-parallel\n";
  o << "--context-parallel-size " << c.cp << "\n";
  if (c.cp > 1) {
    if (s.gathers_kv) o << "--cp-comm-type all_gather\n";
    else if (m.a2a > 1 && m.ring > 1)
      o << "--cp-comm-type a2a+p2p\n--hierarchical-context-parallel-sizes " << m.a2a << " " << m.ring << "\n";
    else if (m.a2a > 1) o << "--cp-comm-type a2a\n";
    else o << "--cp-comm-type p2p\n";
    if (!c.cp_load_balance)
      notes.push_back("context_parallel_load_balance=false: Megatron-Core always splits the sequence into 2 x cp "
                      "chunks (zigzag), which balances the causal work");
  }
  if (fsdp) {
    o << "--use-megatron-fsdp\n--data-parallel-sharding-strategy optim_grads_params\n--ckpt-format fsdp_dtensor\n";
  } else if (c.shard_optimizer_over_data) {
    o << "--use-distributed-optimizer\n";
  }
  if (c.remat_policy == RematPolicy::full) {
    o << "--recompute-granularity full\n--recompute-method uniform\n--recompute-num-layers 1\n";
  } else if (!save.context || !save.mlpwi) {
    o << "--recompute-granularity selective\n--recompute-modules";
    if (!save.context) o << " core_attn";
    if (!save.mlpwi) o << " mlp";
    o << "\n";
  }
  if (offloads_activations(c)) {
    // The modules whose inputs are the tensors this policy offloads (attn_proj's input is core_attn's output).
    std::string modules;
    if (save.offloaded(SavePoint::decoder_layer_input)) modules += " attn_norm";
    if (save.offloaded(SavePoint::qkv_proj) || save.offloaded(SavePoint::context)) modules += " core_attn";
    if (save.offloaded(SavePoint::context)) modules += " attn_proj";
    if (save.offloaded(SavePoint::out_proj)) modules += " mlp_norm";
    o << "--fine-grained-activation-offloading\n--offload-modules" << modules << "\n";
  }
  if (c.optimizer_memory_host_offload) o << "--optimizer-cpu-offload\n--use-precision-aware-optimizer\n";
  for (const std::string& n : notes) o << "# note: " << n << "\n";
  return o.str();
}

std::string torchtitan(const RunConfig& c, int64_t devices) {
  std::ostringstream o;
  const Mesh m = mesh_of(c, devices);
  o << "# TorchTitan 0.3.0: the trainer's command line (torchtitan.config.ConfigManager)\n";
  o << "--module llama3\n--config " << titan_model(c.model)->config << "\n";
  o << "--parallelism.data_parallel_replicate_degree " << c.dp << "\n";
  o << "--parallelism.data_parallel_shard_degree " << c.fsdp << "\n";
  o << "--parallelism.context_parallel_degree " << c.cp << "\n";
  o << "--parallelism.tensor_parallel_degree " << c.tp << "\n";
  o << "--training.seq_len " << c.max_target_length << "\n";
  o << "--training.local_batch_size " << c.per_device_batch_size << "\n";
  o << "--training.global_batch_size " << c.per_device_batch_size * m.slices << "\n";
  o << "--training.mixed_precision_param " << name_of(c.dtype) << "\n";
  if (c.parameter_memory_host_offload) o << "--training.enable_cpu_offload\n";
  o << "activation-checkpoint:" << (c.remat_policy == RematPolicy::full ? "full" : "none") << "\n";
  if (!c.cp_load_balance && c.cp > 1)
    o << "# note: context_parallel_load_balance=false: TorchTitan balances the causal work (headtail)\n";
  return o.str();
}

}  // namespace

std::vector<std::string> framework_refusals(const RunConfig& config, int64_t devices, Platform platform,
                                            Framework framework) {
  RunConfig c = config;
  const MeshShape mesh = c.mesh_shape(devices);
  c.dp = mesh.dp, c.fsdp = mesh.fsdp;
  return refusals(c, devices, platform, framework);
}

std::string framework_refusal(const RunConfig& config, int64_t devices, Platform platform, Framework framework) {
  std::string out;
  for (const std::string& r : framework_refusals(config, devices, platform, framework))
    out += (out.empty() ? "" : "; ") + r;
  return out;
}

std::string emit_settings(const RunConfig& config, int64_t devices, Platform platform, Framework framework) {
  if (const std::string no = framework_refusal(config, devices, platform, framework); !no.empty())
    throw ConfigError("plan --emit " + std::string(name_of(framework)) + ": " + no);
  RunConfig c = config;  // an axis at -1 takes the devices the others leave
  const MeshShape mesh = c.mesh_shape(devices);
  c.dp = mesh.dp, c.fsdp = mesh.fsdp;
  switch (framework) {
    case Framework::maxtext: return maxtext(c, devices, platform);
    case Framework::megatron: return megatron(c, devices);
    case Framework::torchtitan: return torchtitan(c, devices);
  }
  return "";
}

}  // namespace longctx
