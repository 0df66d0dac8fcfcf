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
  const std::vector<int32_t> t = c.tokens();
  for (int64_t d = 0; d < c.num_documents(); ++d)
    for (int64_t i = c.doc_offsets()[d]; i + 1 < c.doc_offsets()[d + 1]; ++i) s.emplace(t[i], t[i + 1]);
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
  EXPECT_EQ(c.tokens(), (std::vector<int32_t>{kBosId, 'a', kEosId, kBosId, 'b', 'b', kEosId}));
  EXPECT_EQ(c.doc_offsets(), (std::vector<int64_t>{0, 3, 7}));
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
  EXPECT_EQ(back.tokens(), c.tokens());
  EXPECT_EQ(back.doc_offsets(), c.doc_offsets());
  EXPECT_EQ(back.pad_id(), kEosId);

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
  EXPECT_EQ(d.num_sequences(), (c.size() - 1) / 10);
  Sequence s;
  d.sequence(2, s);
  EXPECT_TRUE(s.segments.empty());
  const std::vector<int32_t> t = c.tokens();
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(s.tokens[i], t[20 + i]);
    EXPECT_EQ(s.targets[i], t[21 + i]);
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
  EXPECT_EQ(a.tokens(), b.tokens());
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
  Corpus c({1, 2, 150, 257}, {0, 4});
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
  EXPECT_NE(e.find("adir' is a directory (dataset_type=binary reads token files; name them, e.g. '"),
            std::string::npos) << e;
  e = data_error([&] { load_token_file((t.path / "none.bin").string(), 259); });
  EXPECT_NE(e.find("none.bin' does not exist"), std::string::npos) << e;
}

// 2 * max_target_length wrapped (signed overflow); S = 0 packed forever.
TEST(Data, SizesAreOverflowChecked) {
  EXPECT_THROW(synthetic_corpus(1, int64_t(1) << 62, 1), ConfigError);
  EXPECT_THROW(Dataset(synthetic_corpus(1, 8, 2), INT64_MAX, false), ConfigError);
  EXPECT_THROW(Dataset(synthetic_corpus(1, 8, 2), 0, true), ShapeError);
}

namespace {

// The documents of `c` split over several corpora: [0, cut1), [cut1, cut2), ...
std::vector<Corpus> split_documents(const Corpus& c, const std::vector<int64_t>& doc_cuts) {
  const std::vector<int32_t> t = c.tokens();
  std::vector<Corpus> parts;
  int64_t first_doc = 0;
  for (size_t k = 0; k <= doc_cuts.size(); ++k) {
    const int64_t last_doc = k < doc_cuts.size() ? doc_cuts[k] : c.num_documents();
    const int64_t begin = c.doc_offsets()[first_doc], end = c.doc_offsets()[last_doc];
    std::vector<int64_t> offsets;
    for (int64_t d = first_doc; d <= last_doc; ++d) offsets.push_back(c.doc_offsets()[d] - begin);
    parts.emplace_back(std::vector<int32_t>(t.begin() + begin, t.begin() + end), offsets);
    first_doc = last_doc;
  }
  return parts;
}

}  // namespace

// Entries in the order given; a glob's matches sorted byte-wise; a pattern
// matching nothing and an empty entry are errors naming them.
TEST(Data, DatasetPathIsAListOfPathsAndGlobs) {
  TempDir t;
  for (const char* name : {"s/b10.bin", "s/b2.bin", "s/a.bin", "s/.hidden.bin", "s/c.txt"}) t.write(name, "x");
  const std::string s = (t.path / "s").string();
  EXPECT_EQ(expand_dataset_path(s + "/*.bin"),
            (std::vector<std::string>{s + "/a.bin", s + "/b10.bin", s + "/b2.bin"}));
  EXPECT_EQ(expand_dataset_path(s + "/c.txt," + s + "/b?.bin,missing.bin"),
            (std::vector<std::string>{s + "/c.txt", s + "/b2.bin", "missing.bin"}));  // existence: the loaders'
  std::string e = data_error([&] { expand_dataset_path(s + "/a.bin," + s + "/*.none"); });
  EXPECT_NE(e.find("dataset_path pattern '" + s + "/*.none' matches no file"), std::string::npos) << e;
  e = data_error([&] { expand_dataset_path(s + "/a.bin,,b"); });
  EXPECT_NE(e.find("has an empty entry"), std::string::npos) << e;

  // Text: files and directories from a list and a glob, in that order.
  t.write("t/1/b.txt", "bb");
  t.write("t/1/a.txt", "a");
  t.write("t/z.txt", "z");
  Corpus c = load_text_corpus((t.path / "t/z.txt").string() + "," + (t.path / "t/[1]").string(), "");
  EXPECT_EQ(c.tokens(), (std::vector<int32_t>{kBosId, 'z', kEosId, kBosId, 'a', kEosId, kBosId, 'b', 'b', kEosId}));
  e = data_error([&] { load_text_corpus((t.path / "t/z.txt").string() + ",nowhere.txt", ""); });
  EXPECT_NE(e.find("dataset_path 'nowhere.txt' does not exist"), std::string::npos) << e;

  // A YAML list is the same as the comma-separated form.
  const fs::path yml = t.write("list.yml", "dataset_path:\n  - " + s + "/c.txt\n  - " + s + "/b?.bin\n");
  EXPECT_EQ(load_config(yml.string()).dataset_path, s + "/c.txt," + s + "/b?.bin");
  const fs::path bad = t.write("bad.yml", "dataset_path:\n  - a,b\n");
  EXPECT_THROW(load_config(bad.string()), ConfigError);
}

// Several token files give exactly the batches of their concatenation in one
// file, packed or not, at every dp and cp rank.
TEST(Data, SeveralTokenFilesGiveTheBatchesOfOneConcatenatedFile) {
  TempDir t;
  const Corpus whole = synthetic_corpus(21, 24, 17);
  write_token_file((t.path / "whole.bin").string(), whole, 259);
  std::vector<Corpus> parts = split_documents(whole, {3, 4, 11});  // files of 3, 1, 7 and 6 documents
  for (size_t k = 0; k < parts.size(); ++k)
    write_token_file((t.path / ("part" + std::to_string(k) + ".bin")).string(), parts[k], 259);
  RunConfig cfg = config_from_values({{"dataset_type", std::string("binary")},
                                      {"dataset_path", (t.path / "part*.bin").string()}});
  const Corpus one = load_token_file((t.path / "whole.bin").string(), 259), many = load_corpus(cfg);
  ASSERT_EQ(many.tokens(), one.tokens());
  ASSERT_EQ(many.doc_offsets(), one.doc_offsets());
  for (bool packing : {true, false}) {
    for (int64_t S : {int64_t(13), int64_t(24)}) {
      const Dataset a(one, S, packing), b(many, S, packing);
      ASSERT_EQ(a.num_sequences(), b.num_sequences());
      const CpLayout layout(LayoutKind::zigzag, S - S % 4, 2);
      for (int64_t k = 0; k < 2 * a.num_sequences(); ++k) {  // two epochs
        Sequence x, y;
        a.sequence(k, x);
        b.sequence(k, y);
        ASSERT_EQ(x.tokens, y.tokens) << "packing " << packing << " S " << S << " sequence " << k;
        ASSERT_EQ(x.targets, y.targets);
        ASSERT_EQ(x.positions, y.positions);
        ASSERT_EQ(x.segments, y.segments);
        ASSERT_EQ(x.weights, y.weights);
      }
      if (S % 4 != 0) continue;
      for (int64_t dp_rank : {0, 1})
        for (int cp_rank : {0, 1}) {
          const LocalBatch x = make_local_batch(a, 3, 2, 2, dp_rank, layout, cp_rank, MaskSpec::causal()),
                           y = make_local_batch(b, 3, 2, 2, dp_rank, layout, cp_rank, MaskSpec::causal());
          EXPECT_EQ(x.tokens, y.tokens);
          EXPECT_EQ(x.targets, y.targets);
          EXPECT_EQ(x.segments, y.segments);
          EXPECT_EQ(x.global_unmasked_pairs, y.global_unmasked_pairs);
        }
    }
  }
}

// One bad file among good ones is an error naming it; so is a file of another tokenizer.
TEST(Data, OneBadTokenFileAmongGoodOnesIsNamed) {
  TempDir t;
  const Corpus c = synthetic_corpus(4, 16, 3);
  const std::string good = (t.path / "a_good.bin").string(), other = (t.path / "c_other.bin").string();
  write_token_file(good, c, 259);
  write_token_file(other, c, 300, 5);
  t.write("b_bad.bin", "LCTXTOK1 not really");
  std::string e = data_error([&] { load_token_files(expand_dataset_path((t.path / "*.bin").string()), 512); });
  EXPECT_NE(e.find("b_bad.bin"), std::string::npos) << e;
  EXPECT_EQ(e.find("a_good.bin"), std::string::npos) << e;
  e = data_error([&] { load_token_files({good, other}, 512); });
  EXPECT_NE(e.find("token file '" + other + "' was made for vocab 300 with EOS 5, but '" + good +
                   "' for vocab 259 with EOS 257"), std::string::npos) << e;
  e = data_error([&] { load_token_files({good, (t.path / "gone.bin").string()}, 512); });
  EXPECT_NE(e.find("gone.bin' does not exist"), std::string::npos) << e;
}

// The map is read, not a copy: a file rewritten after loading is caught at
// the next read (an id past the vocab, or a new size), never trained on.
TEST(Data, ATokenFileChangedAfterOpeningIsAnError) {
  TempDir t;
  const Corpus c = synthetic_corpus(8, 16, 4);
  const fs::path p = t.path / "c.bin";
  write_token_file(p.string(), c, 259);
  const Dataset d(load_token_file(p.string(), 259), 16, true);
  Sequence s;
  d.sequence(0, s);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(32 + 4 * 5);
    const uint32_t past_vocab = 1000;
    f.write(reinterpret_cast<const char*>(&past_vocab), 4);
  }
  std::string e = data_error([&] { d.sequence(0, s); });
  EXPECT_NE(e.find("c.bin': changed since it was opened: an id now reads 1000, >= its vocab 259"), std::string::npos)
      << e;
  write_token_file((t.path / "d.bin").string(), c, 259);
  const Dataset d2(load_token_file((t.path / "d.bin").string(), 259), 16, true);
  std::ofstream(t.path / "d.bin", std::ios::binary | std::ios::app) << "more";
  e = data_error([&] { d2.sequence(0, s); });
  EXPECT_NE(e.find("d.bin': changed since it was opened (size "), std::string::npos) << e;
}
