#pragma once
// The corpus in memory and its pre-tokenized binary file. Apart from
// data.h so that the file reader builds alone (tests/fuzz links only core
// and this).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace longctx {

// ---- byte-level tokenizer ids ------------------------------------------------
constexpr int32_t kBosId = 256;
constexpr int32_t kEosId = 257;
constexpr int32_t kPadId = 258;
constexpr int64_t kByteVocabSize = 259;

// ---- corpus --------------------------------------------------------------------
// Every document, concatenated: tokens the corpus owns (text, synthetic)
// and/or read-only memory maps of token files, in order. Read through read():
// a mapped file is never read whole into memory.
class Corpus {
 public:
  struct Source;  // one run of tokens (owned or mapped), token_file.cpp
  Corpus() = default;
  // Owned tokens; doc_offsets from 0 to tokens.size(), one more than documents.
  Corpus(std::vector<int32_t> tokens, std::vector<int64_t> doc_offsets, int32_t pad_id = kPadId);
  Corpus(std::shared_ptr<const Source> tokens, std::vector<int64_t> doc_offsets, int32_t pad_id);
  // Appends `next`'s documents after these; the end of each part ends a document.
  void append(Corpus next);

  int64_t size() const { return doc_offsets_.empty() ? 0 : doc_offsets_.back(); }
  int64_t num_documents() const { return doc_offsets_.empty() ? 0 : static_cast<int64_t>(doc_offsets_.size()) - 1; }
  const std::vector<int64_t>& doc_offsets() const { return doc_offsets_; }
  int32_t pad_id() const { return pad_id_; }  // input id of padding slots (binary files: their EOS)
  // Tokens [begin, begin + count) into out. DataError naming the file when a
  // mapped token file changed since it was opened (see load_token_file).
  void read(int64_t begin, int64_t count, int32_t* out) const;
  std::vector<int32_t> tokens() const;  // all of them, copied (small corpora and tests)

 private:
  struct Part {
    std::shared_ptr<const Source> source;
    int64_t start;  // of its first token in the concatenation
  };
  std::vector<Part> parts_;
  std::vector<int64_t> doc_offsets_;
  int32_t pad_id_ = kPadId;
};

// Pre-tokenized binary file, little-endian, 32-byte header:
//   bytes 0..7   magic "LCTXTOK1"
//   bytes 8..11  uint32 format version (1)
//   bytes 12..15 uint32 vocab size the ids were made for (<= 2^31: ids are int32)
//   bytes 16..19 uint32 EOS id (ends every document; also the input of padding slots)
//   bytes 20..23 uint32 reserved (0)
//   bytes 24..31 uint64 number of ids n
//   then n uint32 ids, documents separated by (ending with) EOS.
// The file is memory-mapped read-only and validated by one pass through the
// map (the only time all of it is paged in). DataError naming the file on: a
// path that is missing, a directory or not a regular file; a bad
// magic/version; a size that does not match n; n == 0; a header vocab above
// the model's vocab_size (or 2^31); an EOS id or any id >= the header's vocab.
// A file changed after it was opened never yields wrong ids silently: every
// read checks each id against the header's vocab and then fstat()s the open
// file, so a change of size or modification time is a DataError at the next
// read. A truncation that lands between that check and the copy makes the
// read of the lost pages raise SIGBUS, which ends the process.
Corpus load_token_file(const std::string& path, int64_t vocab_size);
// Several token files, concatenated in the order given (each file's end also
// ends a document). They must agree on the header's vocab and EOS id (one
// tokenizer): DataError naming both files otherwise.
Corpus load_token_files(const std::vector<std::string>& paths, int64_t vocab_size);
// Writes the corpus (each document should end with eos_id).
void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size,
                      int32_t eos_id = kEosId);

}  // namespace longctx
