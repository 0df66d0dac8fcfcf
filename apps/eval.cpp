// `mpiexec -n N longctx eval CONFIG.yml [key=value ...]`
// The loss of the model (load_parameters_path: a Hugging Face Llama
// directory or a longctx checkpoint) on held-out data by context position
// (src/train/eval.h): a table on stdout, eval_output (JSON) and a PNG beside
// it (scripts/plot_eval.py, Debian's matplotlib).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "plan/hardware.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/trainer.h"

namespace longctx {

namespace fs = std::filesystem;

const char* const kEvalUsage =
    "usage: mpiexec -n N longctx eval CONFIG.yml [key=value ...]\n"
    "  the loss by context position on held-out data, on the config's mesh and strategy\n"
    "  load_parameters_path=DIR   Hugging Face Llama directory or longctx checkpoint (step_N)\n"
    "  eval_steps=N eval_dataset_path=PATH eval_output=FILE.json eval_first_bucket=1024\n";

namespace {

// Every byte written and flushed, or a DataError naming the file and errno
// (a full disk, /dev/full, a file the system will not let us write).
void write_result(const fs::path& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0;
  const int err = errno;
  if (f && std::fclose(f) != 0) ok = false;
  if (!ok)
    throw DataError("eval_output '" + path.string() + "' could not be written (" + std::strerror(err) +
                    "): the table above has the numbers; name a writable file");
}

}  // namespace

int run_eval(const Args& args) {
  if (args.empty()) throw ConfigError(std::string("eval needs a config file\n") + kEvalUsage);
  RunConfig config = load_config(args[0], Args(args.begin() + 1, args.end()));
  if (!config.cp_strategy) throw ConfigError("eval needs a context_parallel_strategy (not auto)");
  apply_hf_model_config(config);
  validate_config(config, comm_world_size());
  Mesh mesh(config.mesh_shape());
  const fs::path json_path = eval_output_path(config);
  // Before the evaluation, not after it: a directory is no place for the result.
  if (fs::is_directory(json_path))
    throw ConfigError("eval_output '" + json_path.string() + "' is a directory; name a file for the JSON result");
  const EvalResult r = evaluate(config, mesh);
  if (mesh.world_rank() != 0) return 0;
  if (json_path.has_parent_path()) fs::create_directories(json_path.parent_path());
  std::printf("eval: %s on %lld sequences from #%lld of %s %s (S=%lld, %s, cp=%lld, tp=%lld, dp=%lld, fsdp=%lld)\n%s",
              r.weights.c_str(), static_cast<long long>(r.sequences), static_cast<long long>(r.first_sequence),
              name_of(config.dataset_type),
              config.dataset_type == DatasetType::synthetic ? "data"
              : config.eval_dataset_path.empty()            ? config.dataset_path.c_str()
                                                            : config.eval_dataset_path.c_str(),
              static_cast<long long>(config.max_target_length), name_of(config.strategy()),
              static_cast<long long>(config.cp), static_cast<long long>(config.tp), static_cast<long long>(config.dp), static_cast<long long>(config.fsdp),
              eval_table(r).c_str());
  write_result(json_path, eval_json(r, config));
  // The plot: best effort (matplotlib may be missing); the JSON is the result.
  const fs::path png = fs::path(json_path).replace_extension(".png");
  // Debian's python3 has matplotlib; a python3 earlier on PATH (a venv, pyenv) may not.
  const std::string command = "py=python3; python3 -c 'import matplotlib' 2>/dev/null || py=/usr/bin/python3; $py '" +
                              find_in_repository("scripts/plot_eval.py") + "' '" + json_path.string() + "' -o '" +
                              png.string() + "'";
  const bool plotted = std::system(command.c_str()) == 0;
  std::printf("wrote %s%s\n", json_path.c_str(),
              plotted ? (" and " + png.string()).c_str() : " (no plot: scripts/plot_eval.py failed, see above)");
  return 0;
}

}  // namespace longctx
