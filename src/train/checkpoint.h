#pragma once
// Checkpoints: unsharded (TP shards gathered), so a run can resume on any
// mesh, and loadable by Hugging Face transformers.
//
//   <checkpoint_dir>/step_00000010/
//     model.safetensors      weights, HF Llama names, fp32, full shapes
//     config.json            HF LlamaConfig (LlamaForCausalLM)
//     optimizer.safetensors  AdamW moments: "<name>.exp_avg", "<name>.exp_avg_sq"
//     train_state.json       step, data cursor, RNG seeds, optimizer step
//     run_config.yml         the full RunConfig of the run that wrote it
//     MANIFEST.json          size and CRC-32 of every file above; written last
//
// Atomic: everything goes to a hidden temporary directory (.step_N.tmp); every
// write, fsync and close is checked (a full disk is a DataError naming the
// file and errno, and the failed save deletes its temporary and prunes
// nothing); MANIFEST.json is written last, the files are read back and
// verified (sizes + CRC-32), and only then is the directory renamed into
// place. A directory without MANIFEST.json is never considered.
// Re-saving an existing step swaps old and new in one renameat2
// RENAME_EXCHANGE (where the filesystem cannot, the old one is renamed aside
// to a hidden name first: only then is there a moment without that step).
// Pruning renames a checkpoint to a hidden .step_N.trash before deleting its
// files, so a kill mid-prune never leaves a "complete" one with files
// missing; the next save deletes such leftovers (hidden .tmp/.trash only).
// Loading verifies every size and checksum, every train_state.json field,
// the model config (config.json) and every tensor name and shape BEFORE
// touching the model, so a corrupt or mismatched checkpoint is refused
// (DataError), never half-loaded; resume falls back to the newest VALID one.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/llama.h"
#include "train/checkpoint_files.h"
#include "train/optimizer.h"

namespace longctx {

class Mesh;

// Collective over the world (every rank calls it); world rank 0 writes; it
// prunes nothing (prune_checkpoints). A
// sharded optimizer's (ZeRO-1) moment pieces are gathered over the replicas
// first: the files never depend on the mesh or on sharding.
// Returns the checkpoint directory.
std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const AdamW& optimizer,
                            const TrainState& state, const RunConfig& config, const Mesh& mesh);

// The complete checkpoints (step_N with a MANIFEST.json), newest first.
std::vector<std::string> checkpoints_newest_first(const std::string& checkpoint_dir);
// step_N directories without a MANIFEST.json: never a save of ours (saves
// write it last, then rename), so cut short by hand or by another tool.
std::vector<std::string> step_dirs_without_manifest(const std::string& checkpoint_dir);

// The complete checkpoint with the highest step in checkpoint_dir, or "".
std::string latest_checkpoint(const std::string& checkpoint_dir);

// The newest complete checkpoint that verifies (verify_checkpoint), or "" when
// there is none at all. Each newer one that fails is skipped with a warning
// on `warn` (nullptr: quiet) saying which and why. DataError when complete
// checkpoints exist but none verifies: starting over silently would be worse.
std::string latest_valid_checkpoint(const std::string& checkpoint_dir, std::FILE* warn = stderr);

// DataError unless MANIFEST.json lists every file and each is present with
// its recorded size and CRC-32.
void verify_checkpoint(const std::string& path);

// Deletes all but the `keep` newest complete checkpoints (keep <= 0: none),
// but only ones older than step `below_step`: the newest checkpoint known
// good. The Trainer passes the newest one a finite step has since run from
// (a save is verified on disk, but weights that diverged finitely, 1e29
// say, verify too: the one before them must survive until a step shows
// them sound). The caller holds the only writer (world rank 0).
void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep, int64_t below_step);

// ---- test seams (nullptr/empty: off) -----------------------------------------------
// Called at each named point of the save / re-save / prune protocol
// ("files-written", "verified", "renamed", "resave-exchanged", "resave-aside",
// "resave-renamed", "prune-renamed", "prune-deleted"); a test throws from it
// something that is not a std::exception to simulate a kill there (nothing is
// cleaned up, as after a real kill).
void set_checkpoint_fault_hook(std::function<void(const char* point)> hook);
// Called before each checkpoint I/O call, op = "open", "write", "fsync",
// "close", "rename" or "exchange", with the path; a non-zero return is taken
// as that call failing with that errno (ENOSPC: a full disk).
void set_checkpoint_io_fault(std::function<int(const char* op, const std::string& path)> fault);

// Verifies and loads (every rank reads the files and keeps its shard, and of
// the moments only its optimizer's piece).
// DataError when a file is missing, a checksum or size differs, or the
// tensors do not match the model's names and shapes.
TrainState load_checkpoint(const std::string& path, LlamaModel& model, AdamW& optimizer);

// ---- building blocks (exposed for tests; the readers in train/checkpoint_files.h) ----
// fp32 safetensors with {"format": "pt"} metadata, written durably.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors);

// HF config.json text for this model shape and attention: LlamaForCausalLM
// for causal attention, MistralForCausalLM with sliding_window = W for a
// causal window of W tokens (Mistral's mask keeps kv > q - W: the same W
// tokens, the query included; the rest of Mistral is Llama's, rope_scaling
// included). ConfigError for attention hf_export_refusal refuses.
std::string hf_config_json(const LlamaConfig& config, int64_t max_position_embeddings,
                           const MaskSpec& mask = MaskSpec::causal());
// Why no Hugging Face architecture computes exactly this attention, or ""
// when hf_config_json can describe it. A checkpoint of such a model has no
// config.json (a config.json would make transformers compute another
// attention without a word): README.txt and MANIFEST.json's "no_hf_config"
// say why; the weights are written as usual.
std::string hf_export_refusal(const MaskSpec& mask);

// ---- pretrained weights (load_parameters_path) --------------------------------------
// The model shape of config.json in `config.load_parameters_path` (a Hugging
// Face Llama directory, or a longctx checkpoint) applied to config.model,
// except for keys the run sets explicitly: set anywhere but the built-in
// defaults and configs/base.yml (i.e. by a recipe, the model file or the
// command line; config.sources tells). An explicit shape key (vocabulary,
// widths, heads, head_dim, layers, tied embedding) that differs from
// config.json is a ConfigError; explicit RoPE keys (theta, Llama 3.1
// scaling: context extension), normalization_layer_epsilon and the
// attention window win over config.json. No-op when load_parameters_path is
// empty. ConfigError/DataError naming the file and the rule otherwise
// (another model_type, activation, biases, RoPE type).
void apply_hf_model_config(RunConfig& config);

// Loads the weights of a Hugging Face Llama directory (config.json +
// model.safetensors or sharded model.safetensors.index.json; F32, BF16 or
// F16), or of a longctx checkpoint (verified against its MANIFEST.json
// first; refused without one), into the model: every rank reads one tensor at a time from its file
// and keeps its tp shard. DataError naming the tensor and the rule when a
// tensor is missing, unexpected or of another shape, before the model is
// touched.
void load_hf_parameters(const std::string& dir, LlamaModel& model);

}  // namespace longctx
