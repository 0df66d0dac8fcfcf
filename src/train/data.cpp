#include "train/data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <glob.h>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;

std::vector<int32_t> tokenize_bytes(std::string_view text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string detokenize_bytes(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids)
    if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  return s;
}

namespace {

// Documents being collected (BOS + bytes + EOS each), turned into a Corpus at the end.
struct CorpusBuilder {
  std::vector<int32_t> tokens;
  std::vector<int64_t> doc_offsets{0};
  void add_document(std::string_view text) {
    if (text.empty()) return;
    tokens.push_back(kBosId);
    std::vector<int32_t> ids = tokenize_bytes(text);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.push_back(kEosId);
    doc_offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  Corpus corpus() && { return Corpus(std::move(tokens), std::move(doc_offsets)); }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw DataError("cannot read '" + p.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// splitmix64: the one hash behind synthetic data (a function of its input only).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<std::string> expand_dataset_path(const std::string& dataset_path) {
  std::vector<std::string> paths;
  size_t start = 0;
  while (true) {
    const size_t comma = dataset_path.find(',', start);
    const std::string entry = dataset_path.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.empty())
      throw DataError("dataset_path '" + dataset_path + "' has an empty entry (a list is comma-separated paths)");
    if (entry.find_first_of("*?[") == std::string::npos) {
      paths.push_back(entry);
    } else {
      glob_t g{};
      const int rc = ::glob(entry.c_str(), 0, nullptr, &g);
      std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
      ::globfree(&g);
      if (rc == GLOB_NOMATCH || (rc == 0 && matches.empty()))
        throw DataError("dataset_path pattern '" + entry + "' matches no file");
      if (rc != 0) throw DataError("dataset_path pattern '" + entry + "' cannot be expanded (a directory is unreadable)");
      std::sort(matches.begin(), matches.end());  // byte order, whatever the locale
      paths.insert(paths.end(), matches.begin(), matches.end());
    }
    if (comma == std::string::npos) return paths;
    start = comma + 1;
  }
}

Corpus load_text_corpus(const std::string& dataset_path, const std::string& separator) {
  std::vector<fs::path> files;
  for (const std::string& path : expand_dataset_path(dataset_path)) {
    if (!fs::exists(path))
      throw DataError("dataset_path '" + path + "' does not exist (scripts/prepare_corpus.sh makes data/kjv)");
    if (!fs::is_directory(path)) {
      files.push_back(path);
      continue;
    }
    std::vector<fs::path> in_dir;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file() && e.path().filename().string()[0] != '.') in_dir.push_back(e.path());
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  CorpusBuilder c;
  for (const auto& f : files) {
    std::string text = read_file(f);
    if (separator.empty()) {
      c.add_document(text);
      continue;
    }
    size_t start = 0;
    while (true) {
      size_t at = text.find(separator, start);
      c.add_document(std::string_view(text).substr(start, at == std::string::npos ? std::string::npos : at - start));
      if (at == std::string::npos) break;
      start = at + separator.size();
    }
  }
  if (c.doc_offsets.size() < 2)
    throw DataError("dataset_path '" + dataset_path + "' holds no text (every document is empty)");
  return std::move(c).corpus();
}

Corpus synthetic_corpus(uint64_t seed, int64_t max_target_length, int64_t num_documents) {
  CorpusBuilder c;
  const int64_t lo = std::max<int64_t>(1, max_target_length / 4),
                hi = checked_mul(2, max_target_length, "2 * max_target_length (synthetic document length)");
  check_shape(hi >= lo, "synthetic_corpus: max_target_length must be >= 1");
  for (int64_t d = 0; d < num_documents; ++d) {
    uint64_t h = mix(seed * 0x100000001b3ull + static_cast<uint64_t>(d));
    int64_t len = lo + static_cast<int64_t>(h % static_cast<uint64_t>(hi - lo + 1));
    c.tokens.push_back(kBosId);
    for (int64_t i = 0; i < len; ++i) c.tokens.push_back(static_cast<int32_t>(mix(h + static_cast<uint64_t>(i)) % 256));
    c.tokens.push_back(kEosId);
    c.doc_offsets.push_back(static_cast<int64_t>(c.tokens.size()));
  }
  return std::move(c).corpus();
}

Corpus load_corpus(const RunConfig& config) {
  switch (config.dataset_type) {
    case DatasetType::text: return load_text_corpus(config.dataset_path, config.document_separator);
    case DatasetType::binary:
      return load_token_files(expand_dataset_path(config.dataset_path), config.model.vocab_size);
    case DatasetType::synthetic:
      return synthetic_corpus(static_cast<uint64_t>(config.init_weights_seed), config.max_target_length);
  }
  throw ConfigError("unknown dataset_type");
}

Dataset::Dataset(Corpus corpus, int64_t max_target_length, bool packing)
    : corpus_(std::move(corpus)), seq_len_(max_target_length), packing_(packing) {
  const int64_t S = seq_len_;
  // S = 0 packed forever (pieces of no tokens); S + 1 must not wrap.
  check_shape(S >= 1, "Dataset: max_target_length must be >= 1");
  checked_add(S, 1, "max_target_length + 1");
  if (!packing_) {
    if (corpus_.size() < S + 1)
      throw DataError("the corpus has " + std::to_string(corpus_.size()) +
                      " tokens; packing=false needs at least max_target_length + 1 = " + std::to_string(S + 1));
    return;
  }
  std::vector<Piece> current;
  int64_t free = S;
  for (int64_t d = 0; d < corpus_.num_documents(); ++d) {
    int64_t pos = corpus_.doc_offsets()[d], end = corpus_.doc_offsets()[d + 1];
    while (end - pos >= 2) {  // at least one (input, target) pair left
      int64_t len = std::min(end - pos - 1, free);
      current.push_back({pos, len});
      free -= len;
      pos += len;  // the last target is the next piece's first input
      if (free == 0) {
        packed_.push_back(std::move(current));
        current.clear();
        free = S;
      }
    }
  }
  if (!current.empty()) packed_.push_back(std::move(current));
  if (packed_.empty()) throw DataError("the corpus has no document of two or more tokens to train on");
}

int64_t Dataset::num_sequences() const {
  if (packing_) return static_cast<int64_t>(packed_.size());
  return (corpus_.size() - 1) / seq_len_;
}

void Dataset::sequence(int64_t index, Sequence& out) const {
  const int64_t S = seq_len_;
  const int64_t k = index % num_sequences();
  out.tokens.assign(S, corpus_.pad_id());
  out.targets.assign(S, corpus_.pad_id());
  out.positions.resize(S);
  out.weights.assign(S, 0.0f);
  // The sequence's tokens are one contiguous range of the corpus (packed
  // pieces follow each other, consecutive ones of a document sharing a
  // token): one read, which also checks mapped files for changes.
  const int64_t first = packing_ ? packed_[k].front().begin : k * S;
  const int64_t end = packing_ ? packed_[k].back().begin + packed_[k].back().len + 1 : k * S + S + 1;
  std::vector<int32_t> span(static_cast<size_t>(end - first));
  corpus_.read(first, end - first, span.data());
  auto t = [&](int64_t i) { return span[static_cast<size_t>(i - first)]; };  // corpus token i
  if (!packing_) {
    out.segments.clear();
    for (int64_t i = 0; i < S; ++i) {
      out.tokens[i] = t(k * S + i);
      out.targets[i] = t(k * S + i + 1);
      out.positions[i] = i;
      out.weights[i] = 1.0f;
    }
    return;
  }
  out.segments.assign(S, 0);
  int64_t slot = 0;
  int32_t segment = 1;
  for (const Piece& p : packed_[k]) {
    for (int64_t i = 0; i < p.len; ++i, ++slot) {
      out.tokens[slot] = t(p.begin + i);
      out.targets[slot] = t(p.begin + i + 1);
      out.positions[slot] = i;
      out.segments[slot] = segment;
      out.weights[slot] = 1.0f;
    }
    ++segment;
  }
  // Padding: its own segment 0, positions counting on (never attended by real tokens).
  for (int64_t i = 0; slot < S; ++slot, ++i) out.positions[slot] = i;
}

Batch LocalBatch::view() const {
  Batch b;
  b.batch = batch;
  b.seq_local = seq_local;
  b.tokens = tokens.data();
  b.targets = targets.data();
  b.positions = positions.data();
  b.segments = segments.empty() ? nullptr : segments.data();
  b.loss_weights = weights.data();
  return b;
}

LocalBatch make_local_batch(const Dataset& data, int64_t first_sequence, int64_t batch_per_replica, int64_t dp,
                            int64_t dp_rank, const CpLayout& layout, int cp_rank, const MaskSpec& mask) {
  const int64_t S = data.seq_len(), L = layout.local_len(), B = batch_per_replica;
  check_shape(layout.seq_len() == S, "make_local_batch: layout length differs from max_target_length");
  LocalBatch out;
  out.batch = B;
  out.seq_local = L;
  out.tokens.resize(B * L);
  out.targets.resize(B * L);
  out.positions.resize(B * L);
  out.weights.resize(B * L);
  if (data.packing()) out.segments.resize(B * L);
  const CpLayout whole(LayoutKind::contiguous, S, 1);
  MaskSpec pair_mask = mask;
  pair_mask.same_segment = data.packing();
  Sequence seq;
  for (int64_t r = 0; r < dp; ++r) {
    for (int64_t b = 0; b < B; ++b) {
      data.sequence(first_sequence + r * B + b, seq);
      for (float w : seq.weights) out.global_target_tokens += static_cast<int64_t>(w);
      out.global_unmasked_pairs += unmasked_pairs_per_rank(whole, pair_mask, seq.positions.data(),
                                                           data.packing() ? seq.segments.data() : nullptr, 1)[0];
      if (r != dp_rank) continue;
      layout.shard(cp_rank, seq.tokens.data(), out.tokens.data() + b * L, 1);
      layout.shard(cp_rank, seq.targets.data(), out.targets.data() + b * L, 1);
      layout.shard(cp_rank, seq.positions.data(), out.positions.data() + b * L, 1);
      layout.shard(cp_rank, seq.weights.data(), out.weights.data() + b * L, 1);
      if (data.packing()) layout.shard(cp_rank, seq.segments.data(), out.segments.data() + b * L, 1);
    }
  }
  return out;
}

}  // namespace longctx
