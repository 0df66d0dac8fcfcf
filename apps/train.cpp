// `mpiexec -n N longctx train CONFIG.yml [key=value ...]`
// Loads and checks the config on every rank (before any work), builds the
// mesh, and runs the Trainer (src/train/trainer.h).
#include <cstdio>

#include "apps/commands.h"
#include "core/config.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/cpu/select.h"
#include "kernels/gemm.h"
#include "plan/hardware.h"
#include "plan/measure.h"
#include "plan/planner.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace longctx {

const char* const kTrainUsage =
    "usage: mpiexec -n N longctx train CONFIG.yml [key=value ...]\n"
    "  CONFIG.yml   a recipe (e.g. configs/demo.yml); configs/base.yml lists every key\n"
    "  key=value    overrides, e.g. steps=100 ici_context_parallelism=4\n";

namespace {

// context_parallel_strategy=auto: the planner (src/plan) picks the strategy,
// the ulysses factor and (when nothing else fits) the remat policy for this
// machine's profile. Without configs/hardware/cpu-local.yml (`longctx plan
// --measure` writes it) every rank measures a quick one together, on the fly
// (a few seconds; not saved): a committed default would describe some other
// machine, and the choice hinges on this one's memory and compute/link ratios.
void resolve_auto_strategy(RunConfig& config, const Communicator& world) {
  const int rank = world.rank();
  HardwareProfile hw;
  std::string source = "cpu-local profile";
  // Every rank must take the same branch: the measurement is collective.
  int64_t have = 1;
  try {
    hw = load_hardware_profile("cpu-local");
  } catch (const ConfigError&) {
    have = 0;
  }
  world.all_reduce_min(&have, 1);
  if (!have) {
    if (rank == 0) {
      std::fprintf(stderr, "warning: context_parallel_strategy=auto: no cpu-local hardware profile in %s; "
                           "measuring a quick one now (run `mpiexec -n N longctx plan --measure` to save a "
                           "full one)\n", default_hardware_dir().c_str());
      std::fflush(stderr);
    }
    Timer t;
    hw = measure_cpu_local_profile(world, MeasureSize::quick);
    char buf[64];
    std::snprintf(buf, sizeof buf, "quick profile measured in %.1f s", t.seconds());
    source = buf;
  }
  if (const std::string w = hw.dtype_tables_warning(config.dtype); !w.empty() && rank == 0)
    std::fprintf(stderr, "warning: context_parallel_strategy=auto: %s\n", w.c_str());
  PlanOptions options;
  options.devices = world.size();
  PlanRecommendation r = recommend(config, hw, options);
  if (!r.found) throw ConfigError("context_parallel_strategy=auto: the planner found no configuration that fits: " + r.reason);
  const int64_t asked_tp = config.tp;
  config = r.config;
  if (rank == 0) {
    std::printf("auto: %s%s remat_policy=%s%s (%s)\n"
                "  why: %s\n",
                cp_strategy_settings(r.strategy, r.cp, r.ulysses).c_str(),
                r.tp == asked_tp ? "" : (" ici_tensor_parallelism=" + std::to_string(r.tp)).c_str(),
                name_of(r.remat_policy), r.levers.empty() ? "" : (", levers: " + r.levers).c_str(),
                source.c_str(), r.reason.c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int run_train(const Args& args) {
  if (args.empty()) throw ConfigError(std::string("train needs a config file\n") + kTrainUsage);
  // Here only, and first (a signal while loading or measuring stops after
  // the first step): other commands keep the default, ending at once.
  install_stop_signal_handlers();
  RunConfig config = load_config(args[0], Args(args.begin() + 1, args.end()));
  apply_hf_model_config(config);  // load_parameters_path's config.json: the model shape
  if (!config.cp_strategy) resolve_auto_strategy(config, Communicator::world("auto"));
  validate_config(config, comm_world_size());
  require_memory_fits(config, Communicator::world("memory check"));
  Mesh mesh(config.mesh_shape());
  if (config.dtype == DType::bf16 && comm_world_rank() == 0 && cpu_kernel_set().gemm_bf16_path() != Bf16GemmPath::native)
    std::fprintf(stderr, "note: dtype=bfloat16 here multiplies in fp32 (gemm_bf16: %s): bf16 halves activation "
                         "memory and bytes sent, but its GEMMs run at the float32 rate (plus widening their "
                         "operands), so steps gain only what moving fewer bytes gains\n",
                 gemm_bf16_implementation(2048).c_str());
  Trainer trainer(config, mesh);
  trainer.run(stdout);
  // Stopped early by a signal: non-zero, as a killed process would exit.
  return trainer.stopped_by_signal() ? 128 + trainer.stopped_by_signal() : 0;
}

}  // namespace longctx
