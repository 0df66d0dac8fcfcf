#include "plan/hardware.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;

double HardwareProfile::peak_flops(DType dtype) const {
  double peak = dtype == DType::bf16 ? peak_flops_bf16 : peak_flops_fp32;
  if (peak <= 0)
    throw ConfigError("hardware profile '" + name + "' has no peak FLOP/s for " +
                      name_of(dtype) + "; choose another dtype or profile");
  return peak;
}

HardwareProfile HardwareProfile::for_dtype(DType dtype) const {
  HardwareProfile h = *this;
  if (dtype == DType::bf16 && bf16) static_cast<KernelTables&>(h) = *bf16;
  h.bf16.reset();
  return h;
}

std::string HardwareProfile::dtype_tables_warning(DType dtype) const {
  // Only tables `plan --measure` took (it times the elementwise kernels too)
  // are per dtype; a datasheet profile's GEMM table was measured in bf16.
  if (dtype != DType::bf16 || bf16 || matmul_efficiency_per_width.empty() || elementwise_bandwidth_per_kernel.empty())
    return "";
  return "hardware profile '" + name + "' has no bf16 tables (measured before `plan --measure` took them): "
         "this bf16 plan uses its fp32 kernel rates; rerun `mpiexec -n N longctx plan --measure`";
}

namespace {
// Log-linear in x (head dim, width) between measured points, clamped to the ends.
double interpolate(const std::map<int64_t, double>& m, double x) {
  if (x <= m.begin()->first) return m.begin()->second;
  if (x >= m.rbegin()->first) return m.rbegin()->second;
  auto hi = m.upper_bound(static_cast<int64_t>(x)), lo = std::prev(hi);
  const double t = std::log(x / lo->first) / std::log(double(hi->first) / lo->first);
  return lo->second + t * (hi->second - lo->second);
}
}  // namespace

double HardwareProfile::matmul_efficiency_at(double width) const {
  if (matmul_efficiency_per_width.empty()) return matmul_efficiency;
  return interpolate(matmul_efficiency_per_width, width);
}

double HardwareProfile::attention_efficiency_at(int64_t head_dim) const {
  if (attention_efficiency_per_head_dim.empty()) return attention_efficiency;
  return interpolate(attention_efficiency_per_head_dim, double(head_dim));
}

double HardwareProfile::attention_forward_efficiency_at(int64_t head_dim) const {
  if (attention_forward_efficiency_per_head_dim.empty()) return attention_efficiency_at(head_dim);
  return interpolate(attention_forward_efficiency_per_head_dim, double(head_dim));
}

double HardwareProfile::attention_partial_tile_cost_at(const std::string& mask_kind, int64_t head_dim) const {
  auto it = attention_partial_tile_cost.find(mask_kind);
  if (it == attention_partial_tile_cost.end() || it->second.empty()) return 1.0;
  return interpolate(it->second, double(head_dim));
}

double HardwareProfile::elementwise_bandwidth_of(const std::string& kernel) const {
  auto it = elementwise_bandwidth_per_kernel.find(kernel);
  if (it != elementwise_bandwidth_per_kernel.end() && it->second > 0) return it->second;
  return elementwise_bandwidth > 0 ? elementwise_bandwidth : memory_bandwidth;
}

namespace {

// Every numeric field with its YAML key, so that load and save cannot drift.
struct Field {
  const char* key;
  double HardwareProfile::*real;
  int64_t HardwareProfile::*integer;
};
const std::vector<Field>& fields() {
  using H = HardwareProfile;
  static const std::vector<Field> f = {
      {"peak_flops_bf16", &H::peak_flops_bf16, nullptr},
      {"peak_flops_fp32", &H::peak_flops_fp32, nullptr},
      {"matmul_efficiency", &H::matmul_efficiency, nullptr},
      {"attention_efficiency", &H::attention_efficiency, nullptr},
      {"attention_block", nullptr, &H::attention_block},
      {"attention_half_rate_tokens", &H::attention_half_rate_tokens, nullptr},
      {"threads_per_device", nullptr, &H::threads_per_device},
      {"memory_bytes", nullptr, &H::memory_bytes},
      {"memory_bandwidth", &H::memory_bandwidth, nullptr},
      {"elementwise_bandwidth", &H::elementwise_bandwidth, nullptr},
      {"devices_per_node", nullptr, &H::devices_per_node},
      {"link_bandwidth", &H::link_bandwidth, nullptr},
      {"links_per_device", nullptr, &H::links_per_device},
      {"torus", nullptr, &H::torus},
      {"p2p_bandwidth", &H::p2p_bandwidth, nullptr},
      {"collective_bandwidth", &H::collective_bandwidth, nullptr},
      {"all_to_all_bandwidth", &H::all_to_all_bandwidth, nullptr},
      {"latency", &H::latency, nullptr},
      {"inter_node_bandwidth", &H::inter_node_bandwidth, nullptr},
      {"inter_node_latency", &H::inter_node_latency, nullptr},
      {"inter_node_all_reduce_bandwidth", &H::inter_node_all_reduce_bandwidth, nullptr},
      {"inter_node_collective_bandwidth", &H::inter_node_collective_bandwidth, nullptr},
      {"inter_node_all_to_all_bandwidth", &H::inter_node_all_to_all_bandwidth, nullptr},
      {"host_link_bandwidth", &H::host_link_bandwidth, nullptr},
      {"disk_bandwidth", &H::disk_bandwidth, nullptr},
  };
  return f;
}

// The tables keyed by an integer (head dim, width), with their YAML keys.
using IntTable = std::map<int64_t, double> KernelTables::*;
const std::vector<std::pair<const char*, IntTable>>& int_tables() {
  using H = KernelTables;
  static const std::vector<std::pair<const char*, IntTable>> t = {
      {"matmul_efficiency_per_width", &H::matmul_efficiency_per_width},
      {"attention_efficiency_per_head_dim", &H::attention_efficiency_per_head_dim},
      {"attention_forward_efficiency_per_head_dim", &H::attention_forward_efficiency_per_head_dim},
  };
  return t;
}

// Reads `key` into `t` when it names a kernel table (KernelTables); false
// when it does not. The top level and the bf16 section both read through it.
bool read_table(const std::string& key, const YAML::Node& value, KernelTables& t, const std::string& where) {
  if (key == "elementwise_bandwidth_per_kernel") {
    try {
      for (const auto& e : value) t.elementwise_bandwidth_per_kernel[e.first.as<std::string>()] = e.second.as<double>();
    } catch (const YAML::Exception&) {
      throw ConfigError("hardware profile " + where + ": " + key + " must map kernel names to bytes/s");
    }
    return true;
  }
  if (key == "attention_partial_tile_cost") {
    try {
      for (const auto& kind : value)
        for (const auto& e : kind.second)
          t.attention_partial_tile_cost[kind.first.as<std::string>()][e.first.as<int64_t>()] = e.second.as<double>();
    } catch (const YAML::Exception&) {
      throw ConfigError("hardware profile " + where + ": " + key +
                        " must map mask kinds to maps of head dims to numbers");
    }
    return true;
  }
  for (const auto& [name, member] : int_tables()) {
    if (key != name) continue;
    try {
      for (const auto& e : value) (t.*member)[e.first.as<int64_t>()] = e.second.as<double>();
    } catch (const YAML::Exception&) {
      throw ConfigError("hardware profile " + where + ": " + key + " must map integers to numbers");
    }
    return true;
  }
  return false;
}

// The non-empty tables of `t`, under the keys read_table reads.
void write_tables(YAML::Emitter& out, const KernelTables& t) {
  for (const auto& [key, member] : int_tables()) {
    if ((t.*member).empty()) continue;
    out << YAML::Key << key << YAML::Value << YAML::BeginMap;
    for (const auto& [d, e] : t.*member) out << YAML::Key << d << YAML::Value << e;
    out << YAML::EndMap;
  }
  if (!t.attention_partial_tile_cost.empty()) {
    out << YAML::Key << "attention_partial_tile_cost" << YAML::Value << YAML::BeginMap;
    for (const auto& [kind, by_dim] : t.attention_partial_tile_cost) {
      out << YAML::Key << kind << YAML::Value << YAML::BeginMap;
      for (const auto& [d, c] : by_dim) out << YAML::Key << d << YAML::Value << c;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  if (!t.elementwise_bandwidth_per_kernel.empty()) {
    out << YAML::Key << "elementwise_bandwidth_per_kernel" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, bw] : t.elementwise_bandwidth_per_kernel) out << YAML::Key << k << YAML::Value << bw;
    out << YAML::EndMap;
  }
}

std::string executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

}  // namespace

std::string find_in_repository(const std::string& relative) {
  // The command runs from the repository root or from a build directory
  // beside configs/ (build/longctx, build-*/tests/unit/...).
  std::vector<fs::path> candidates = {fs::current_path() / relative};
  for (fs::path p = executable_dir(); !p.empty() && p != p.root_path(); p = p.parent_path())
    candidates.push_back(p / relative);
  for (const fs::path& c : candidates)
    if (fs::exists(c)) return c.string();
  return relative;
}

std::string default_hardware_dir() {
  // LONGCTX_HARDWARE_DIR overrides (tests: a directory without cpu-local.yml).
  if (const char* env = std::getenv("LONGCTX_HARDWARE_DIR"); env && *env) return env;
  return find_in_repository("configs/hardware");
}

HardwareProfile load_hardware_profile(const std::string& name_or_path,
                                      const std::string& search_dir) {
  fs::path path = name_or_path;
  if (path.extension() != ".yml") {
    path = fs::path(search_dir.empty() ? default_hardware_dir() : search_dir) / (name_or_path + ".yml");
  }
  if (!fs::exists(path)) {
    std::string known;
    if (fs::is_directory(path.parent_path()))
      for (const auto& e : fs::directory_iterator(path.parent_path()))
        if (e.path().extension() == ".yml") known += " " + e.path().stem().string();
    throw ConfigError("hardware profile '" + name_or_path + "' not found at " + path.string() +
                      (known.empty() ? "" : "; known profiles:" + known) +
                      (name_or_path == "cpu-local" ? "; run `longctx plan --measure` first" : ""));
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& e) {
    throw ConfigError("hardware profile " + path.string() + ": " + e.what());
  }
  HardwareProfile h;
  h.name = root["name"] ? root["name"].as<std::string>() : path.stem().string();
  if (root["description"]) h.description = root["description"].as<std::string>();
  if (root["topology"]) h.topology = root["topology"].as<std::string>();
  if (root["kernels"]) {
    try {
      h.kernels = kernel_target_of(root["kernels"].as<std::string>());
    } catch (const ConfigError& e) {
      throw ConfigError("hardware profile " + name_or_path + ": " + e.what());
    }
  }
  if (root["platform"]) {
    try {
      h.platform = parse_enum<Platform>(root["platform"].as<std::string>());
    } catch (const ConfigError& e) {
      throw ConfigError("hardware profile " + name_or_path + ": " + e.what());
    }
  }
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    if (key == "name" || key == "description" || key == "topology" || key == "kernels" || key == "platform" ||
        key == "sources")
      continue;
    if (key == "bf16") {
      if (!kv.second.IsMap())
        throw ConfigError("hardware profile " + path.string() + ": bf16 must be a section of kernel tables");
      KernelTables& t = h.bf16.emplace();
      for (const auto& e : kv.second) {
        const std::string table = e.first.as<std::string>();
        if (!read_table(table, e.second, t, path.string()))
          throw ConfigError("hardware profile " + path.string() + ": unknown key 'bf16." + table +
                            "' (the bf16 section holds kernel tables only)");
      }
      continue;
    }
    if (read_table(key, kv.second, h, path.string())) continue;
    bool known = false;
    for (const Field& f : fields())
      if (key == f.key) {
        known = true;
        try {
          if (f.real) h.*f.real = kv.second.as<double>();
          else h.*f.integer = static_cast<int64_t>(kv.second.as<double>());
        } catch (const YAML::Exception&) {
          throw ConfigError("hardware profile " + path.string() + ": '" + key + "' must be a number");
        }
      }
    if (!known) throw ConfigError("hardware profile " + path.string() + ": unknown key '" + key + "'");
  }
  if (root["sources"])
    for (const auto& kv : root["sources"])
      h.sources[kv.first.as<std::string>()] = kv.second.as<std::string>();
  if (h.memory_bytes <= 0 || h.p2p_bandwidth <= 0 || h.collective_bandwidth <= 0 ||
      h.all_to_all_bandwidth <= 0 || h.memory_bandwidth <= 0)
    throw ConfigError("hardware profile " + path.string() +
                      ": memory_bytes, memory_bandwidth, p2p_bandwidth, collective_bandwidth and "
                      "all_to_all_bandwidth must all be > 0");
  return h;
}

void save_hardware_profile(const HardwareProfile& h, const std::string& path) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << h.name;
  out << YAML::Key << "description" << YAML::Value << h.description;
  out << YAML::Key << "topology" << YAML::Value << h.topology;
  out << YAML::Key << "kernels" << YAML::Value << kernel_target_name(h.kernels);
  out << YAML::Key << "platform" << YAML::Value << name_of(h.platform);
  for (const Field& f : fields()) {
    out << YAML::Key << f.key << YAML::Value;
    if (f.real) out << h.*f.real;
    else out << h.*f.integer;
  }
  write_tables(out, h);
  if (h.bf16) {
    out << YAML::Key << "bf16" << YAML::Value << YAML::BeginMap;
    write_tables(out, *h.bf16);
    out << YAML::EndMap;
  }
  out << YAML::Key << "sources" << YAML::Value << YAML::BeginMap;
  for (const auto& [k, v] : h.sources) out << YAML::Key << k << YAML::Value << v;
  out << YAML::EndMap << YAML::EndMap;
  fs::path tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw ConfigError("cannot write hardware profile to " + path);
    f << "# Written by `longctx plan --measure`; numbers in SI units (bytes, bytes/s, FLOP/s, s).\n"
      << out.c_str() << "\n";
  }
  fs::rename(tmp, path);
}

}  // namespace longctx
