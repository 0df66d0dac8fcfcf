// Data: tokenizer, corpus loading and corruption, packing (every next-token
// pair of every document exactly once per epoch), dp/cp sharding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "train/data.h"
#include "error_text.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace longctx;

namespace {


// Every (document, i) next-token pair of the corpus, as (input, target, i-th in doc).
std::multiset<std::tuple<int32_t, int32_t>> corpus_pairs(const Corpus& c) {
  std::multiset<std::tuple<int32_t, int32_t>> s;
  for (int64_t d = 0; d < c.num_documents(); ++d)
    for (int64_t i = c.doc_offsets[d]; i + 1 < c.doc_offsets[d + 1]; ++i) s.emplace(c.tokens[i], c.tokens[i + 1]);
  return s;
}

}  // namespace

TEST(Data, ByteTokenizerRoundTrips) {
  std::string text = "In the beginning\n\xff\x00z";
  text.push_back('\0');
  std::vector<int32_t> ids = tokenize_bytes(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'I');
  EXPECT_EQ(ids[17], 255);
  ids.push_back(kEosId);
  EXPECT_EQ(detokenize_bytes(ids), text);
  EXPECT_EQ(kByteVocabSize, 259);
}

TEST(Data, TextDirectoryIsOneDocumentPerFileInNameOrder) {
  TempDir t;
  t.write("b.txt", "bb");
  t.write("a.txt", "a");
  t.write(".hidden", "zzz");
  t.write("c.txt", "");
  Corpus c = load_text_corpus(t.path.string(), "");
  ASSERT_EQ(c.num_documents(), 2);
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{kBosId, 'a', kEosId, kBosId, 'b', 'b', kEosId}));
  EXPECT_EQ(c.doc_offsets, (std::vector<int64_t>{0, 3, 7}));
  Corpus split = load_text_corpus(t.write("one.txt", "x||yy||||z").string(), "||");
  EXPECT_EQ(split.num_documents(), 3);
  EXPECT_NE(data_error([&] { load_text_corpus((t.path / "missing").string(), ""); }).find("does not exist"),
            std::string::npos);
  EXPECT_NE(data_error([&] { load_text_corpus(t.write("empty.txt", "").string(), ""); }).find("no text"),
            std::string::npos);
}

TEST(Data, TokenFileRoundTripsAndRejectsCorruption) {
  TempDir t;
  Corpus c = synthetic_corpus(3, 16, 5);
  fs::path p = t.path / "c.bin";
  write_token_file(p.string(), c, 259);
  Corpus back = load_token_file(p.string(), 259);
  EXPECT_EQ(back.tokens, c.tokens);
  EXPECT_EQ(back.doc_offsets, c.doc_offsets);
  EXPECT_EQ(back.pad_id, kEosId);

  std::string bytes;
  {
    std::ifstream in(p, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  EXPECT_NE(data_error([&] { load_token_file(t.write("m.bin", "XXXX" + bytes.substr(4)).string(), 259); })
                .find("magic"), std::string::npos);
  EXPECT_NE(data_error([&] { load_token_file(t.write("tr.bin", bytes.substr(0, bytes.size() - 2)).string(), 259); })
                .find("truncated"), std::string::npos);
  std::string big = bytes;
  big[32 + 4 * 3] = static_cast<char>(0x10);  // id 3 -> >= 259
  big[32 + 4 * 3 + 1] = static_cast<char>(0x10);
  EXPECT_NE(data_error([&] { load_token_file(t.write("big.bin", big).string(), 259); }).find(">= vocab_size"),
            std::string::npos);
  EXPECT_NE(data_error([&] { load_token_file(p.string(), 100); }).find("vocab"), std::string::npos);
  Corpus empty;
  write_token_file((t.path / "e.bin").string(), empty, 259);
  EXPECT_NE(data_error([&] { load_token_file((t.path / "e.bin").string(), 259); }).find("no tokens"),
            std::string::npos);
}

TEST(Data, PackingCoversEveryPairOnceWithRestartingPositions) {
  for (int64_t S : {7, 16, 40}) {
    Corpus c = synthetic_corpus(11, 12, 9);
    Dataset d(c, S, /*packing=*/true);
    std::multiset<std::tuple<int32_t, int32_t>> seen;
    Sequence s;
    for (int64_t k = 0; k < d.num_sequences(); ++k) {
      d.sequence(k, s);
      ASSERT_EQ(static_cast<int64_t>(s.tokens.size()), S);
      for (int64_t i = 0; i < S; ++i) {
        if (s.weights[i] == 0.0f) {
          EXPECT_EQ(s.segments[i], 0);
          continue;
        }
        seen.emplace(s.tokens[i], s.targets[i]);
        bool starts = i == 0 || s.segments[i - 1] != s.segments[i];
        EXPECT_EQ(s.positions[i], starts ? 0 : s.positions[i - 1] + 1) << "S=" << S << " k=" << k << " i=" << i;
        if (!starts) {  // consecutive within a piece
          EXPECT_EQ(s.tokens[i], s.targets[i - 1]);
        }
      }
      // Only the last sequence of the epoch may have padding.
      if (k + 1 < d.num_sequences()) {
        EXPECT_EQ(s.weights.back(), 1.0f);
      }
    }
    EXPECT_EQ(seen, corpus_pairs(c)) << "S=" << S;
    // Epochs wrap.
    Sequence again;
    d.sequence(d.num_sequences() + 1, again);
    d.sequence(1, s);
    EXPECT_EQ(again.tokens, s.tokens);
  }
}

TEST(Data, ConcatenationWindowsOverlapByOneToken) {
  Corpus c = synthetic_corpus(5, 10, 4);
  Dataset d(c, 10, /*packing=*/false);
  EXPECT_EQ(d.num_sequences(), (static_cast<int64_t>(c.tokens.size()) - 1) / 10);
  Sequence s;
  d.sequence(2, s);
  EXPECT_TRUE(s.segments.empty());
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(s.tokens[i], c.tokens[20 + i]);
    EXPECT_EQ(s.targets[i], c.tokens[21 + i]);
    EXPECT_EQ(s.positions[i], i);
  }
  EXPECT_NE(data_error([&] { Dataset(synthetic_corpus(1, 1, 1), 1000, false); }).find("at least"), std::string::npos);
}

TEST(Data, LocalBatchShardsOverDpAndFollowsTheCpLayout) {
  const int64_t S = 16, B = 2, dp = 2;
  Dataset d(synthetic_corpus(7, S, 20), S, true);
  MaskSpec mask = MaskSpec::causal();
  for (LayoutKind kind : {LayoutKind::contiguous, LayoutKind::zigzag}) {
    CpLayout layout(kind, S, 4);
    for (int64_t r = 0; r < dp; ++r) {
      for (int c = 0; c < 4; ++c) {
        LocalBatch lb = make_local_batch(d, 6, B, dp, r, layout, c, mask);
        ASSERT_EQ(lb.seq_local, 4);
        int64_t tokens = 0, pairs = 0;
        MaskSpec doc_mask = mask;  // packed: attention stays inside each document
        doc_mask.same_segment = true;
        Sequence s;
        for (int64_t g = 0; g < B * dp; ++g) {
          d.sequence(6 + g, s);
          for (int64_t i = 0; i < S; ++i) {
            tokens += s.weights[i] != 0.0f;
            for (int64_t j = 0; j < S; ++j)
              pairs += doc_mask.allows(s.positions[i], s.positions[j], s.segments[i], s.segments[j]);
          }
        }
        EXPECT_EQ(lb.global_target_tokens, tokens);
        EXPECT_EQ(lb.global_unmasked_pairs, pairs);
        for (int64_t b = 0; b < B; ++b) {
          d.sequence(6 + r * B + b, s);
          for (int64_t i = 0; i < 4; ++i) {
            int64_t g = layout.token_indices(c)[i];
            EXPECT_EQ(lb.tokens[b * 4 + i], s.tokens[g]);
            EXPECT_EQ(lb.targets[b * 4 + i], s.targets[g]);
            EXPECT_EQ(lb.positions[b * 4 + i], s.positions[g]);
            EXPECT_EQ(lb.segments[b * 4 + i], s.segments[g]);
            EXPECT_EQ(lb.weights[b * 4 + i], s.weights[g]);
          }
        }
        Batch v = lb.view();
        EXPECT_EQ(v.segments, lb.segments.data());
      }
    }
  }
}

TEST(Data, ConfigSelectsTheCorpusAndMask) {
  RunConfig c = config_from_values({{"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(32)}});
  Corpus a = load_corpus(c), b = load_corpus(c);
  EXPECT_EQ(a.tokens, b.tokens);
  c = config_from_values({{"attention_type", std::string("local")}, {"sliding_window_size", int64_t(3)}});
  MaskSpec m = c.mask();
  EXPECT_TRUE(m.allows(10, 8));
  EXPECT_FALSE(m.allows(10, 7));
  EXPECT_FALSE(m.allows(10, 11));
}

// The header's vocab bounds the ids (an id the tokenizer cannot have made is
// corruption) and must itself fit the model; a directory is named as one.
TEST(Data, TokenFileIdsAreCheckedAgainstItsOwnVocab) {
  TempDir t;
  Corpus c;
  c.tokens = {1, 2, 150, 257};
  c.doc_offsets = {0, 4};
  const std::string small = (t.path / "small.bin").string();
  write_token_file(small, c, /*vocab_size=*/100, /*eos_id=*/2);  // id 150 >= the file's vocab 100
  std::string e = data_error([&] { load_token_file(small, 259); });
  EXPECT_NE(e.find("small.bin': id 150 at index 2 is >= vocab_size 100 of the file's header"), std::string::npos) << e;
  const std::string big = (t.path / "big.bin").string();
  write_token_file(big, c, 300);
  e = data_error([&] { load_token_file(big, 259); });
  EXPECT_NE(e.find("big.bin': made for vocab size 300, larger than the model's vocab_size 259"), std::string::npos)
      << e;
  // A vocab above 2^31 turned ids negative in int32.
  const std::string huge = (t.path / "huge.bin").string();
  write_token_file(huge, c, int64_t(3) << 30);
  e = data_error([&] { load_token_file(huge, int64_t(1) << 34); });
  EXPECT_NE(e.find("huge.bin': header vocab size 3221225472 exceeds 2^31"), std::string::npos) << e;
  fs::create_directories(t.path / "adir");
  e = data_error([&] { load_token_file((t.path / "adir").string(), 259); });
  EXPECT_NE(e.find("adir' is a directory"), std::string::npos) << e;
  e = data_error([&] { load_token_file((t.path / "none.bin").string(), 259); });
  EXPECT_NE(e.find("none.bin' does not exist"), std::string::npos) << e;
}

// 2 * max_target_length wrapped (signed overflow); S = 0 packed forever.
TEST(Data, SizesAreOverflowChecked) {
  EXPECT_THROW(synthetic_corpus(1, int64_t(1) << 62, 1), ConfigError);
  EXPECT_THROW(Dataset(synthetic_corpus(1, 8, 2), INT64_MAX, false), ConfigError);
  EXPECT_THROW(Dataset(synthetic_corpus(1, 8, 2), 0, true), ShapeError);
}
