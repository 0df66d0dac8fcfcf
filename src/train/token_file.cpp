#include "train/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;

namespace {

constexpr char kTokenMagic[8] = {'L', 'C', 'T', 'X', 'T', 'O', 'K', '1'};
constexpr size_t kTokenHeaderBytes = 32;

}  // namespace

// One run of tokens. check_read runs after each copy out of it.
struct Corpus::Source {
  const int32_t* data = nullptr;
  int64_t size = 0;
  virtual ~Source() = default;
  virtual void check_read(const int32_t* copied, int64_t count) const = 0;
};

namespace {

struct OwnedTokens final : Corpus::Source {
  std::vector<int32_t> tokens;
  explicit OwnedTokens(std::vector<int32_t> t) : tokens(std::move(t)) {
    data = tokens.data();
    size = static_cast<int64_t>(tokens.size());
  }
  void check_read(const int32_t*, int64_t) const override {}
};

// A token file mapped read-only; the descriptor stays open so that reads can
// fstat() it for changes.
struct MappedTokenFile final : Corpus::Source {
  std::string path;
  int fd = -1;
  void* map = MAP_FAILED;
  size_t map_bytes = 0;
  struct stat at_open {};
  uint32_t vocab = 0, eos = 0;

  ~MappedTokenFile() override {
    if (map != MAP_FAILED) ::munmap(map, map_bytes);
    if (fd >= 0) ::close(fd);
  }
  DataError bad(const std::string& why) const { return DataError("token file '" + path + "': " + why); }

  void check_read(const int32_t* copied, int64_t count) const override {
    for (int64_t i = 0; i < count; ++i)
      if (static_cast<uint32_t>(copied[i]) >= vocab)
        throw bad("changed since it was opened: an id now reads " + std::to_string(static_cast<uint32_t>(copied[i])) +
                  ", >= its vocab " + std::to_string(vocab) + " (do not rewrite a dataset while training reads it)");
    struct stat now {};
    if (::fstat(fd, &now) != 0) throw bad(std::string("fstat failed: ") + std::strerror(errno));
    if (now.st_size != at_open.st_size || now.st_mtim.tv_sec != at_open.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != at_open.st_mtim.tv_nsec)
      throw bad("changed since it was opened (size " + std::to_string(at_open.st_size) + " -> " +
                std::to_string(now.st_size) + " bytes, or its modification time): its tokens are no longer the "
                "ones validated (do not rewrite a dataset while training reads it)");
  }
};

}  // namespace

Corpus::Corpus(std::vector<int32_t> tokens, std::vector<int64_t> doc_offsets, int32_t pad_id)
    : Corpus(std::make_shared<OwnedTokens>(std::move(tokens)), std::move(doc_offsets), pad_id) {}

Corpus::Corpus(std::shared_ptr<const Source> tokens, std::vector<int64_t> doc_offsets, int32_t pad_id)
    : doc_offsets_(std::move(doc_offsets)), pad_id_(pad_id) {
  check_shape(doc_offsets_.empty() ? tokens->size == 0 : doc_offsets_.front() == 0 && doc_offsets_.back() == tokens->size,
              "Corpus: doc_offsets must run from 0 to the number of tokens");
  if (tokens->size > 0) parts_.push_back({std::move(tokens), 0});
}

void Corpus::append(Corpus next) {
  if (next.size() == 0) return;
  if (size() == 0) {
    *this = std::move(next);
    return;
  }
  const int64_t shift = size();
  for (Part& p : next.parts_) parts_.push_back({std::move(p.source), p.start + shift});
  for (size_t d = 1; d < next.doc_offsets_.size(); ++d) doc_offsets_.push_back(next.doc_offsets_[d] + shift);
}

void Corpus::read(int64_t begin, int64_t count, int32_t* out) const {
  check_shape(begin >= 0 && count >= 0 && begin + count <= size(), "Corpus::read: range past the corpus");
  // The last part starting at or before `begin`.
  auto it = std::upper_bound(parts_.begin(), parts_.end(), begin,
                             [](int64_t at, const Part& p) { return at < p.start; });
  for (--it; count > 0; ++it) {
    const int64_t offset = begin - it->start, n = std::min(count, it->source->size - offset);
    std::memcpy(out, it->source->data + offset, static_cast<size_t>(n) * sizeof(int32_t));
    it->source->check_read(out, n);
    out += n;
    begin += n;
    count -= n;
  }
}

std::vector<int32_t> Corpus::tokens() const {
  std::vector<int32_t> all(static_cast<size_t>(size()));
  read(0, size(), all.data());
  return all;
}

void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size, int32_t eos_id) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw DataError("cannot write '" + path + "'");
  char header[kTokenHeaderBytes] = {};
  std::memcpy(header, kTokenMagic, 8);
  uint32_t version = 1, vocab = static_cast<uint32_t>(vocab_size), eos = static_cast<uint32_t>(eos_id);
  uint64_t n = static_cast<uint64_t>(corpus.size());
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &vocab, 4);
  std::memcpy(header + 16, &eos, 4);
  std::memcpy(header + 24, &n, 8);
  out.write(header, sizeof header);
  std::vector<int32_t> block;
  for (int64_t at = 0; at < corpus.size(); at += static_cast<int64_t>(block.size())) {
    block.resize(static_cast<size_t>(std::min<int64_t>(corpus.size() - at, int64_t(1) << 20)));
    corpus.read(at, static_cast<int64_t>(block.size()), block.data());
    out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(block.size() * 4));
  }
  if (!out) throw DataError("writing '" + path + "' failed");
}

namespace {

struct MappedCorpus {
  std::shared_ptr<MappedTokenFile> file;
  std::vector<int64_t> doc_offsets;
  Corpus corpus() && { return Corpus(file, std::move(doc_offsets), static_cast<int32_t>(file->eos)); }
};

MappedCorpus map_token_file(const std::string& path, int64_t vocab_size) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw DataError("token file '" + path + "' does not exist");
  if (fs::is_directory(st))
    throw DataError("token file '" + path + "' is a directory (dataset_type=binary reads token files; "
                    "name them, e.g. '" + path + "/*.bin')");
  if (!fs::is_regular_file(st)) throw DataError("token file '" + path + "' is not a regular file");
  auto file = std::make_shared<MappedTokenFile>();
  MappedTokenFile& f = *file;
  f.path = path;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0 || ::fstat(f.fd, &f.at_open) != 0)
    throw f.bad(std::string("cannot be read: ") + std::strerror(errno));
  const uint64_t bytes = static_cast<uint64_t>(f.at_open.st_size);
  char header[kTokenHeaderBytes];
  if (bytes < kTokenHeaderBytes || ::pread(f.fd, header, kTokenHeaderBytes, 0) != kTokenHeaderBytes ||
      std::memcmp(header, kTokenMagic, 8) != 0)
    throw f.bad("not a longctx token file (magic 'LCTXTOK1' missing)");
  uint32_t version, vocab, eos;
  uint64_t n;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&vocab, header + 12, 4);
  std::memcpy(&eos, header + 16, 4);
  std::memcpy(&n, header + 24, 8);
  if (version != 1) throw f.bad("format version " + std::to_string(version) + " is not supported (expected 1)");
  if (n == 0) throw f.bad("holds no tokens");
  if ((bytes - kTokenHeaderBytes) / 4 != n || (bytes - kTokenHeaderBytes) % 4 != 0)
    throw f.bad("header says " + std::to_string(n) + " ids but the file has " +
                std::to_string(bytes - kTokenHeaderBytes) + " bytes after the header (truncated or corrupt)");
  if (vocab > vocab_size)
    throw f.bad("made for vocab size " + std::to_string(vocab) + ", larger than the model's vocab_size " +
                std::to_string(vocab_size));
  // Ids are int32 in memory: a larger vocab would turn ids negative.
  constexpr uint32_t kMaxVocab = uint32_t(1) << 31;
  if (vocab > kMaxVocab)
    throw f.bad("header vocab size " + std::to_string(vocab) + " exceeds 2^31 (ids must fit int32)");
  if (eos >= vocab) throw f.bad("EOS id " + std::to_string(eos) + " is outside its vocab " + std::to_string(vocab));
  f.vocab = vocab;
  f.eos = eos;
  f.map_bytes = static_cast<size_t>(bytes);
  f.map = ::mmap(nullptr, f.map_bytes, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (f.map == MAP_FAILED) throw f.bad(std::string("mmap failed: ") + std::strerror(errno));
  // uint32 ids below 2^31 are the same bits as int32 (little-endian, 4-byte aligned after the header).
  f.data = reinterpret_cast<const int32_t*>(static_cast<const char*>(f.map) + kTokenHeaderBytes);
  f.size = static_cast<int64_t>(n);
  // The one pass through the map: ids checked, documents found.
  ::madvise(f.map, f.map_bytes, MADV_SEQUENTIAL);
  std::vector<int64_t> doc_offsets{0};
  const auto* ids = reinterpret_cast<const uint32_t*>(f.data);
  for (uint64_t i = 0; i < n; ++i) {
    // Against the file's own vocab (<= the model's, checked above): an id the
    // tokenizer cannot have made means the file is corrupt.
    if (ids[i] >= vocab)
      throw f.bad("id " + std::to_string(ids[i]) + " at index " + std::to_string(i) + " is >= vocab_size " +
                  std::to_string(vocab) + " of the file's header (corrupt)");
    if (ids[i] == eos || i + 1 == n) doc_offsets.push_back(static_cast<int64_t>(i + 1));
  }
  ::madvise(f.map, f.map_bytes, MADV_NORMAL);
  return {std::move(file), std::move(doc_offsets)};
}

}  // namespace

Corpus load_token_file(const std::string& path, int64_t vocab_size) {
  return map_token_file(path, vocab_size).corpus();
}

Corpus load_token_files(const std::vector<std::string>& paths, int64_t vocab_size) {
  Corpus all;
  uint32_t vocab = 0, eos = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    MappedCorpus m = map_token_file(paths[i], vocab_size);
    const MappedTokenFile& f = *m.file;
    if (i == 0) {
      vocab = f.vocab;
      eos = f.eos;
    } else if (f.vocab != vocab || f.eos != eos) {
      throw DataError("token file '" + paths[i] + "' was made for vocab " + std::to_string(f.vocab) + " with EOS " +
                      std::to_string(f.eos) + ", but '" + paths[0] + "' for vocab " + std::to_string(vocab) +
                      " with EOS " + std::to_string(eos) + ": the files of a dataset must come from one tokenizer");
    }
    all.append(std::move(m).corpus());
  }
  return all;
}

}  // namespace longctx
