#pragma once
// The context-parallel strategies as one table of rules. Everything outside
// src/cp (config validation, the planner, the trainer, the apps) asks this
// table what a strategy does; none of it matches on a CpStrategy value.
//
//   const CpStrategyInfo& s = cp_strategy_info(config.strategy());
//   s.ulysses_degree(cp, usp_factor)   -> the all-to-all (head split) degree
//   make_cp_attention(id, mesh, opts)  -> the CpAttention the model calls
//
// The declarations live in core because config validation asks them; the
// registry beside the strategies' classes (src/cp/strategy_registry.cpp,
// core headers only: it needs no communicator or kernel). A fifth strategy is its name in
// core/vocabulary.h, one descriptor in cp_strategies() (src/cp/strategy_registry.cpp),
// its class in its own file in src/cp and one case in make_cp_attention
// (src/cp/cp_common.cpp; the compiler's -Wswitch names a missing case).
#include <cstdint>
#include <string>
#include <vector>

#include "core/vocabulary.h"

namespace longctx {

struct CpStrategyInfo {
  CpStrategy id;
  const char* moves;  // what crosses the cp ranks, one line (for --help and the README)
  // Reads ici_context_usp_ulysses_parallelism (the ulysses x ring split of
  // cp); every other strategy requires it to be 1.
  bool takes_usp_factor;
  // Every rank attends over the whole sequence's K,V, gathered (no ring
  // steps, no head split): memory grows with the full length.
  bool gathers_kv;
  // The all-to-all (head-split) degree at `cp` ranks with the configured usp
  // factor: 1 = no all-to-all. The ring degree is cp / this.
  int64_t (*ulysses_degree)(int64_t cp, int64_t usp_factor);
  // The ulysses degrees the planner tries at `cp` (one plan each).
  std::vector<int64_t> (*planner_ulysses_degrees)(int64_t cp);

  // K,V move in ring steps (a ring degree above 1): transfers overlap
  // compute, and bf16 partial results are merged once more.
  bool ring_steps(int64_t cp, int64_t usp_factor) const {
    return !gathers_kv && ulysses_degree(cp, usp_factor) < cp;
  }
};

// Every strategy, in the order the planner lists them.
const std::vector<const CpStrategyInfo*>& cp_strategies();
const CpStrategyInfo& cp_strategy_info(CpStrategy id);

// "ring", "usp 2x4" (ulysses x ring) where the split is the user's choice.
std::string cp_strategy_label(CpStrategy id, int64_t cp, int64_t ulysses);

// The key=value settings that select the strategy at this cp and split
// ("context_parallel_strategy=usp ici_context_parallelism=8
// ici_context_usp_ulysses_parallelism=2").
std::string cp_strategy_settings(CpStrategy id, int64_t cp, int64_t ulysses);

// The rule for the usp factor, "" when it holds.
std::string usp_factor_rule(CpStrategy id, int64_t cp, int64_t usp_factor);

// Heads per rank after a ulysses all-to-all over U ranks of H query and G kv
// heads: query heads split (U must divide H); kv heads split when U divides
// G, else replicated, one per rank, when G divides U. The one rule of
// UlyssesAttention, config validation, the planner and the sizes.
struct UlyssesHeads {
  int64_t Hu, Gu;       // q and kv heads per rank
  int64_t kv_per_rank;  // ranks sharing one kv head (1 when split)
  int64_t kv_head(int64_t j) const { return kv_per_rank == 1 ? j * Gu : j / kv_per_rank; }
};
// The rule U breaks for these heads, "" when it holds.
std::string ulysses_heads_rule(int64_t U, int64_t H, int64_t G);
// ConfigError naming the rule when U does not fit the heads.
UlyssesHeads ulysses_heads(int64_t U, int64_t H, int64_t G);

}  // namespace longctx
