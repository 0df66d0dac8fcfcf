#include "train/token_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace longctx {

namespace fs = std::filesystem;

namespace {

constexpr char kTokenMagic[8] = {'L', 'C', 'T', 'X', 'T', 'O', 'K', '1'};
constexpr size_t kTokenHeaderBytes = 32;

}  // namespace

void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size, int32_t eos_id) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw DataError("cannot write '" + path + "'");
  char header[kTokenHeaderBytes] = {};
  std::memcpy(header, kTokenMagic, 8);
  uint32_t version = 1, vocab = static_cast<uint32_t>(vocab_size), eos = static_cast<uint32_t>(eos_id);
  uint64_t n = corpus.tokens.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &vocab, 4);
  std::memcpy(header + 16, &eos, 4);
  std::memcpy(header + 24, &n, 8);
  out.write(header, sizeof header);
  std::vector<uint32_t> ids(corpus.tokens.begin(), corpus.tokens.end());
  out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  if (!out) throw DataError("writing '" + path + "' failed");
}

Corpus load_token_file(const std::string& path, int64_t vocab_size) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw DataError("token file '" + path + "' does not exist");
  if (fs::is_directory(st))
    throw DataError("token file '" + path + "' is a directory (dataset_type=binary reads one token file)");
  if (!fs::is_regular_file(st)) throw DataError("token file '" + path + "' is not a regular file");
  auto bad = [&](const std::string& why) { return DataError("token file '" + path + "': " + why); };
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in) throw bad("cannot be read");
  const std::string bytes = s.str();
  if (bytes.size() < kTokenHeaderBytes || std::memcmp(bytes.data(), kTokenMagic, 8) != 0)
    throw bad("not a longctx token file (magic 'LCTXTOK1' missing)");
  uint32_t version, vocab, eos;
  uint64_t n;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&vocab, bytes.data() + 12, 4);
  std::memcpy(&eos, bytes.data() + 16, 4);
  std::memcpy(&n, bytes.data() + 24, 8);
  if (version != 1) throw bad("format version " + std::to_string(version) + " is not supported (expected 1)");
  if (n == 0) throw bad("holds no tokens");
  if ((bytes.size() - kTokenHeaderBytes) / 4 != n || (bytes.size() - kTokenHeaderBytes) % 4 != 0)
    throw bad("header says " + std::to_string(n) + " ids but the file has " +
              std::to_string(bytes.size() - kTokenHeaderBytes) + " bytes after the header (truncated or corrupt)");
  if (vocab > vocab_size)
    throw bad("made for vocab size " + std::to_string(vocab) + ", larger than the model's vocab_size " +
              std::to_string(vocab_size));
  // Ids are int32 in memory: a larger vocab would turn ids negative.
  constexpr uint32_t kMaxVocab = uint32_t(1) << 31;
  if (vocab > kMaxVocab)
    throw bad("header vocab size " + std::to_string(vocab) + " exceeds 2^31 (ids must fit int32)");
  if (eos >= vocab) throw bad("EOS id " + std::to_string(eos) + " is outside its vocab " + std::to_string(vocab));
  Corpus c;
  c.pad_id = static_cast<int32_t>(eos);
  c.tokens.resize(n);
  c.doc_offsets.push_back(0);
  const char* p = bytes.data() + kTokenHeaderBytes;
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t id;
    std::memcpy(&id, p + 4 * i, 4);
    // Against the file's own vocab (<= the model's, checked above): an id the
    // tokenizer cannot have made means the file is corrupt.
    if (id >= vocab)
      throw bad("id " + std::to_string(id) + " at index " + std::to_string(i) + " is >= vocab_size " +
                std::to_string(vocab) + " of the file's header (corrupt)");
    c.tokens[i] = static_cast<int32_t>(id);
    if (id == eos || i + 1 == n) c.doc_offsets.push_back(static_cast<int64_t>(i + 1));
  }
  return c;
}

}  // namespace longctx
