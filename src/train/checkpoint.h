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
// Atomic: everything goes to a hidden temporary directory, each file is
// fsync'ed, then MANIFEST.json, then the directory is renamed into place.
// A directory without MANIFEST.json is never considered. Loading verifies
// every size and checksum and every tensor name and shape BEFORE touching the
// model, so a corrupt or mismatched checkpoint is refused (DataError), never
// half-loaded.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/llama.h"
#include "train/optimizer.h"

namespace longctx {

class Mesh;

struct TrainState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_cursor = 0;    // sequences consumed (global)
  int64_t init_weights_seed = 0;  // the only RNG state: init and synthetic data are pure functions of it
};

// Collective over the world (every rank calls it); world rank 0 writes. A
// sharded optimizer's (ZeRO-1) moment pieces are gathered over the replicas
// first: the files never depend on the mesh or on sharding.
// Returns the checkpoint directory.
std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const AdamW& optimizer,
                            const TrainState& state, const RunConfig& config, const Mesh& mesh);

// The complete checkpoint with the highest step in checkpoint_dir, or "".
std::string latest_checkpoint(const std::string& checkpoint_dir);

// Deletes all but the `keep` newest complete checkpoints (keep <= 0: none).
// save_checkpoint calls it with max_num_checkpoints_to_keep after each save.
void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep);

// Verifies and loads (every rank reads the files and keeps its shard, and of
// the moments only its optimizer's piece).
// DataError when a file is missing, a checksum or size differs, or the
// tensors do not match the model's names and shapes.
TrainState load_checkpoint(const std::string& path, LlamaModel& model, AdamW& optimizer);

// ---- building blocks (exposed for tests) -----------------------------------------
uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// fp32 safetensors with {"format": "pt"} metadata.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors);
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// HF config.json text for this model shape.
std::string hf_config_json(const LlamaConfig& config, int64_t max_position_embeddings);

}  // namespace longctx
