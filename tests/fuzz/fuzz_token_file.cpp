// The binary token-file reader: the input is the file, read for a model of
// the byte vocabulary (259) and of a larger one (2^31 + 5), memory-mapped and
// read back through the map.
#include "fuzz_util.h"
#include "train/token_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = fuzz::write_file(fuzz::scratch_dir() / "tokens.bin",
                                     std::string(reinterpret_cast<const char*>(data), size));
  for (int64_t vocab : {int64_t(259), (int64_t(1) << 31) + 5}) {
    fuzz::allow_project_errors([&] {
      const longctx::Corpus c = longctx::load_token_file(path.string(), vocab);
      const std::vector<int32_t> tokens = c.tokens();  // read through the map
      const std::vector<int64_t>& docs = c.doc_offsets();
      fuzz::require(!tokens.empty() && docs.front() == 0 && docs.back() == static_cast<int64_t>(tokens.size()),
                    "documents cover the tokens");
      for (size_t i = 1; i < docs.size(); ++i)
        fuzz::require(docs[i] > docs[i - 1], "documents are non-empty and in order");
      for (int32_t id : tokens) fuzz::require(id >= 0 && id < vocab, "ids are in [0, vocab_size)");
      fuzz::require(c.pad_id() >= 0 && c.pad_id() < vocab, "the pad id is in the vocab");
    });
  }
  return 0;
}
