#include "train/checkpoint_files.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace longctx {

namespace fs = std::filesystem;
using json = nlohmann::json;

uint32_t crc32(const void* data, size_t bytes, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

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

std::map<std::string, HostTensor> parse_safetensors(const std::string& bytes, const std::string& what) {
  auto bad = [&](const std::string& why) { return DataError("checkpoint file '" + what + "': " + why); };
  if (bytes.size() < 8) throw bad("too short for a safetensors header");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) throw bad("header length exceeds the file");
  json header;
  try {
    header = json::parse(bytes.substr(8, n));
  } catch (const json::exception& e) {
    throw bad(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header must be a JSON object of tensors, got " + std::string(header.type_name()));
  const uint64_t data_start = 8 + n, data_bytes = bytes.size() - data_start;
  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  std::map<std::string, HostTensor> out;
  for (const auto& [name, info] : header.items()) {
    const std::string t_name = "tensor '" + name + "'";
    if (name == "__metadata__") {
      if (!info.is_object()) throw bad("__metadata__ must be a JSON object");
      continue;
    }
    if (!info.is_object()) throw bad(t_name + " must be a JSON object (dtype, shape, data_offsets)");
    if (!info.contains("dtype") || info["dtype"] != "F32") throw bad(t_name + " is not F32");
    if (!info.contains("shape") || !info["shape"].is_array())
      throw bad(t_name + ": shape must be an array of non-negative integers");
    HostTensor t;
    // The product is overflow-checked: [2^31, 2^31] * 4 bytes wrapped.
    int64_t numel = 1;
    for (const json& d : info["shape"]) {
      if (!is_count(d) || d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw bad(t_name + ": shape must be an array of non-negative integers, got " + info["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
      int64_t next;
      if (__builtin_mul_overflow(numel, t.shape.back(), &next) || __builtin_mul_overflow(next, int64_t(4), &next))
        throw bad(t_name + ": shape " + info["shape"].dump() + " has more bytes than int64 holds");
      numel *= t.shape.back();
    }
    const json& off = info.contains("data_offsets") ? info["data_offsets"] : json();
    if (!off.is_array() || off.size() != 2 || !is_count(off[0]) || !is_count(off[1]))
      throw bad(t_name + ": data_offsets must be [begin, end], two non-negative integers");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end < begin) throw bad(t_name + ": data_offsets [begin, end] must have begin <= end, got " + off.dump());
    if (end > data_bytes)
      throw bad(t_name + ": data_offsets " + off.dump() + " end past the data section (" +
                std::to_string(data_bytes) + " bytes)");
    if (end - begin != static_cast<uint64_t>(numel) * sizeof(float))
      throw bad(t_name + ": data_offsets " + off.dump() + " hold " + std::to_string(end - begin) +
                " bytes, its shape " + info["shape"].dump() + " needs " + std::to_string(numel * 4));
    spans.push_back({begin, end, name});
    t.data.resize(static_cast<size_t>(numel));
    if (numel) std::memcpy(t.data.data(), bytes.data() + data_start + begin, end - begin);
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

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  return parse_safetensors(read_all(path), path);
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
  for (const std::string& f : checkpoint_file_names()) {
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
  try {
    out.hf_config = json::parse(files["config.json"]);
  } catch (const json::exception& e) {
    throw bad(std::string("config.json is not valid JSON: ") + e.what());
  }
  if (!out.hf_config.is_object()) throw bad("config.json must be a JSON object");
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
