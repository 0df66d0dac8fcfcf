// `longctx plan CONFIG.yml [key=value ...] [--hardware NAME] [--devices N]
//               [--device-memory BYTES] [--json] [--longest [--granule N]]`
// `mpiexec -n 2 longctx plan --measure [--output PATH]`
// `mpiexec -n N longctx plan CONFIG.yml [key=value ...] --validate [--steps N] [--markdown FILE]`
//    runs real train steps and compares the predicted step time with them
//
// The planning itself is src/plan (pure arithmetic, and the measurement of
// the cpu-local profile in src/plan/measure.cpp); this file parses flags and prints.

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/config.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "plan/emit.h"
#include "plan/hardware.h"
#include "plan/measure.h"
#include "plan/planner.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace longctx {

namespace {

using nlohmann::json;

int run_measure(const std::string& output, MeasureSize size) {
  const Communicator world = Communicator::world("measure");
  const int rank = world.rank(), P = world.size();
  if (P < 2 && rank == 0)
    std::fprintf(stderr, "warning: plan --measure on one rank: no links to time (placeholders); the compute "
                         "numbers describe one-rank runs. Measure under `mpiexec -n N` for N-rank runs.\n");
  HardwareProfile h = measure_cpu_local_profile(world, size);
  if (rank == 0) {
    std::string path = output.empty() ? default_hardware_dir() + "/cpu-local.yml" : output;
    save_hardware_profile(h, path);
    std::printf("cpu-local profile written to %s\n", path.c_str());
    // The kernel tables of one dtype, over that dtype's GEMM rate.
    auto print_tables = [&](const char* dtype, double gemm, const KernelTables& t) {
      std::printf("  %s: GEMM %.1f GFLOP/s per rank; projections of width", dtype, gemm / 1e9);
      for (const auto& [w, e] : t.matmul_efficiency_per_width) std::printf(" %lld: %.0f%%", (long long)w, e * 100);
      std::printf("\n    attention at");
      for (const auto& [D, e] : t.attention_efficiency_per_head_dim) std::printf(" %.0f%% (D=%lld)", e * 100, (long long)D);
      std::printf(" of it (forward alone:");
      for (const auto& [D, e] : t.attention_forward_efficiency_per_head_dim) std::printf(" %.0f%%", e * 100);
      std::printf(")\n    partial %lldx%lld tiles cost, in full ones:", (long long)h.attention_block,
                  (long long)h.attention_block);
      for (const auto& [kind, by_dim] : t.attention_partial_tile_cost) {
        std::printf(" %s", kind.c_str());
        for (const auto& [D, c] : by_dim) std::printf(" %.2f", c);
      }
      std::printf("\n    elementwise kernels (GB/s):");
      for (const auto& [k, bw] : t.elementwise_bandwidth_per_kernel) std::printf(" %s %.1f", k.c_str(), bw / 1e9);
      std::printf("\n");
    };
    std::printf("  bf16 GEMM: %s\n", gemm_bf16_implementation(2048).c_str());
    print_tables("fp32", h.peak_flops_fp32, h);
    if (h.bf16) print_tables("bf16", h.peak_flops_bf16, *h.bf16);
    std::printf("  memory %.1f GB/s\n", h.memory_bandwidth / 1e9);
    std::printf("  p2p %.2f GB/s, latency %.1f us, all-to-all %.2f GB/s, all-gather %.2f GB/s per rank\n",
                h.p2p_bandwidth / 1e9, h.latency * 1e6, h.all_to_all_bandwidth / 1e9,
                h.collective_bandwidth / 1e9);
    if (h.inter_node_bandwidth > 0)
      std::printf("  between hosts (%lld rank(s) per host): %.3f GB/s each way, latency %.1f us; all-reduce %.3f, "
                  "all-gather %.3f, all-to-all %.3f GB/s per rank\n",
                  (long long)h.devices_per_node, h.inter_node_bandwidth / 1e9, h.inter_node_latency * 1e6,
                  h.inter_node_all_reduce_bandwidth / 1e9, h.inter_node_collective_bandwidth / 1e9,
                  h.inter_node_all_to_all_bandwidth / 1e9);
  }
  return 0;
}

// ---- printing -----------------------------------------------------------------------

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

json to_json(const StrategyPlan& p) {
  json j = {{"strategy", name_of(p.strategy)}, {"dp", p.dp}, {"fsdp", p.fsdp}, {"cp", p.cp}, {"ulysses", p.ulysses},
            {"ring", p.ring}, {"tp", p.tp}, {"remat_policy", name_of(p.remat_policy)}, {"valid", p.valid}};
  if (!p.valid) {
    j["invalid_reason"] = p.invalid_reason;
    return j;
  }
  json mem = json::array();
  for (const MemoryLine& m : p.memory)
    mem.push_back({{"category", mem_category_name(m.category)}, {"name", m.name}, {"bytes", m.bytes}});
  json comm = json::array();
  for (const CommLine& c : p.comm)
    comm.push_back({{"op", comm_op_name(c.op)}, {"axis", mesh_axis_name(c.axis)}, {"what", c.what}, {"calls", c.calls},
                    {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received},
                    {"seconds", c.seconds}, {"hidden_seconds", c.hidden_seconds}});
  j.update({{"memory", mem}, {"memory_total_bytes", p.memory_total},
            {"device_memory_bytes", p.device_memory}, {"fits", p.fits}, {"communication", comm},
            {"comm_bytes_sent", p.comm_bytes_sent}, {"model_flops", p.model_flops},
            {"hardware_flops", p.hardware_flops}, {"attention_pairs", p.attention_pairs},
            {"load_imbalance", p.load_imbalance}, {"compute_seconds", p.compute_seconds},
            {"matmul_seconds", p.matmul_seconds}, {"attention_seconds", p.attention_seconds},
            {"elementwise_seconds", p.elementwise_seconds},
            {"comm_seconds", p.comm_seconds}, {"hidden_comm_seconds", p.hidden_comm_seconds},
            {"step_seconds", p.step_seconds}, {"tokens_per_second_per_device", p.tokens_per_second},
            {"mfu", p.mfu}});
  if (p.offload_bytes > 0) {
    json off = json::array();
    for (const OffloadLine& m : p.offload_memory) off.push_back({{"tier", name_of(p.offload_target)}, {"name", m.name}, {"bytes", m.bytes}});
    j["offload"] = {{"target", name_of(p.offload_target)}, {"memory", off}, {"bytes", p.offload_bytes},
                    {"moved_bytes_per_step", p.offload_moved_bytes}, {"bandwidth", p.offload_bandwidth},
                    {"seconds", p.offload_seconds}, {"hidden_seconds", p.offload_hidden_seconds}};
  }
  if (p.state_offload_bytes > 0) {
    json st = json::array();
    for (const OffloadLine& m : p.state_offload) st.push_back({{"name", m.name}, {"bytes", m.bytes}});
    j["state_offload"] = {{"target", name_of(p.state_offload_target)}, {"memory", st}, {"bytes", p.state_offload_bytes},
                          {"moved_bytes_per_step", p.state_offload_moved_bytes},
                          {"bandwidth", p.state_offload_bandwidth},  // 0: the profile has none, seconds not counted
                          {"seconds", p.state_offload_seconds},
                          {"hidden_seconds", p.state_offload_hidden_seconds}};
  }
  if (!p.advice.empty()) j["advice"] = p.advice;
  return j;
}

std::string plan_label(const StrategyPlan& p) {
  return cp_strategy_label(p.strategy, p.cp, p.ulysses);
}

// The memory lines of one plan: device memory by tensor, what is offloaded, host-resident state.
void print_memory(const StrategyPlan& p) {
  for (const MemoryLine& m : p.memory)
    std::printf("   %-14s %-58s %12s\n", mem_category_name(m.category), m.name.c_str(),
                human_bytes(double(m.bytes)).c_str());
  if (p.offload_bytes > 0) {
    std::printf("   offloaded to %s (not device memory): %s; moved per step %s (written after forward, read "
                "before backward)",
                name_of(p.offload_target), human_bytes(double(p.offload_bytes)).c_str(),
                human_bytes(double(p.offload_moved_bytes)).c_str());
    if (p.offload_bandwidth > 0)
      std::printf(" at %s/s: %s, %s hidden behind compute\n", human_bytes(p.offload_bandwidth).c_str(),
                  seconds(p.offload_seconds).c_str(), seconds(p.offload_hidden_seconds).c_str());
    else
      std::printf(": the profile has no %s bandwidth, time not counted\n",
                  p.offload_target == OffloadTarget::host ? "host_link" : "disk");
    for (const OffloadLine& m : p.offload_memory)
      std::printf("   %-14s %-58s %12s\n", name_of(p.offload_target), m.name.c_str(), human_bytes(double(m.bytes)).c_str());
  }
  if (p.state_offload_bytes > 0) {
    const bool disk = p.state_offload_target == OffloadTarget::disk;
    std::printf("   state in %s (not device memory): %s; moved per step %s %s", disk ? "disk spill files" : "host memory",
                human_bytes(double(p.state_offload_bytes)).c_str(), disk ? "to and from disk" : "over the host link",
                human_bytes(double(p.state_offload_moved_bytes)).c_str());
    if (p.state_offload_bandwidth > 0)
      std::printf(": %s, %s hidden\n", seconds(p.state_offload_seconds).c_str(),
                  seconds(p.state_offload_hidden_seconds).c_str());
    else
      std::printf(": the profile has no %s bandwidth, time not counted\n", disk ? "disk" : "host_link");
    for (const OffloadLine& m : p.state_offload)
      std::printf("   %-14s %-58s %12s\n", name_of(p.state_offload_target), m.name.c_str(), human_bytes(double(m.bytes)).c_str());
  }
}

void print_text(const RunConfig& c, const PlanReport& r, double plan_seconds) {
  const StrategyPlan* any = nullptr;
  for (const StrategyPlan& p : r.candidates)
    if (p.valid) any = &p;
  std::printf("plan: %s, S=%lld x batch %lld, %s mask, %s layout, dtype %s, remat %s%s\n",
              c.model_name.empty() ? "model" : c.model_name.c_str(),
              (long long)c.max_target_length, (long long)c.per_device_batch_size,
              name_of(c.attention_type), name_of(c.layout()), name_of(c.dtype), name_of(c.remat_policy),
              c.shard_optimizer_over_data ? ", optimizer sharded over its replicas (ZeRO-1)" : "");
  if (any)
    std::printf("      %lld x %s (%s each): dp %lld x fsdp %lld%s x cp %lld x tp %lld\n\n", (long long)r.devices,
                r.hardware.c_str(), human_bytes(double(any->device_memory)).c_str(), (long long)any->dp,
                (long long)any->fsdp, c.fsdp_over_context ? " (parameters sharded over fsdp x cp)" : "",
                (long long)any->cp, (long long)any->tp);
  std::printf("%-12s %10s %6s %12s %10s %10s %10s %10s %8s %12s %6s\n", "strategy", "memory", "fits",
              "comm sent", "compute", "comm", "hidden", "step", "imbal.", "tok/s/dev", "MFU");
  for (const StrategyPlan& p : r.candidates) {
    if (!p.valid) {
      std::printf("%-12s %s\n", plan_label(p).c_str(), p.invalid_reason.c_str());
      continue;
    }
    std::printf("%-12s %10s %6s %12s %10s %10s %10s %10s %8.3f %12.1f %5.1f%%\n", plan_label(p).c_str(),
                human_bytes(double(p.memory_total)).c_str(), p.fits ? "yes" : "NO",
                human_bytes(double(p.comm_bytes_sent)).c_str(), seconds(p.compute_seconds).c_str(),
                seconds(p.comm_seconds).c_str(), seconds(p.hidden_comm_seconds).c_str(),
                seconds(p.step_seconds).c_str(), p.load_imbalance, p.tokens_per_second, p.mfu * 100);
  }
  for (const StrategyPlan& p : r.candidates) {
    if (!p.valid) continue;
    std::printf("\n-- %s: memory per device %s of %s%s\n", plan_label(p).c_str(),
                human_bytes(double(p.memory_total)).c_str(), human_bytes(double(p.device_memory)).c_str(),
                p.fits ? "" : (" -- does NOT fit; " + p.advice).c_str());
    print_memory(p);
    std::printf("   communication per device per step:\n");
    for (const CommLine& l : p.comm)
      std::printf("   %-14s %-8s %-38s %6lld calls  sent %10s  recv %10s  %9s%s\n", comm_op_name(l.op),
                  mesh_axis_name(l.axis), l.what.c_str(), (long long)l.calls,
                  human_bytes(double(l.bytes_sent)).c_str(), human_bytes(double(l.bytes_received)).c_str(),
                  seconds(l.seconds).c_str(), l.hidden_seconds > 0 ? " (overlapped)" : "");
    std::printf("   FLOPs per device: %.3g model, %.3g with remat; %lld attention pairs, imbalance %.3f\n",
                p.model_flops, p.hardware_flops, (long long)p.attention_pairs, p.load_imbalance);
  }
  const PlanRecommendation& rec = r.recommendation;
  std::printf("\nrecommendation: ");
  if (rec.found)
    std::printf("%s%s remat_policy=%s%s\n  why: %s\n", cp_strategy_settings(rec.strategy, rec.cp, rec.ulysses).c_str(),
                rec.tp == c.tp ? "" : (" ici_tensor_parallelism=" + std::to_string(rec.tp)).c_str(), name_of(rec.remat_policy), rec.levers.empty() ? "" : ("\n  memory levers: " + rec.levers).c_str(),
                rec.reason.c_str());
  else
    std::printf("none: %s\n", rec.reason.c_str());
  for (size_t i = 0; i < rec.runners_up.size(); ++i)
    std::printf("  %zu. %s\n", i + 2, rec.runners_up[i].c_str());
  std::printf("(planned in %.3f s)\n", plan_seconds);
}

// `--longest`: the length, the memory at it and at one granule more, the breakdown.
int print_longest(const RunConfig& c, const LongestLength& r, bool as_json) {
  const StrategyPlan& p = r.plan;
  const int64_t next_length = r.length + r.granule;
  if (as_json) {
    json j = {{"granule", r.granule}, {"longest_max_target_length", r.length}, {"plan", to_json(p)},
              {"host_pool_bytes", host_pool_bytes(p)},
              {"next", {{"max_target_length", next_length}, {"memory_total_bytes", r.next.memory_total},
                        {"host_pool_bytes", host_pool_bytes(r.next)}, {"fits", r.next.fits}}}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("longest: %s cp=%lld x tp %lld (dp %lld, fsdp %lld), remat %s, %s mask, dtype %s\n",
              plan_label(p).c_str(), (long long)p.cp, (long long)p.tp, (long long)p.dp, (long long)p.fsdp,
              name_of(p.remat_policy), name_of(c.attention_type), name_of(c.dtype));
  auto pool = [&](const StrategyPlan& q) {
    const int64_t host = host_pool_bytes(q);
    return host > 0 ? ", host pool " + human_bytes(double(host)) +
                          (c.host_memory_budget > 0 ? " of " + human_bytes(double(c.host_memory_budget)) : "")
                    : std::string();
  };
  if (r.length == 0) {
    std::printf("  nothing fits: one granule (%lld tokens) needs %s of %s%s\n", (long long)r.granule,
                human_bytes(double(p.memory_total)).c_str(), human_bytes(double(p.device_memory)).c_str(),
                pool(p).c_str());
    print_memory(p);
    return 0;
  }
  std::printf("  max_target_length=%lld (a multiple of %lld): %s of %s device memory%s\n", (long long)r.length,
              (long long)r.granule, human_bytes(double(p.memory_total)).c_str(),
              human_bytes(double(p.device_memory)).c_str(), pool(p).c_str());
  std::printf("  at %lld: %s%s, does not fit\n", (long long)next_length,
              human_bytes(double(r.next.memory_total)).c_str(), pool(r.next).c_str());
  std::printf("  predicted step %s (compute %s, exposed communication and moves %s), %.1f tok/s/dev\n",
              seconds(p.step_seconds).c_str(), seconds(p.compute_seconds).c_str(),
              seconds(p.step_seconds - p.compute_seconds).c_str(), p.tokens_per_second);
  std::printf("\nmemory per device at max_target_length=%lld:\n", (long long)r.length);
  print_memory(p);
  return 0;
}

// ---- validating the time model against real steps --------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `steps` real training steps (after one warm-up) of the config on this
// launch's ranks and prints the planner's predicted step time beside the
// measured median (the slowest rank's), with both breakdowns. With
// `markdown`, rank 0 appends one table row to that file.
int run_validate(RunConfig config, const HardwareProfile& hw, int64_t steps, const std::string& markdown) {
  const int rank = comm_world_rank(), world = comm_world_size();
  config.steps = steps + 1;
  config.enable_checkpointing = false;
  config.metrics_file = "";
  if (config.peak_tflops_per_device <= 0) config.peak_tflops_per_device = hw.peak_flops(config.dtype) / 1e12;
  validate_config(config, world);
  PlanOptions options;
  options.devices = world;
  const StrategyPlan plan = plan_strategy(config, hw, options);
  if (!plan.valid) throw ConfigError("plan --validate: " + plan.invalid_reason);
  Mesh mesh(config.mesh_shape());
  Trainer trainer(config, mesh);
  trainer.train_step();  // warm-up: workspace allocation, first touch
  std::vector<double> seconds;
  StepProfile sum;
  double comm_wait = 0;  // seconds blocked in communication waits: the exposed communication, measured
  for (int64_t i = 0; i < steps; ++i) {
    const double waited = mesh.total_counters().wait_seconds();
    seconds.push_back(trainer.train_step().seconds);
    comm_wait += mesh.total_counters().wait_seconds() - waited;
    const StepProfile& p = trainer.model().last_step_profile();
    sum.matmul += p.matmul, sum.attention += p.attention, sum.loss += p.loss;
    sum.elementwise += p.elementwise, sum.tp_comm += p.tp_comm;
  }
  const double measured = median(seconds), n = double(steps);
  const double err = (plan.step_seconds - measured) / measured;
  if (rank != 0) return 0;
  const std::string label = cp_strategy_label(plan.strategy, plan.cp, plan.ulysses);
  const char* name = label.c_str();
  std::printf("validate: %d rank(s), %s, %s cp=%lld, S=%lld B=%lld, remat %s, %s mask\n", world,
              name_of(config.dtype), name, (long long)plan.cp, (long long)config.max_target_length, (long long)config.per_device_batch_size,
              name_of(config.remat_policy), name_of(config.attention_type));
  std::printf("  predicted %.3f s/step: matmul %.3f, attention %.3f, elementwise %.3f, exposed comm %.3f\n",
              plan.step_seconds, plan.matmul_seconds, plan.attention_seconds, plan.elementwise_seconds,
              plan.comm_seconds - plan.hidden_comm_seconds);
  // The rest of the step: the optimizer, gradient all-reduce, data, waiting for the slowest rank.
  double mean = 0;
  for (double t : seconds) mean += t / n;
  const double rest = mean - sum.total() / n;
  std::printf("  measured  %.3f s/step (median of %lld; rank 0 means: matmul %.3f, attention+its comm %.3f, "
              "loss head %.3f, elementwise %.3f, tp %.3f, rest of the step %.3f; blocked in comm waits %.3f)\n",
              measured, (long long)steps, sum.matmul / n, sum.attention / n, sum.loss / n, sum.elementwise / n,
              sum.tp_comm / n, rest, comm_wait / n);
  std::printf("  predicted / measured - 1 = %+.1f%%\n", err * 100);
  if (config.packing)
    std::printf("  note: packing=true: packed documents skip the attention across document boundaries, which the plan\n"
                "  (every sequence one document) counts; the prediction is an upper bound. Compare with packing=false.\n");
  if (!markdown.empty()) {
    std::ofstream f(markdown, std::ios::app);
    if (!f) throw ConfigError("plan --validate: cannot append to " + markdown);
    char row[512];
    std::snprintf(row, sizeof row,
                  "| %d | %s | %s | %lldx%lldx%lld | %s | %lld | %lld | %s | %s | %.3f | %.3f | %+.1f%% | %.2f / %.2f / %.2f / %.2f | %.2f / %.2f / %.2f / %.2f |\n",
                  world, config.model_name.c_str(), name_of(config.dtype), (long long)plan.dp, (long long)plan.cp, (long long)plan.tp, name,
                  (long long)config.max_target_length, (long long)config.per_device_batch_size,
                  name_of(config.remat_policy),
                  (name_of(config.attention_type) + (config.attention_type == MaskKind::local ? " " + std::to_string(config.sliding_window_size) : "")).c_str(),
                  plan.step_seconds, measured,
                  err * 100, plan.matmul_seconds, plan.attention_seconds, plan.elementwise_seconds,
                  plan.comm_seconds - plan.hidden_comm_seconds, (sum.matmul + sum.loss) / n, sum.attention / n,
                  sum.elementwise / n, sum.tp_comm / n + rest);
    f << row;
  }
  return 0;
}

}  // namespace

const char* const kPlanUsage =
    "usage: longctx plan CONFIG.yml [key=value ...] [--hardware NAME] [--devices N]\n"
    "         [--device-memory BYTES] [--json] [--longest [--granule N]] [--emit maxtext|megatron|torchtitan]\n"
    "       mpiexec -n N longctx plan CONFIG.yml [key=value ...] --validate [--steps N] [--markdown FILE]\n"
    "       mpiexec -n N longctx plan --measure [--output FILE] [--quick | --smoke]\n"
    "  --hardware NAME   configs/hardware/NAME.yml (default cpu-local; tpu-v5p, tpu-v7, h100, h200)\n"
    "  --devices N       devices to plan for (default: the config's mesh, which must fill them;\n"
    "                    ici_data_parallelism=-1 or ici_fsdp_parallelism=-1 takes what is left)\n"
    "  --longest         the longest max_target_length (a multiple of --granule, default 1024) at which\n"
    "                    exactly this config fits device memory (and host_memory_budget), and the memory there\n"
    "  --emit FRAMEWORK  recommend the fastest plan that framework runs on this hardware, print how much\n"
    "                    faster longctx's own best would be and why, then the plan as MaxText's YAML\n"
    "                    keys, Megatron-Core's flags or TorchTitan's command line (src/plan/emit.h)\n"
    "  --validate        run real training steps and compare them with the prediction\n"
    "  --measure         measure this machine's profile (GEMM, bandwidths, MPI links)\n"
    "  --quick           with --measure: smaller sizes and fewer repeats (what train's auto does; seconds)\n"
    "  --smoke           with --measure: the smallest sizes, once each: proves every measurement runs on\n"
    "                    this CPU (CI under emulation); its numbers are no profile to plan a run with\n";

int run_plan(const Args& args) {
  std::string config_path, hardware = "cpu-local", output;
  std::vector<std::string> overrides;
  PlanOptions options;
  bool as_json = false, measure = false, validate = false, longest = false;
  int64_t granule = 1024;
  int64_t steps = 3;
  bool quick = false, smoke = false;
  std::string markdown;
  std::optional<Framework> emit;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw ConfigError("plan: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--json") as_json = true;
    else if (a == "--longest") longest = true;
    else if (a == "--granule") granule = parse_int_flag("plan", a, value(), 1);
    else if (a == "--measure") measure = true;
    else if (a == "--quick") quick = true;
    else if (a == "--smoke") smoke = true;
    else if (a == "--output") output = value();
    else if (a == "--validate") validate = true;
    else if (a == "--steps") steps = parse_int_flag("plan", a, value(), 1);
    else if (a == "--markdown") markdown = value();
    else if (a == "--emit") options.framework = emit = parse_enum<Framework>(value());
    else if (a == "--hardware") hardware = value();
    else if (a == "--devices") options.devices = parse_int_flag("plan", a, value(), 1);
    else if (a == "--device-memory") options.device_memory = parse_bytes(value());
    else if (a.rfind("--", 0) == 0)
      throw ConfigError("plan: unknown flag '" + a + "'\n" + kPlanUsage);
    else if (a.find('=') != std::string::npos) overrides.push_back(a);
    else if (config_path.empty()) config_path = a;
    else throw ConfigError("plan: unexpected argument '" + a + "'");
  }
  if ((quick || smoke) && !measure) throw ConfigError("plan: --quick and --smoke apply to --measure only");
  if (quick && smoke) throw ConfigError("plan: --quick or --smoke, not both");
  if (emit && (measure || validate || longest)) throw ConfigError("plan: --emit prints a recommendation; not with --measure, --validate or --longest");
  if (measure) return run_measure(output, smoke ? MeasureSize::smoke : quick ? MeasureSize::quick : MeasureSize::full);
  if (config_path.empty())
    throw ConfigError(std::string("plan needs a config file\n") + kPlanUsage);
  if (validate)
    return run_validate(load_config(config_path, overrides), load_hardware_profile(hardware), steps, markdown);
  if (comm_world_rank() != 0) return 0;  // pure arithmetic: one rank prints
  Timer t;
  RunConfig config = load_config(config_path, overrides);
  HardwareProfile hw = load_hardware_profile(hardware);
  if (const std::string w = hw.dtype_tables_warning(config.dtype); !w.empty())
    std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (longest) return print_longest(config, longest_length(config, hw, options, granule), as_json);
  PlanReport report = make_plan(config, hw, options);
  double elapsed = t.seconds();
  const PlanRecommendation& recommended = report.recommendation;
  if (emit && !recommended.found)
    throw ConfigError("plan --emit: no plan fits (" + recommended.reason + "), so there is nothing to emit");
  const std::string settings = emit ? emit_settings(recommended.config, report.devices, hw.platform, *emit) : "";
  if (as_json) {
    json j;
    j["hardware"] = report.hardware;
    j["devices"] = report.devices;
    j["max_target_length"] = config.max_target_length;
    j["per_device_batch_size"] = config.per_device_batch_size;
    j["attention_type"] = name_of(config.attention_type);
    j["sliding_window_size"] = config.sliding_window_size;
    const LlamaConfig& m = config.model;
    j["model"] = {{"d_model", m.d_model}, {"num_layers", m.num_layers}, {"num_heads", m.num_heads},
                  {"num_kv_heads", m.num_kv_heads}, {"head_dim", m.head_dim}, {"mlp_dim", m.mlp_dim},
                  {"vocab_size", m.vocab_size}};
    j["candidates"] = json::array();
    for (const StrategyPlan& p : report.candidates) j["candidates"].push_back(to_json(p));
    const PlanRecommendation& rec = report.recommendation;
    j["recommendation"] = {{"found", rec.found}, {"reason", rec.reason}};
    if (rec.found)
      j["recommendation"].update({{"strategy", name_of(rec.strategy)}, {"cp", rec.cp}, {"ulysses", rec.ulysses}, {"tp", rec.tp},
                                  {"remat_policy", name_of(rec.remat_policy)},
                                  {"shard_optimizer_over_data", rec.shard_optimizer_over_data},
                                  {"levers", rec.levers}, {"runners_up", rec.runners_up},
                                  {"plan", to_json(rec.plan)}});
    j["plan_seconds"] = elapsed;
    if (emit) {
      j["emit"] = settings;
      j["framework"] = name_of(*emit);
      j["recommendation"]["framework_gap"] = rec.framework_gap;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_text(config, report, elapsed);
    if (emit) {
      std::printf("\n%s runs this plan%s\n", name_of(*emit),
                  recommended.framework_gap.empty() ? ": longctx's own best, or one within 1% of it" : ("; " + recommended.framework_gap).c_str());
      std::printf("\n%s", settings.c_str());
    }
  }
  return 0;
}

}  // namespace longctx
