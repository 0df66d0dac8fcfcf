#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "core/cp_strategy.h"
#include "core/crc32.h"
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

std::unique_ptr<Device> make_run_device(const RunConfig& c) {
  KernelSet kernels = device_of(static_cast<const void*>(nullptr)).kernels();  // the calling thread's CPU device's (a test's pinned set)
  kernels.gemm_thread_count_independent = c.deterministic_across_thread_counts;
  return Device::make_cpu(std::move(kernels));
}

SystemSettings::SystemSettings(const RunConfig& c, Device& run_device)
    : threads_(omp_get_max_threads()),
      device_budget_(MemoryTracker::global().budget()),
      host_budget_(MemoryTracker::global().host_budget()),
      collective_timeout_seconds_(collective_timeout_seconds()),
      on_run_device_(run_device) {
  set_collective_timeout_seconds(static_cast<double>(c.collective_timeout_seconds));  // first: the one that can throw
  if (c.num_threads > 0) omp_set_num_threads(static_cast<int>(c.num_threads));
  MemoryTracker::global().set_budget(static_cast<size_t>(c.device_memory_budget));
  MemoryTracker::global().set_host_budget(static_cast<size_t>(c.host_memory_budget));
}

SystemSettings::~SystemSettings() {
  omp_set_num_threads(threads_);
  MemoryTracker::global().set_budget(device_budget_);
  MemoryTracker::global().set_host_budget(host_budget_);
  set_collective_timeout_seconds(collective_timeout_seconds_);
}

// ---- start-up checks ---------------------------------------------------------------

namespace {

// Runs check() on every rank, then the ranks compare: where it failed on
// any rank, every rank throws (that rank its own error, the others one
// naming `rule` and the ranks that broke it), so that no rank goes on into
// a collective a failed rank never joins.
void on_every_rank(const Communicator& world, const std::string& rule, const std::function<void()>& check) {
  std::exception_ptr error;
  try {
    check();
  } catch (const std::exception&) {
    error = std::current_exception();
  }
  std::vector<int64_t> failed(world.size(), 0);
  failed[world.rank()] = error ? 1 : 0;
  world.all_reduce_sum(failed.data(), failed.size());
  if (error) std::rethrow_exception(error);
  std::string ranks;
  for (int r = 0; r < world.size(); ++r)
    if (failed[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty()) throw ConfigError(rule + ": broken on rank(s) " + ranks + " (their messages say how)");
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every rank runs the same binary with the same config (but offload_dir): a
// rank started from another build or with other key=value arguments would
// compute something else, or wait in a collective the others never make.
void check_same_binary_and_config(const RunConfig& c, const Communicator& world) {
  static const uint32_t binary = [] {
    const std::string bytes = file_bytes("/proc/self/exe");
    return crc32(bytes.data(), bytes.size());
  }();
  RunConfig shared = c;
  shared.offload_dir.clear();  // a local spill directory: per host (or per rank) by design
  const std::string yaml = shared.to_yaml();
  const int64_t mine[2] = {binary, crc32(yaml.data(), yaml.size())};
  std::vector<int64_t> all(2 * world.size());
  world.all_gather(mine, all.data(), sizeof mine);
  std::string problems;
  for (int r = 1; r < world.size(); ++r)
    for (int x = 0; x < 2; ++x)
      if (all[2 * r + x] != all[x])
        problems += std::string(problems.empty() ? "" : "; ") + "rank " + std::to_string(r) + "'s " +
                    (x == 0 ? "binary (another build)" : "config (other key=value arguments or file)");
  if (!problems.empty())
    throw ConfigError("every rank must run the same longctx binary with the same config; rank 0's differs from " +
                      problems);
}

// checkpoint_dir: made and written by rank 0 (a regular file or a read-only
// filesystem is found now, not at the first save), and the same directory
// on every host: rank 0 writes the checkpoints every rank reads to resume,
// so they must live on a filesystem all hosts share.
void check_checkpoint_dir(const std::string& dir, const Communicator& world) {
  uint64_t token = 0;
  if (world.rank() == 0) token = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}() ^ uint64_t(::getpid());
  world.broadcast(&token, sizeof token, 0);
  char name[48];
  std::snprintf(name, sizeof name, ".longctx-shared-%016llx", static_cast<unsigned long long>(token));
  const fs::path marker = fs::path(dir) / name;
  const std::string text = std::string(name) + "\n";
  on_every_rank(world, "checkpoint_dir '" + dir + "' must be a directory rank 0 can write", [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir))
      throw ConfigError("checkpoint_dir '" + dir + "' cannot be made a directory (" +
                        (ec ? ec.message() : "a file of that name exists") + ")");
    std::FILE* f = std::fopen(marker.c_str(), "wb");
    const bool wrote = f && std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
    const int err = errno;
    if (f) std::fclose(f);
    if (!wrote) {
      fs::remove(marker, ec);
      throw ConfigError("checkpoint_dir '" + dir + "' is not writable (" + std::strerror(err) +
                        "): checkpoints could never be saved");
    }
  });
  struct RemoveMarker {  // on rank 0, once every rank has looked (the check below is collective), pass or fail
    const fs::path& marker;
    bool mine;
    ~RemoveMarker() {
      std::error_code ec;
      if (mine) fs::remove(marker, ec);
    }
  } remove_marker{marker, world.rank() == 0};
  on_every_rank(world,
                "checkpoint_dir '" + dir + "' must be the same directory on every host (a filesystem all hosts share: "
                "rank 0 writes the checkpoints, every rank reads them to resume)",
                [&] {
                  if (file_bytes(marker) != text)
                    throw ConfigError("checkpoint_dir '" + dir + "' on rank " + std::to_string(world.rank()) +
                                      " is not rank 0's: rank 0's marker " + marker.string() +
                                      " is not there (per-host local disks? checkpoints must live on a "
                                      "filesystem all hosts share)");
                });
}

}  // namespace

Trainer::Trainer(const RunConfig& config, const Mesh& mesh) : config_(config), mesh_(mesh), device_(make_run_device(config_)) {
  const SystemSettings settings(config_, *device_);
  const RunConfig& c = config_;
  const MeshShape want = c.mesh_shape(), got = mesh_.shape();
  if (want.dp != got.dp || want.fsdp != got.fsdp || want.cp != got.cp || want.ulysses != got.ulysses ||
      want.tp != got.tp || want.fsdp_over_context != got.fsdp_over_context)
    throw ConfigError("the mesh (" + got.to_string() + ") differs from the config's (" + want.to_string() + ")");
  // Start-up checks on every rank, before anything waits on another rank.
  const Communicator& world = mesh_.world();
  if (world.size() > 1) check_same_binary_and_config(c, world);
  if (c.enable_checkpointing) check_checkpoint_dir(c.checkpoint_dir, world);
  on_every_rank(world, "the data must be readable on every rank", [&] {
    data_ = std::make_unique<Dataset>(load_corpus(c), c.max_target_length, c.packing);
  });
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
  const SystemSettings settings(config_, *device_);
  const std::string& dir = config_.checkpoint_dir;
  std::FILE* warn = is_logger() ? stderr : nullptr;
  const std::vector<std::string> unfinished = step_dirs_without_manifest(dir);
  for (const std::string& path : unfinished)
    if (warn) std::fprintf(warn, "WARNING: ignoring %s: no MANIFEST.json, so not a complete checkpoint\n", path.c_str());
  const std::vector<std::string> found = checkpoints_newest_first(dir);
  // Every rank must see the same checkpoints (a per-host local disk would
  // not), or the ranks would load different ones, or wait for each other.
  std::string names;
  for (const std::string& path : found) names += path + "\n";
  int64_t lowest = crc32(names.data(), names.size()), highest = lowest;
  mesh_.world().all_reduce_min(&lowest, 1);
  mesh_.world().all_reduce_max(&highest, 1);
  if (lowest != highest)
    throw ConfigError("checkpoint_dir '" + dir + "' holds other checkpoints on some ranks than on others (this rank: " +
                      std::to_string(found.size()) + "): it must be the same directory on every host (a filesystem all "
                      "hosts share)");
  if (found.empty() && !unfinished.empty())
    throw DataError("checkpoint_dir '" + dir + "' holds step directories but no complete checkpoint (" +
                    unfinished.front() + " has no MANIFEST.json): refusing to start over from step 0 silently; "
                    "restore the checkpoint, or move those directories away to start a new run");
  // The newest one that loads: load_checkpoint checks sizes, checksums,
  // train_state.json, the model config and every tensor before it touches
  // the model, so a newer one failing any check is skipped loudly. Every
  // rank must take the same one: they agree after each try.
  std::string reasons;
  for (const std::string& path : found) {
    std::string why;
    try {
      state_ = load_checkpoint(path, *model_, *optimizer_);
    } catch (const DataError& e) {
      why = e.what();
    }
    int64_t failed = why.empty() ? 0 : 1;
    mesh_.world().all_reduce_max(&failed, 1);
    if (!failed) return path;
    if (why.empty()) why = "another rank could not load it (its message says why)";
    if (warn) std::fprintf(warn, "WARNING: skipping checkpoint %s: %s; trying an older one\n", path.c_str(), why.c_str());
    reasons += "\n  " + why;
  }
  if (!found.empty())
    throw DataError("no valid checkpoint in '" + dir + "': all " + std::to_string(found.size()) +
                    " complete ones fail their checks (refusing to start over silently):" + reasons);
  return "";
}

std::string Trainer::save() {
  const SystemSettings settings(config_, *device_);
  return save_checkpoint(config_.checkpoint_dir, *model_, *optimizer_, state_, config_, mesh_);
}

void Trainer::prune(int64_t good_step) {
  const SystemSettings settings(config_, *device_);
  if (mesh_.world_rank() == 0) prune_checkpoints(config_.checkpoint_dir, config_.max_num_checkpoints_to_keep, good_step);
}

StepMetrics Trainer::train_step() {
  const SystemSettings settings(config_, *device_);
  const RunConfig& c = config_;
  Timer timer;
  publish_step_position(StepPass::batch);
  const int64_t dp = c.mesh_shape().batch_slices();
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
    // Name exactly the values that are not finite (a finite loss with a NaN
    // gradient norm is what weights that diverged finitely give).
    std::string bad, fine;
    for (const auto& [name, value] : {std::pair<const char*, double>{"loss", loss},
                                      {"gradient norm", m.grad_norm},
                                      {"learning rate", m.learning_rate}}) {
      char one[64];
      std::snprintf(one, sizeof one, "%s %g", name, value);
      std::string& list = std::isfinite(value) ? fine : bad;
      list += (list.empty() ? "" : ", ") + std::string(one);
    }
    throw Error("step " + std::to_string(state_.step + 1) + ": non-finite " + bad +
                (fine.empty() ? "" : " (finite: " + fine + ")") +
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
  const SystemSettings settings(config_, *device_);
  const RunConfig& c = config_;
  const bool log = is_logger() && out;
  if (!c.resume && c.enable_checkpointing) {
    // A new run would overwrite its steps and prune the rest: another run's work.
    std::vector<std::string> there = checkpoints_newest_first(c.checkpoint_dir);
    for (const std::string& path : step_dirs_without_manifest(c.checkpoint_dir)) there.push_back(path);
    if (!there.empty())
      throw ConfigError("resume=false, but checkpoint_dir '" + c.checkpoint_dir + "' already holds " +
                        std::to_string(there.size()) + " checkpoint(s) (" + there.front() +
                        "): this run would overwrite and prune them. Use another checkpoint_dir, "
                        "resume=true to continue from them, or move them away");
  }
  bool resumed = false;
  if (c.resume) {
    std::string from = resume();
    resumed = !from.empty();
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
  // The newest checkpoint no step has run from yet (the resumed one, or the
  // last save), -1 if none: the one before it is never pruned.
  int64_t unproven = resumed ? state_.step : -1;
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
    if (metrics.is_open() && !(metrics << step_json(m) << "\n" << std::flush))
      throw DataError("metrics_file '" + c.metrics_file + "': writing step " + std::to_string(m.step) +
                      " failed (" + std::strerror(errno) + ")");
    // A step ran from the weights of the newest checkpoint, its loss and
    // gradient finite: only now may that checkpoint push older ones out.
    if (unproven >= 0) prune(unproven), unproven = -1;
    if (c.enable_checkpointing && c.checkpoint_period > 0 && m.step % c.checkpoint_period == 0) {
      last_path = save();
      last_saved = unproven = m.step;
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
