#pragma once
// Training data: byte-level tokenizer, corpus loading (text or pre-tokenized
// binary or synthetic), packing into max_target_length sequences, and the
// per-rank batch (sharded across dp, laid out per the CP layout).
//
// A corpus is a list of documents, each a token sequence. Text documents are
// BOS + bytes + EOS. Sequence k of the dataset is a pure function of k (the
// packing is computed once at load), so the data cursor is just "sequences
// consumed": resuming, even with another dp, continues exactly.
//
// One training sequence of S = max_target_length slots pairs inputs with
// next-token targets:
//   packing: true   documents are cut into pieces of at most S+1 tokens and
//                   packed greedily; each piece of L+1 tokens gives L slots
//                   (inputs t0..t_{L-1}, targets t1..t_L) with positions
//                   0..L-1 and its own segment id (1, 2, ...). A document that
//                   does not fit continues in the next sequence. Trailing
//                   slots are PAD with segment 0 and loss weight 0.
//   packing: false  the documents concatenated into one stream, cut into
//                   windows of S+1 tokens overlapping by one; positions 0..S-1,
//                   no segment ids (plain causal attention across documents).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "cp/layout.h"
#include "kernels/attention/attention.h"
#include "model/llama.h"
#include "train/token_file.h"

namespace longctx {

// ---- byte-level tokenizer (ids in train/token_file.h) ---------------------------
std::vector<int32_t> tokenize_bytes(std::string_view text);  // bytes only, no BOS/EOS
std::string detokenize_bytes(const std::vector<int32_t>& ids);  // special ids dropped

// ---- corpus (Corpus and the binary token file: train/token_file.h) ------------
// The files dataset_path names, in order: comma-separated entries in the order
// given, each a path (kept as is) or a glob pattern (an entry with * ? or [),
// replaced by its matches sorted byte-wise; hidden files match only a pattern
// that starts with a dot. DataError for a pattern that matches nothing (naming
// it) or an empty entry.
std::vector<std::string> expand_dataset_path(const std::string& dataset_path);

// dataset_path (expanded as above): each text file, or each directory's
// regular files (sorted by name, hidden files skipped), in order, is a
// document. A non-empty separator splits each file into several documents;
// empty pieces are dropped. DataError when a path is missing or no document
// has any byte.
Corpus load_text_corpus(const std::string& dataset_path, const std::string& separator);

// Random documents of random bytes (BOS + bytes + EOS), lengths in
// [S/4, 2S], a function of seed only: for tests and benchmarks.
Corpus synthetic_corpus(uint64_t seed, int64_t max_target_length, int64_t num_documents = 64);

// The corpus the config names (dataset_type, dataset_path, ...).
Corpus load_corpus(const RunConfig& config);

// ---- packed sequences ----------------------------------------------------------
struct Sequence {  // one full sequence, [S] each
  std::vector<int32_t> tokens, targets;
  std::vector<int64_t> positions;
  std::vector<int32_t> segments;  // empty when not packing
  std::vector<float> weights;     // 1 for real targets, 0 for padding
};

class Dataset {
 public:
  Dataset(Corpus corpus, int64_t max_target_length, bool packing);

  int64_t seq_len() const { return seq_len_; }
  bool packing() const { return packing_; }
  // Sequences per epoch; index k >= that wraps around (next epoch).
  int64_t num_sequences() const;
  void sequence(int64_t index, Sequence& out) const;
  const Corpus& corpus() const { return corpus_; }

 private:
  struct Piece {  // corpus tokens [begin, begin + len + 1) -> len slots
    int64_t begin;
    int64_t len;
  };
  Corpus corpus_;
  int64_t seq_len_;
  bool packing_;
  std::vector<std::vector<Piece>> packed_;  // packing: pieces of each sequence
};

// ---- this rank's batch -----------------------------------------------------------
// The per_device_batch_size sequences of one dp replica, in this cp rank's
// layout. Arrays are [B, S_local]; view() is what LlamaModel takes.
struct LocalBatch {
  int64_t batch = 0, seq_local = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<int64_t> positions;
  std::vector<int32_t> segments;  // empty when not packing
  std::vector<float> weights;
  // Over the GLOBAL batch (every dp replica, full sequences):
  int64_t global_target_tokens = 0;  // sum of weights: the loss normaliser
  int64_t global_unmasked_pairs = 0; // (q, kv) pairs allowed by the mask, one head
  Batch view() const;
};

// Builds the batch of step `first_sequence` .. for dp rank `dp_rank`: global
// batch = sequences [first_sequence, first_sequence + B * dp); replica r takes
// B consecutive ones from first_sequence + r * B.
LocalBatch make_local_batch(const Dataset& data, int64_t first_sequence, int64_t batch_per_replica,
                            int64_t dp, int64_t dp_rank, const CpLayout& layout, int cp_rank,
                            const MaskSpec& mask);

}  // namespace longctx
