#pragma once
// The run configuration: one YAML file (configs/base.yml documents every key
// with its default), recipes that inherit from it with `base_config:`, an
// optional model-shape file picked by `model_name:`, and `key=value`
// overrides from the command line. Key names follow MaxText where one exists.
//
// Precedence, lowest first:
//   built-in defaults (== configs/base.yml, a test keeps them equal)
//   < the base_config chain, root first (each file overrides its parent)
//   < configs/model/<model_name>.yml (the model shape; MaxText order)
//   < key=value overrides
//
// Usage:
//   RunConfig cfg = load_config("configs/demo.yml", {"steps=10"});
//   validate_config(cfg, world_size);   // every rule, before any work
//   cfg.model.d_model; cfg.steps; cfg.strategy(); cfg.get<int64_t>("steps");
//
// The typed fields are the only truth: each key of config_keys() is bound to
// one field, parsed once (enums by core/vocabulary.h) when the configuration
// is read; the key/value form (values(), to_yaml(), get<T>()) is derived
// from the fields.
//
// Every error is a ConfigError naming the file/key and the broken rule; an
// unknown key suggests the nearest valid one. The planner (src/plan) reads
// configs through the same functions.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/mask.h"
#include "core/mesh_shape.h"
#include "core/model_shape.h"
#include "core/vocabulary.h"

namespace longctx {

// One configuration value. Integers stay integers (steps: 10), floats accept
// integers (learning_rate: 1), booleans are YAML booleans.
using ConfigValue = std::variant<int64_t, double, bool, std::string>;

struct RunConfig;

// The schema: every valid key, its type (the default's alternative), default,
// and the field it is bound to.
struct ConfigKey {
  const char* name;
  ConfigValue default_value;
  const char* help;  // one line; configs/base.yml carries the longer comment
  ConfigValue (*get)(const RunConfig&);
  void (*set)(RunConfig&, const ConfigValue&);  // ConfigError on a bad name or type
};
const std::vector<ConfigKey>& config_keys();

// The parsed configuration. Every key's default lives in config_keys()
// alone: the constructor applies them (fields here have no initialisers).
struct RunConfig {
  RunConfig();
  // ---- run / output
  std::string run_name;               // run_name
  std::string base_output_directory;  // base_output_directory
  std::string checkpoint_dir;         // checkpoint_dir ("" = <base_output_directory>/<run_name>/checkpoints)
  std::string metrics_file;           // metrics_file ("" = <base_output_directory>/<run_name>/metrics.jsonl)
  bool enable_checkpointing;   // enable_checkpointing
  int64_t checkpoint_period;      // checkpoint_period (0 = only at the end)
  int64_t max_num_checkpoints_to_keep;  // max_num_checkpoints_to_keep (0 = keep all)
  bool resume;                 // resume: continue from the latest complete checkpoint
  int64_t log_period;             // log_period
  double progress_interval_seconds;  // progress_interval_seconds (0 = off)

  // ---- model
  std::string model_name;             // model_name (configs/model/<name>.yml; "" = keys below)
  LlamaConfig model;                  // base_emb_dim, base_num_query_heads, ...
  DType dtype;            // dtype: activations and matmul inputs
  DType weight_dtype;     // weight_dtype: master weights (float32 only)
  RematPolicy remat_policy;  // remat_policy
  // custom remat: true = save ("device"), false = recompute ("remat"), in
  // SavePoint order: decoder_layer_input, qkv_proj, context, out_proj, mlpwi, mlpwo.
  CustomSave remat_custom_save;
  // custom remat: true where the key says `offload` (saved, outside device memory).
  CustomOffload remat_custom_offload;
  OffloadTarget offload_target;  // offload_target
  std::string offload_dir;  // offload_dir ("" = <base_output_directory>/<run_name>/offload)
  // layer_token_chunk: tokens whose norms, projections and SwiGLU a layer
  // computes at once (0 = all local tokens; model/llama.h).
  int64_t layer_token_chunk;

  // ---- attention
  MaskKind attention_type;  // attention_type
  int64_t sliding_window_size;    // sliding_window_size (local)
  int64_t chunk_attn_window_size; // chunk_attn_window_size (chunked)
  KernelImpl attention_kernel;  // attention_kernel

  // ---- parallelism (dp x fsdp x cp x tp == world size; cp = ulysses x ring)
  int64_t dp;                     // ici_data_parallelism (-1 in the file = fill the rest)
  // ici_fsdp_parallelism (-1 = fill; only one of dp and fsdp): more data
  // ranks (the batch is split over dp x fsdp) that shard the parameters,
  // gradients and AdamW moments among themselves (src/model/sharded_parameters.h).
  int64_t fsdp;
  // fsdp_over_context: the cp ranks shard them too (shard group fsdp x cp).
  bool fsdp_over_context;
  int64_t cp;                     // ici_context_parallelism
  int64_t cp_ulysses;             // ici_context_usp_ulysses_parallelism (usp only; 1 otherwise)
  int64_t tp;                     // ici_tensor_parallelism
  // tensor_sequence_parallelism (Megatron's sequence_parallel): the residual
  // stream and norms sharded over tp along the tokens; needs tp > 1 and the
  // local tokens (per_device_batch_size * max_target_length / cp) divisible by tp.
  bool tp_sequence_parallel;
  // context_parallel_strategy; nullopt = "auto" (the planner picks; apps/train.cpp).
  std::optional<CpStrategy> cp_strategy;
  bool cp_load_balance;        // context_parallel_load_balance: zigzag (true) or contiguous

  // ---- data
  DatasetType dataset_type;  // dataset_type
  std::string dataset_path;           // dataset_path: comma-separated files, directories or globs
  std::string document_separator;     // document_separator ("" = one document per file)
  bool packing;                // packing
  int64_t max_target_length;      // max_target_length (tokens per sequence)
  int64_t per_device_batch_size;  // per_device_batch_size (sequences per data rank, dp x fsdp, per step)

  // ---- optimisation
  int64_t steps;                  // steps
  double learning_rate;           // learning_rate (peak)
  double warmup_steps_fraction;   // warmup_steps_fraction
  double cosine_learning_rate_final_fraction;  // cosine_learning_rate_final_fraction
  double adam_b1, adam_b2, adam_eps, adam_weight_decay;
  double gradient_clipping_threshold;  // gradient_clipping_threshold (0 = off)
  // shard_optimizer_over_data (ZeRO-1): each of the dp x cp replicas keeps the
  // AdamW moments of one contiguous piece of the parameters; gradients are
  // reduce-scattered and the updated pieces all-gathered (src/train/trainer.h).
  bool shard_optimizer_over_data;
  // optimizer_memory_host_offload / parameter_memory_host_offload (MaxText's
  // keys): the AdamW moments, and with FSDP the parameter shards, live in
  // the host pool (host_memory_budget), not in device memory.
  // state_offload_target: where they go, host or disk (spill files in offload_dir).
  bool optimizer_memory_host_offload;
  bool parameter_memory_host_offload;
  OffloadTarget state_offload_target;
  StateTier optimizer_tier() const { return state_tier(optimizer_memory_host_offload, state_offload_target); }
  StateTier parameter_tier() const { return state_tier(parameter_memory_host_offload, state_offload_target); }
  int64_t init_weights_seed;      // init_weights_seed (also seeds synthetic data)
  std::string load_parameters_path;   // load_parameters_path: pretrained weights (train/checkpoint.h)

  // ---- evaluation (longctx eval, train/eval.h)
  int64_t eval_steps;             // eval_steps
  std::string eval_dataset_path;      // eval_dataset_path ("" = the tail of dataset_path)
  std::string eval_output;            // eval_output ("" = <base_output_directory>/<run_name>/eval.json)
  int64_t eval_first_bucket;   // eval_first_bucket

  // ---- system
  int64_t device_memory_budget;   // device_memory_budget (bytes; 0 = unlimited)
  int64_t host_memory_budget;     // host_memory_budget: the host offload pool (bytes; 0 = unlimited)
  double peak_tflops_per_device;  // peak_tflops_per_device (0 = measure a GEMM at start-up)
  int64_t collective_timeout_seconds;  // collective_timeout_seconds
  int64_t num_threads;            // num_threads (0 = OpenMP default)
  bool deterministic_across_thread_counts;  // thread-count-independent GEMM pieces

  // The mesh's axes (src/core/mesh_shape.h: its groups, ring factor, shard
  // group, replicas). cp splits into ulysses x ring only for usp: validation
  // holds ici_context_usp_ulysses_parallelism at 1 for the other strategies.
  // dp must be resolved (not -1).
  MeshShape mesh_shape() const;
  // The same on `world` ranks: dp x fsdp x cp x tp must be the world, an
  // axis at -1 (fill) taking what the others leave; ConfigError naming the
  // rule otherwise (validate_config resolves the axes with it).
  MeshShape mesh_shape(int64_t world) const;
  // The resolved strategy (ConfigError while it is still "auto").
  CpStrategy strategy() const;
  // The ulysses (all-to-all) degree of the strategy: cp for ulysses, the
  // usp factor for usp, 1 for all_gather and ring.
  int64_t ulysses_degree() const;
  // The token layout over the cp ranks (zigzag only when cp > 1).
  LayoutKind layout() const;
  // The attention mask of attention_type and its window.
  MaskSpec mask() const;
  // save_set_for(remat_policy, remat_custom_save, remat_custom_offload).
  SaveSet save_set() const { return save_set_for(remat_policy, remat_custom_save, remat_custom_offload); }

  // Every key with its value, derived from the fields.
  std::map<std::string, ConfigValue> values() const;
  // Where each key's value came from ("default", a file path, "command line").
  std::map<std::string, std::string> sources;

  template <typename T>
  T get(const std::string& key) const;  // ConfigError if missing or of another type
  // The final configuration as YAML (every key), loadable by load_config.
  std::string to_yaml() const;
};

// The custom remat policy's per-tensor keys as a user sets them
// ("decoder_layer_input=device qkv_proj=remat context=offload ...").
std::string remat_custom_keys(const RunConfig& c);

// Reads `path` (following base_config and model_name) and applies overrides
// of the form key=value (value parsed as YAML). Checks key names and types.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from an in-memory map (tests, checkpoints): defaults, then `values`.
RunConfig config_from_values(const std::map<std::string, ConfigValue>& values);

// Every rule that does not need the data: mesh product vs world size,
// divisibility of sequence and heads, strategy constraints, ranges. Resolves
// ici_data_parallelism = -1. Throws ConfigError naming the rule. Call it on
// every rank before any work. context_parallel_strategy "auto" must be
// resolved (apps/train.cpp asks the planner) before this is called.
void validate_config(RunConfig& config, int64_t world_size);

// Parses "123", "64MiB", "2GiB", "1.5GB"-style byte counts (ConfigError otherwise).
int64_t parse_bytes(const std::string& text);

// Levenshtein distance (for "did you mean" suggestions).
int64_t edit_distance(const std::string& a, const std::string& b);

}  // namespace longctx
