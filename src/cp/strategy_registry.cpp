// The registry of context-parallel strategies (core/cp_strategy.h): one
// descriptor each, beside their classes, in the order the planner lists them.
// It includes core headers only (no MPI, no kernels), so that config
// validation in core can ask it, and the fuzzed config reader links it
// (tests/fuzz/CMakeLists.txt) without the rest of src/cp.
#include "core/cp_strategy.h"

#include "core/error.h"

namespace longctx {

namespace {
int64_t no_head_split(int64_t, int64_t) { return 1; }
std::vector<int64_t> no_split_to_try(int64_t) { return {1}; }
}  // namespace

const std::vector<const CpStrategyInfo*>& cp_strategies() {
  static const CpStrategyInfo all_gather{
      CpStrategy::all_gather, "K,V of the whole sequence gathered on every rank; dK,dV reduce-scattered back",
      /*takes_usp_factor=*/false, /*gathers_kv=*/true, no_head_split, no_split_to_try};
  static const CpStrategyInfo ulysses{
      CpStrategy::ulysses, "all-to-all of Q,K,V from sequence shards to head shards over all cp ranks, and back",
      /*takes_usp_factor=*/false, /*gathers_kv=*/false, [](int64_t cp, int64_t) -> int64_t { return cp; },
      [](int64_t cp) { return std::vector<int64_t>{cp}; }};
  static const CpStrategyInfo ring{
      CpStrategy::ring, "K,V chunks passed around the ring, overlapped with attention; dK,dV sent back to their owners",
      /*takes_usp_factor=*/false, /*gathers_kv=*/false, no_head_split, no_split_to_try};
  static const CpStrategyInfo usp{
      CpStrategy::usp, "ulysses all-to-all over the usp factor inside a ring over the rest of cp",
      /*takes_usp_factor=*/true, /*gathers_kv=*/false, [](int64_t, int64_t usp_factor) { return usp_factor; },
      [](int64_t cp) {
        std::vector<int64_t> out;  // the proper splits: 1 and cp are ring and ulysses
        for (int64_t u = 2; u < cp; ++u)
          if (cp % u == 0) out.push_back(u);
        return out;
      }};
  static const std::vector<const CpStrategyInfo*> all{&all_gather, &ulysses, &ring, &usp};
  return all;
}

const CpStrategyInfo& cp_strategy_info(CpStrategy id) {
  for (const CpStrategyInfo* s : cp_strategies())
    if (s->id == id) return *s;
  throw ConfigError("context_parallel_strategy '" + std::string(name_of(id)) + "' has no entry in cp_strategies()");
}

std::string cp_strategy_label(CpStrategy id, int64_t cp, int64_t ulysses) {
  if (!cp_strategy_info(id).takes_usp_factor) return name_of(id);
  return std::string(name_of(id)) + " " + std::to_string(ulysses) + "x" + std::to_string(cp / ulysses);
}

std::string cp_strategy_settings(CpStrategy id, int64_t cp, int64_t ulysses) {
  std::string out = "context_parallel_strategy=" + std::string(name_of(id)) + " ici_context_parallelism=" + std::to_string(cp);
  if (cp_strategy_info(id).takes_usp_factor) out += " ici_context_usp_ulysses_parallelism=" + std::to_string(ulysses);
  return out;
}

std::string usp_factor_rule(CpStrategy id, int64_t cp, int64_t usp_factor) {
  const std::string u = std::to_string(usp_factor);
  if (cp_strategy_info(id).takes_usp_factor) {
    if (usp_factor < 1 || cp % usp_factor != 0)
      return "ici_context_usp_ulysses_parallelism (" + u + ") must divide ici_context_parallelism (" +
             std::to_string(cp) + ")";
  } else if (usp_factor != 1) {
    std::string users;
    for (const CpStrategyInfo* s : cp_strategies())
      if (s->takes_usp_factor) users += (users.empty() ? "" : "|") + std::string(name_of(s->id));
    return "ici_context_usp_ulysses_parallelism is only used by context_parallel_strategy=" + users + " (got " + u +
           " with " + name_of(id) + ")";
  }
  return "";
}

std::string ulysses_heads_rule(int64_t U, int64_t H, int64_t G) {
  const std::string u = std::to_string(U);
  if (U < 1 || H % U != 0)
    return "the ulysses degree (" + u + ") must divide the query heads (" + std::to_string(H) + ")";
  if (G % U != 0 && U % G != 0)
    return "the kv heads (" + std::to_string(G) + ") and the ulysses degree (" + u +
           ") must divide one another (G % U == 0 splits kv heads, U % G == 0 replicates them)";
  return "";
}

UlyssesHeads ulysses_heads(int64_t U, int64_t H, int64_t G) {
  const std::string rule = ulysses_heads_rule(U, H, G);
  if (!rule.empty()) throw ConfigError("ulysses: " + rule);
  if (G % U == 0) return {H / U, G / U, 1};
  return {H / U, 1, U / G};
}

}  // namespace longctx
