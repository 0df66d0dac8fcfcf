// `longctx selftest [--json] [flags]`: every context-parallel strategy and
// every factorization the job's ranks allow, against the float64 single-rank
// reference, for every mask and layout. Exit status 0 only if all pass.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

#include "apps/commands.h"
#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "cp/cp_selfcheck.h"

namespace longctx {

const char* const kSelftestUsage =
    "usage: mpiexec -n N longctx selftest [--json] [--strategy all_gather|ulysses|ring|usp]\n"
    "         [--layout contiguous|zigzag] [--mask full|causal|local:W|chunked:C[+segments]]\n"
    "         [--cp C] [--ulysses U] [--batch B] [--seq S] [--heads H] [--kv-heads G]\n"
    "         [--head-dim D] [--collective-timeout SECONDS]\n"
    "  defaults: every strategy, layout and mask; cp = N; S = 24 cp; H = lcm(4, cp), G = H/2, D = 16;\n"
    "  usp at every factorization of cp. Exit status 0 only if every case passes.\n";

namespace {

constexpr double kTolerance = 2e-5;  // max abs error / max abs reference, fp32

struct SelftestFlags {
  bool json = false;
  int64_t batch = 1, seq = 0, heads = 0, kv_heads = 0, head_dim = 16;
  int cp = 0;  // 0: the world size (dp = world / cp)
  std::vector<std::string> strategies{"all_gather", "ulysses", "ring", "usp"};
  int ulysses = 0;  // usp factor; 0: every divisor of cp
  std::vector<std::string> layouts{"contiguous", "zigzag"};
  std::vector<std::string> masks{"full", "causal", "local:7", "chunked:16", "causal+segments"};
};

int64_t parse_int(const std::string& flag, const std::string& value) { return parse_int_flag("selftest", flag, value); }

SelftestFlags parse_flags(const Args& args, int world) {
  SelftestFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      f.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw ConfigError("selftest: unknown flag or missing value: " + a + "\n" + kSelftestUsage);
    const std::string& v = args[++i];
    if (a == "--batch") f.batch = parse_int(a, v);
    else if (a == "--seq") f.seq = parse_int(a, v);
    else if (a == "--heads") f.heads = parse_int(a, v);
    else if (a == "--kv-heads") f.kv_heads = parse_int(a, v);
    else if (a == "--head-dim") f.head_dim = parse_int(a, v);
    else if (a == "--cp") f.cp = static_cast<int>(parse_int(a, v));
    else if (a == "--ulysses") f.ulysses = static_cast<int>(parse_int(a, v));
    else if (a == "--strategy") f.strategies = {v};
    else if (a == "--layout") f.layouts = {v};
    else if (a == "--mask") f.masks = {v};
    else if (a == "--collective-timeout") set_collective_timeout_seconds(static_cast<double>(parse_int(a, v)));
    else throw ConfigError("selftest: unknown flag " + a + "\n" + kSelftestUsage);
  }
  if (f.cp == 0) f.cp = world;
  if (f.seq == 0) f.seq = 24 * f.cp;
  if (f.heads == 0) f.heads = std::lcm<int64_t>(4, f.cp);
  if (f.kv_heads == 0) f.kv_heads = f.heads / 2;
  // Every name is checked before any work, so that each rank fails the same way.
  for (const auto& s : f.strategies) parse_enum<CpStrategy>(s);
  for (const auto& l : f.layouts) parse_enum<LayoutKind>(l);
  for (const auto& m : f.masks) MaskSpec::parse(m);
  return f;
}

}  // namespace

int run_selftest(const Args& args) {
  const int world = comm_world_size(), rank = comm_world_rank();
  SelftestFlags f = parse_flags(args, world);
  validate_mesh(MeshShape{std::max(1, world / f.cp), f.cp, f.ulysses > 0 ? f.ulysses : 1, 1}, world);

  // (strategy, ulysses degree of the mesh) to run.
  std::vector<std::pair<CpStrategy, int>> runs;
  for (const auto& name : f.strategies) {
    CpStrategy s = parse_enum<CpStrategy>(name);
    if (!cp_strategy_info(s).takes_usp_factor) {
      runs.push_back({s, 1});
      continue;
    }
    for (int u = 1; u <= f.cp; ++u)
      if (f.cp % u == 0 && (f.ulysses == 0 || f.ulysses == u)) runs.push_back({s, u});
  }
  // Shapes are checked on every rank before any communication.
  for (const auto& l : f.layouts) CpLayout(parse_enum<LayoutKind>(l), f.seq, f.cp, 1);

  nlohmann::json rows = nlohmann::json::array();
  bool all_pass = true;
  if (rank == 0 && !f.json)
    std::printf("%-16s %-18s %-11s %10s %10s %10s %10s %10s  %s\n", "strategy", "mask", "layout",
                "err_o", "err_lse", "err_dq", "err_dk", "err_dv", "result");
  for (const auto& [strategy, u] : runs) {
    Mesh mesh(world / f.cp, f.cp, u, 1);
    const std::string name = cp_strategy_label(strategy, f.cp, u);
    for (const auto& l : f.layouts)
      for (const auto& m : f.masks) {
        CpCheckCase c;
        c.strategy = strategy;
        c.layout = parse_enum<LayoutKind>(l);
        c.mask = MaskSpec::parse(m);
        c.batch = f.batch;
        c.seq_len = f.seq;
        c.heads = f.heads;
        c.kv_heads = f.kv_heads;
        c.head_dim = f.head_dim;
        CpCheckResult r = check_cp_strategy(mesh, c);
        bool pass = r.max_error() <= kTolerance;
        all_pass = all_pass && pass;
        if (rank != 0) continue;
        if (f.json) {
          rows.push_back({{"strategy", name}, {"mask", m}, {"layout", l}, {"err_o", r.err_o},
                          {"err_lse", r.err_lse}, {"err_dq", r.err_dq}, {"err_dk", r.err_dk},
                          {"err_dv", r.err_dv}, {"pass", pass}});
        } else {
          std::printf("%-16s %-18s %-11s %10.2e %10.2e %10.2e %10.2e %10.2e  %s\n", name.c_str(),
                      m.c_str(), l.c_str(), r.err_o, r.err_lse, r.err_dq, r.err_dk, r.err_dv,
                      pass ? "PASS" : "FAIL");
          std::fflush(stdout);
        }
      }
  }
  if (rank == 0) {
    if (f.json) {
      nlohmann::json out = {{"ranks", world}, {"cp", f.cp}, {"seq", f.seq}, {"heads", f.heads},
                            {"kv_heads", f.kv_heads}, {"tolerance", kTolerance},
                            {"pass", all_pass}, {"results", rows}};
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("%s: %zu strategy/factorization(s) x %zu layout(s) x %zu mask(s), tolerance %.0e\n",
                  all_pass ? "ALL PASS" : "FAILURES", runs.size(), f.layouts.size(), f.masks.size(),
                  kTolerance);
    }
  }
  return all_pass ? 0 : 1;
}

}  // namespace longctx
