#include "train/checkpoint_files.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace longctx {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_all(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) throw DataError("checkpoint file '" + p.string() + "' is not a regular file");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw DataError("checkpoint file '" + p.string() + "' cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw DataError("checkpoint file '" + p.string() + "' cannot be read (I/O error)");
  return s.str();
}

// A JSON value that is a non-negative integer (json "3", not 3.0 or -1).
bool is_count(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

}  // namespace

std::string safetensors_bytes(const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    size_t bytes = t->data.size() * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", t->shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : tensors)
    out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size() * sizeof(float));
  return out;
}

size_t stored_type_bytes(StoredType t) { return t == StoredType::f32 ? 4 : 2; }

namespace {

// IEEE half to float, exactly (every half, subnormals, Inf and NaN included).
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf, NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal: exact in fp32
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::optional<StoredType> stored_type_named(const json& name) {
  if (name == "F32") return StoredType::f32;
  if (name == "BF16") return StoredType::bf16;
  if (name == "F16") return StoredType::f16;
  return std::nullopt;
}

}  // namespace

void widen_to_f32(StoredType t, const void* src, size_t n, float* dst) {
  const auto* b = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    if (t == StoredType::f32) {
      std::memcpy(dst + i, b + 4 * i, 4);
      continue;
    }
    const uint16_t h = static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8));
    if (t == StoredType::f16) {
      dst[i] = half_to_float(h);
    } else {  // bf16: the high half of an fp32
      const uint32_t bits = uint32_t(h) << 16;
      std::memcpy(dst + i, &bits, 4);
    }
  }
}

std::map<std::string, SafetensorsEntry> parse_safetensors_header(const std::string& text, uint64_t data_bytes,
                                                                 const std::string& what) {
  auto bad = [&](const std::string& why) { return DataError("checkpoint file '" + what + "': " + why); };
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw bad(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header must be a JSON object of tensors, got " + std::string(header.type_name()));
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  std::map<std::string, SafetensorsEntry> out;
  for (const auto& [name, info] : header.items()) {
    const std::string t_name = "tensor '" + name + "'";
    if (name == "__metadata__") {
      if (!info.is_object()) throw bad("__metadata__ must be a JSON object");
      continue;
    }
    if (!info.is_object()) throw bad(t_name + " must be a JSON object (dtype, shape, data_offsets)");
    const json dtype = info.contains("dtype") ? info["dtype"] : json("(missing)");
    const auto type = stored_type_named(dtype);
    if (!type) throw bad(t_name + " has unsupported dtype " + dtype.dump() + " (longctx reads F32, BF16 and F16)");
    if (!info.contains("shape") || !info["shape"].is_array())
      throw bad(t_name + ": shape must be an array of non-negative integers");
    SafetensorsEntry t;
    t.type = *type;
    const int64_t elem = static_cast<int64_t>(stored_type_bytes(t.type));
    // The product is overflow-checked: [2^31, 2^31] * 4 bytes wrapped.
    int64_t numel = 1;
    for (const json& d : info["shape"]) {
      if (!is_count(d) || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw bad(t_name + ": shape must be an array of non-negative integers, got " + info["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
      int64_t next;
      if (__builtin_mul_overflow(numel, t.shape.back(), &next) || __builtin_mul_overflow(next, elem, &next))
        throw bad(t_name + ": shape " + info["shape"].dump() + " has more bytes than int64 holds");
      numel *= t.shape.back();
    }
    const json& off = info.contains("data_offsets") ? info["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !is_count(off[0]) || !is_count(off[1]))
      throw bad(t_name + ": data_offsets must be [begin, end], two non-negative integers");
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.end < t.begin) throw bad(t_name + ": data_offsets [begin, end] must have begin <= end, got " + off.dump());
    if (t.end > data_bytes)
      throw bad(t_name + ": data_offsets " + off.dump() + " end past the data section (" +
                std::to_string(data_bytes) + " bytes)");
    if (t.end - t.begin != static_cast<uint64_t>(numel * elem))
      throw bad(t_name + ": data_offsets " + off.dump() + " hold " + std::to_string(t.end - t.begin) +
                " bytes, its shape " + info["shape"].dump() + " of " + dtype.get<std::string>() + " needs " +
                std::to_string(numel * elem));
    spans.push_back({t.begin, t.end, name});
    out.emplace(name, std::move(t));
  }
  // In offset order the tensors must tile the data section: an overlap or a
  // gap (room for other content) is a corrupt or crafted file.
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.begin < covered)
      throw bad("tensor '" + s.name + "' data_offsets [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                "] overlap tensor '" + spans[i - 1].name + "' (offsets must not overlap)");
    if (s.begin > covered)
      throw bad("tensor '" + s.name + "' starts at byte " + std::to_string(s.begin) + " of the data section, after a gap from byte " +
                std::to_string(covered) + " (the tensors must cover it, in order, without gaps)");
    covered = s.end;
  }
  if (covered != data_bytes)
    throw bad("the tensors cover " + std::to_string(covered) + " of the data section's " +
              std::to_string(data_bytes) + " bytes (they must cover all of it)");
  return out;
}

std::map<std::string, HostTensor> parse_safetensors(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 8) throw DataError("checkpoint file '" + what + "': too short for a safetensors header");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) throw DataError("checkpoint file '" + what + "': header length exceeds the file");
  const uint64_t data_start = 8 + n;
  std::map<std::string, HostTensor> out;
  for (auto& [name, e] : parse_safetensors_header(bytes.substr(8, n), bytes.size() - data_start, what)) {
    HostTensor t;
    t.shape = e.shape;
    t.data.resize((e.end - e.begin) / stored_type_bytes(e.type));
    widen_to_f32(e.type, bytes.data() + data_start + e.begin, t.data.size(), t.data.data());
    out.emplace(name, std::move(t));
  }
  return out;
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  return parse_safetensors(read_all(path), path);
}

std::map<std::string, std::string> parse_safetensors_index(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) { return DataError("checkpoint file '" + what + "': " + why); };
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    throw bad(std::string("not valid JSON: ") + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw bad("must be a JSON object with a \"weight_map\" object {tensor: file}");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) throw bad("weight_map entry of tensor '" + name + "' must be a file name, got " + file.dump());
    const std::string f = file.get<std::string>();
    // A plain name: the shards live in the directory itself, never outside it.
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\0') != std::string::npos)
      throw bad("weight_map names file '" + f + "' for tensor '" + name +
                "': shard files must be plain names inside the model directory");
    out.emplace(name, f);
  }
  return out;
}

json read_hf_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::exists(p, ec)) throw DataError("model directory '" + dir + "' has no config.json");
  json cfg;
  try {
    cfg = json::parse(read_all(p));
  } catch (const json::exception& e) {
    throw DataError("checkpoint file '" + p.string() + "' is not valid JSON: " + e.what());
  }
  if (!cfg.is_object()) throw DataError("checkpoint file '" + p.string() + "' must be a JSON object");
  return cfg;
}

HfWeights::HfWeights(const std::string& dir) {
  const fs::path d(dir), index_path = d / "model.safetensors.index.json";
  std::error_code ec;
  // file name -> the tensors the index puts there (no index: one file, all of its tensors)
  std::map<std::string, std::set<std::string>> listed;
  const bool indexed = fs::exists(index_path, ec);
  if (indexed) {
    for (const auto& [tensor, file] : parse_safetensors_index(read_all(index_path), index_path.string()))
      listed[file].insert(tensor);
  } else {
    listed["model.safetensors"];
  }
  for (const auto& [file, names] : listed) {
    const fs::path p = d / file;
    if (!fs::exists(p, ec))
      throw DataError("model directory '" + dir + "': " + (indexed ? "shard '" + file + "' named by " + index_path.filename().string() : file) +
                      " is missing");
    const std::string what = p.string();
    std::ifstream in(p, std::ios::binary);
    const uint64_t size = fs::is_regular_file(p, ec) ? fs::file_size(p, ec) : 0;
    uint64_t n = 0;
    if (!in || ec || size < 8 || !in.read(reinterpret_cast<char*>(&n), 8))
      throw DataError("checkpoint file '" + what + "': not a readable safetensors file (too short for its header)");
    if (n > size - 8) throw DataError("checkpoint file '" + what + "': header length exceeds the file");
    std::string header(n, '\0');
    if (!in.read(header.data(), static_cast<std::streamsize>(n)))
      throw DataError("checkpoint file '" + what + "' cannot be read");
    for (auto& [name, entry] : parse_safetensors_header(header, size - 8 - n, what)) {
      if (indexed && !names.count(name))
        throw DataError("checkpoint file '" + what + "' holds tensor '" + name + "', which " +
                        index_path.filename().string() + " does not list there");
      tensors_.emplace(name, Located{what, std::move(entry), 8 + n});
    }
    for (const std::string& name : names)
      if (!tensors_.count(name))
        throw DataError(index_path.filename().string() + " puts tensor '" + name + "' in '" + file +
                        "', which does not hold it");
  }
}

HostTensor HfWeights::read(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw DataError("tensor '" + name + "' is not in the model directory");
  const Located& t = it->second;
  std::string bytes(t.entry.end - t.entry.begin, '\0');
  std::ifstream in(t.file, std::ios::binary);
  if (!in || !in.seekg(static_cast<std::streamoff>(t.data_start + t.entry.begin)) ||
      !in.read(bytes.data(), static_cast<std::streamsize>(bytes.size())))
    throw DataError("checkpoint file '" + t.file + "': tensor '" + name + "' cannot be read");
  HostTensor out;
  out.shape = t.entry.shape;
  out.data.resize(bytes.size() / stored_type_bytes(t.entry.type));
  widen_to_f32(t.entry.type, bytes.data(), out.data.size(), out.data.data());
  return out;
}

std::optional<int64_t> checkpoint_step_from_name(const std::string& name) {
  // Digits only (no sign, no spaces) and within int64: atoll took any prefix
  // and saturated, so "step_99999999999999999999999" looked like the newest.
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return std::nullopt;
  const char *b = name.data() + 5, *e = name.data() + name.size();
  if (!std::all_of(b, e, [](char ch) { return ch >= '0' && ch <= '9'; })) return std::nullopt;
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(b, e, step);
  if (ec != std::errc() || end != e) return std::nullopt;
  return step;
}

DataError checkpoint_refused(const std::string& path, const std::string& why) {
  return DataError("checkpoint '" + path + "' refused: " + why + " (delete it to start over, or fix checkpoint_dir)");
}

const std::vector<std::string>& checkpoint_file_names() {
  static const std::vector<std::string> names = {"model.safetensors", "config.json", "optimizer.safetensors",
                                                 "train_state.json", "run_config.yml"};
  return names;
}

std::map<std::string, std::string> read_verified_files(const std::string& path, json& manifest) {
  const fs::path dir(path);
  auto bad = [&](const std::string& why) { return checkpoint_refused(path, why); };
  try {
    manifest = json::parse(read_all(dir / "MANIFEST.json"));
  } catch (const json::exception& e) {
    throw bad(std::string("MANIFEST.json is not valid JSON: ") + e.what());
  }
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    throw bad("MANIFEST.json must be an object with a \"files\" object");
  std::map<std::string, std::string> files;
  const bool no_hf_config = manifest.contains("no_hf_config");
  if (no_hf_config && !manifest["no_hf_config"].is_string())
    throw bad("MANIFEST.json field \"no_hf_config\" must be a string (why there is no config.json)");
  for (const std::string& f : checkpoint_file_names()) {
    if (f == "config.json" && no_hf_config) continue;
    if (!manifest["files"].contains(f)) throw bad("MANIFEST.json does not list " + f);
    const json& rec = manifest["files"][f];
    if (!rec.is_object() || !rec.contains("bytes") || !is_count(rec["bytes"]) || !rec.contains("crc32") ||
        !is_count(rec["crc32"]) || rec["crc32"].get<uint64_t>() > 0xffffffffu)
      throw bad("MANIFEST.json entry of " + f +
                " must be {\"bytes\": a non-negative integer, \"crc32\": an integer below 2^32}, got " + rec.dump());
    std::error_code ec;
    if (!fs::exists(dir / f, ec)) throw bad("file " + f + " is missing");
    std::string bytes = read_all(dir / f);
    const uint64_t want = rec["bytes"].get<uint64_t>();
    if (bytes.size() != want)
      throw bad(f + " has " + std::to_string(bytes.size()) + " bytes, the manifest says " + std::to_string(want));
    if (crc32(bytes.data(), bytes.size()) != rec["crc32"].get<uint64_t>())
      throw bad(f + " fails its CRC-32 check (corrupt)");
    files[f] = std::move(bytes);
  }
  return files;
}

SavedTrainState parse_train_state(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) { return DataError("checkpoint file '" + what + "': " + why); };
  json st;
  try {
    st = json::parse(text);
  } catch (const json::exception& e) {
    throw bad(std::string("train_state.json is not valid JSON: ") + e.what());
  }
  if (!st.is_object()) throw bad("train_state.json must be a JSON object, got " + std::string(st.type_name()));
  // Every field checked: data_cursor = -1 indexed before the data, 2^63-1
  // overflowed the next cursor, step = -100 trained from a negative step.
  // 2^53 steps or sequences are beyond any run and keep all arithmetic exact.
  constexpr int64_t kMaxCount = int64_t(1) << 53;
  auto field = [&](const char* key, int64_t max) -> int64_t {
    const std::string where = "train_state.json field '" + std::string(key) + "'";
    if (!st.contains(key)) throw bad(where + " is missing");
    const json& v = st[key];
    if (!v.is_number_integer()) throw bad(where + " must be an integer, got " + v.dump());
    if ((v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > max)))
      throw bad(where + " = " + v.dump() + " is outside [0, " + std::to_string(max) + "]");
    return v.get<int64_t>();
  };
  SavedTrainState s;
  s.state.step = field("step", kMaxCount);
  s.state.data_cursor = field("data_cursor", kMaxCount);
  s.state.init_weights_seed = field("init_weights_seed", std::numeric_limits<int64_t>::max());
  s.optimizer_step = field("optimizer_step", s.state.step);  // AdamW steps once per training step at most
  return s;
}

CheckpointFiles read_checkpoint_files(const std::string& path) {
  const fs::path dir(path);
  auto bad = [&](const std::string& why) { return checkpoint_refused(path, why); };
  json manifest;
  std::map<std::string, std::string> files = read_verified_files(path, manifest);
  CheckpointFiles out;
  out.weights = parse_safetensors(files["model.safetensors"], (dir / "model.safetensors").string());
  out.moments = parse_safetensors(files["optimizer.safetensors"], (dir / "optimizer.safetensors").string());
  if (files.count("config.json")) {
    try {
      out.hf_config = json::parse(files["config.json"]);
    } catch (const json::exception& e) {
      throw bad(std::string("config.json is not valid JSON: ") + e.what());
    }
    if (!out.hf_config.is_object()) throw bad("config.json must be a JSON object");
  }
  out.train = parse_train_state(files["train_state.json"], (dir / "train_state.json").string());
  const int64_t step = out.train.state.step;
  const json manifest_step = manifest.contains("step") ? manifest["step"] : json();
  if (manifest_step != json(step))
    throw bad("train_state.json field 'step' = " + std::to_string(step) + " differs from MANIFEST.json's step " +
              manifest_step.dump());
  const auto named = checkpoint_step_from_name(dir.filename().string());
  if (named && *named != step)
    throw bad("train_state.json field 'step' = " + std::to_string(step) + " differs from the directory name");
  return out;
}

}  // namespace longctx
