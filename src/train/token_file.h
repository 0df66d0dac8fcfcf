#pragma once
// The corpus in memory and its pre-tokenized binary file. Apart from
// data.h so that the file reader builds alone (tests/fuzz links only core
// and this).
#include <cstdint>
#include <string>
#include <vector>

namespace longctx {

// ---- byte-level tokenizer ids ------------------------------------------------
constexpr int32_t kBosId = 256;
constexpr int32_t kEosId = 257;
constexpr int32_t kPadId = 258;
constexpr int64_t kByteVocabSize = 259;

// ---- corpus --------------------------------------------------------------------
struct Corpus {
  std::vector<int32_t> tokens;        // every document, concatenated
  std::vector<int64_t> doc_offsets;   // [num_documents + 1]
  int32_t pad_id = kPadId;            // input id of padding slots (binary files: their EOS)
  int64_t num_documents() const { return static_cast<int64_t>(doc_offsets.size()) - 1; }
};

// Pre-tokenized binary file, little-endian, 32-byte header:
//   bytes 0..7   magic "LCTXTOK1"
//   bytes 8..11  uint32 format version (1)
//   bytes 12..15 uint32 vocab size the ids were made for (<= 2^31: ids are int32)
//   bytes 16..19 uint32 EOS id (ends every document; also the input of padding slots)
//   bytes 20..23 uint32 reserved (0)
//   bytes 24..31 uint64 number of ids n
//   then n uint32 ids, documents separated by (ending with) EOS.
// DataError naming the file on: a path that is missing, a directory or not a
// regular file; a bad magic/version; a size that does not match n; n == 0;
// a header vocab above the model's vocab_size (or 2^31); an EOS id or any id
// >= the header's vocab.
Corpus load_token_file(const std::string& path, int64_t vocab_size);
// Writes the corpus (each document should end with eos_id).
void write_token_file(const std::string& path, const Corpus& corpus, int64_t vocab_size,
                      int32_t eos_id = kEosId);

}  // namespace longctx
