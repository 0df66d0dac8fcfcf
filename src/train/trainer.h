#pragma once
// The training loop: data -> forward/backward -> gradient reduction over the
// parameter replicas (dp x cp) -> global-norm clipping -> AdamW (the last
// three in AdamW, src/train/optimizer.h), with step metrics, periodic
// checkpoints and resume.
//
//   Mesh mesh(MeshShape{dp, cp, ulysses, tp});       // or Mesh::single(): one process, no MPI
//   Trainer trainer(config, mesh);                    // config already validated
//   trainer.run();                                    // or trainer.train_step() in a loop
//
// Gradients: each rank's forward_backward is scaled by 1 / (target tokens of
// the GLOBAL batch), then summed over mesh.replicas(): the mean loss's
// gradient, whatever the dp and cp sizes. With shard_optimizer_over_data
// (ZeRO-1) the sum is a reduce-scatter: each replica gets only its piece
// (AdamW::piece()), computes the global norm from the pieces (all-reduced
// over the replicas, then over tp), clips and updates that piece with its
// share of the moments, and all-gathers the updated pieces. Same config + seed + mesh + thread
// count gives bit-identical losses (no atomics, fixed reduction order); across thread counts
// the model's oneDNN GEMMs round differently (README, "Determinism").
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "comm/mesh.h"
#include "core/config.h"
#include "cp/layout.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "core/device.h"
#include "train/data.h"
#include "train/metrics.h"
#include "train/optimizer.h"

namespace longctx {

ModelOptions model_options_from_config(const RunConfig& config, const Mesh& mesh);
// The CPU device a config runs on: this CPU's kernel set with the run's own
// kernel settings (the thread-count-independent GEMMs). Whoever runs a
// config owns one (the Trainer, evaluate()), made before anything that
// allocates on it and ended after.
std::unique_ptr<Device> make_run_device(const RunConfig& config);

// The config's process-wide switches (num_threads, device_memory_budget,
// host_memory_budget, collective_timeout_seconds) and its run device as the
// calling thread's current one (a DeviceScope), set while this lives, and
// what was set before back when it ends. The owner of a run holds one for
// each call that runs the config, not for the run's lifetime: runs one after
// another in a process (tests, a sweep) never inherit each other's switches,
// and two runs alive at once in one thread (a test comparing them) each step
// with their own switches on their own device, whichever of them ends first.
class SystemSettings {
 public:
  SystemSettings(const RunConfig& config, Device& run_device);
  ~SystemSettings();
  SystemSettings(const SystemSettings&) = delete;
  SystemSettings& operator=(const SystemSettings&) = delete;

 private:
  int threads_;
  size_t device_budget_, host_budget_;
  double collective_timeout_seconds_;
  DeviceScope on_run_device_;
};

// Graceful stop. The train command installs handlers for SIGTERM, SIGINT
// and SIGUSR1: the first one makes Trainer::run finish the current step on
// every rank (the ranks agree on the step through one small all-reduce over
// the world per step), write a checkpoint and return with
// stopped_by_signal() set; a second one exits at once (_exit(128 + signal),
// no checkpoint). The handlers only set a sig_atomic_t flag.
void install_stop_signal_handlers();
// The first stop signal this process received, 0 if none.
int stop_signal_received();

class Trainer {
 public:
  // Builds data, model (seeded init, or the weights of load_parameters_path,
  // whose config.json apply_hf_model_config has applied) and optimizer;
  // each call below holds the system settings (SystemSettings). Does not
  // resume: run() does, or call resume() yourself (a checkpoint then
  // replaces the loaded weights).
  // `mesh` must outlive the Trainer and match the config's shape.
  Trainer(const RunConfig& config, const Mesh& mesh);
  ~Trainer();

  // Loads the latest complete checkpoint in checkpoint_dir, if any; returns its path or "".
  std::string resume();
  // One optimizer step on the next global batch.
  StepMetrics train_step();
  // resume (if config.resume), train to config.steps printing step lines on
  // rank 0 to `out`, JSON lines to metrics_file, checkpoints every
  // checkpoint_period steps and at the end, then the memory report. After a
  // stop signal (any rank's) every rank stops after the same step, with the
  // checkpoint and a line on stderr (rank 0), and stopped_by_signal() says
  // which signal.
  // While a step runs, rank 0 prints its position (layer, pass) to `progress`
  // every progress_interval_seconds (src/train/progress.h).
  void run(std::FILE* out = stdout, std::FILE* progress = stderr);
  int stopped_by_signal() const { return stopped_by_; }
  std::string save();  // a checkpoint of the current state (prunes nothing)
  // Prunes to max_num_checkpoints_to_keep, deleting only checkpoints older
  // than step good_step (one a finite step has run from). run() calls it:
  // until a step has run from the newest save, the one before it stays too.
  void prune(int64_t good_step);

  int64_t step() const { return state_.step; }
  int64_t data_cursor() const { return state_.data_cursor; }
  LlamaModel& model() { return *model_; }
  const RunConfig& config() const { return config_; }
  const AdamW& optimizer() const { return *optimizer_; }
  double peak_tflops_per_device() const { return peak_tflops_; }

 private:
  bool is_logger() const;
  RunConfig config_;
  const Mesh& mesh_;
  std::unique_ptr<Device> device_;  // before every member that allocates on it
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<CpLayout> layout_;
  MaskSpec mask_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  TrainState state_;
  double peak_tflops_ = 0;
  int stopped_by_ = 0;
};

}  // namespace longctx
