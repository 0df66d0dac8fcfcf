// The search (recommend): which plan is fastest and fits, over every
// strategy, cp, tp and remat policy the user left open, each with the memory
// levers it needs in MaxText's order (memory_ladder); and the report of the
// configured cp (make_plan); the longest length that fits (longest_length).
// Each plan is plan_strategy's (planner.cpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <tuple>

#include "core/cp_strategy.h"
#include "plan/emit.h"
#include "plan/planner.h"

namespace longctx {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1LL << 30));
  return buf;
}

// The chunk the memory ladder sets for a layer's token-wise parts: long
// enough that the GEMMs keep their rate, short enough that its transients
// are small next to a long sequence's attention operands.
constexpr int64_t kLadderTokenChunk = 4096;

// Policies from most to least memory; the planner escalates along it.
constexpr RematPolicy kRematLadder[] = {RematPolicy::none, RematPolicy::minimal, RematPolicy::save_context,
                                        RematPolicy::full};

// The strategy/factorization candidates at cp: (strategy, ulysses degree).
std::vector<std::pair<CpStrategy, int64_t>> candidates_at(int64_t cp) {
  std::vector<std::pair<CpStrategy, int64_t>> out;
  for (const CpStrategyInfo* s : cp_strategies())
    for (int64_t u : s->planner_ulysses_degrees(cp)) out.push_back({s->id, u});
  return out;
}

RunConfig with_candidate(const RunConfig& c, int64_t cp, CpStrategy strategy, int64_t U, RematPolicy remat) {
  RunConfig k = c;
  k.cp = cp;
  k.cp_strategy = strategy;
  k.cp_ulysses = cp_strategy_info(strategy).takes_usp_factor ? U : 1;
  k.remat_policy = remat;
  return k;
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

}  // namespace

namespace {

std::vector<StrategyPlan> plans_at(const RunConfig& c, const HardwareProfile& hw,
                                   const PlanOptions& o, int64_t cp, RematPolicy remat) {
  std::vector<StrategyPlan> out;
  for (const auto& [strategy, U] : candidates_at(cp))
    out.push_back(plan_strategy(with_candidate(c, cp, strategy, U, remat), hw, o));
  return out;
}

// One line, in the users' terms, on why `best` won among `plans`.
std::string reason_for(const RunConfig& c, const StrategyPlan& best,
                       const std::vector<StrategyPlan>& plans) {
  const int64_t G = c.model.num_kv_heads / c.tp, H = c.model.num_heads / c.tp;
  // By what the strategies do (core/cp_strategy.h), not by name: the gathering one,
  // the all-to-all over all of cp, a split of cp, and a ring.
  auto find = [&](auto&& is) -> const StrategyPlan* {
    for (const StrategyPlan& p : plans)
      if (is(p)) return &p;
    return nullptr;
  };
  auto gathers = [](const StrategyPlan& p) { return cp_strategy_info(p.strategy).gathers_kv; };
  auto a2a_over_cp = [&](const StrategyPlan& p) { return !gathers(p) && p.ulysses == p.cp && p.cp > 1; };
  const StrategyPlan* ag = find(gathers);
  const StrategyPlan* ul = find(a2a_over_cp);
  std::string why;
  if (best.cp == 1) {
    why = "cp=1: the whole sequence fits on one device, no context parallelism needed";
  } else if (gathers(best)) {
    why = std::string(name_of(best.strategy)) + ": the gathered K,V fit in memory (" + gib(double(best.memory_total)) + " of " +
          gib(double(best.device_memory)) + ") and it is the fastest here";
  } else if (a2a_over_cp(best)) {
    why = std::string(name_of(best.strategy)) + ": " + str(G) + " KV heads allow an all-to-all over all cp=" + str(best.cp) +
          " ranks, moving less than ring" + (ag && !ag->fits ? " (gathered K,V do not fit)" : "");
  } else if (best.ulysses > 1) {
    why = cp_strategy_label(best.strategy, best.cp, best.ulysses) + ": ulysses limited by KV heads (" +
          str(G) + " per tp rank), so an all-to-all over " + str(best.ulysses) +
          " (>= 2 KV heads each way) and a ring over " + str(best.ring);
  } else {
    const bool heads_block = ul && !ul->valid;
    const std::string name = name_of(best.strategy);
    why = heads_block ? name + ": heads (" + str(H) + " query, " + str(G) + " KV per tp rank) do not divide cp=" +
                            str(best.cp) + ", and the ring hides its transfers behind compute"
                      : name + ": fastest here, its K,V transfers hide behind compute";
    if (ag && !ag->fits && ag->valid) why += "; gathered K,V would not fit";
  }
  why += " (" + fmt_seconds(best.step_seconds) + "/step, MFU " +
         std::to_string(static_cast<int>(std::lround(best.mfu * 100))) + "%)";
  return why;
}

// Candidate cp sizes: the configured one when the mesh is pinned, else every
// cp that leaves the fill axis (dp or fsdp, whichever is -1) a whole share
// of devices / tp beside the other, pinned one.
std::vector<int64_t> cp_sizes(const RunConfig& c, int64_t devices) {
  if (c.dp != -1 && c.fsdp != -1) return {c.cp};
  const int64_t pinned = c.dp == -1 ? c.fsdp : c.dp;
  std::vector<int64_t> out;
  for (int64_t cp = 1; cp <= devices / c.tp; ++cp)
    if (devices % c.tp == 0 && (devices / c.tp) % (cp * pinned) == 0) out.push_back(cp);
  return out;
}

}  // namespace

namespace {

// One rung of the memory ladder: a lever added to the ones before it.
struct Rung {
  std::string what;  // "key=value ...", as a user would set it
  std::string why;   // what it saves
  RunConfig config;
  int heavier = 0;   // remat policies past the asked one (0: the asked policy)
};

// The levers in the reference's order for tight memory (MaxText): shard
// first (ZeRO-1, then FSDP: the dp ranks and the cp ranks shard the
// parameters; then sequence parallelism over tp), then move state off the
// device (the saved activations, the optimizer
// state, then the layer inputs, then the parameters), and recompute last: at each
// heavier remat policy, every lever above with the tensors it still saves
// offloaded. Each rung keeps the rungs before it.
// The reasons a framework refuses a config, one per entry (emit.h; an open
// strategy counts as all_gather: the ladder's levers do not depend on it).
// A tp whose mesh the ladder's cp does not fill has none here: the search
// checks each run it plans (with its own cp) again.
std::vector<std::string> refusal_reasons(RunConfig c, int64_t devices, const HardwareProfile& hw, Framework f) {
  if (!c.cp_strategy) c.cp_strategy = CpStrategy::all_gather;
  try {
    return framework_refusals(c, devices, hw.platform, f);
  } catch (const ConfigError&) {
    return {};
  }
}

// With a framework (PlanOptions::framework), a lever it has no setting for
// is left off the ladder, so the rungs after it stay runnable there.
std::vector<Rung> memory_ladder(const RunConfig& c, const HardwareProfile& hw, bool heavier_remat, int64_t devices,
                                std::optional<Framework> framework) {
  std::vector<Rung> ladder{{"", "", c}};
  int heavier = 0;
  auto runnable = [&](const RunConfig& k) {
    if (!framework) return true;
    const std::vector<std::string> before = refusal_reasons(ladder.back().config, devices, hw, *framework);
    for (const std::string& r : refusal_reasons(k, devices, hw, *framework))
      if (std::find(before.begin(), before.end(), r) == before.end()) return false;
    return true;
  };
  auto add = [&](const std::string& what, const std::string& why, const std::function<void(RunConfig&)>& f) {
    RunConfig k = ladder.back().config;
    f(k);
    if (runnable(k)) ladder.push_back({what, why, k, heavier});
  };
  if (!c.shard_optimizer_over_data)
    add("shard_optimizer_over_data=true", "AdamW moments sharded over the replicas (ZeRO-1)",
        [](RunConfig& k) { k.shard_optimizer_over_data = true; });
  if (c.dp > 1 || (c.cp > 1 && !c.fsdp_over_context) || c.dp == -1)
    add("ici_fsdp_parallelism=" + std::string(c.dp == -1 ? "-1" : str(c.dp * c.fsdp)) +
            " ici_data_parallelism=1 fsdp_over_context=true",
        "parameters, gradients and moments sharded over the dp and cp ranks (FSDP)", [](RunConfig& k) {
          k.fsdp = k.dp == -1 ? -1 : k.dp * k.fsdp;
          k.dp = 1;
          k.fsdp_over_context = true;
        });
  if (c.tp > 1 && !c.tp_sequence_parallel)
    add("tensor_sequence_parallelism=true", "layer inputs and norms sharded over tp",
        [](RunConfig& k) { k.tp_sequence_parallel = true; });
  // Chunking moves no bytes and recomputes nothing (the GEMMs only get
  // shorter), so it comes before any offload; it saves nothing when a
  // rank's tokens fit one chunk.
  if (c.layer_token_chunk == 0 &&
      c.per_device_batch_size * c.max_target_length > kLadderTokenChunk * std::max<int64_t>(c.cp, 1))
    add("layer_token_chunk=" + str(kLadderTokenChunk),
        "a layer's norms, projections and SwiGLU computed " + str(kLadderTokenChunk) +
            " tokens at a time: their transients stop growing with the sequence",
        [](RunConfig& k) { k.layer_token_chunk = kLadderTokenChunk; });
  const bool host_link = hw.host_link_bandwidth > 0;
  const bool host = host_link || c.offload_target == OffloadTarget::disk;
  std::vector<RematPolicy> remats{c.remat_policy};
  bool past = false;
  for (RematPolicy r : kRematLadder) {
    if (past && heavier_remat) remats.push_back(r);
    past = past || c.remat_policy == r;
  }
  for (size_t i = 0; i < remats.size(); ++i) {
    heavier = static_cast<int>(i);
    if (i > 0)
      add(std::string("remat_policy=") + name_of(remats[i]), "recomputes more in backward", [&](RunConfig& k) {
        k.remat_policy = remats[i];
        k.remat_custom_offload = {};
      });
    if (!host || remats[i] == RematPolicy::custom) continue;
    // Offload what this policy saves, one named tensor at a time, largest
    // first (MaxText's recipes offload some tensors and keep others), then
    // the layer inputs. Each rung is the custom policy a user would write.
    const SaveSet saved = save_set_for(remats[i]);
    const CustomSave keep{true, saved.qkv, saved.context, saved.out_proj, saved.mlpwi, false};
    auto offload_rung = [&](const CustomOffload& offloaded, const std::string& why) {
      RunConfig k = ladder.back().config;
      k.remat_policy = RematPolicy::custom;
      k.remat_custom_save = keep;
      k.remat_custom_offload = offloaded;
      k.offload_target = c.offload_target;
      if (!runnable(k)) return;
      ladder.push_back({"remat_policy=custom " + remat_custom_keys(k) + " offload_target=" + name_of(c.offload_target),
                        why, k, heavier});
    };
    const LlamaConfig& m = c.model;
    const int64_t tp = std::max<int64_t>(c.tp, 1);
    const std::pair<SavePoint, int64_t> per_token[] = {  // elements per token (SaveSet's shapes)
        {SavePoint::qkv_proj, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tp},
        {SavePoint::context, m.num_heads * m.head_dim / tp},
        {SavePoint::out_proj, 2 * m.d_model},
        {SavePoint::mlpwi, 2 * m.mlp_dim / tp}};
    std::vector<std::pair<int64_t, SavePoint>> largest_first;
    for (const auto& [point, elements] : per_token)
      if (keep[static_cast<int>(point)]) largest_first.push_back({elements, point});
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    CustomOffload offloaded{};
    for (const auto& [elements, point] : largest_first) {
      offloaded[static_cast<int>(point)] = true;
      offload_rung(offloaded, std::string(name_of(point)) + " moved off the device between forward and backward");
    }
    if (i == 0 && host_link && !c.optimizer_memory_host_offload)
      add("optimizer_memory_host_offload=true", "AdamW moments in host memory",
          [](RunConfig& k) { k.optimizer_memory_host_offload = true; });
    offloaded[static_cast<int>(SavePoint::decoder_layer_input)] = true;
    offload_rung(offloaded, "layer inputs moved off the device too");
    const RunConfig& now = ladder.back().config;
    if (i == 0 && host_link && !c.parameter_memory_host_offload && (now.fsdp == -1 || now.mesh_shape().shard_group() > 1))
      add("parameter_memory_host_offload=true", "FSDP parameter shards in host memory",
          [](RunConfig& k) { k.parameter_memory_host_offload = true; });
  }
  return ladder;
}

}  // namespace

namespace {

// Whether the user chose `key` (a config file of theirs or the command
// line), rather than leaving it at the defaults (the key table, configs/base.yml).
bool user_set(const RunConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  if (it == c.sources.end() || it->second == "default") return false;
  return std::filesystem::path(it->second).filename() != "base.yml";
}

// Rungs the search tries past the first at which a plan fits.
constexpr int kMoreRungs = 2;

// One plan the search found to fit: the config to run, its prediction, the
// memory levers it needed (with why), and its place in MaxText's order
// (100 x the remat policy's place, plus the rung: the levers it added), which breaks ties.
struct Found {
  RunConfig config;
  StrategyPlan plan;
  std::string levers;
  int order = 0;
  bool heavier_remat = false;  // a remat policy heavier than the user's
};

// The winner: among the plans within 1% (the model's resolution) of the
// fastest (tokens per second per device: a step's tokens grow with dp as cp
// shrinks), the one with the fewest levers in MaxText's order, then the
// smallest tp, then the smallest cp. Moved to the front; the rest follow by speed.
void rank_found(std::vector<Found>& found) {
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.plan.tokens_per_second > b.plan.tokens_per_second; });
  const double fastest = found.front().plan.tokens_per_second;
  size_t best = 0;
  for (size_t i = 1; i < found.size() && found[i].plan.tokens_per_second * 1.01 >= fastest; ++i)
    if (std::tuple(found[i].order, found[i].plan.tp, found[i].plan.cp) <
        std::tuple(found[best].order, found[best].plan.tp, found[best].plan.cp))
      best = i;
  std::rotate(found.begin(), found.begin() + best, found.begin() + best + 1);
}

std::string alternative_line(const Found& f) {
  return cp_strategy_label(f.plan.strategy, f.plan.cp, f.plan.ulysses) + " cp=" + str(f.plan.cp) + ", remat " +
         name_of(f.plan.remat_policy) +
         (f.order % 100 == 0 ? "" : ", " + std::to_string(f.order % 100) + " lever(s)") +
         ": " + std::to_string(std::lround(f.plan.tokens_per_second)) + " tokens/s/device, MFU " +
         std::to_string(static_cast<int>(std::lround(f.plan.mfu * 100))) + "%, " + gib(double(f.plan.memory_total));
}

// Candidate tp sizes: the configured one when the user set it or the mesh is
// pinned, else every tp that divides the heads, KV heads, MLP width and
// devices and stays within a node (tp's per-layer collectives need its links).
std::vector<int64_t> tp_sizes(const RunConfig& c, int64_t devices, const HardwareProfile& hw) {
  if (user_set(c, "ici_tensor_parallelism") || (c.dp != -1 && c.fsdp != -1)) return {c.tp};
  const LlamaConfig& m = c.model;
  std::vector<int64_t> out;
  for (int64_t tp = 1; tp <= devices && (hw.devices_per_node <= 0 || tp <= hw.devices_per_node); tp *= 2)
    if (m.num_heads % tp == 0 && m.num_kv_heads % tp == 0 && m.mlp_dim % tp == 0 && devices % tp == 0)
      out.push_back(tp);
  return out;
}

}  // namespace

// The search: every tp and remat policy the user left open (lightest first), and
// for each its memory ladder without heavier remat; at every candidate cp,
// each strategy with the first rung at which it fits (memory only: the counted step, memoised),
// then its full prediction. The fastest wins.
namespace {

PlanRecommendation search(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  const int64_t devices = plan_devices(c, o);
  c.mesh_shape(devices);  // the user's mesh must fill the devices: ConfigError naming the rule
  PlanOptions opts = o, memory = o;
  opts.devices = memory.devices = devices;
  memory.memory_only = true;
  std::vector<RematPolicy> policies{c.remat_policy};
  const bool remat_open = !user_set(c, "remat_policy") && c.remat_policy != RematPolicy::custom;
  if (remat_open) policies.assign(std::begin(kRematLadder), std::end(kRematLadder));
  std::vector<Found> found;
  for (int64_t tp : tp_sizes(c, devices, hw))
  for (size_t pi = 0; pi < policies.size(); ++pi) {
    RunConfig base = c;
    base.tp = tp;
    base.remat_policy = policies[pi];
    const std::vector<Rung> ladder = memory_ladder(base, hw, !remat_open, devices, o.framework);
    for (int64_t cp : cp_sizes(base, devices)) {
      std::vector<std::pair<CpStrategy, int64_t>> variants = candidates_at(cp);
      if (cp == 1) {
        variants.resize(1);  // no context parallelism: every strategy is the same run
      } else if (c.cp_strategy && user_set(c, "context_parallel_strategy")) {
        // A strategy the user named (not auto) is theirs to keep, with its usp factor when they set one.
        std::erase_if(variants, [&](const std::pair<CpStrategy, int64_t>& v) {
          return v.first != *c.cp_strategy ||
                 (user_set(c, "ici_context_usp_ulysses_parallelism") && v.second != c.cp_ulysses);
        });
      }
      // Rungs each variant may still try: the first that fits and the next
      // kMoreRungs (a lever can pay for itself: FSDP's reduce-scatter moves
      // less than the all-reduce of full gradients).
      std::vector<int> left(variants.size(), kMoreRungs + 1);
      std::string added;
      for (size_t r = 0; r < ladder.size(); ++r) {
        if (!ladder[r].what.empty()) added += "; " + ladder[r].what + " (" + ladder[r].why + ")";
        const RunConfig& k = ladder[r].config;
        for (size_t v = 0; v < variants.size(); ++v) {
          // A heavier remat than the user's only where nothing lighter fits.
          if (left[v] == 0 || (left[v] <= kMoreRungs && ladder[r].heavier > 0)) continue;
          const RunConfig run = with_candidate(k, cp, variants[v].first, variants[v].second, k.remat_policy);
          if (o.framework && !framework_refusal(run, devices, hw.platform, *o.framework).empty()) continue;
          const StrategyPlan m = plan_strategy(run, hw, memory);
          if (!m.valid) left[v] = 0;
          if (!m.valid || !m.fits) continue;
          --left[v];
          found.push_back({run, plan_strategy(run, hw, opts), added.empty() ? "" : added.substr(2),
                           static_cast<int>(pi * 100 + r), ladder[r].heavier > 0});
        }
        if (std::all_of(left.begin(), left.end(), [](int n) { return n == 0; })) break;
      }
    }
  }
  if (found.empty()) {
    PlanRecommendation none;
    none.reason = "nothing fits on " + str(devices) + " devices with tp=" + str(c.tp) +
                  " at any cp, with every memory lever (ZeRO-1, FSDP over dp and cp, sequence parallelism, "
                  "offload of activations, optimizer state, layer inputs and parameters, " +
                  (remat_open ? std::string("every remat policy") : "heavier remat policies") +
                  "): raise ici_tensor_parallelism, add devices or shorten max_target_length";
    return none;
  }
  // The user's remat policy wherever it fits at all: heavier ones only when it does not.
  if (std::any_of(found.begin(), found.end(), [](const Found& f) { return !f.heavier_remat; }))
    std::erase_if(found, [](const Found& f) { return f.heavier_remat; });
  rank_found(found);
  const Found& best = found.front();
  PlanRecommendation r;
  r.found = true;
  r.strategy = best.plan.strategy;
  r.cp = best.plan.cp;
  r.tp = best.plan.tp;
  r.ulysses = best.plan.ulysses;
  r.remat_policy = best.config.remat_policy;
  r.shard_optimizer_over_data = best.config.shard_optimizer_over_data;
  r.config = best.config;
  r.levers = best.levers;
  r.plan = best.plan;
  r.reason = reason_for(best.config, best.plan, plans_at(best.config, hw, opts, best.plan.cp, best.config.remat_policy));
  r.reason = "the fastest of " + str(int64_t(found.size())) + " plans that fit" +
             (remat_open ? " (every remat policy, cp, strategy and the memory levers each needs)" : "") + "; " +
             r.reason;
  if (!best.levers.empty()) r.reason += "; it needs the memory levers listed apart (MaxText's order)";
  for (size_t i = 1; i < found.size() && r.runners_up.size() < 2; ++i) r.runners_up.push_back(alternative_line(found[i]));
  return r;
}

}  // namespace

PlanRecommendation recommend(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  if (!o.framework) return search(c, hw, o);
  // The fastest plan the framework runs, and what longctx's own best would gain.
  PlanOptions own_options = o;
  own_options.framework.reset();
  const PlanRecommendation own = search(c, hw, own_options);
  PlanRecommendation r = search(c, hw, o);
  const int64_t devices = plan_devices(c, o);
  const std::string f = name_of(*o.framework);
  const std::string own_line = own.found ? cp_strategy_label(own.strategy, own.cp, own.ulysses) + " cp=" + str(own.cp) +
                                               " tp=" + str(own.tp) + ", remat " + name_of(own.remat_policy)
                                         : "";
  if (!r.found) {
    if (own.found)
      r.reason = "nothing " + f + " runs on " + hw.name + " fits; longctx's own best (" + own_line + ") needs what " +
                 f + " lacks: " + framework_refusal(own.config, devices, hw.platform, *o.framework);
    return r;
  }
  if (own.found && own.plan.tokens_per_second > r.plan.tokens_per_second * 1.01) {
    const double gain = own.plan.tokens_per_second / r.plan.tokens_per_second - 1;
    r.framework_gap = "longctx's own best, " + own_line + ", is " + std::to_string(std::lround(gain * 100)) +
                      "% faster: " +
                      framework_refusal(own.config, devices, hw.platform, *o.framework);
  }
  return r;
}

PlanReport make_plan(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o) {
  PlanReport report;
  report.hardware = hw.name;
  report.devices = plan_devices(c, o);
  c.mesh_shape(report.devices);  // the user's mesh must fill the devices: ConfigError naming the rule
  PlanOptions opts = o;
  opts.devices = report.devices;
  report.candidates = plans_at(c, hw, opts, c.cp, c.remat_policy);
  // Advice for what does not fit: sharding the optimizer, the lightest remat,
  // then the smallest larger cp (whether each fits: memory only).
  PlanOptions memory = opts;
  memory.memory_only = true;
  for (StrategyPlan& p : report.candidates) {
    if (!p.valid || p.fits) continue;
    if (!c.shard_optimizer_over_data) {
      RunConfig k = with_candidate(c, p.cp, p.strategy, p.ulysses, c.remat_policy);
      k.shard_optimizer_over_data = true;
      StrategyPlan q = plan_strategy(k, hw, memory);
      if (q.valid && q.fits) {
        p.advice = "fits with shard_optimizer_over_data=true";
        continue;
      }
    }
    for (RematPolicy remat : kRematLadder) {
      StrategyPlan q = plan_strategy(with_candidate(c, p.cp, p.strategy, p.ulysses, remat), hw, memory);
      if (q.valid && q.fits) {
        p.advice = "fits with remat_policy=" + std::string(name_of(remat));
        break;
      }
    }
    if (!p.advice.empty()) continue;
    for (int64_t cp = p.cp * 2; cp * c.tp <= report.devices; cp *= 2) {
      int64_t U = cp_strategy_info(p.strategy).takes_usp_factor ? p.ulysses : 1;
      StrategyPlan q = plan_strategy(with_candidate(c, cp, p.strategy, U, c.remat_policy), hw, memory);
      if (q.valid && q.fits) {
        p.advice = "fits with ici_context_parallelism=" + str(cp);
        break;
      }
    }
    if (p.advice.empty())
      p.advice = c.shard_optimizer_over_data
                     ? "does not fit with any remat policy or larger cp"
                     : "does not fit with shard_optimizer_over_data, any remat policy or larger cp";
  }
  report.recommendation = recommend(c, hw, opts);
  return report;
}

LongestLength longest_length(const RunConfig& c, const HardwareProfile& hw, const PlanOptions& o, int64_t granule) {
  if (granule < 1) throw ConfigError("the length granule must be >= 1 (got " + str(granule) + ")");
  if (!c.cp_strategy)
    throw ConfigError("the longest length is searched for one strategy: set context_parallel_strategy (all_gather, "
                      "ulysses, ring or usp), not auto");
  LongestLength r;
  r.granule = granule;
  auto at = [&](int64_t multiple) {
    RunConfig k = c;
    k.max_target_length = multiple * granule;
    return plan_strategy(k, hw, o);
  };
  r.plan = r.next = at(1);
  // The length rules are divisibility rules: a granule that keeps them keeps them at every multiple.
  if (!r.plan.valid)
    throw ConfigError("granule " + str(granule) + " breaks a length rule: " + r.plan.invalid_reason +
                      "; choose a granule that satisfies it");
  if (!r.plan.fits) return r;
  // fits(lo), not fits(hi): double, then bisect.
  int64_t lo = 1, hi = 2;
  constexpr int64_t kMaxTokens = int64_t{1} << 50;  // far beyond any device: memory does not grow?
  while (at(hi).fits) {
    lo = hi;
    if (hi > kMaxTokens / granule / 2)
      throw ConfigError("more than 2^50 tokens fit in " + str(r.plan.device_memory) + " bytes: nothing to search");
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (at(mid).fits ? lo : hi) = mid;
  }
  r.length = lo * granule;
  r.plan = at(lo);
  r.next = at(lo + 1);
  return r;
}

}  // namespace longctx
