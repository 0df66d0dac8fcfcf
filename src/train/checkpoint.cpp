#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "comm/mesh.h"
#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::function<void(const char*)>& fault_hook() {
  static std::function<void(const char*)> hook;
  return hook;
}
std::function<int(const char*, const std::string&)>& io_fault() {
  static std::function<int(const char*, const std::string&)> fault;
  return fault;
}
void fault_point(const char* point) {
  if (fault_hook()) fault_hook()(point);
}
// The errno a test injects into this call, or 0.
int injected(const char* op, const fs::path& p) { return io_fault() ? io_fault()(op, p.string()) : 0; }

[[noreturn]] void io_error(const char* op, const fs::path& p, int err) {
  throw DataError(std::string("checkpoint I/O: ") + op + " of '" + p.string() + "' failed: " + std::strerror(err) +
                  (err == ENOSPC || err == EDQUOT ? " (disk full: free space or point checkpoint_dir elsewhere)" : ""));
}

void fsync_path(const fs::path& p) {
  int err = injected("open", p);
  const int fd = err ? -1 : ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_error("open (to fsync)", p, err ? err : errno);
  err = injected("fsync", p);
  if (!err && ::fsync(fd) != 0) err = errno;
  ::close(fd);  // read-only: nothing to lose at close
  if (err) io_error("fsync", p, err);
}

// Writes and fsyncs one file with POSIX calls, every return code checked: a
// buffered stream reports a full disk only at close, and that error was lost.
void write_durable(const fs::path& p, const std::string& bytes) {
  int err = injected("open", p);
  const int fd = err ? -1 : ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_error("open", p, err ? err : errno);
  auto fail = [&](const char* op, int e) {
    ::close(fd);
    io_error(op, p, e);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    if ((err = injected("write", p))) fail("write", err);
    const ssize_t n = ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, size_t(1) << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    done += static_cast<size_t>(n);
  }
  if ((err = injected("fsync", p)) || ::fsync(fd) != 0) fail("fsync", err ? err : errno);
  err = injected("close", p);
  if (::close(fd) != 0 && !err) err = errno;
  if (err) io_error("close", p, err);
}

void rename_checked(const fs::path& from, const fs::path& to) {
  const int err = injected("rename", to);
  if (err || ::rename(from.c_str(), to.c_str()) != 0)
    io_error("rename", from.string() + "' to '" + to.string(), err ? err : errno);
}

// Swaps two directories in one step (renameat2 RENAME_EXCHANGE); false when
// this filesystem cannot (the caller falls back to renaming aside).
bool exchange_dirs(const fs::path& a, const fs::path& b) {
  int err = injected("exchange", b);
  if (!err && ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (!err) err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) return false;
  io_error("rename (exchange)", a.string() + "' and '" + b.string(), err);
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

// Every tensor's full shape by name.
template <typename Tensors>
std::map<std::string, std::vector<int64_t>> shapes_of(const Tensors& tensors) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, t] : tensors) {
    if constexpr (requires { t.shape; })
      out.emplace(name, t.shape);
    else
      out.emplace(name, t.entry.shape);
  }
  return out;
}

// `bad(why)` unless `shapes` holds exactly the model's tensors (each name
// with each suffix) at their full shapes: none missing, none unexpected.
void match_model_tensors(const std::vector<NamedTensor>& params, const std::map<std::string, std::vector<int64_t>>& shapes,
                         const std::vector<std::string>& suffixes, const std::function<DataError(const std::string&)>& bad) {
  std::set<std::string> expected;
  for (const NamedTensor& p : params) {
    const std::vector<int64_t> want = full_shape_of(p);
    for (const std::string& suffix : suffixes) {
      const std::string key = p.name + suffix;
      expected.insert(key);
      const auto it = shapes.find(key);
      if (it == shapes.end()) throw bad("tensor '" + key + "' is missing (the model has it, shape " + shape_text(want) + ")");
      if (it->second != want)
        throw bad("tensor '" + key + "' has shape " + shape_text(it->second) + ", the model wants " +
                  shape_text(want) + " (model shape differs from the config)");
    }
  }
  for (const auto& [name, shape] : shapes)
    if (!expected.count(name))
      throw bad("unexpected tensor '" + name + "' (shape " + shape_text(shape) + "): the model has no such parameter" +
                (name == "lm_head.weight" ? " (tied embeddings: logits_via_embedding / tie_word_embeddings)" : ""));
}

// config.json of a model directory; for a longctx checkpoint without one
// (attention no Hugging Face model computes), the same model keys described
// from its run_config.yml.
json model_config_of(const std::string& dir) {
  const fs::path run_config = fs::path(dir) / "run_config.yml";
  if (fs::exists(fs::path(dir) / "config.json") || !fs::exists(run_config)) return read_hf_config(dir);
  return json::parse(hf_config_json(load_config(run_config.string()).model, 0));
}

// The config.json keys that fix what the weights mean, and the run's keys for each.
struct HfModelKey {
  const char* hf;
  const char* ours;
};
const std::vector<HfModelKey>& hf_model_keys() {
  static const std::vector<HfModelKey> keys = {
      {"vocab_size", "vocab_size"}, {"hidden_size", "base_emb_dim"}, {"intermediate_size", "base_mlp_dim"},
      {"num_hidden_layers", "base_num_decoder_layers"}, {"num_attention_heads", "base_num_query_heads"},
      {"num_key_value_heads", "base_num_kv_heads"}, {"head_dim", "head_dim"},
      {"rms_norm_eps", "normalization_layer_epsilon"}, {"rope_theta", "rope_max_timescale"},
      {"rope_scaling", "rope_use_scaling / rope_*_factor / rope_original_max_position"},
      {"tie_word_embeddings", "logits_via_embedding"}};
  return keys;
}

void remove_stale(const fs::path& dir);
// ".step_N.tmp" / ".step_N.trash": hidden, so never taken for a checkpoint.
std::string hidden_name(const std::string& name, const char* suffix) {
  std::string h(1, '.');
  return h.append(name).append(suffix);
}
void prune_older_than(const fs::path& dir, int64_t keep, int64_t verified);

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  write_durable(path, safetensors_bytes(tensors));
}

std::string hf_export_refusal(const MaskSpec& mask) {
  switch (mask.kind) {
    case MaskKind::causal: return "";
    case MaskKind::local:
      if (mask.right == 0) return "";
      return "attention_type local with a window reaching " + std::to_string(mask.right) +
             " tokens ahead: Hugging Face's sliding windows (Mistral, Qwen2) are causal";
    case MaskKind::full:
      return "attention_type full (bidirectional): LlamaForCausalLM and every Hugging Face causal LM mask the "
             "future, so transformers would compute causal attention with these weights";
    case MaskKind::chunked:
      return "attention_type chunked: the only Hugging Face architecture with chunked attention is Llama 4 "
             "(attention_chunk_size), whose attention is not this model's (interleaved RoPE pairs instead of "
             "rotated halves, NoPE layers, QK norm, its own tensor names); a LlamaForCausalLM config.json "
             "would make transformers compute full causal attention with these weights";
  }
  return "unknown attention type";
}

std::string hf_config_json(const LlamaConfig& c, int64_t max_position_embeddings, const MaskSpec& mask) {
  if (const std::string why = hf_export_refusal(mask); !why.empty())
    throw ConfigError("no Hugging Face config.json for this model: " + why);
  const bool window = mask.kind == MaskKind::local;
  json j = {
      {"architectures", {window ? "MistralForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", window ? "mistral" : "llama"},
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
  // Mistral's window W keeps kv_idx > q_idx - W: W tokens, the query included,
  // as local(W - 1, 0) (transformers masking_utils.sliding_window_overlay).
  if (window) j["sliding_window"] = mask.left + 1;
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
  // Gather (collective on every rank), then rank 0 writes. This tp rank's
  // flat vectors: the replicas' ZeRO-1 pieces of the moments gathered first,
  // then the FSDP shards of everything.
  const auto& params = model.parameters();
  const size_t n = model.flat_gradients().size();
  auto moments = [&](StateStore& store) {
    std::vector<float> piece = store.read_all();
    return model.unshard(optimizer.sharded() ? gather_pieces(piece, optimizer.piece(), n, mesh) : piece);
  };
  const std::vector<float> flat = model.unshard(model.parameter_store().read_all());
  const std::vector<float> m_all = moments(optimizer.exp_avg()), v_all = moments(optimizer.exp_avg_sq());
  std::vector<HostTensor> weights, exp_avg, exp_avg_sq;
  for (const NamedTensor& p : params) {
    weights.push_back(gather_full(p, flat.data() + p.offset, mesh));
    exp_avg.push_back(gather_full(p, m_all.data() + p.offset, mesh));
    exp_avg_sq.push_back(gather_full(p, v_all.data() + p.offset, mesh));
  }
  // Never write NaN/Inf: a run that diverged must not replace (and then
  // prune) the good checkpoints. Every rank holds the gathered tensors, so
  // all refuse together.
  auto check_finite = [&](const std::vector<HostTensor>& ts, const char* what) {
    for (size_t i = 0; i < ts.size(); ++i)
      for (float x : ts[i].data)
        if (!std::isfinite(x))
          throw DataError("refusing to save checkpoint step " + std::to_string(state.step) + ": " + what + " of '" +
                          params[i].name + "' holds NaN or Inf (the run diverged; the existing checkpoints are kept)");
  };
  check_finite(weights, "the weights");
  check_finite(exp_avg, "the AdamW exp_avg");
  check_finite(exp_avg_sq, "the AdamW exp_avg_sq");
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(state.step));
  const fs::path dir(checkpoint_dir), final_dir = dir / name;
  const bool writer = mesh.world_rank() == 0;
  if (writer) {
    const fs::path tmp = dir / hidden_name(name, ".tmp");
    try {
      fs::create_directories(dir);
      remove_stale(dir);  // a killed run's .tmp/.trash would keep the disk full
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
      const std::string no_hf_config = hf_export_refusal(model.options().mask);
      if (no_hf_config.empty())
        files["config.json"] = hf_config_json(model.config(), config.max_target_length, model.options().mask);
      else
        files["README.txt"] = "No Hugging Face config.json in this checkpoint: " + no_hf_config +
                              ".\nmodel.safetensors holds the weights under Hugging Face Llama names; "
                              "run_config.yml says how longctx computes with them.\n";
      files["train_state.json"] = json{{"step", state.step},
                                       {"data_cursor", state.data_cursor},
                                       {"init_weights_seed", state.init_weights_seed},
                                       {"optimizer_step", optimizer.step()}}
                                      .dump(2) + "\n";
      files["run_config.yml"] = config.to_yaml();
      json manifest = {{"format", "longctx-checkpoint-1"}, {"step", state.step}, {"files", json::object()}};
      if (!no_hf_config.empty()) manifest["no_hf_config"] = no_hf_config;
      for (const auto& [file, bytes] : files) {
        write_durable(tmp / file, bytes);
        manifest["files"][file] = {{"bytes", bytes.size()}, {"crc32", crc32(bytes.data(), bytes.size())}};
      }
      fault_point("files-written");
      write_durable(tmp / "MANIFEST.json", manifest.dump(2) + "\n");
      fsync_path(tmp);
      // Read back what is on disk before it may count (and before anything older is pruned).
      verify_checkpoint(tmp.string());
      fault_point("verified");
      if (fs::exists(final_dir)) {
        // A rerun of the same step replaces it, without a moment where that step is incomplete.
        if (exchange_dirs(tmp, final_dir)) {
          fsync_path(dir);
          fault_point("resave-exchanged");
          fs::remove_all(tmp);  // now the old one; hidden, so a kill here leaves only a stale .tmp
        } else {
          const fs::path trash = dir / hidden_name(name, ".trash");
          rename_checked(final_dir, trash);  // hidden: no longer counts as complete
          try {
            fsync_path(dir);
            fault_point("resave-aside");
            rename_checked(tmp, final_dir);
          } catch (const std::exception&) {
            std::error_code ec;
            fs::rename(trash, final_dir, ec);  // an error (not a kill): put the old one back
            throw;
          }
          fsync_path(dir);
          fault_point("resave-renamed");
          fs::remove_all(trash);
        }
      } else {
        rename_checked(tmp, final_dir);
        fsync_path(dir);
        fault_point("renamed");
      }
    } catch (const std::exception& e) {
      // Free the space for the next attempt; nothing older was touched.
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw DataError("checkpoint step " + std::to_string(state.step) +
                      " was NOT saved (the existing checkpoints are kept, none pruned): " + e.what());
    }
  }
  mesh.world().barrier();  // nobody resumes from a checkpoint still being written
  return final_dir.string();
}

void set_checkpoint_fault_hook(std::function<void(const char*)> hook) { fault_hook() = std::move(hook); }
void set_checkpoint_io_fault(std::function<int(const char*, const std::string&)> fault) {
  io_fault() = std::move(fault);
}

namespace {

// Complete checkpoints (step_N with a MANIFEST.json) by step, oldest first.
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& checkpoint_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(checkpoint_dir)) {
    const auto step = checkpoint_step_from_name(e.path().filename().string());
    if (!step || !e.is_directory()) continue;
    if (!fs::exists(e.path() / "MANIFEST.json")) continue;  // incomplete: never renamed... or damaged
    found.emplace_back(*step, e.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Deletes the hidden leftovers of a killed save or prune: ".step_<digits>.tmp"
// and ".step_<digits>.trash", the only hidden names this code makes.
void remove_stale(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    for (const std::string suffix : {".tmp", ".trash"})
      if (n.size() > 1 + suffix.size() && n[0] == '.' && n.ends_with(suffix) &&
          checkpoint_step_from_name(n.substr(1, n.size() - 1 - suffix.size())))
        fs::remove_all(e.path());
  }
}

// Prunes to `keep` complete checkpoints, deleting only ones older than step
// `verified` (a checkpoint read back and verified): a newer one that is
// corrupt is never counted on to replace the ones it would push out.
void prune_older_than(const fs::path& dir, int64_t keep, int64_t verified) {
  if (keep <= 0) return;
  const auto found = complete_checkpoints(dir.string());
  for (size_t i = 0; i + static_cast<size_t>(keep) < found.size() && found[i].first < verified; ++i) {
    // Hidden first: from here on it does not count as complete, whatever
    // order its files are deleted in.
    const fs::path trash = dir / hidden_name(found[i].second.filename().string(), ".trash");
    fs::remove_all(trash);
    rename_checked(found[i].second, trash);
    fsync_path(dir);
    fault_point("prune-renamed");
    fs::remove_all(trash);
    fault_point("prune-deleted");
  }
}

}  // namespace

std::vector<std::string> checkpoints_newest_first(const std::string& checkpoint_dir) {
  std::vector<std::string> out;
  const auto found = complete_checkpoints(checkpoint_dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) out.push_back(it->second.string());
  return out;
}

std::vector<std::string> step_dirs_without_manifest(const std::string& checkpoint_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(checkpoint_dir))
    if (checkpoint_step_from_name(e.path().filename().string()) && e.is_directory() &&
        !fs::exists(e.path() / "MANIFEST.json"))
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string latest_checkpoint(const std::string& checkpoint_dir) {
  const auto found = complete_checkpoints(checkpoint_dir);
  return found.empty() ? "" : found.back().second.string();
}

void verify_checkpoint(const std::string& path) {
  json manifest;
  read_verified_files(path, manifest);
}

std::string latest_valid_checkpoint(const std::string& checkpoint_dir, std::FILE* warn) {
  const auto found = complete_checkpoints(checkpoint_dir);
  std::string reasons;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    try {
      verify_checkpoint(it->second.string());
      return it->second.string();
    } catch (const DataError& e) {
      if (warn) {
        std::fprintf(warn, "WARNING: skipping checkpoint %s: %s; trying an older one\n", it->second.c_str(), e.what());
        std::fflush(warn);
      }
      reasons += std::string("\n  ") + e.what();
    }
  }
  if (!found.empty())
    throw DataError("no valid checkpoint in '" + checkpoint_dir + "': all " + std::to_string(found.size()) +
                    " complete ones fail verification (refusing to start over silently):" + reasons);
  return "";
}

void prune_checkpoints(const std::string& checkpoint_dir, int64_t keep, int64_t below_step) {
  prune_older_than(checkpoint_dir, keep, below_step);
}

TrainState load_checkpoint(const std::string& path, LlamaModel& model, AdamW& optimizer) {
  auto bad = [&](const std::string& why) { return checkpoint_refused(path, why); };
  // 1. Every file present, of the recorded size and checksum, and parsed
  // (train_state.json's fields in range, its step that of the manifest and
  // the directory).
  CheckpointFiles files = read_checkpoint_files(path);
  const auto& weights = files.weights;
  const auto& moments = files.moments;
  // 2. Matched against the model.
  const auto& params = model.parameters();
  match_model_tensors(params, shapes_of(weights), {""}, bad);
  match_model_tensors(params, shapes_of(moments), {".exp_avg", ".exp_avg_sq"}, bad);
  // The model config: tensor shapes alone accept 4 heads x 16 as 2 x 32, or
  // another RoPE theta; every key that changes what the weights mean must
  // match. Without config.json (attention no Hugging Face model computes),
  // the same keys described from the saved run_config.yml.
  const json saved_cfg = files.hf_config.is_object() ? files.hf_config : model_config_of(path);
  const json want_cfg = json::parse(hf_config_json(model.config(), 0));
  for (const HfModelKey& k : hf_model_keys()) {
    const json got = saved_cfg.contains(k.hf) ? saved_cfg[k.hf] : json("(missing)");
    if (got != want_cfg[k.hf])
      throw bad("config.json: model key '" + std::string(k.hf) + "' (" + k.ours + ") is " + got.dump() +
                " in the checkpoint but " + want_cfg[k.hf].dump() + " in this run (another model shape)");
  }
  const TrainState state = files.train.state;
  const int64_t optimizer_step = files.train.optimizer_step;
  // 3. Only now touch the model and optimizer: this tp rank's flat
  // vectors, then its FSDP shard of them, then this replica's ZeRO-1 piece
  // of the moments.
  const size_t n = model.flat_gradients().size();
  const int64_t flat_size = parameters_per_tp_rank(model.config(), model.tp());
  std::vector<float> flat(static_cast<size_t>(flat_size)), flat_m(flat.size()), flat_v(flat.size());
  for (const NamedTensor& p : params) {
    take_shard(p, weights.at(p.name), flat.data() + p.offset);
    take_shard(p, moments.at(p.name + ".exp_avg"), flat_m.data() + p.offset);
    take_shard(p, moments.at(p.name + ".exp_avg_sq"), flat_v.data() + p.offset);
  }
  model.load_flat_parameters(flat);
  const FlatPiece& piece = optimizer.piece();
  std::vector<float> shard(n);
  model.reshard(flat_m, shard);
  optimizer.exp_avg().write(0, std::span<const float>(shard).subspan(piece.begin, piece.size));
  model.reshard(flat_v, shard);
  optimizer.exp_avg_sq().write(0, std::span<const float>(shard).subspan(piece.begin, piece.size));
  optimizer.set_step(optimizer_step);
  return state;
}

void load_hf_parameters(const std::string& dir, LlamaModel& model) {
  auto bad = [&](const std::string& why) { return DataError("load_parameters_path '" + dir + "': " + why); };
  // A longctx checkpoint is checked as resume checks it (every size and
  // CRC-32 of its MANIFEST.json) before a byte of it is used; one without a
  // MANIFEST.json was never completed (saves write it last).
  if (fs::exists(fs::path(dir) / "MANIFEST.json")) {
    try {
      verify_checkpoint(dir);
    } catch (const DataError& e) {
      throw bad(std::string("a longctx checkpoint that fails verification, refused: ") + e.what());
    }
  } else if (fs::exists(fs::path(dir) / "train_state.json")) {
    throw bad("a longctx checkpoint without MANIFEST.json (its save never completed), refused");
  }
  const HfWeights files(dir);  // headers only
  match_model_tensors(model.parameters(), shapes_of(files.tensors()), {""}, bad);
  // One tensor in memory at a time (widened to fp32), of which this tp rank
  // keeps its shard, into the flat vector; then this rank's FSDP shard of that.
  std::vector<float> flat(static_cast<size_t>(parameters_per_tp_rank(model.config(), model.tp())));
  for (const NamedTensor& p : model.parameters()) take_shard(p, files.read(p.name), flat.data() + p.offset);
  model.load_flat_parameters(flat);
}

namespace {

// A key counts as set by this run unless it comes from the built-in
// defaults or the defaults file configs/base.yml.
std::string text_of(const ConfigValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) return x;
        else if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else return json(x).dump();
      },
      v);
}

bool set_explicitly(const RunConfig& c, const std::string& key) {
  const auto it = c.sources.find(key);
  return it != c.sources.end() && it->second != "default" && fs::path(it->second).filename() != "base.yml";
}

}  // namespace

void apply_hf_model_config(RunConfig& c) {
  if (c.load_parameters_path.empty()) return;
  const std::string file = (fs::path(c.load_parameters_path) / "config.json").string();
  const json hf = model_config_of(c.load_parameters_path);
  auto bad = [&](const std::string& why) { return ConfigError("load_parameters_path: '" + file + "': " + why); };
  const json type = hf.value("model_type", json());
  if (type != "llama" && type != "mistral")
    throw bad("model_type is " + type.dump() + "; longctx computes Llama (and Mistral, Llama with a sliding window)");
  if (hf.value("hidden_act", json("silu")) != "silu") throw bad("hidden_act must be \"silu\" (SwiGLU)");
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (hf.value(k, json(false)) != false) throw bad(std::string(k) + " must be false: the model has no biases");
  if (hf.value("pretraining_tp", json(1)) != 1) throw bad("pretraining_tp must be 1");
  // transformers 5 writes rope_parameters {rope_theta, rope_type, ...}; 4.x
  // and the published Llama 3.1 files rope_theta and rope_scaling.
  json rope = hf.value("rope_parameters", json());
  if (!rope.is_object()) {
    rope = hf.value("rope_scaling", json());
    if (!rope.is_object()) rope = json::object();
    if (hf.contains("rope_theta")) rope["rope_theta"] = hf["rope_theta"];
  }
  const json rope_type = rope.value("rope_type", rope.value("type", json("default")));
  if (rope_type != "default" && rope_type != "llama3")
    throw bad("rope type " + rope_type.dump() + " is not supported (default and llama3 are)");

  auto number = [&](const json& j, const char* name) -> json {
    if (!j.is_number()) throw bad(std::string(name) + " must be a number, got " + j.dump());
    return j;
  };
  const int64_t heads = number(hf.value("num_attention_heads", json()), "num_attention_heads").get<int64_t>();
  const int64_t hidden = number(hf.value("hidden_size", json()), "hidden_size").get<int64_t>();
  if (heads < 1) throw bad("num_attention_heads must be >= 1");
  // (config key, value, shape key: must agree when set explicitly)
  struct Value {
    const char* key;
    ConfigValue value;
    bool shape;
  };
  std::vector<Value> values;
  auto integer = [&](const char* hf_key, const char* key, std::optional<int64_t> fallback) {
    const json j = hf.value(hf_key, json());
    if (j.is_null() && fallback) return values.push_back({key, *fallback, true});
    if (!j.is_number_integer()) throw bad(std::string(hf_key) + " must be an integer, got " + j.dump());
    values.push_back({key, j.get<int64_t>(), true});
  };
  integer("vocab_size", "vocab_size", std::nullopt);
  integer("hidden_size", "base_emb_dim", std::nullopt);
  integer("intermediate_size", "base_mlp_dim", std::nullopt);
  integer("num_hidden_layers", "base_num_decoder_layers", std::nullopt);
  integer("num_attention_heads", "base_num_query_heads", std::nullopt);
  integer("num_key_value_heads", "base_num_kv_heads", heads);  // transformers' defaults
  integer("head_dim", "head_dim", hidden / heads);
  const json tie = hf.value("tie_word_embeddings", json(false));
  if (!tie.is_boolean()) throw bad("tie_word_embeddings must be true or false, got " + tie.dump());
  values.push_back({"logits_via_embedding", tie.get<bool>(), true});
  values.push_back({"normalization_layer_epsilon", number(hf.value("rms_norm_eps", json(1e-6)), "rms_norm_eps").get<double>(), false});
  values.push_back({"rope_max_timescale", number(rope.value("rope_theta", json(10000.0)), "rope_theta").get<double>(), false});
  values.push_back({"rope_use_scaling", rope_type == "llama3", false});
  if (rope_type == "llama3") {
    values.push_back({"rope_scaling_factor", number(rope.value("factor", json()), "rope factor").get<double>(), false});
    values.push_back({"rope_low_freq_factor", number(rope.value("low_freq_factor", json()), "low_freq_factor").get<double>(), false});
    values.push_back({"rope_high_freq_factor", number(rope.value("high_freq_factor", json()), "high_freq_factor").get<double>(), false});
    const json orig = rope.value("original_max_position_embeddings", json());
    if (!orig.is_number_integer()) throw bad("original_max_position_embeddings must be an integer, got " + orig.dump());
    values.push_back({"rope_original_max_position", orig.get<int64_t>(), false});
  }
  // Mistral's sliding window W: our local attention over W tokens.
  if (const json w = hf.value("sliding_window", json()); type == "mistral" && !w.is_null()) {
    if (!w.is_number_integer() || w.get<int64_t>() < 1) throw bad("sliding_window must be a positive integer or null, got " + w.dump());
    values.push_back({"attention_type", std::string("local"), false});
    values.push_back({"sliding_window_size", w.get<int64_t>(), false});
  }

  const std::map<std::string, ConfigValue> current = c.values();
  for (const Value& v : values) {
    const ConfigKey* k = nullptr;
    for (const ConfigKey& key : config_keys())
      if (v.key == std::string(key.name)) k = &key;
    if (set_explicitly(c, v.key)) {
      const ConfigValue& mine = current.at(v.key);
      const bool same = mine == v.value || (std::holds_alternative<double>(mine) && std::holds_alternative<int64_t>(v.value) &&
                                            std::get<double>(mine) == static_cast<double>(std::get<int64_t>(v.value)));
      if (v.shape && !same)
        throw bad(std::string("the model shape key '") + v.key + "' is " + text_of(mine) + " (set in " +
                  c.sources.at(v.key) + ") but " + text_of(v.value) +
                  " in config.json: drop it from the run config, or load weights of that shape");
      continue;  // the run's own value wins
    }
    k->set(c, std::holds_alternative<int64_t>(v.value) && std::holds_alternative<double>(k->default_value)
                  ? ConfigValue(static_cast<double>(std::get<int64_t>(v.value)))
                  : v.value);
    c.sources[v.key] = file;
  }
}

}  // namespace longctx
