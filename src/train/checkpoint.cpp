#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "comm/mesh.h"
#include "core/error.h"

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
  std::ifstream in(p, std::ios::binary);
  if (!in) throw DataError("checkpoint file '" + p.string() + "' cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open '" + p.string() + "' to fsync");
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("fsync of '" + p.string() + "' failed");
}

// Writes and fsyncs one file.
void write_durable(const fs::path& p, const std::string& bytes) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("writing checkpoint file '" + p.string() + "' failed (disk full?)");
  }
  fsync_path(p);
}

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
  const size_t data_start = 8 + n, data_bytes = bytes.size() - data_start;
  std::map<std::string, HostTensor> out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (info.value("dtype", "") != "F32") throw bad("tensor '" + name + "' is not F32");
    HostTensor t;
    t.shape = info.at("shape").get<std::vector<int64_t>>();
    auto off = info.at("data_offsets").get<std::vector<size_t>>();
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (off.size() != 2 || off[1] < off[0] || off[1] > data_bytes ||
        off[1] - off[0] != static_cast<size_t>(numel) * sizeof(float))
      throw bad("tensor '" + name + "' has inconsistent data offsets");
    t.data.resize(static_cast<size_t>(numel));
    std::memcpy(t.data.data(), bytes.data() + data_start + off[0], off[1] - off[0]);
    out.emplace(name, std::move(t));
  }
  return out;
}

// The full tensor of a TP-sharded view (collective over tp).
HostTensor gather_full(const NamedTensor& nt, const float* local, const Mesh& mesh) {
  HostTensor t;
  const int rank = nt.local.rank;
  const int64_t rows = nt.full_shape[0], cols = rank == 2 ? nt.full_shape[1] : 1;
  t.shape = rank == 2 ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
  t.data.resize(static_cast<size_t>(rows * cols));
  const int64_t n = nt.local.numel();
  const int tp = mesh.shape().tp;
  if (nt.split == TpSplit::none || tp == 1) {
    std::memcpy(t.data.data(), local, static_cast<size_t>(n) * sizeof(float));
    return t;
  }
  std::vector<float> all(static_cast<size_t>(n) * tp);
  std::vector<int64_t> offsets(tp);
  mesh.tp().all_gather(local, all.data(), static_cast<size_t>(n) * sizeof(float));
  mesh.tp().all_gather(&nt.split_offset, offsets.data(), sizeof(int64_t));
  const int64_t lrows = nt.split == TpSplit::dim0 ? rows / tp : rows;
  const int64_t lcols = nt.split == TpSplit::dim1 ? cols / tp : cols;
  for (int j = 0; j < tp; ++j) {
    const float* src = all.data() + static_cast<size_t>(j) * n;
    const int64_t r0 = nt.split == TpSplit::dim0 ? offsets[j] : 0;
    const int64_t c0 = nt.split == TpSplit::dim1 ? offsets[j] : 0;
    for (int64_t r = 0; r < lrows; ++r)
      std::memcpy(&t.data[(r0 + r) * cols + c0], src + r * lcols, static_cast<size_t>(lcols) * sizeof(float));
  }
  return t;
}

// This rank's shard of a full tensor.
void take_shard(const NamedTensor& nt, const HostTensor& full, float* local) {
  const int64_t cols = nt.local.rank == 2 ? nt.full_shape[1] : 1;
  const int64_t lrows = nt.local.shape[0], lcols = nt.local.rank == 2 ? nt.local.shape[1] : 1;
  const int64_t r0 = nt.split == TpSplit::dim0 ? nt.split_offset : 0;
  const int64_t c0 = nt.split == TpSplit::dim1 ? nt.split_offset : 0;
  for (int64_t r = 0; r < lrows; ++r)
    std::memcpy(local + r * lcols, &full.data[(r0 + r) * cols + c0], static_cast<size_t>(lcols) * sizeof(float));
}

// A flat vector of n elements from every replica's piece of it (collective
// over mesh.replicas(); pieces as in flat_piece).
std::vector<float> gather_pieces(std::span<const float> mine, const FlatPiece& piece, size_t n, const Mesh& mesh) {
  const Communicator& reps = mesh.replicas();
  std::vector<float> full(n);
  reps.all_gather(mine.data(), full.data(), piece.block * sizeof(float));
  if (piece.tail > 0) {
    std::vector<float> tails(piece.tail * static_cast<size_t>(reps.size()));
    const float* my_tail = mine.data() + piece.block;  // only the last replica's is real
    std::vector<float> zeros(piece.tail);
    reps.all_gather(reps.rank() + 1 == reps.size() ? my_tail : zeros.data(), tails.data(), piece.tail * sizeof(float));
    std::copy_n(tails.data() + (tails.size() - piece.tail), piece.tail, full.data() + (n - piece.tail));
  }
  return full;
}

std::vector<int64_t> full_shape_of(const NamedTensor& nt) {
  return nt.local.rank == 2 ? std::vector<int64_t>{nt.full_shape[0], nt.full_shape[1]}
                            : std::vector<int64_t>{nt.full_shape[0]};
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

const char* kFiles[] = {"model.safetensors", "config.json", "optimizer.safetensors", "train_state.json",
                        "run_config.yml"};

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  write_durable(path, safetensors_bytes(tensors));
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  return parse_safetensors(read_all(path), path);
}

std::string hf_config_json(const LlamaConfig& c, int64_t max_position_embeddings) {
  json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.d_model},
      {"intermediate_size", c.mlp_dim},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", c.tie_embeddings},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"bos_token_id", 256},
      {"eos_token_id", 257},
      {"pad_token_id", 258},
      {"torch_dtype", "float32"},
  };
  if (c.rope_llama3_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_scaling_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_position}};
  return j.dump(2) + "\n";
}

std::string save_checkpoint(const std::string& checkpoint_dir, const LlamaModel& model, const AdamW& optimizer,
                            const TrainState& state, const RunConfig& config, const Mesh& mesh) {
  // Gather (collective over tp on every rank), then rank 0 writes.
  // The moments of this tp rank's whole flat vector: the replicas' pieces
  // gathered first when the optimizer is sharded (ZeRO-1).
  const auto& params = model.parameters();
  const float* flat = model.flat_parameters().data();
  std::vector<float> full_m, full_v;
  const float* m_all = optimizer.exp_avg().data();
  const float* v_all = optimizer.exp_avg_sq().data();
  if (optimizer.sharded()) {
    full_m = gather_pieces(optimizer.exp_avg(), optimizer.piece(), model.flat_parameters().size(), mesh);
    full_v = gather_pieces(optimizer.exp_avg_sq(), optimizer.piece(), model.flat_parameters().size(), mesh);
    m_all = full_m.data();
    v_all = full_v.data();
  }
  std::vector<HostTensor> weights, exp_avg, exp_avg_sq;
  for (const NamedTensor& p : params) {
    const size_t off = static_cast<size_t>(p.local.f32() - flat);
    weights.push_back(gather_full(p, p.local.f32(), mesh));
    exp_avg.push_back(gather_full(p, m_all + off, mesh));
    exp_avg_sq.push_back(gather_full(p, v_all + off, mesh));
  }
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(state.step));
  const fs::path final_dir = fs::path(checkpoint_dir) / name;
  const bool writer = mesh.world_rank() == 0;
  if (writer) {
    const fs::path tmp = fs::path(checkpoint_dir) / (std::string(".") + name + ".tmp");
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::map<std::string, std::string> files;
    std::vector<std::pair<std::string, const HostTensor*>> w, o;
    for (size_t i = 0; i < params.size(); ++i) {
      w.emplace_back(params[i].name, &weights[i]);
      o.emplace_back(params[i].name + ".exp_avg", &exp_avg[i]);
      o.emplace_back(params[i].name + ".exp_avg_sq", &exp_avg_sq[i]);
    }
    files["model.safetensors"] = safetensors_bytes(w);
    files["optimizer.safetensors"] = safetensors_bytes(o);
    files["config.json"] = hf_config_json(model.config(), config.max_target_length);
    files["train_state.json"] = json{{"step", state.step},
                                     {"data_cursor", state.data_cursor},
                                     {"init_weights_seed", state.init_weights_seed},
                                     {"optimizer_step", optimizer.step()}}
                                    .dump(2) + "\n";
    files["run_config.yml"] = config.to_yaml();
    json manifest = {{"format", "longctx-checkpoint-1"}, {"step", state.step}, {"files", json::object()}};
    for (const auto& [file, bytes] : files) {
      write_durable(tmp / file, bytes);
      manifest["files"][file] = {{"bytes", bytes.size()}, {"crc32", crc32(bytes.data(), bytes.size())}};
    }
    write_durable(tmp / "MANIFEST.json", manifest.dump(2) + "\n");
    fsync_path(tmp);
    fs::remove_all(final_dir);  // a rerun of the same step replaces it
    fs::rename(tmp, final_dir);
    fsync_path(checkpoint_dir);
    // Only after the new one is complete on disk: a crash here loses nothing.
    prune_checkpoints(checkpoint_dir, config.max_num_checkpoints_to_keep);
  }
  mesh.world().barrier();  // nobody resumes from a checkpoint still being written
  return final_dir.string();
}

namespace {

// Complete checkpoints (step_N with a MANIFEST.json) by step, oldest first.
std::vector<std::pair<long long, fs::path>> complete_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::pair<long long, fs::path>> found;
  if (!fs::is_directory(checkpoint_dir)) return found;
  for (const auto& e : fs::directory_iterator(checkpoint_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step_", 0) != 0) continue;
    if (!fs::exists(e.path() / "MANIFEST.json")) continue;  // incomplete: never renamed... or damaged
    found.emplace_back(std::atoll(n.c_str() + 5), e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::string latest_checkpoint(const std::string& checkpoint_dir) {
  const auto found = complete_checkpoints(checkpoint_dir);
  return found.empty() ? "" : found.back().second.string();
}

void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep) {
  if (keep <= 0) return;
  const auto found = complete_checkpoints(checkpoint_dir);
  for (size_t i = 0; i + keep < found.size(); ++i) fs::remove_all(found[i].second);
}

TrainState load_checkpoint(const std::string& path, LlamaModel& model, AdamW& optimizer) {
  const fs::path dir(path);
  auto bad = [&](const std::string& why) {
    return DataError("checkpoint '" + path + "' refused: " + why + " (delete it to start over, or fix checkpoint_dir)");
  };
  // 1. Every file present, of the recorded size and checksum.
  json manifest;
  try {
    manifest = json::parse(read_all(dir / "MANIFEST.json"));
  } catch (const json::exception& e) {
    throw bad(std::string("MANIFEST.json is not valid JSON: ") + e.what());
  }
  std::map<std::string, std::string> files;
  for (const char* f : kFiles) {
    if (!manifest.contains("files") || !manifest["files"].contains(f)) throw bad(std::string("MANIFEST.json does not list ") + f);
    if (!fs::exists(dir / f)) throw bad(std::string("file ") + f + " is missing");
    std::string bytes = read_all(dir / f);
    const auto& rec = manifest["files"][f];
    if (bytes.size() != rec.at("bytes").get<size_t>())
      throw bad(std::string(f) + " has " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                std::to_string(rec.at("bytes").get<size_t>()));
    if (crc32(bytes.data(), bytes.size()) != rec.at("crc32").get<uint32_t>())
      throw bad(std::string(f) + " fails its CRC-32 check (corrupt)");
    files[f] = std::move(bytes);
  }
  // 2. Everything parsed and matched against the model.
  auto weights = parse_safetensors(files["model.safetensors"], (dir / "model.safetensors").string());
  auto moments = parse_safetensors(files["optimizer.safetensors"], (dir / "optimizer.safetensors").string());
  const auto& params = model.parameters();
  if (weights.size() != params.size())
    throw bad("it holds " + std::to_string(weights.size()) + " weight tensors, the model has " +
              std::to_string(params.size()) + " (another model shape?)");
  for (const NamedTensor& p : params) {
    const std::vector<int64_t> want = full_shape_of(p);
    for (const std::string& key : {p.name, p.name + ".exp_avg", p.name + ".exp_avg_sq"}) {
      const auto& src = key == p.name ? weights : moments;
      auto it = src.find(key);
      if (it == src.end()) throw bad("tensor '" + key + "' is missing");
      if (it->second.shape != want)
        throw bad("tensor '" + key + "' has shape " + shape_text(it->second.shape) + ", the model wants " +
                  shape_text(want) + " (model shape differs from the config)");
    }
  }
  json st;
  try {
    st = json::parse(files["train_state.json"]);
  } catch (const json::exception& e) {
    throw bad(std::string("train_state.json is not valid JSON: ") + e.what());
  }
  TrainState state;
  state.step = st.at("step").get<int64_t>();
  state.data_cursor = st.at("data_cursor").get<int64_t>();
  state.init_weights_seed = st.at("init_weights_seed").get<int64_t>();
  // 3. Only now touch the model and optimizer.
  // The moments: this tp rank's shards, then only this replica's piece of them.
  const float* flat = model.flat_parameters().data();
  const FlatPiece& piece = optimizer.piece();
  std::vector<float> full_m(model.flat_parameters().size()), full_v(full_m.size());
  for (const NamedTensor& p : params) {
    const size_t off = static_cast<size_t>(p.local.f32() - flat);
    take_shard(p, weights.at(p.name), p.local.f32());
    take_shard(p, moments.at(p.name + ".exp_avg"), full_m.data() + off);
    take_shard(p, moments.at(p.name + ".exp_avg_sq"), full_v.data() + off);
  }
  std::copy_n(full_m.data() + piece.begin, piece.size, optimizer.exp_avg().data());
  std::copy_n(full_v.data() + piece.begin, piece.size, optimizer.exp_avg_sq().data());
  optimizer.set_step(st.at("optimizer_step").get<int64_t>());
  return state;
}

}  // namespace longctx
