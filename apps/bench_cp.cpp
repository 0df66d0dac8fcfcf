// `longctx bench cp`: context-parallel attention (forward + backward) over the
// job's ranks, against the same problem on one rank measured in the same run.
// Prints per rank: forward and backward seconds, exposed communication
// (seconds blocked in communicator waits), bytes sent/received, unmasked
// pairs of its queries, peak tracked memory; then parallel efficiency
// t(1 rank) / (N * t(N ranks)) and memory ratios.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <ctime>

#include "apps/commands.h"
#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "core/timer.h"
#include "cp/cp_attention.h"
#include "cp/layout.h"

namespace longctx {

const char* const kBenchCpUsage =
    "usage: mpiexec -n N longctx bench cp --strategy all_gather|ulysses|ring|usp [--ulysses U]\n"
    "         [--layout contiguous|zigzag] [--batch B] [--seq S] [--heads H] [--kv-heads G]\n"
    "         [--head-dim D] [--mask full|causal|local:W|chunked:C[+segments]] [--doc-len N]\n"
    "         [--threads T] [--ring-chunk-tokens C] [--repeat N] [--no-single] [--json]\n"
    "  defaults: zigzag, B=1 S=16384 H=4 G=H D=128 causal, 1 thread per rank,\n"
    "  usp ulysses = 2; documents of --doc-len tokens (default S/4) for +segments;\n"
    "  --ring-chunk-tokens 0 = automatic (cp_ring_auto_chunk_tokens, the default);\n"
    "  --repeat N runs N steps\n"
    "  (and N 1-rank steps) and keeps the fastest, for a machine shared with others\n";

namespace {

struct BenchFlags {
  std::string strategy, layout = "zigzag", mask = "causal";
  int ulysses = 0, threads = 1, repeat = 1;
  int64_t batch = 1, seq = 16384, heads = 4, kv_heads = 0, head_dim = 128, doc_len = 0;
  int64_t ring_chunk_tokens = CpOptions{}.ring_chunk_tokens;
  bool json = false, single = true;
};

int64_t positive(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    long long x = std::stoll(v, &used);
    if (used == v.size() && x > 0) return x;
  } catch (...) {
  }
  throw ConfigError("bench cp: " + flag + " expects a positive integer, got '" + v + "'");
}

BenchFlags parse(const Args& args) {
  BenchFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") { f.json = true; continue; }
    if (a == "--no-single") { f.single = false; continue; }
    if (i + 1 >= args.size()) throw ConfigError("bench cp: unknown flag or missing value: " + a + "\n" + kBenchCpUsage);
    const std::string& v = args[++i];
    if (a == "--strategy") f.strategy = v;
    else if (a == "--layout") f.layout = v;
    else if (a == "--mask") f.mask = v;
    else if (a == "--ulysses") f.ulysses = static_cast<int>(positive(a, v));
    else if (a == "--threads") f.threads = static_cast<int>(positive(a, v));
    else if (a == "--batch") f.batch = positive(a, v);
    else if (a == "--seq") f.seq = positive(a, v);
    else if (a == "--heads") f.heads = positive(a, v);
    else if (a == "--kv-heads") f.kv_heads = positive(a, v);
    else if (a == "--head-dim") f.head_dim = positive(a, v);
    else if (a == "--doc-len") f.doc_len = positive(a, v);
    else if (a == "--ring-chunk-tokens") f.ring_chunk_tokens = v == "0" ? 0 : positive(a, v);
    else if (a == "--repeat") f.repeat = static_cast<int>(positive(a, v));
    else throw ConfigError("bench cp: unknown flag " + a);
  }
  if (f.strategy.empty()) throw ConfigError(std::string("bench cp: --strategy is required\n") + kBenchCpUsage);
  if (f.kv_heads == 0) f.kv_heads = f.heads;
  if (f.doc_len == 0) f.doc_len = std::max<int64_t>(1, f.seq / 4);
  return f;
}

// Forward + backward of `attention` on this rank's tokens, timed; with
// f.repeat > 1 the fastest of f.repeat steps (the slowest rank's time
// decides, so every rank keeps the same step). Peak memory covers them all.
struct StepResult {
  double forward = 0, backward = 0, exposed = 0;
  double cpu = 0;  // process CPU seconds of forward + backward (steadier on a shared machine)
  int64_t sent = 0, received = 0;
  size_t peak = 0;
};

StepResult run_step(CpAttention& attention, const Mesh* mesh, const BenchFlags& f,
                    const std::vector<int64_t>& pos, const std::vector<int32_t>& seg, int64_t L,
                    uint64_t seed) {
  const int64_t B = f.batch, H = f.heads, G = f.kv_heads, D = f.head_dim;
  MemoryTracker& mt = MemoryTracker::global();
  mt.reset_peaks();
  const size_t base = mt.current_total();
  Tensor q({B, L, H, D}, DType::f32, MemCategory::activations, "bench q");
  Tensor k({B, L, G, D}, DType::f32, MemCategory::activations, "bench k");
  Tensor v({B, L, G, D}, DType::f32, MemCategory::activations, "bench v");
  Tensor o({B, L, H, D}, DType::f32, MemCategory::activations, "bench o");
  Tensor lse({B, L, H}, DType::f32, MemCategory::activations, "bench lse");
  Tensor dout({B, L, H, D}, DType::f32, MemCategory::gradients, "bench dout");
  Tensor dq({B, L, H, D}, DType::f32, MemCategory::gradients, "bench dq");
  Tensor dk({B, L, G, D}, DType::f32, MemCategory::gradients, "bench dk");
  Tensor dv({B, L, G, D}, DType::f32, MemCategory::gradients, "bench dv");
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (Tensor* t : {&q, &k, &v, &dout})
    for (int64_t i = 0; i < t->numel(); ++i) t->f32()[i] = u(rng);
  AttentionArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.q_pos = a.kv_pos = pos.data();
  a.q_seg = a.kv_seg = seg.data();
  a.mask = MaskSpec::parse(f.mask);
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  StepResult r;
  double best = 0;
  for (int rep = 0; rep < f.repeat; ++rep) {
    if (mesh) {
      mesh->cp().barrier();
      mesh->reset_counters();
    }
    StepResult x;
    const double cpu0 = cpu_now();
    Timer t;
    attention.forward(a, o.view(), lse.f32());
    x.forward = t.seconds();
    t.reset();
    attention.backward(a, o.view(), lse.f32(), dout.view(), dq.view(), dk.view(), dv.view());
    x.backward = t.seconds();
    x.cpu = cpu_now() - cpu0;
    double step = x.forward + x.backward;
    if (mesh) {
      CommCounters c = mesh->total_counters();
      x.exposed = c.wait_seconds();
      x.sent = c.bytes_sent();
      x.received = c.bytes_received();
      mesh->world().all_reduce_max(&step, 1);
    }
    if (rep == 0 || step < best) {
      best = step;
      r = x;
    }
  }
  r.peak = mt.peak_total() - base;
  return r;
}

}  // namespace

int run_bench_cp(const Args& args) {
  BenchFlags f = parse(args);
  const int world = comm_world_size(), rank = comm_world_rank();
  CpStrategy strategy = parse_enum<CpStrategy>(f.strategy);
  const CpStrategyInfo& info = cp_strategy_info(strategy);
  int ulysses = 1;  // the mesh's split of cp (the strategies that take it)
  if (info.takes_usp_factor) ulysses = f.ulysses ? f.ulysses : (world % 2 == 0 ? 2 : 1);
  const std::string split_rule = usp_factor_rule(strategy, world, f.ulysses ? f.ulysses : ulysses);
  if (!split_rule.empty()) throw ConfigError("bench cp: --ulysses: " + split_rule);
  omp_set_num_threads(f.threads);
  Mesh mesh(1, world, ulysses, 1);
  CpLayout layout(parse_enum<LayoutKind>(f.layout), f.seq, world, ulysses);
  const MaskSpec mask = MaskSpec::parse(f.mask);

  // Global positions and segments: documents of doc_len tokens with positions
  // restarting, or one sequence.
  const int64_t B = f.batch, S = f.seq, L = layout.local_len();
  std::vector<int64_t> gpos(B * S);
  std::vector<int32_t> gseg(B * S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i) {
      gpos[b * S + i] = mask.same_segment ? i % f.doc_len : i;
      gseg[b * S + i] = static_cast<int32_t>(mask.same_segment ? i / f.doc_len : 0);
    }
  std::vector<int64_t> pos(B * L);
  std::vector<int32_t> seg(B * L);
  layout.shard(mesh.cp_rank(), gpos.data(), pos.data(), B);
  layout.shard(mesh.cp_rank(), gseg.data(), seg.data(), B);
  auto pairs = unmasked_pairs_per_rank(layout, mask, gpos.data(), gseg.data(), B);
  const double imbalance = load_imbalance(layout, mask, gpos.data(), gseg.data(), B);

  // The same problem on one rank (rank 0 alone; the others wait), first.
  StepResult single;
  if (f.single) {
    Mesh alone(world, 1, 1, 1);  // cp = 1: the plain kernel
    if (rank == 0) {
      auto local = make_cp_attention(strategy, alone);
      single = run_step(*local, nullptr, f, gpos, gseg, S, 1);
    }
    mesh.world().barrier();
  }
  CpOptions options;
  options.ring_chunk_tokens = f.ring_chunk_tokens;
  // The ring's shard: S / ring tokens (for usp, the ulysses group's tokens).
  const int64_t ring_local = S / (world / ulysses);
  const int64_t chunk_tokens =
      f.ring_chunk_tokens ? f.ring_chunk_tokens : cp_ring_auto_chunk_tokens(ring_local);
  const int64_t ring_chunks = cp_ring_chunks(ring_local, f.ring_chunk_tokens);
  auto attention = make_cp_attention(strategy, mesh, options);
  StepResult r = run_step(*attention, &mesh, f, pos, seg, L, 2 + rank);

  // Every rank's numbers, for rank 0 to print.
  const int kFields = 8;
  double mine[kFields] = {r.forward, r.backward, r.exposed, static_cast<double>(r.sent),
                          static_cast<double>(r.received), static_cast<double>(pairs[mesh.cp_rank()] * f.heads),
                          static_cast<double>(r.peak), r.cpu};
  std::vector<double> all(kFields * world);
  mesh.world().all_gather(mine, all.data(), sizeof mine);
  if (rank != 0) return 0;

  double step_max = 0, exposed_max = 0, peak_max = 0, cpu_max = 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (int i = 0; i < world; ++i) {
    const double* x = &all[i * kFields];
    step_max = std::max(step_max, x[0] + x[1]);
    exposed_max = std::max(exposed_max, x[2]);
    peak_max = std::max(peak_max, x[6]);
    cpu_max = std::max(cpu_max, x[7]);
    ranks.push_back({{"rank", i}, {"forward_s", x[0]}, {"backward_s", x[1]}, {"exposed_comm_s", x[2]},
                     {"bytes_sent", x[3]}, {"bytes_received", x[4]}, {"unmasked_pairs", x[5]},
                     {"peak_bytes", x[6]}, {"cpu_s", x[7]}});
  }
  const double single_step = single.forward + single.backward;
  const double efficiency = f.single ? single_step / (world * step_max) : 0.0;
  const double cpu_efficiency = f.single && cpu_max > 0 ? single.cpu / (world * cpu_max) : 0.0;
  const std::string name = cp_strategy_label(strategy, world, ulysses);
  nlohmann::json out = {
      {"strategy", name}, {"ranks", world}, {"layout", f.layout}, {"mask", f.mask},
      {"batch", B}, {"seq", S}, {"heads", f.heads}, {"kv_heads", f.kv_heads}, {"head_dim", f.head_dim},
      {"threads", f.threads}, {"repeat", f.repeat}, {"ring_chunk_tokens", chunk_tokens},
      {"ring_chunks", ring_chunks},
      {"load_imbalance", imbalance}, {"per_rank", ranks},
      {"step_s", step_max}, {"exposed_comm_s", exposed_max},
      {"exposed_fraction", step_max > 0 ? exposed_max / step_max : 0.0}};
  if (f.single) {
    out["single_rank"] = {{"forward_s", single.forward}, {"backward_s", single.backward},
                          {"peak_bytes", single.peak}};
    out["single_rank"]["cpu_s"] = single.cpu;
    out["parallel_efficiency"] = efficiency;
    out["parallel_efficiency_cpu"] = cpu_efficiency;
    out["peak_ratio"] = single.peak ? peak_max / single.peak : 0.0;
  }
  if (f.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("bench cp: %s on %d ranks, %s layout, B=%lld S=%lld H=%lld G=%lld D=%lld %s, %d thread(s)/rank, "
              "load imbalance %.3f, best of %d\n",
              name.c_str(), world, f.layout.c_str(), (long long)B, (long long)S, (long long)f.heads,
              (long long)f.kv_heads, (long long)f.head_dim, f.mask.c_str(), f.threads, imbalance, f.repeat);
  if (info.ring_steps(world, ulysses))
    std::printf("ring chunks: %lld per shard of %lld tokens, %lld tokens each\n", (long long)ring_chunks,
                (long long)ring_local, (long long)chunk_tokens);
  std::printf("%5s %10s %10s %10s %12s %14s %14s %16s %12s\n", "rank", "fwd_s", "bwd_s", "cpu_s",
              "exposed_s", "bytes_sent", "bytes_recv", "unmasked_pairs", "peak");
  for (int i = 0; i < world; ++i) {
    const double* x = &all[i * kFields];
    std::printf("%5d %10.3f %10.3f %10.3f %12.4f %14.0f %14.0f %16.0f %12s\n", i, x[0], x[1], x[7], x[2],
                x[3], x[4], x[5], format_bytes(static_cast<size_t>(x[6])).c_str());
  }
  std::printf("step %.3f s, exposed communication %.4f s (%.1f%% of the step)\n", step_max, exposed_max,
              step_max > 0 ? 100.0 * exposed_max / step_max : 0.0);
  if (f.single)
    std::printf("1 rank: fwd %.3f s, bwd %.3f s, cpu %.3f s, peak %s | parallel efficiency %.3f (wall), "
                "%.3f (cpu) | peak per rank / 1-rank peak %.3f\n",
                single.forward, single.backward, single.cpu, format_bytes(single.peak).c_str(), efficiency,
                cpu_efficiency, single.peak ? peak_max / single.peak : 0.0);
  return 0;
}

}  // namespace longctx
