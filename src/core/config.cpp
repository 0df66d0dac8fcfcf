#include "core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/checked.h"
#include "core/cp_strategy.h"

namespace longctx {

namespace fs = std::filesystem;

namespace {

std::string type_name(const ConfigValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t>) return "an integer";
        if constexpr (std::is_same_v<T, double>) return "a number";
        if constexpr (std::is_same_v<T, bool>) return "a boolean (true/false)";
        return "a string";
      },
      v);
}

// The value as the field's type; integers are valid numbers.
template <typename T>
T value_as(const ConfigValue& v) {
  if (const T* x = std::get_if<T>(&v)) return *x;
  if constexpr (std::is_same_v<T, double>)
    if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw ConfigError("is " + type_name(v) + ", not the type asked for");
}

// context_parallel_strategy: a strategy, or "auto" (nullopt: the planner picks).
std::optional<CpStrategy> parse_strategy_or_auto(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (const auto& [strategy, known] : EnumNames<CpStrategy>::names)
    if (name == known) return strategy;
  throw ConfigError("unknown context_parallel_strategy '" + name + "': expected " + enum_choices<CpStrategy>() +
                    "|auto");
}

// A custom remat key: device (save), remat (recompute) or offload (save
// outside device memory); sets the point's save and offload flags.
void parse_save_choice(const std::string& v, RunConfig& c, SavePoint point) {
  const int i = static_cast<int>(point);
  if (v != "device" && v != "remat" && v != "offload")
    throw ConfigError("must be 'device' (save), 'remat' (recompute) or 'offload' (save off the device), got '" + v + "'");
  c.remat_custom_save[i] = v != "remat";
  c.remat_custom_offload[i] = v == "offload";
}

std::string save_choice_name(const RunConfig& c, SavePoint point) {
  const int i = static_cast<int>(point);
  return c.remat_custom_offload[i] ? "offload" : c.remat_custom_save[i] ? "device" : "remat";
}

}  // namespace

std::string remat_custom_keys(const RunConfig& c) {
  std::string out;
  for (const auto& [point, name] : EnumNames<SavePoint>::names)
    out += (out.empty() ? "" : " ") + std::string(name) + "=" + save_choice_name(c, point);
  return out;
}

// Bindings of a key to its RunConfig field: plain fields, enums (by their
// name table), the per-tensor remat choices and the strategy ("auto" = none).
#define F(member)                                                                \
  [](const RunConfig& c) -> ConfigValue { return c.member; },                    \
  [](RunConfig& c, const ConfigValue& v) { c.member = value_as<decltype(c.member)>(v); }
#define ENUM(member)                                                                        \
  [](const RunConfig& c) -> ConfigValue { return std::string(name_of(c.member)); },         \
  [](RunConfig& c, const ConfigValue& v) {                                                  \
    c.member = parse_enum<decltype(c.member)>(value_as<std::string>(v));                    \
  }
#define SAVE(point)                                                                              \
  [](const RunConfig& c) -> ConfigValue { return save_choice_name(c, SavePoint::point); },        \
  [](RunConfig& c, const ConfigValue& v) { parse_save_choice(value_as<std::string>(v), c, SavePoint::point); }
#define STRATEGY                                                                          \
  [](const RunConfig& c) -> ConfigValue {                                                 \
    return std::string(c.cp_strategy ? name_of(*c.cp_strategy) : "auto");                \
  },                                                                                      \
  [](RunConfig& c, const ConfigValue& v) { c.cp_strategy = parse_strategy_or_auto(value_as<std::string>(v)); }

const std::vector<ConfigKey>& config_keys() {
  using S = std::string;
  using I = int64_t;
  // Keep in the order and with the defaults of configs/base.yml
  // (tests/unit/test_config.cpp checks that they agree).
  static const std::vector<ConfigKey> keys = {
      // run / output
      {"run_name", S("run"), "name of the run (output subdirectory)", F(run_name)},
      {"base_output_directory", S("runs"), "root of run outputs", F(base_output_directory)},
      {"checkpoint_dir", S(""), "checkpoints; empty = <base_output_directory>/<run_name>/checkpoints", F(checkpoint_dir)},
      {"metrics_file", S(""), "JSON lines; empty = <base_output_directory>/<run_name>/metrics.jsonl", F(metrics_file)},
      {"enable_checkpointing", true, "write checkpoints", F(enable_checkpointing)},
      {"checkpoint_period", I(0), "steps between checkpoints; 0 = only at the end", F(checkpoint_period)},
      {"max_num_checkpoints_to_keep", I(0), "newest complete checkpoints kept, older ones deleted (until a step has run from the newest, the one before it stays too); 0 = keep all", F(max_num_checkpoints_to_keep)},
      {"resume", true, "continue from the latest complete checkpoint in checkpoint_dir", F(resume)},
      {"log_period", I(1), "steps between printed step lines", F(log_period)},
      {"progress_interval_seconds", 10.0, "during a step, rank 0's layer and pass on stderr this often; 0 = off",
       F(progress_interval_seconds)},
      // model
      {"model_name", S(""), "configs/model/<model_name>.yml; empty = the shape keys below", F(model_name)},
      {"vocab_size", I(259), "vocabulary (byte-level: 256 bytes + BOS, EOS, PAD)", F(model.vocab_size)},
      {"base_emb_dim", I(256), "d_model", F(model.d_model)},
      {"base_num_query_heads", I(4), "attention heads", F(model.num_heads)},
      {"base_num_kv_heads", I(2), "KV heads (GQA)", F(model.num_kv_heads)},
      {"head_dim", I(64), "per-head dimension", F(model.head_dim)},
      {"base_mlp_dim", I(768), "SwiGLU hidden size", F(model.mlp_dim)},
      {"base_num_decoder_layers", I(2), "decoder layers", F(model.num_layers)},
      {"rope_max_timescale", 500000.0, "RoPE theta", F(model.rope_theta)},
      {"rope_use_scaling", false, "Llama 3.1 RoPE frequency scaling", F(model.rope_llama3_scaling)},
      {"rope_scaling_factor", 8.0, "Llama 3.1 scaling factor", F(model.rope_scaling_factor)},
      {"rope_low_freq_factor", 1.0, "Llama 3.1 low frequency factor", F(model.rope_low_freq_factor)},
      {"rope_high_freq_factor", 4.0, "Llama 3.1 high frequency factor", F(model.rope_high_freq_factor)},
      {"rope_original_max_position", I(8192), "Llama 3.1 original context", F(model.rope_original_max_position)},
      {"normalization_layer_epsilon", 1e-5, "RMSNorm epsilon", F(model.norm_eps)},
      {"logits_via_embedding", false, "tie the LM head to the embedding", F(model.tie_embeddings)},
      {"dtype", S("float32"), "activations and matmul inputs: float32 | bfloat16 (fp32 accumulation)", ENUM(dtype)},
      {"weight_dtype", S("float32"), "master weights and AdamW moments: float32 (always)", ENUM(weight_dtype)},
      {"remat_policy", S("full"), "none|minimal|save_context|full|custom", ENUM(remat_policy)},
      {"decoder_layer_input", S("device"), "custom remat: device (save) | remat | offload", SAVE(decoder_layer_input)},
      {"qkv_proj", S("remat"), "custom remat: device (save) | remat | offload", SAVE(qkv_proj)},
      {"context", S("remat"), "custom remat: device (save) | remat | offload", SAVE(context)},
      {"out_proj", S("remat"), "custom remat: device (save) | remat | offload", SAVE(out_proj)},
      {"mlpwi", S("remat"), "custom remat: device (save) | remat | offload", SAVE(mlpwi)},
      {"mlpwo", S("remat"), "custom remat: device (save) | remat | offload", SAVE(mlpwo)},
      {"offload_target", S("host"), "where `offload` tensors live: host|disk", ENUM(offload_target)},
      {"optimizer_memory_host_offload", false, "AdamW moments in the host pool instead of device memory", F(optimizer_memory_host_offload)},
      {"parameter_memory_host_offload", false, "FSDP parameter shards in the host pool (units gathered to the device)", F(parameter_memory_host_offload)},
      {"state_offload_target", S("host"), "where *_memory_host_offload put the state: host|disk (spill files in offload_dir)", ENUM(state_offload_target)},
      {"layer_token_chunk", I(0), "tokens a layer's norms, projections and SwiGLU process at once; 0 = all", F(layer_token_chunk)},
      {"offload_dir", S(""), "disk offload spill files; empty = <base_output_directory>/<run_name>/offload", F(offload_dir)},
      // attention
      {"attention_type", S("causal"), "full|causal|local|chunked", ENUM(attention_type)},
      {"sliding_window_size", I(0), "local: tokens each query sees (itself included)", F(sliding_window_size)},
      {"chunk_attn_window_size", I(0), "chunked: causal attention within blocks of this size", F(chunk_attn_window_size)},
      {"attention_kernel", S("fast"), "fast|reference (float64, for tests)", ENUM(attention_kernel)},
      // parallelism
      {"ici_data_parallelism", I(1), "dp; -1 = world size / (fsdp * cp * tp)", F(dp)},
      {"ici_fsdp_parallelism", I(1), "fsdp: data-parallel ranks that shard parameters, gradients, moments; -1 = fill", F(fsdp)},
      {"fsdp_over_context", false, "the cp ranks shard parameters, gradients and moments too (FSDP group fsdp x cp)", F(fsdp_over_context)},
      {"ici_context_parallelism", I(1), "cp: ranks that split each sequence", F(cp)},
      {"ici_context_usp_ulysses_parallelism", I(1), "usp: all-to-all factor of cp", F(cp_ulysses)},
      {"ici_tensor_parallelism", I(1), "tp (Megatron)", F(tp)},
      {"tensor_sequence_parallelism", false, "shard the residual stream and norms over tp along the tokens", F(tp_sequence_parallel)},
      {"context_parallel_strategy", S("all_gather"), "all_gather|ulysses|ring|usp|auto", STRATEGY},
      {"context_parallel_load_balance", true, "zigzag layout (true) or contiguous (false)", F(cp_load_balance)},
      // data
      {"dataset_type", S("text"), "text|binary|synthetic", ENUM(dataset_type)},
      {"dataset_path", S("data/kjv"), "files, directories (text) or globs; a list or comma-separated", F(dataset_path)},
      {"document_separator", S(""), "text: split files at this string; empty = one document per file", F(document_separator)},
      {"packing", true, "pack documents with segment ids (document mask) or concatenate", F(packing)},
      {"max_target_length", I(1024), "tokens per sequence", F(max_target_length)},
      {"per_device_batch_size", I(1), "sequences per data rank (dp x fsdp) per step", F(per_device_batch_size)},
      // optimisation
      {"steps", I(20), "optimizer steps", F(steps)},
      {"learning_rate", 3e-4, "peak learning rate", F(learning_rate)},
      {"warmup_steps_fraction", 0.1, "fraction of steps of linear warmup", F(warmup_steps_fraction)},
      {"cosine_learning_rate_final_fraction", 0.1, "final lr as a fraction of the peak", F(cosine_learning_rate_final_fraction)},
      {"adam_b1", 0.9, "AdamW beta1", F(adam_b1)},
      {"adam_b2", 0.95, "AdamW beta2", F(adam_b2)},
      {"adam_eps", 1e-8, "AdamW epsilon", F(adam_eps)},
      {"adam_weight_decay", 0.1, "AdamW decoupled weight decay (matrices only)", F(adam_weight_decay)},
      {"gradient_clipping_threshold", 1.0, "global-norm clipping; 0 = off", F(gradient_clipping_threshold)},
      {"shard_optimizer_over_data", false, "ZeRO-1: shard AdamW moments over the dp x cp replicas", F(shard_optimizer_over_data)},
      {"init_weights_seed", I(0), "seed of weights and synthetic data", F(init_weights_seed)},
      {"load_parameters_path", S(""), "Hugging Face Llama directory (or longctx checkpoint) to initialise from", F(load_parameters_path)},
      // evaluation
      {"eval_steps", I(4), "longctx eval: global batches evaluated", F(eval_steps)},
      {"eval_dataset_path", S(""), "held-out data; empty = the last eval_steps batches of dataset_path", F(eval_dataset_path)},
      {"eval_output", S(""), "eval JSON (+ .png); empty = <base_output_directory>/<run_name>/eval.json", F(eval_output)},
      {"eval_first_bucket", I(1024), "eval: first position bucket [0, this), then doubling", F(eval_first_bucket)},
      // system
      {"device_memory_budget", I(0), "bytes (or \"8GiB\"); 0 = unlimited", F(device_memory_budget)},
      {"host_memory_budget", I(0), "host offload pool, bytes (or \"8GiB\"); 0 = unlimited", F(host_memory_budget)},
      {"peak_tflops_per_device", 0.0, "MFU denominator; 0 = measure fp32 GEMM at start-up", F(peak_tflops_per_device)},
      {"collective_timeout_seconds", I(600), "abort when a collective waits longer", F(collective_timeout_seconds)},
      {"num_threads", I(0), "OpenMP threads per rank; 0 = OpenMP default", F(num_threads)},
      {"deterministic_across_thread_counts", false, "bit-identical at any num_threads (slower GEMMs)",
       F(deterministic_across_thread_counts)},
  };
  return keys;
}
#undef F
#undef ENUM
#undef SAVE
#undef STRATEGY

int64_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<int64_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int64_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

int64_t parse_bytes(const std::string& text) {
  static const std::vector<std::pair<std::string, double>> units = {
      {"KiB", 1024.0}, {"MiB", 1024.0 * 1024}, {"GiB", 1024.0 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"B", 1.0}, {"", 1.0}};
  for (const auto& [suffix, scale] : units) {
    if (text.size() < suffix.size() || text.compare(text.size() - suffix.size(), suffix.size(), suffix))
      continue;
    std::string number = text.substr(0, text.size() - suffix.size());
    try {
      size_t used = 0;
      double v = std::stod(number, &used);
      // Below 2^63: llround of anything larger is undefined (1e300GiB read as negative).
      if (used == number.size() && v >= 0 && v * scale < 9.2e18) return static_cast<int64_t>(std::llround(v * scale));
    } catch (const std::exception&) {
    }
    break;
  }
  throw ConfigError("'" + text + "' is not a byte count (e.g. 123, 64MiB, 8GiB)");
}

namespace {

const ConfigKey* find_key(const std::string& name) {
  for (const auto& k : config_keys())
    if (name == k.name) return &k;
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& name, const std::string& where) {
  const ConfigKey* best = nullptr;
  int64_t best_d = 0;
  for (const auto& k : config_keys()) {
    int64_t d = edit_distance(name, k.name);
    if (!best || d < best_d) best = &k, best_d = d;
  }
  throw ConfigError(where + ": unknown key '" + name + "'; did you mean '" + best->name +
                    "'? (configs/base.yml lists every key)");
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF). Other bytes cannot be written back by to_yaml() (the emitter
// replaces them), so a checkpoint's run_config.yml would differ from the run.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    // n continuation bytes follow the lead byte
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : -1;
    if (n < 0) return false;
    uint32_t cp = n == 0 ? c : c & (0x3f >> n);
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 0x2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

// Converts a YAML scalar to the type of the key's default.
ConfigValue convert(const ConfigKey& key, const YAML::Node& node, const std::string& where) {
  auto fail = [&](const std::string& got) -> ConfigError {
    return ConfigError(where + ": key '" + key.name + "' must be " + type_name(key.default_value) +
                       ", got '" + got + "'");
  };
  if (node.IsNull()) {
    if (std::holds_alternative<std::string>(key.default_value)) return std::string();
    throw fail("null");
  }
  // dataset_path may be a YAML list of paths and patterns: it is kept as one
  // comma-separated string (the form a command line gives).
  if (node.IsSequence() && std::string(key.name) == "dataset_path") {
    std::string joined;
    for (const YAML::Node& item : node) {
      if (!item.IsScalar() || item.Scalar().empty() || item.Scalar().find(',') != std::string::npos)
        throw ConfigError(where + ": key 'dataset_path': each list item must be one non-empty path without a comma");
      joined += (joined.empty() ? "" : ",") + item.Scalar();
    }
    if (joined.empty()) throw ConfigError(where + ": key 'dataset_path' is an empty list");
    return convert(key, YAML::Node(joined), where);
  }
  if (!node.IsScalar()) throw fail("a list or map");
  const std::string text = node.Scalar();
  return std::visit(
      [&](const auto& def) -> ConfigValue {
        using T = std::decay_t<decltype(def)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (!valid_utf8(text))
            throw ConfigError(where + ": key '" + key.name + "' must be UTF-8 text (it holds other bytes)");
          return text;
        } else if constexpr (std::is_same_v<T, bool>) {
          bool b;
          if (!YAML::convert<bool>::decode(node, b)) throw fail(text);
          return b;
        } else if constexpr (std::is_same_v<T, int64_t>) {
          long long i;
          if (YAML::convert<long long>::decode(node, i)) return static_cast<int64_t>(i);
          if (std::string(key.name).ends_with("_memory_budget")) return parse_bytes(text);
          // Accept integral floats such as 1e6.
          double d;
          if (YAML::convert<double>::decode(node, d) && std::isfinite(d) && d == std::floor(d) &&
              std::fabs(d) < 9e18)
            return static_cast<int64_t>(d);
          throw fail(text);
        } else {
          double d;
          if (!YAML::convert<double>::decode(node, d)) throw fail(text);
          return d;
        }
      },
      key.default_value);
}

struct Layer {
  std::string source;
  std::vector<std::pair<std::string, YAML::Node>> entries;
};

// The file must be a regular file: a directory "exists" too, and reading one
// gave a misleading error.
void require_regular_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw ConfigError(what + " '" + path.string() + "' does not exist");
  if (fs::is_directory(st)) throw ConfigError(what + " '" + path.string() + "' is a directory, not a YAML file");
  if (!fs::is_regular_file(st)) throw ConfigError(what + " '" + path.string() + "' is not a regular file");
}

// yaml-cpp 0.7 reads an unclosed quote to the end of the file as one string
// ("a: \"x\nb: 1" is a = "x b: 1"), silently swallowing every key after it.
// A quoted scalar starts at its mark with the quote: find its end as YAML does.
bool quote_closed(const std::string& text, size_t pos) {
  const char q = text[pos];
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (q == '"' && text[i] == '\\') {
      ++i;  // an escape: the next character never ends the string
    } else if (text[i] == q) {
      if (q == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;  // '' is a quote inside a single-quoted string
        continue;
      }
      return true;
    }
  }
  return false;
}

void check_quote(const YAML::Node& node, const std::string& text, const fs::path& path) {
  if (!node.IsScalar() || node.Tag() != "!") return;  // "!": a quoted or block scalar
  const size_t pos = node.Mark().pos;
  if (pos < text.size() && (text[pos] == '"' || text[pos] == '\'') && !quote_closed(text, pos))
    throw ConfigError("config file '" + path.string() + "' line " + std::to_string(node.Mark().line + 1) +
                      ": unclosed quote (" + text[pos] + ") runs to the end of the file");
}

// The entries of a config file in order: a map of unique plain keys to values.
std::vector<std::pair<std::string, YAML::Node>> load_yaml_file(const fs::path& path) {
  require_regular_file(path, "config file");
  const std::string file = "config file '" + path.string() + "'";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!in) throw ConfigError(file + " cannot be read");
  const std::string text = buf.str();
  std::vector<std::pair<std::string, YAML::Node>> entries;
  try {
    YAML::Node root = YAML::Load(text);
    check_quote(root, text, path);
    if (root.IsNull()) return entries;
    if (!root.IsMap()) throw ConfigError(file + " must be a YAML map of key: value");
    std::map<std::string, int> line_of;  // key -> line it first appeared on
    for (const auto& kv : root) {
      check_quote(kv.first, text, path);
      check_quote(kv.second, text, path);
      const int line = kv.first.Mark().line + 1;
      if (!kv.first.IsScalar())
        throw ConfigError(file + " line " + std::to_string(line) + ": a key must be a plain name, not a list or map");
      const std::string key = kv.first.Scalar();
      // yaml-cpp keeps both; the later one silently won.
      if (const auto [it, fresh] = line_of.emplace(key, line); !fresh)
        throw ConfigError(file + " line " + std::to_string(line) + ": duplicate key '" + key +
                          "' (first set on line " + std::to_string(it->second) + ")");
      entries.emplace_back(key, kv.second);
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(file + " is not valid YAML: " + e.what());
  }
  return entries;
}

// The base_config chain, root first. `root_dir` receives the directory of the
// root file (where model/<name>.yml is looked up).
void load_chain(const fs::path& path, std::vector<Layer>& layers, std::set<std::string>& seen,
                fs::path& root_dir) {
  std::string canon = fs::weakly_canonical(path).string();
  if (!seen.insert(canon).second)
    throw ConfigError("config file '" + path.string() + "': base_config forms a cycle");
  Layer layer{path.string(), {}};
  std::string base;
  for (auto& [key, value] : load_yaml_file(path)) {
    if (key == "base_config") {
      // null or "" = no base
      if (!value.IsNull() && !value.IsScalar())
        throw ConfigError("config file '" + path.string() + "': base_config must be one file name, not a list or map");
      if (value.IsScalar()) base = value.Scalar();
      continue;
    }
    layer.entries.emplace_back(key, value);
  }
  if (!base.empty()) {
    const fs::path base_path = path.parent_path() / base;
    try {
      require_regular_file(base_path, "base_config");
    } catch (const ConfigError& e) {
      throw ConfigError("config file '" + path.string() + "': " + e.what());
    }
    load_chain(base_path, layers, seen, root_dir);
  } else {
    root_dir = path.parent_path();
  }
  layers.push_back(std::move(layer));
}

void apply_layer(const Layer& layer, std::map<std::string, ConfigValue>& values,
                 std::map<std::string, std::string>& sources) {
  for (const auto& [key, node] : layer.entries) {
    const ConfigKey* k = find_key(key);
    if (!k) unknown_key(key, layer.source);
    values[key] = convert(*k, node, layer.source);
    sources[key] = layer.source;
  }
}

Layer parse_overrides(const std::vector<std::string>& overrides) {
  Layer layer{"command line", {}};
  for (const auto& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("command line: '" + o + "' is not key=value");
    std::string key = o.substr(0, eq), text = o.substr(eq + 1);
    YAML::Node node;
    try {
      node = text.empty() ? YAML::Node(std::string()) : YAML::Load(text);
    } catch (const YAML::Exception&) {
      node = YAML::Node(text);  // keep it as a plain string; conversion checks the type
    }
    layer.entries.emplace_back(key, node);
  }
  return layer;
}

}  // namespace

template <typename T>
T RunConfig::get(const std::string& key) const {
  const ConfigKey* k = find_key(key);
  if (!k) throw ConfigError("config has no key '" + key + "'");
  try {
    return value_as<T>(k->get(*this));
  } catch (const ConfigError& e) {
    throw ConfigError("config key '" + key + "' " + e.what());
  }
}
template int64_t RunConfig::get<int64_t>(const std::string&) const;
template double RunConfig::get<double>(const std::string&) const;
template bool RunConfig::get<bool>(const std::string&) const;
template std::string RunConfig::get<std::string>(const std::string&) const;

namespace {

// Defaults, then `given` (checked against the schema), each key set through
// its binding; `source_of` names where a value came from, for errors.
RunConfig config_from(const std::map<std::string, ConfigValue>& given,
                      const std::map<std::string, std::string>& source_of) {
  RunConfig c;
  for (const auto& [key, value] : given) {
    const ConfigKey* k = find_key(key);
    const std::string where = source_of.count(key) ? source_of.at(key) : "config";
    if (!k) unknown_key(key, where);
    const bool number_from_integer =
        std::holds_alternative<double>(k->default_value) && std::holds_alternative<int64_t>(value);
    if (value.index() != k->default_value.index() && !number_from_integer)
      throw ConfigError(where + ": key '" + key + "' must be " + type_name(k->default_value));
    try {
      k->set(c, value);
    } catch (const ConfigError& e) {
      throw ConfigError(where + ": key '" + key + "': " + e.what());
    }
  }
  if (c.checkpoint_dir.empty())
    c.checkpoint_dir = (fs::path(c.base_output_directory) / c.run_name / "checkpoints").string();
  if (c.metrics_file.empty())
    c.metrics_file = (fs::path(c.base_output_directory) / c.run_name / "metrics.jsonl").string();
  if (c.offload_dir.empty()) c.offload_dir = (fs::path(c.base_output_directory) / c.run_name / "offload").string();
  for (const ConfigKey& k : config_keys())
    c.sources[k.name] = source_of.count(k.name) ? source_of.at(k.name) : given.count(k.name) ? "config" : "default";
  return c;
}

}  // namespace

RunConfig config_from_values(const std::map<std::string, ConfigValue>& given) { return config_from(given, {}); }

std::map<std::string, ConfigValue> RunConfig::values() const {
  std::map<std::string, ConfigValue> v;
  for (const ConfigKey& k : config_keys()) v[k.name] = k.get(*this);
  return v;
}

RunConfig::RunConfig() {
  for (const ConfigKey& k : config_keys()) k.set(*this, k.default_value);
}

namespace {

void require(bool ok, const std::string& rule) {
  if (!ok) throw ConfigError("invalid config: " + rule);
}

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

MeshShape RunConfig::mesh_shape() const {
  MeshShape s;
  s.dp = static_cast<int>(dp), s.cp = static_cast<int>(cp), s.ulysses = static_cast<int>(cp_ulysses);
  s.tp = static_cast<int>(tp), s.fsdp = static_cast<int>(fsdp), s.fsdp_over_context = fsdp_over_context;
  return s;
}

MeshShape RunConfig::mesh_shape(int64_t world) const {
  require(cp >= 1, "ici_context_parallelism must be >= 1 (got " + str(cp) + ")");
  require(tp >= 1, "ici_tensor_parallelism must be >= 1 (got " + str(tp) + ")");
  require(dp >= 1 || dp == -1, "ici_data_parallelism must be >= 1 or -1 (fill), got " + str(dp));
  require(fsdp >= 1 || fsdp == -1, "ici_fsdp_parallelism must be >= 1 or -1 (fill), got " + str(fsdp));
  require(dp != -1 || fsdp != -1, "only one of ici_data_parallelism and ici_fsdp_parallelism may be -1 (fill)");
  // Products of config sizes are checked: 4611686018427387904 * 4 wrapped to 0.
  const int64_t cp_tp = checked_mul(cp, tp, "ici_context_parallelism * ici_tensor_parallelism");
  int64_t data = dp, shards = fsdp;
  if (dp == -1 || fsdp == -1) {
    const int64_t other = dp == -1 ? fsdp : dp;
    const char* fill = dp == -1 ? "ici_data_parallelism" : "ici_fsdp_parallelism";
    const int64_t rest = checked_mul(other, cp_tp, "the mesh axes");
    require(world % rest == 0, std::string(fill) + "=-1 needs the world size (" + str(world) +
                                   ") divisible by the product of the other axes (" + str(rest) + ")");
    (dp == -1 ? data : shards) = world / rest;
  }
  const int64_t mesh = checked_mul(checked_mul(data, shards, "ici_data_parallelism * ici_fsdp_parallelism"), cp_tp,
                                   "ici_data_parallelism * ici_fsdp_parallelism * ici_context_parallelism * "
                                   "ici_tensor_parallelism");
  require(mesh == world, "ici_data_parallelism * ici_fsdp_parallelism * ici_context_parallelism * "
                         "ici_tensor_parallelism = " + str(data) + " * " + str(shards) + " * " + str(cp) + " * " +
                             str(tp) + " = " + str(mesh) + " must equal the number of ranks (" + str(world) + ")");
  MeshShape s = mesh_shape();
  s.dp = static_cast<int>(data);
  s.fsdp = static_cast<int>(shards);
  return s;
}

CpStrategy RunConfig::strategy() const {
  if (!cp_strategy) throw ConfigError("context_parallel_strategy=auto must be resolved by the planner first");
  return *cp_strategy;
}

int64_t RunConfig::ulysses_degree() const {
  if (!cp_strategy) return 1;  // auto: the planner picks the split with the strategy
  return cp_strategy_info(*cp_strategy).ulysses_degree(cp, cp_ulysses);
}

LayoutKind RunConfig::layout() const {
  return cp_load_balance && cp > 1 ? LayoutKind::zigzag : LayoutKind::contiguous;
}

MaskSpec RunConfig::mask() const {
  switch (attention_type) {
    case MaskKind::full: return MaskSpec::full();
    case MaskKind::causal: return MaskSpec::causal();
    case MaskKind::local:  // the window counts the query itself
      if (sliding_window_size <= 0) throw ConfigError("attention_type=local needs sliding_window_size > 0");
      return MaskSpec::local(sliding_window_size - 1, 0);
    case MaskKind::chunked:
      if (chunk_attn_window_size <= 0) throw ConfigError("attention_type=chunked needs chunk_attn_window_size > 0");
      return MaskSpec::chunked(chunk_attn_window_size);
  }
  return MaskSpec::causal();
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::vector<Layer> layers;
  std::set<std::string> seen;
  fs::path root_dir;
  load_chain(path, layers, seen, root_dir);
  Layer cmdline = parse_overrides(overrides);

  std::map<std::string, ConfigValue> values;
  std::map<std::string, std::string> sources;
  for (const auto& l : layers) apply_layer(l, values, sources);
  // model_name may come from any layer, the command line included.
  std::map<std::string, ConfigValue> probe = values;
  std::map<std::string, std::string> probe_sources;
  apply_layer(cmdline, probe, probe_sources);
  std::string model_name = probe.count("model_name") ? std::get<std::string>(probe["model_name"]) : "";
  if (!model_name.empty()) {
    fs::path model_path = model_name.ends_with(".yml") || model_name.ends_with(".yaml")
                              ? fs::path(model_name)
                              : root_dir / "model" / (model_name + ".yml");
    if (!fs::exists(model_path))
      throw ConfigError("model_name '" + model_name + "': no model file '" + model_path.string() +
                        "' (model files live in configs/model/)");
    Layer model{model_path.string(), load_yaml_file(model_path)};
    apply_layer(model, values, sources);
  }
  apply_layer(cmdline, values, sources);

  return config_from(values, sources);
}

std::string RunConfig::to_yaml() const {
  std::ostringstream out;
  for (const auto& k : config_keys()) {
    const ConfigValue v = k.get(*this);
    out << k.name << ": ";
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            YAML::Emitter e;
            e << YAML::DoubleQuoted << x;
            out << e.c_str();
          } else if constexpr (std::is_same_v<T, bool>) {
            out << (x ? "true" : "false");
          } else if constexpr (std::is_same_v<T, double>) {
            char buf[40];
            std::snprintf(buf, sizeof buf, "%.17g", x);
            std::string s = buf;
            // Keep it a float in YAML so the type survives a reload.
            if (s.find_first_of(".eninf") == std::string::npos) s += ".0";
            out << s;
          } else {
            out << x;
          }
        },
        v);
    out << "\n";
  }
  return out.str();
}

void validate_config(RunConfig& c, int64_t world) {
  const LlamaConfig& m = c.model;
  // ---- numbers: NaN/Inf pass every >= and < rule (or fail it with a wrong
  // message) and train NaN from step 1: every double key must be finite.
  // The key/value form is derived from the fields, so this covers every one.
  for (const ConfigKey& k : config_keys())
    if (std::holds_alternative<double>(k.default_value)) {
      const double d = std::get<double>(k.get(c));
      require(std::isfinite(d), std::string(k.name) + " must be a finite number (got " + std::to_string(d) + ")");
    }
  require(m.norm_eps > 0, "normalization_layer_epsilon must be > 0 (got " + std::to_string(m.norm_eps) + ")");
  require(m.rope_theta > 0, "rope_max_timescale must be > 0 (got " + std::to_string(m.rope_theta) + ")");
  require(m.rope_scaling_factor > 0,
          "rope_scaling_factor must be > 0 (got " + std::to_string(m.rope_scaling_factor) + ")");
  // ---- mesh: the data axes resolved on the world (an axis at -1 fills it)
  const MeshShape resolved = c.mesh_shape(world);
  c.dp = resolved.dp;
  c.fsdp = resolved.fsdp;

  // ---- strategy
  require(c.cp_strategy.has_value(), "context_parallel_strategy=auto must be resolved by the planner before validation");
  const CpStrategy s = *c.cp_strategy;
  const std::string usp_rule = usp_factor_rule(s, c.cp, c.cp_ulysses);
  require(usp_rule.empty(), usp_rule);
  // Ranks that exchange heads by all-to-all: all of cp for ulysses, the
  // ulysses factor for usp.
  const int64_t a2a = c.ulysses_degree();

  // ---- model shape
  require(m.vocab_size >= 1 && m.d_model >= 1 && m.num_heads >= 1 && m.num_kv_heads >= 1 &&
              m.head_dim >= 2 && m.mlp_dim >= 1 && m.num_layers >= 1,
          "model dimensions (vocab_size, base_emb_dim, heads, head_dim, base_mlp_dim, layers) must be positive");
  // Every size derived from the shape must fit int64: the parameter count
  // (checked inside), its bytes (weights, gradients, AdamW moments: 16 per
  // parameter), and the per-head widths the projections use.
  checked_mul(m.num_heads, m.head_dim, "base_num_query_heads * head_dim");
  checked_mul(parameters_per_tp_rank(m, 1), 16, "the model's bytes (parameters * 16: weights, gradients, moments)");
  require(m.head_dim % 2 == 0, "head_dim must be even (RoPE rotates halves), got " + str(m.head_dim));
  require(m.num_heads % m.num_kv_heads == 0,
          "base_num_query_heads (" + str(m.num_heads) + ") must be divisible by base_num_kv_heads (" +
              str(m.num_kv_heads) + ") (GQA)");
  require(m.num_heads % c.tp == 0, "base_num_query_heads (" + str(m.num_heads) +
                                       ") must be divisible by ici_tensor_parallelism (" + str(c.tp) + ")");
  require(m.num_kv_heads % c.tp == 0, "base_num_kv_heads (" + str(m.num_kv_heads) +
                                          ") must be divisible by ici_tensor_parallelism (" + str(c.tp) + ")");
  require(m.mlp_dim % c.tp == 0, "base_mlp_dim (" + str(m.mlp_dim) +
                                     ") must be divisible by ici_tensor_parallelism (" + str(c.tp) + ")");
  if (a2a > 1) {
    int64_t h = m.num_heads / c.tp, g = m.num_kv_heads / c.tp, u = a2a;
    require(h % u == 0, "ulysses all-to-all needs the query heads per tp rank (" + str(h) +
                            ") divisible by the ulysses degree (" + str(u) + ")");
    require(g % u == 0 || u % g == 0, "ulysses all-to-all needs the KV heads per tp rank (" + str(g) +
                                          ") divisible by the ulysses degree (" + str(u) +
                                          ") or dividing it (KV heads replicated)");
  }
  require(c.weight_dtype == DType::f32,
          "weight_dtype must be float32: master weights, gradients and AdamW moments stay fp32 (dtype: bfloat16 "
          "sets the compute precision), got '" + std::string(name_of(c.weight_dtype)) + "'");
  c.save_set();  // ConfigError when a custom policy does not keep the layer input

  // ---- attention
  const MaskKind a = c.attention_type;
  require(a != MaskKind::local || c.sliding_window_size > 0,
          "attention_type=local needs sliding_window_size > 0 (got " + str(c.sliding_window_size) + ")");
  require(a != MaskKind::chunked || c.chunk_attn_window_size > 0,
          "attention_type=chunked needs chunk_attn_window_size > 0 (got " + str(c.chunk_attn_window_size) + ")");
  require(c.sliding_window_size >= 0 && c.chunk_attn_window_size >= 0, "window sizes must be >= 0");
  require(c.layer_token_chunk >= 0, "layer_token_chunk must be >= 0 (0 = all local tokens; got " +
                                        str(c.layer_token_chunk) + ")");

  // ---- sequence and layout
  require(c.max_target_length >= 2, "max_target_length must be >= 2 (got " + str(c.max_target_length) + ")");
  require(c.max_target_length % c.cp == 0, "max_target_length (" + str(c.max_target_length) +
                                               ") must be divisible by ici_context_parallelism (" + str(c.cp) + ")");
  if (c.cp_load_balance && c.cp > 1) {
    // zigzag (src/cp/layout.h): 2 * ring chunks; ring rank i holds chunks i and 2R-1-i.
    require(c.max_target_length % checked_mul(2, c.mesh_shape().ring(), "2 * ring") == 0,
            "context_parallel_load_balance (zigzag) needs max_target_length (" + str(c.max_target_length) +
                ") divisible by 2 * ring (ring = ici_context_parallelism / ulysses = " + str(c.mesh_shape().ring()) + ")");
  }
  require(c.per_device_batch_size >= 1, "per_device_batch_size must be >= 1");
  if (c.tp_sequence_parallel) {
    require(c.tp > 1, "tensor_sequence_parallelism needs ici_tensor_parallelism > 1 (got " + str(c.tp) + ")");
    const int64_t local = checked_mul(c.per_device_batch_size, c.max_target_length,
                                      "per_device_batch_size * max_target_length") / c.cp;  // divisible: checked above
    require(local % c.tp == 0, "tensor_sequence_parallelism needs the tokens of a cp rank, per_device_batch_size * "
                               "max_target_length / ici_context_parallelism = " + str(local) +
                               ", divisible by ici_tensor_parallelism (" + str(c.tp) + ")");
  }
  // The largest activation, the logits of a replica's batch (and the data's
  // 2 * max_target_length), must have a size that fits int64.
  checked_mul(checked_mul(checked_mul(c.per_device_batch_size, c.max_target_length,
                                      "per_device_batch_size * max_target_length"),
                          m.vocab_size, "per_device_batch_size * max_target_length * vocab_size"),
              4, "the logits' bytes (per_device_batch_size * max_target_length * vocab_size * 4)");

  // ---- data
  const DatasetType d = c.dataset_type;
  require(d == DatasetType::synthetic || !c.dataset_path.empty(),
          "dataset_path must be set for dataset_type=" + std::string(name_of(d)));
  require(d != DatasetType::text || m.vocab_size >= 259,
          "dataset_type=text (byte tokenizer: 256 bytes + BOS, EOS, PAD) needs vocab_size >= 259 (got " +
              str(m.vocab_size) + ")");

  // ---- optimisation
  require(c.steps >= 1, "steps must be >= 1 (got " + str(c.steps) + ")");
  require(c.learning_rate >= 0, "learning_rate must be >= 0");
  require(c.warmup_steps_fraction >= 0 && c.warmup_steps_fraction <= 1, "warmup_steps_fraction must be in [0, 1]");
  require(c.cosine_learning_rate_final_fraction >= 0 && c.cosine_learning_rate_final_fraction <= 1,
          "cosine_learning_rate_final_fraction must be in [0, 1]");
  require(c.adam_b1 >= 0 && c.adam_b1 < 1 && c.adam_b2 >= 0 && c.adam_b2 < 1, "adam_b1 and adam_b2 must be in [0, 1)");
  require(c.adam_eps > 0, "adam_eps must be > 0");
  require(c.adam_weight_decay >= 0, "adam_weight_decay must be >= 0");
  require(c.gradient_clipping_threshold >= 0, "gradient_clipping_threshold must be >= 0 (0 = off)");
  require(c.init_weights_seed >= 0, "init_weights_seed must be >= 0");
  require(c.eval_steps >= 1, "eval_steps must be >= 1 (got " + str(c.eval_steps) + ")");
  require(c.eval_first_bucket >= 1, "eval_first_bucket must be >= 1 (got " + str(c.eval_first_bucket) + ")");
  if (c.shard_optimizer_over_data) {
    // Each replica of the parameter shard owns a contiguous piece of at least one element.
    const int64_t group = c.mesh_shape().shard_group(), replicas = c.mesh_shape().replicas();
    const int64_t shard = parameter_shard_elements(m, c.tp, group);
    require(shard >= replicas,  // <= the world size: no overflow
            "shard_optimizer_over_data needs at least one parameter per replica (replicas = " + str(replicas) +
                ", parameters per shard = " + str(shard) + ")");
  }

  require(!c.parameter_memory_host_offload || c.mesh_shape().shard_group() > 1,
          "parameter_memory_host_offload needs FSDP (ici_fsdp_parallelism > 1, or fsdp_over_context with "
          "ici_context_parallelism > 1): unsharded, the model computes from its parameters in place, so there is "
          "nothing to bring to the device per layer");
  require(c.parameter_tier() != StateTier::disk || !c.shard_optimizer_over_data ||
              c.dp * (c.fsdp_over_context ? 1 : c.cp) == 1,
          "parameter_memory_host_offload with state_offload_target: disk does not combine with "
          "shard_optimizer_over_data over 2 or more replicas (the updated pieces are all-gathered in device memory): "
          "use state_offload_target: host, or turn ZeRO-1 off");

  // ---- run and system
  require(c.checkpoint_period >= 0, "checkpoint_period must be >= 0 (0 = only at the end)");
  require(c.max_num_checkpoints_to_keep >= 0, "max_num_checkpoints_to_keep must be >= 0 (0 = keep all)");
  require(c.log_period >= 1, "log_period must be >= 1");
  require(c.progress_interval_seconds >= 0,
          "progress_interval_seconds must be >= 0 (0 = off; got " + std::to_string(c.progress_interval_seconds) + ")");
  require(c.device_memory_budget >= 0, "device_memory_budget must be >= 0 (0 = unlimited)");
  require(c.host_memory_budget >= 0, "host_memory_budget must be >= 0 (0 = unlimited)");
  require(c.peak_tflops_per_device >= 0, "peak_tflops_per_device must be >= 0 (0 = measure)");
  require(c.collective_timeout_seconds >= 1, "collective_timeout_seconds must be >= 1");
  require(c.num_threads >= 0, "num_threads must be >= 0 (0 = OpenMP default)");
  // libgomp crashes creating 100000 threads; far more than any CPU's cores is a typo.
  constexpr int64_t kMaxThreads = 1024;
  require(c.num_threads <= kMaxThreads, "num_threads must be <= " + str(kMaxThreads) + " (got " +
                                            str(c.num_threads) + ")");
  require(!c.run_name.empty(), "run_name must not be empty");
}

}  // namespace longctx
