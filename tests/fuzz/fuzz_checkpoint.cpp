// The checkpoint readers. The first byte picks the mode:
//   0: the rest is one safetensors file (parse_safetensors);
//   1: the rest is model.safetensors, config.json, optimizer.safetensors,
//      train_state.json, run_config.yml (split by "\n#~~\n"), written to a
//      directory with a MANIFEST.json made here (right sizes and CRC-32,
//      step 0..255 from the first byte), so the parsers behind it are reached;
//   2: the same, the sixth part being MANIFEST.json itself.
//   3 (first byte 255): a Hugging Face sharded directory: model.safetensors.index.json, then
//      shards model-1.safetensors, model-2.safetensors, ... (split by
//      "\n#~~\n"): parse_safetensors_index and HfWeights, every tensor read.
// Modes 1 and 2 then read_checkpoint_files (what load_checkpoint reads before the model).
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "train/checkpoint_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int mode = data[0] == 255 ? 3 : data[0] % 3;
  if (mode == 0) {
    fuzz::allow_project_errors([&] {
      const auto tensors = longctx::parse_safetensors(rest, "fuzz.safetensors");
      for (const auto& [name, t] : tensors) {
        int64_t numel = 1;
        for (int64_t d : t.shape) numel *= d;  // the reader checked it fits
        fuzz::require(numel == static_cast<int64_t>(t.data.size()), "tensor size matches its shape");
      }
    });
    return 0;
  }
  const auto parts = fuzz::split_files(rest);
  if (mode == 3) {
    const auto dir = fuzz::scratch_dir() / "hf";
    std::filesystem::remove_all(dir);  // no shard of an earlier input
    for (size_t i = 0; i < parts.size(); ++i)
      fuzz::write_file(dir / (i == 0 ? std::string("model.safetensors.index.json")
                                     : "model-" + std::to_string(i) + ".safetensors"), parts[i]);
    fuzz::allow_project_errors([&] {
      const longctx::HfWeights w(dir.string());
      for (const auto& [name, t] : w.tensors()) {
        const longctx::HostTensor h = w.read(name);
        int64_t numel = 1;
        for (int64_t d : h.shape) numel *= d;
        fuzz::require(numel == static_cast<int64_t>(h.data.size()), "tensor size matches its shape");
      }
    });
    return 0;
  }
  const auto dir = fuzz::scratch_dir() / "ckpt";
  const auto& names = longctx::checkpoint_file_names();
  nlohmann::json manifest = {{"format", "longctx-checkpoint-1"}, {"step", data[0] / 3}, {"files", nlohmann::json::object()}};
  for (size_t i = 0; i < names.size() && i < parts.size(); ++i) {
    fuzz::write_file(dir / names[i], parts[i]);
    manifest["files"][names[i]] = {{"bytes", parts[i].size()}, {"crc32", longctx::crc32(parts[i].data(), parts[i].size())}};
  }
  if (mode == 2 && parts.size() > names.size())
    fuzz::write_file(dir / "MANIFEST.json", parts[names.size()]);
  else
    fuzz::write_file(dir / "MANIFEST.json", manifest.dump());
  fuzz::allow_project_errors([&] {
    const longctx::CheckpointFiles f = longctx::read_checkpoint_files(dir.string());
    fuzz::require(f.hf_config.is_object() || f.hf_config.is_null(), "config.json is an object (or absent: no_hf_config)");
    fuzz::require(f.train.optimizer_step >= 0 && f.train.optimizer_step <= f.train.state.step,
                  "0 <= optimizer_step <= step");
  });
  return 0;
}
