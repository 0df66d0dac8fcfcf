#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/memory.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "train/progress.h"

namespace longctx {

namespace fs = std::filesystem;

// ---- graceful stop ------------------------------------------------------------------

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

// Async-signal-safe: sets the flag, or on a second signal writes one line
// and exits without unwinding (a checkpoint being written stays a hidden
// temporary: never a "complete" one with files missing).
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    static const char msg[] = "longctx: second stop signal: exiting now, without a checkpoint\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  g_stop_signal = sig;
  static const char msg[] =
      "longctx: stop signal: finishing this step, then a checkpoint (send it again to exit at once)\n";
  (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // system calls (file writes, MPI's) resume after the handler
  sigemptyset(&sa.sa_mask);
  // SIGUSR1 too: Open MPI's mpiexec forwards it to every rank as is, while
  // on SIGTERM / SIGINT it kills the ranks 1 s after passing SIGTERM on.
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaddset(&sa.sa_mask, sig);
  for (int sig : {SIGTERM, SIGINT, SIGUSR1})
    if (::sigaction(sig, &sa, nullptr) != 0) throw Error(std::string("sigaction failed for ") + signal_name(sig));
}

int stop_signal_received() { return g_stop_signal; }

MeshShape mesh_shape_from_config(const RunConfig& c) {
  MeshShape s;
  s.dp = static_cast<int>(c.dp);
  s.cp = static_cast<int>(c.cp);
  s.ulysses = static_cast<int>(c.cp_strategy == CpStrategy::usp ? c.cp_ulysses : 1);
  s.tp = static_cast<int>(c.tp);
  s.fsdp = static_cast<int>(c.fsdp);
  s.fsdp_over_context = c.fsdp_over_context;
  return s;
}

ModelOptions model_options_from_config(const RunConfig& c, const Mesh& mesh) {
  ModelOptions o;
  o.remat = c.remat_policy;
  o.custom_save = c.remat_custom_save;
  o.custom_offload = c.remat_custom_offload;
  o.offload_target = c.offload_target;
  o.offload_dir = c.offload_dir;
  o.mask = c.mask();
  o.cp_strategy = c.strategy();
  o.mesh = &mesh;
  o.impl = c.attention_kernel;
  o.dtype = c.dtype;
  o.sequence_parallel = c.tp_sequence_parallel;
  o.layer_token_chunk = c.layer_token_chunk;
  o.parameter_tier = c.parameter_tier();
  return o;
}

void apply_system_settings(const RunConfig& c) {
  if (c.num_threads > 0) omp_set_num_threads(static_cast<int>(c.num_threads));
  set_gemm_thread_count_independent(c.deterministic_across_thread_counts);
  MemoryTracker::global().set_budget(static_cast<size_t>(c.device_memory_budget));
  MemoryTracker::global().set_host_budget(static_cast<size_t>(c.host_memory_budget));
  set_collective_timeout_seconds(static_cast<double>(c.collective_timeout_seconds));
}

Trainer::Trainer(const RunConfig& config, const Mesh& mesh) : config_(config), mesh_(mesh) {
  const RunConfig& c = config_;
  apply_system_settings(c);
  const MeshShape want = mesh_shape_from_config(c), got = mesh_.shape();
  if (want.dp != got.dp || want.fsdp != got.fsdp || want.cp != got.cp || want.ulysses != got.ulysses ||
      want.tp != got.tp || want.fsdp_over_context != got.fsdp_over_context)
    throw ConfigError("the mesh (" + got.to_string() + ") differs from the config's (" + want.to_string() + ")");
  data_ = std::make_unique<Dataset>(load_corpus(c), c.max_target_length, c.packing);
  const int cp = static_cast<int>(c.cp), ulysses = mesh_.shape().ulysses;
  layout_ = std::make_unique<CpLayout>(c.layout(),
                                       c.max_target_length, cp, ulysses);
  mask_ = c.mask();
  model_ = std::make_unique<LlamaModel>(c.model, model_options_from_config(c, mesh_),
                                        static_cast<uint64_t>(c.init_weights_seed));
  // Pretrained weights for a fresh run; resume() (run() calls it) replaces them with a checkpoint's.
  if (!c.load_parameters_path.empty()) load_hf_parameters(c.load_parameters_path, *model_);
  optimizer_ = std::make_unique<AdamW>(*model_, c, mesh_);
  state_.init_weights_seed = c.init_weights_seed;

  // MFU denominator: the given peak, or this rank's GEMM rate now in the run's dtype
  // (all ranks measure at once, so shared cores count as shared), averaged.
  peak_tflops_ = c.peak_tflops_per_device;
  if (peak_tflops_ <= 0) {
    mesh_.world().barrier();  // measure together, not beside a peer's set-up
    double gflops = measure_gemm_gflops(c.dtype, 1024, 0.3);
    mesh_.world().all_reduce_sum(&gflops, 1);
    gflops /= mesh_.shape().world();
    peak_tflops_ = gflops / 1e3;
  }
}

Trainer::~Trainer() = default;

bool Trainer::is_logger() const { return mesh_.world_rank() == 0; }

std::string Trainer::resume() {
  // The newest one that verifies; a corrupt newer one is skipped loudly (stderr).
  const std::string path = latest_valid_checkpoint(config_.checkpoint_dir, is_logger() ? stderr : nullptr);
  if (path.empty()) return "";
  state_ = load_checkpoint(path, *model_, *optimizer_);
  return path;
}

std::string Trainer::save() {
  return save_checkpoint(config_.checkpoint_dir, *model_, *optimizer_, state_, config_, mesh_);
}

StepMetrics Trainer::train_step() {
  const RunConfig& c = config_;
  Timer timer;
  publish_step_position(StepPass::batch);
  const int64_t dp = c.data_parallelism();
  LocalBatch batch = make_local_batch(*data_, state_.data_cursor, c.per_device_batch_size, dp, mesh_.data_rank(), *layout_,
                                      mesh_.cp_rank(), mask_);
  if (batch.global_target_tokens == 0) throw DataError("a global batch has no target tokens (all padding)");

  model_->zero_gradients();
  LossStats local = model_->forward_backward(batch.view(), 1.0f / static_cast<float>(batch.global_target_tokens));
  publish_step_position(StepPass::optimizer);  // the gradient reduction and the update
  double loss_sums[2] = {local.loss_sum, local.weight_sum};
  optimizer_->reduce_gradients(*model_, loss_sums);
  StepMetrics m;
  m.learning_rate = learning_rate_at(c, state_.step);
  m.grad_norm = optimizer_->gradient_norm(*model_);
  // Stop before the update: one non-finite value makes every weight NaN, and
  // the next checkpoint would save them and prune the good ones. Every rank
  // holds the same reduced values, so all stop together.
  if (const double loss = loss_sums[0] / loss_sums[1];
      !std::isfinite(loss) || !std::isfinite(m.grad_norm) || !std::isfinite(m.learning_rate)) {
    char what[160];
    std::snprintf(what, sizeof what, "loss %g, gradient norm %g, learning rate %g", loss, m.grad_norm, m.learning_rate);
    throw Error("step " + std::to_string(state_.step + 1) + ": non-finite " + what +
                "; training stopped before the update, no checkpoint written (resume from the last checkpoint, "
                "lower learning_rate or check the data)");
  }
  optimizer_->step(*model_, m.learning_rate, m.grad_norm);
  state_.step += 1;
  state_.data_cursor += c.per_device_batch_size * dp;

  m.step = state_.step;
  m.loss = loss_sums[0] / loss_sums[1];
  m.tokens = c.per_device_batch_size * dp * c.max_target_length;
  m.flops = step_flops(c.model, m.tokens, batch.global_unmasked_pairs);
  m.peak_memory_bytes = static_cast<int64_t>(MemoryTracker::global().peak_total());
  mesh_.world().all_reduce_max(&m.peak_memory_bytes, 1);
  m.seconds = timer.seconds();
  mesh_.world().all_reduce_max(&m.seconds, 1);  // the slowest rank sets the pace
  fill_rates(m, mesh_.shape().world(), peak_tflops_);
  return m;
}

void Trainer::run(std::FILE* out, std::FILE* progress) {
  const RunConfig& c = config_;
  const bool log = is_logger() && out;
  if (c.resume) {
    std::string from = resume();
    if (log && !from.empty())
      std::fprintf(out, "resumed from %s (step %lld, data cursor %lld)\n", from.c_str(),
                   static_cast<long long>(state_.step), static_cast<long long>(state_.data_cursor));
  }
  std::ofstream metrics;
  if (is_logger() && !c.metrics_file.empty()) {
    fs::path p(c.metrics_file);
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    metrics.open(p, std::ios::app);
    if (!metrics) throw ConfigError("metrics_file '" + c.metrics_file + "' cannot be opened for writing");
  }
  if (log) {
    std::fprintf(out, "model %lld parameters | mesh %s (%s, %s) | S=%lld x %lld seq/data rank | "
                 "%lld sequences per epoch | peak %.3f TFLOP/s/dev (%s)\n",
                 static_cast<long long>(c.model.num_parameters()), mesh_.shape().to_string().c_str(),
                 name_of(c.strategy()), name_of(layout_->kind()), static_cast<long long>(c.max_target_length),
                 static_cast<long long>(c.per_device_batch_size), static_cast<long long>(data_->num_sequences()),
                 peak_tflops_, c.peak_tflops_per_device > 0 ? "given" : "measured fp32 GEMM");
    std::fflush(out);
  }
  int64_t last_saved = -1;
  std::string last_path;
  ProgressReporter reporter(is_logger() ? c.progress_interval_seconds : 0, c.steps, c.model.num_layers,
                            mesh_.world_rank(), progress);
  while (state_.step < c.steps) {
    reporter.step_started(state_.step + 1);
    StepMetrics m = train_step();
    reporter.step_finished();
    if (log && (m.step % c.log_period == 0 || m.step == c.steps || m.step == 1)) {
      std::fprintf(out, "%s\n", step_line(m).c_str());
      std::fflush(out);
    }
    if (metrics.is_open()) metrics << step_json(m) << "\n" << std::flush;
    if (c.enable_checkpointing && c.checkpoint_period > 0 && m.step % c.checkpoint_period == 0) {
      last_path = save();
      last_saved = m.step;
    }
    // Every rank stops after the same step, whichever got the signal and
    // when: the signal number's maximum over the world (8 bytes a step, on
    // the world communicator, which the planner's per-axis bytes leave out
    // like the step time and peak memory maxima in train_step).
    int64_t stop = stop_signal_received();
    mesh_.world().all_reduce_max(&stop, 1);
    if (stop != 0 && state_.step < c.steps) {
      stopped_by_ = static_cast<int>(stop);
      break;
    }
  }
  if (c.enable_checkpointing && last_saved != state_.step) {
    last_path = save();
    if (log) std::fprintf(out, "checkpoint %s\n", last_path.c_str());
  }
  if (stopped_by_ && is_logger()) {
    std::fprintf(stderr, "longctx: stopped by %s after step %lld of %lld: %s\n", signal_name(stopped_by_),
                 static_cast<long long>(state_.step), static_cast<long long>(c.steps),
                 c.enable_checkpointing
                     ? ("checkpoint " + last_path + " written; run the same command again to resume").c_str()
                     : "no checkpoint (enable_checkpointing: false)");
    std::fflush(stderr);
  }
  if (log) {
    std::fprintf(out, "memory peaks (rank 0):\n%s\n", MemoryTracker::global().report().c_str());
    std::fflush(out);
  }
}

}  // namespace longctx
