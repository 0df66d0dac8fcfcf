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

#include "core/crc32.h"  // crc32, used by the manifest
#include "core/error.h"

namespace longctx {

struct TrainState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_cursor = 0;    // sequences consumed (global)
  int64_t init_weights_seed = 0;  // the only RNG state: init and synthetic data are pure functions of it
};

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// fp32 safetensors with {"format": "pt"} metadata: the file's bytes.
std::string safetensors_bytes(const std::vector<std::pair<std::string, const HostTensor*>>& tensors);

// The element types read (Hugging Face checkpoints are mostly BF16); every
// one is converted exactly to fp32 (fp32 holds every BF16 and F16 value).
enum class StoredType { f32, bf16, f16 };
size_t stored_type_bytes(StoredType t);
// n elements of type t at src (little-endian) widened to fp32.
void widen_to_f32(StoredType t, const void* src, size_t n, float* dst);

// One tensor of a safetensors header: where its bytes are in the data section.
struct SafetensorsEntry {
  StoredType type = StoredType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the data section
};
// Parses a safetensors header (the JSON text after the 8-byte length) of a
// file whose data section holds data_bytes; `what` names the file in errors.
// The rules: a JSON object whose entries (but "__metadata__", an object) are
// objects with "dtype" F32, BF16 or F16 ("unsupported dtype" otherwise),
// "shape" (non-negative integers, product overflow-checked) and
// "data_offsets" [begin, end] (non-negative integers); end - begin = element
// size x the shape's product; the tensors, in offset order, tile the data
// section exactly: no overlap, no gap, none past its end, together covering it.
std::map<std::string, SafetensorsEntry> parse_safetensors_header(const std::string& header, uint64_t data_bytes,
                                                                 const std::string& what);
// A whole safetensors file's bytes (an 8-byte header length within the file,
// then parse_safetensors_header), every tensor widened to fp32.
std::map<std::string, HostTensor> parse_safetensors(const std::string& bytes, const std::string& what);
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// ---- Hugging Face model directories (load_parameters_path) -----------------------
// config.json and either model.safetensors or the shards that
// model.safetensors.index.json lists. Only headers are read when opened;
// read() then reads one tensor's bytes from its file at its offset, so
// loading never holds more than one tensor beyond the model.

// model.safetensors.index.json: an object with "weight_map": {tensor: file},
// each file a plain name inside the directory (no '/', not "." or "..").
std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& what);

class HfWeights {
 public:
  // DataError naming the file and the rule: the index malformed or naming a file outside the
  // directory, a shard missing, a header broken, a tensor the index puts in
  // a file that lacks it, a tensor of a shard the index does not list.
  explicit HfWeights(const std::string& dir);
  // Every tensor: name -> (file, entry).
  struct Located {
    std::string file;  // path
    SafetensorsEntry entry;
    uint64_t data_start = 0;  // file offset of the data section
  };
  const std::map<std::string, Located>& tensors() const { return tensors_; }
  // The tensor widened to fp32 (DataError when the file cannot be read).
  HostTensor read(const std::string& name) const;

 private:
  std::map<std::string, Located> tensors_;
};
// config.json of a model directory: a JSON object (DataError otherwise).
nlohmann::json read_hf_config(const std::string& dir);

// The step of a checkpoint directory name "step_<digits>" that fits int64;
// nullopt for anything else (such directories are ignored).
std::optional<int64_t> checkpoint_step_from_name(const std::string& name);

// DataError("checkpoint '<path>' refused: <why> (delete it ...)").
DataError checkpoint_refused(const std::string& path, const std::string& why);

// The files MANIFEST.json must list. config.json may be left out when
// MANIFEST.json says why in "no_hf_config" (a string): attention that no
// Hugging Face architecture computes (train/checkpoint.h).
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
  nlohmann::json hf_config;  // config.json; null when MANIFEST.json says "no_hf_config"
  SavedTrainState train;
};
CheckpointFiles read_checkpoint_files(const std::string& dir);

}  // namespace longctx
