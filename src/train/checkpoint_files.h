#pragma once
// A checkpoint's files read and checked without a model (train/checkpoint.h
// writes them and matches them against the model): the safetensors format,
// MANIFEST.json (size and CRC-32 of every file), train_state.json. Apart from
// checkpoint.cpp so that the readers build alone (tests/fuzz links only core
// and this). Every problem is a DataError naming the file and the rule.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace longctx {

struct TrainState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_cursor = 0;    // sequences consumed (global)
  int64_t init_weights_seed = 0;  // the only RNG state: init and synthetic data are pure functions of it
};

uint32_t crc32(const void* data, size_t bytes, uint32_t crc = 0);

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// fp32 safetensors with {"format": "pt"} metadata: the file's bytes.
std::string safetensors_bytes(const std::vector<std::pair<std::string, const HostTensor*>>& tensors);
// Parses safetensors bytes; `what` names the file in errors. The rules: an
// 8-byte header length within the file; the header a JSON object whose
// entries (but "__metadata__", an object) are objects with "dtype": "F32",
// "shape" (non-negative integers, product overflow-checked) and
// "data_offsets" [begin, end] (non-negative integers); end - begin = 4 x the
// shape's product; the tensors, in offset order, tile the data section
// exactly: no overlap, no gap, none past its end, together covering it.
std::map<std::string, HostTensor> parse_safetensors(const std::string& bytes, const std::string& what);
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// The step of a checkpoint directory name "step_<digits>" that fits int64;
// nullopt for anything else (such directories are ignored).
std::optional<int64_t> checkpoint_step_from_name(const std::string& name);

// DataError("checkpoint '<path>' refused: <why> (delete it ...)").
DataError checkpoint_refused(const std::string& path, const std::string& why);

// The files MANIFEST.json must list.
const std::vector<std::string>& checkpoint_file_names();

// MANIFEST.json (an object with "files": {name: {"bytes": n, "crc32": c}})
// parsed, and every file of checkpoint_file_names() read from `dir` and
// checked against it; returns the files' bytes by name. DataError
// "checkpoint '<dir>' refused: <rule>" otherwise.
std::map<std::string, std::string> read_verified_files(const std::string& dir, nlohmann::json& manifest);

// train_state.json: an object with integer fields step and data_cursor in
// [0, 2^53], init_weights_seed >= 0, optimizer_step in [0, step].
struct SavedTrainState {
  TrainState state;
  int64_t optimizer_step = 0;
};
SavedTrainState parse_train_state(const std::string& text, const std::string& what);

// Everything of a checkpoint directory that needs no model, verified:
// read_verified_files, both safetensors files parsed, config.json a JSON
// object, train_state.json parsed, its step equal to MANIFEST.json's and to
// the directory's name (step_N).
struct CheckpointFiles {
  std::map<std::string, HostTensor> weights, moments;
  nlohmann::json hf_config;  // config.json
  SavedTrainState train;
};
CheckpointFiles read_checkpoint_files(const std::string& dir);

}  // namespace longctx
