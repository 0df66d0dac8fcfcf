// The table of context-parallel strategies (strategy.h): one line each.
#include "cp/strategy.h"

#include "core/error.h"
#include "cp/strategies.h"

namespace longctx {

const std::vector<const CpStrategyInfo*>& cp_strategies() {
  static const std::vector<const CpStrategyInfo*> all{&all_gather_strategy(), &ulysses_strategy(), &ring_strategy(),
                                                      &usp_strategy()};
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

}  // namespace longctx
