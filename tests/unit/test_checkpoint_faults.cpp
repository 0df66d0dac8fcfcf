// Checkpoints under faults (issue 12): a full disk, a kill at every point of
// save / re-save / prune, stale leftovers, a corrupt newest checkpoint, NaN
// training, untrusted train_state.json and step names, another model config.
// The invariant everywhere: at least one complete checkpoint survives, every
// complete one verifies, and resume finds a valid one.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm/mesh.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "error_text.h"
#include "temp_dir.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;
using json = nlohmann::json;

namespace {

RunConfig tiny_config(std::map<std::string, ConfigValue> extra = {}) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(32)}, {"base_num_query_heads", int64_t(2)}, {"base_num_kv_heads", int64_t(1)},
      {"head_dim", int64_t(16)}, {"base_mlp_dim", int64_t(48)}, {"base_num_decoder_layers", int64_t(1)},
      {"dataset_type", std::string("synthetic")}, {"max_target_length", int64_t(16)}};
  for (auto& [k, x] : extra) v[k] = x;
  return config_from_values(v);
}

// Not a std::exception: the save code cleans up after errors, never after this
// (as after a real kill).
struct Kill {
  std::string point;
};

// Resets the test seams when a test ends, pass or fail.
struct Seams {
  ~Seams() {
    set_checkpoint_fault_hook(nullptr);
    set_checkpoint_io_fault(nullptr);
  }
};

struct Fixture {
  RunConfig c;
  LlamaModel m;
  AdamW opt;
  explicit Fixture(std::map<std::string, ConfigValue> extra = {})
      : c(tiny_config(std::move(extra))), m(c.model, ModelOptions{}, 1), opt(m, c, one_rank()) {}
  // A save, then pruning to `keep` below it (the Trainer prunes below the
  // newest checkpoint a step has run from; here the one just verified).
  std::string save(const fs::path& dir, int64_t step, int64_t keep) {
    c.max_num_checkpoints_to_keep = keep;
    const std::string path = save_checkpoint(dir.string(), m, opt, TrainState{step, step, 0}, c, one_rank());
    prune_checkpoints(dir.string(), keep, step);
    return path;
  }
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The invariant after any fault: every complete checkpoint verifies, and the
// latest one (with and without fallback) is complete, valid and loads.
void expect_only_valid_checkpoints(const fs::path& dir, const std::string& where) {
  SCOPED_TRACE(where);
  const std::string latest = latest_checkpoint(dir.string());
  ASSERT_NE(latest, "") << "no complete checkpoint survived";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!checkpoint_step_from_name(e.path().filename().string()) || !fs::exists(e.path() / "MANIFEST.json")) continue;
    EXPECT_NO_THROW(verify_checkpoint(e.path().string())) << e.path() << " looks complete but is not valid";
  }
  EXPECT_EQ(latest_valid_checkpoint(dir.string(), nullptr), latest);
  Fixture f;
  LlamaModel other(f.c.model, ModelOptions{}, 5);
  AdamW opt(other, f.c, one_rank());
  EXPECT_NO_THROW(load_checkpoint(latest, other, opt));
}

// Rewrites one file of a checkpoint and its manifest record, as if it had
// been written that way (so only the content rules can refuse it).
void rewrite(const fs::path& ckpt, const std::string& file, const std::string& text) {
  std::ofstream(ckpt / file, std::ios::binary | std::ios::trunc) << text;
  json manifest = json::parse(read(ckpt / "MANIFEST.json"));
  manifest["files"][file] = {{"bytes", text.size()}, {"crc32", crc32(text.data(), text.size())}};
  std::ofstream(ckpt / "MANIFEST.json", std::ios::binary | std::ios::trunc) << manifest.dump(2);
}

}  // namespace

// ---- 1. a full disk ------------------------------------------------------------------

TEST(CheckpointFaults, AFailedWriteFsyncOrCloseOfAnyFileFailsTheSaveAndPrunesNothing) {
  Seams seams;
  for (const std::string op : {"write", "fsync", "close"})
    for (const std::string file : {"config.json", "model.safetensors", "optimizer.safetensors", "run_config.yml",
                                   "train_state.json", "MANIFEST.json"}) {
      SCOPED_TRACE(op + " of " + file);
      TempDir t;
      Fixture f;
      const std::string good = f.save(t.path, 2, 1);
      set_checkpoint_io_fault([&](const char* o, const std::string& path) {
        return o == op && fs::path(path).filename() == file ? ENOSPC : 0;
      });
      const std::string e = data_error([&] { f.save(t.path, 4, 1); });
      set_checkpoint_io_fault(nullptr);
      EXPECT_NE(e.find(file), std::string::npos) << e;
      EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << e;
      EXPECT_NE(e.find(op), std::string::npos) << e;
      // The good one is kept (not pruned for a broken newer one), the failed
      // save's temporary is gone.
      EXPECT_EQ(entries(t.path), std::vector<std::string>{"step_00000002"});
      EXPECT_EQ(latest_valid_checkpoint(t.path.string(), nullptr), good);
    }
}

TEST(CheckpointFaults, TheNthWriteFailing) {
  Seams seams;
  // Every write call of a save in turn: whichever fails, nothing is lost.
  for (int n = 1; n <= 6; ++n) {
    SCOPED_TRACE("write #" + std::to_string(n));
    TempDir t;
    Fixture f;
    f.save(t.path, 2, 1);
    int writes = 0;
    set_checkpoint_io_fault([&](const char* op, const std::string&) {
      return std::strcmp(op, "write") == 0 && ++writes == n ? EIO : 0;
    });
    EXPECT_NE(data_error([&] { f.save(t.path, 4, 1); }).find(std::strerror(EIO)), std::string::npos);
    set_checkpoint_io_fault(nullptr);
    EXPECT_EQ(entries(t.path), std::vector<std::string>{"step_00000002"});
    expect_only_valid_checkpoints(t.path, "after write #" + std::to_string(n) + " failed");
  }
}

TEST(CheckpointFaults, ARealFullTmpfsFailsTheSaveAndKeepsTheGoodCheckpoint) {
  TempDir t;
  Fixture f;
  // File sizes of one checkpoint, from a save on the ordinary disk.
  const fs::path probe = f.save(t.path / "probe", 2, 1);
  auto pages = [](uintmax_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  uintmax_t one = 0;
  for (const auto& e : fs::directory_iterator(probe)) one += pages(fs::file_size(e.path()));
  // Room for one checkpoint and the first three files of the next
  // (config.json, model.safetensors, optimizer.safetensors: written in name
  // order): the small files after them (run_config.yml, train_state.json,
  // MANIFEST.json) hit a full disk, which a buffered stream reports only at close.
  const uintmax_t size = one + pages(fs::file_size(probe / "config.json")) +
                         pages(fs::file_size(probe / "model.safetensors")) +
                         pages(fs::file_size(probe / "optimizer.safetensors"));
  const fs::path mnt = t.path / "tmpfs";
  fs::create_directories(mnt);
  const std::string opts = "size=" + std::to_string(size);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "SKIPPED the real full-disk part: mounting a " << size << "-byte tmpfs failed ("
                 << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN). The injected-failure tests cover the logic.";
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  const std::string good = f.save(mnt, 2, 1);
  const std::string e = data_error([&] { f.save(mnt, 4, 1); });
  EXPECT_NE(e.find(std::strerror(ENOSPC)), std::string::npos) << e;
  EXPECT_NE(e.find("run_config.yml"), std::string::npos) << e;
  EXPECT_EQ(entries(mnt), std::vector<std::string>{"step_00000002"});  // failed save cleaned, nothing pruned
  EXPECT_EQ(latest_valid_checkpoint(mnt.string(), nullptr), good);
  expect_only_valid_checkpoints(mnt, "after a real full disk");
}

// ---- 2, 3. a kill at every point of save, re-save and prune -----------------------------

struct KillCase {
  const char* point;
  int64_t step;          // 6: a new step (prunes step 2); 4: re-save of an existing step
  bool no_exchange;      // the filesystem cannot RENAME_EXCHANGE: the rename-aside path
};

TEST(CheckpointFaults, AKillAtAnyPointLeavesOnlyValidCheckpoints) {
  Seams seams;
  const KillCase cases[] = {
      {"files-written", 6, false},  {"verified", 6, false},        {"renamed", 6, false},
      {"prune-renamed", 6, false},  {"prune-deleted", 6, false},   {"files-written", 4, false},
      {"verified", 4, false},       {"resave-exchanged", 4, false}, {"resave-aside", 4, true},
      {"resave-renamed", 4, true},
  };
  for (const KillCase& k : cases) {
    const std::string where = std::string("kill at ") + k.point + " saving step " + std::to_string(k.step) +
                              (k.no_exchange ? " (no RENAME_EXCHANGE)" : "");
    SCOPED_TRACE(where);
    TempDir t;
    Fixture f;
    f.save(t.path, 2, 2);
    f.save(t.path, 4, 2);
    std::fill_n(f.m.flat_parameters().begin(), 8, 0.5f);  // the new save differs from the old
    bool killed = false;
    set_checkpoint_io_fault([&](const char* op, const std::string&) {
      return k.no_exchange && std::strcmp(op, "exchange") == 0 ? EINVAL : 0;
    });
    set_checkpoint_fault_hook([&](const char* point) {
      if (std::strcmp(point, k.point) != 0) return;
      if (std::strcmp(point, "prune-renamed") == 0)  // the old remove_all's order: the model went first
        for (const auto& e : fs::directory_iterator(t.path))
          if (e.path().filename().string().ends_with(".trash")) fs::remove(e.path() / "model.safetensors");
      killed = true;
      throw Kill{point};
    });
    try {
      f.save(t.path, k.step, 2);
    } catch (const Kill&) {
    }
    set_checkpoint_fault_hook(nullptr);
    set_checkpoint_io_fault(nullptr);
    ASSERT_TRUE(killed) << "the save never reached " << k.point;
    expect_only_valid_checkpoints(t.path, where);
    if (k.step == 4 && std::strcmp(k.point, "resave-aside") != 0) {
      EXPECT_TRUE(fs::exists(t.path / "step_00000004" / "MANIFEST.json")) << "a re-save lost its step";
    }
    // The next save cleans what the kill left and prunes normally (keep 2).
    const std::string kept = fs::exists(t.path / "step_00000006")   ? "step_00000006"
                             : fs::exists(t.path / "step_00000004") ? "step_00000004"
                                                                    : "step_00000002";
    f.save(t.path, 8, 2);
    EXPECT_EQ(entries(t.path), (std::vector<std::string>{kept, "step_00000008"}));
    expect_only_valid_checkpoints(t.path, where + ", then a clean save");
  }
}

TEST(CheckpointFaults, ReSavingTheSameStepReplacesItAndLeavesNoLeftovers) {
  TempDir t;
  Fixture f;
  const std::string first = f.save(t.path, 4, 0);
  std::fill_n(f.m.flat_parameters().begin(), 8, 0.75f);
  EXPECT_EQ(f.save(t.path, 4, 0), first);
  EXPECT_EQ(entries(t.path), std::vector<std::string>{"step_00000004"});
  Fixture g;
  load_checkpoint(first, g.m, g.opt);
  EXPECT_EQ(g.m.flat_parameters()[3], 0.75f);  // the new content

  // Without RENAME_EXCHANGE, a failed rename of the new one puts the old one back.
  Seams seams;
  set_checkpoint_io_fault([](const char* op, const std::string& path) {
    if (std::strcmp(op, "exchange") == 0) return EINVAL;
    return std::strcmp(op, "rename") == 0 && fs::path(path).filename() == "step_00000004" ? EIO : 0;
  });
  std::fill_n(f.m.flat_parameters().begin(), 8, 0.25f);
  EXPECT_NE(data_error([&] { f.save(t.path, 4, 0); }).find(std::strerror(EIO)), std::string::npos);
  set_checkpoint_io_fault(nullptr);
  EXPECT_EQ(entries(t.path), std::vector<std::string>{"step_00000004"});
  load_checkpoint(first, g.m, g.opt);
  EXPECT_EQ(g.m.flat_parameters()[3], 0.75f);  // still the previous save
}

// ---- 4. stale temporaries --------------------------------------------------------------

TEST(CheckpointFaults, StaleTemporariesOfAKilledRunAreCleanedOnlyOurs) {
  TempDir t;
  Fixture f;
  t.write(".step_00000003.tmp/model.safetensors", std::string(1 << 16, 'x'));  // a killed save
  t.write(".step_00000001.trash/config.json", "{}");                            // a killed prune
  t.write(".mine/keep.txt", "not ours");
  t.write(".step_x.tmp/keep.txt", "not ours either");
  t.write("notes.txt", "user file");
  f.save(t.path, 5, 1);
  EXPECT_EQ(entries(t.path), (std::vector<std::string>{".mine", ".step_x.tmp", "notes.txt", "step_00000005"}));
}

// ---- 5. fallback to the newest valid checkpoint ---------------------------------------------

TEST(CheckpointFaults, ResumeFallsBackToTheNewestValidOneLoudly) {
  TempDir t;
  Fixture f;
  f.save(t.path, 2, 0);
  const std::string two = (t.path / "step_00000002").string();
  const std::string four = f.save(t.path, 4, 0);
  std::string bytes = read(four + "/model.safetensors");
  bytes[bytes.size() - 3] ^= 0x10;
  std::ofstream(four + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;

  std::FILE* warn = std::tmpfile();
  EXPECT_EQ(latest_valid_checkpoint(t.path.string(), warn), two);
  std::rewind(warn);
  char buf[2048] = {};
  EXPECT_GT(std::fread(buf, 1, sizeof buf - 1, warn), 0u);
  std::fclose(warn);
  EXPECT_NE(std::string(buf).find("skipping checkpoint " + four), std::string::npos) << buf;
  EXPECT_NE(std::string(buf).find("CRC-32"), std::string::npos) << buf;

  // The Trainer resumes from step 2, not refusing.
  RunConfig c = tiny_config({{"checkpoint_dir", t.path.string()}, {"peak_tflops_per_device", 1.0}});
  Trainer trainer(c, one_rank());
  EXPECT_EQ(trainer.resume(), two);
  EXPECT_EQ(trainer.step(), 2);

  // Step 3 (keep = 1) is verified, so step 2 may go; the corrupt step 4 is
  // newer but must never count as the one kept: step 3 stays.
  f.save(t.path, 3, 1);
  EXPECT_TRUE(fs::exists(t.path / "step_00000003")) << "the just-verified checkpoint was pruned";
  EXPECT_EQ(latest_valid_checkpoint(t.path.string(), nullptr), (t.path / "step_00000003").string());

  // Only corrupt ones: refused, not a silent start from scratch.
  TempDir t2;
  const std::string only = f.save(t2.path, 7, 0);
  std::ofstream(only + "/train_state.json", std::ios::app) << " ";
  EXPECT_NE(data_error([&] { latest_valid_checkpoint(t2.path.string(), nullptr); }).find("no valid checkpoint"),
            std::string::npos);
}

// ---- 6. NaN / Inf -----------------------------------------------------------------------------

TEST(CheckpointFaults, ValidateConfigRefusesNonFiniteAndNonPositiveNumbers) {
  RunConfig good = tiny_config();
  ASSERT_NO_THROW(validate_config(good, 1));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const char* key : {"learning_rate", "normalization_layer_epsilon", "rope_max_timescale", "adam_weight_decay",
                          "adam_eps", "gradient_clipping_threshold", "rope_scaling_factor", "rope_low_freq_factor",
                          "rope_high_freq_factor", "warmup_steps_fraction", "cosine_learning_rate_final_fraction",
                          "adam_b1", "adam_b2", "peak_tflops_per_device"})
    for (double bad : {inf, -inf, nan}) {
      RunConfig c = tiny_config({{key, bad}});
      try {
        validate_config(c, 1);
        ADD_FAILURE() << key << "=" << bad << " was accepted";
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("finite"), std::string::npos) << e.what();
      }
    }
  for (const char* key : {"normalization_layer_epsilon", "rope_max_timescale", "rope_scaling_factor"}) {
    RunConfig c = tiny_config({{key, 0.0}});
    EXPECT_THROW(validate_config(c, 1), ConfigError) << key << "=0 was accepted";
  }
}

TEST(CheckpointFaults, AnInfiniteLearningRateStopsBeforeAnyCheckpointAndPrunesNothing) {
  TempDir t;
  std::map<std::string, ConfigValue> run = {
      {"checkpoint_dir", t.path.string()}, {"metrics_file", (t.path / "metrics.jsonl").string()},
      {"checkpoint_period", int64_t(1)},   {"max_num_checkpoints_to_keep", int64_t(1)},
      {"peak_tflops_per_device", 1.0},     {"steps", int64_t(2)}};
  Trainer(tiny_config(run), one_rank()).run(nullptr);
  const std::string good = latest_valid_checkpoint(t.path.string(), nullptr);
  ASSERT_EQ(good, (t.path / "step_00000002").string());

  run["learning_rate"] = std::numeric_limits<double>::infinity();
  run["steps"] = int64_t(4);
  RunConfig bad = tiny_config(run);
  EXPECT_THROW(validate_config(bad, 1), ConfigError);
  // Driven anyway (as a diverging run would be): the step refuses, loudly.
  std::string e;
  try {
    Trainer(bad, one_rank()).run(nullptr);
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_NE(e.find("step 3"), std::string::npos) << e;
  EXPECT_NE(e.find("non-finite"), std::string::npos) << e;
  EXPECT_NE(e.find("learning rate"), std::string::npos) << e;
  EXPECT_NE(e.find("no checkpoint written"), std::string::npos) << e;
  // Step 1 stays too: no step has run from step 2 (the resumed one) yet.
  EXPECT_EQ(entries(t.path), (std::vector<std::string>{"metrics.jsonl", "step_00000001", "step_00000002"}));
  auto weights = read_safetensors(good + "/model.safetensors");
  for (const auto& [name, w] : weights)
    for (float x : w.data) ASSERT_TRUE(std::isfinite(x)) << name;
}

TEST(CheckpointFaults, ANanLossStopsTheStepAndANanModelIsNeverSaved) {
  TempDir t;
  RunConfig c = tiny_config({{"checkpoint_dir", t.path.string()}, {"peak_tflops_per_device", 1.0}});
  Trainer trainer(c, one_rank());
  for (float& w : trainer.model().flat_parameters()) w = std::numeric_limits<float>::quiet_NaN();
  try {
    trainer.train_step();
    ADD_FAILURE() << "a NaN loss trained on";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 1: non-finite loss"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer.step(), 0);
  const std::string e = data_error([&] { trainer.save(); });
  EXPECT_NE(e.find("NaN or Inf"), std::string::npos) << e;
  EXPECT_TRUE(entries(t.path).empty());
}

// ---- 13. untrusted train_state.json and step names ----------------------------------------

TEST(CheckpointFaults, TrainStateFieldsAreValidated) {
  struct Case {
    const char* field;
    std::string value;
  };
  const Case cases[] = {{"data_cursor", "-1"},        {"data_cursor", "9223372036854775807"},
                        {"step", "-100"},             {"step", "18446744073709551615"},
                        {"step", "4.5"},              {"optimizer_step", "5"},
                        {"init_weights_seed", "-3"},  {"data_cursor", "\"12\""},
                        {"step", "6"}};  // differs from MANIFEST.json and the directory name
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.field) + " = " + k.value);
    TempDir t;
    Fixture f;
    f.opt.set_step(4);
    const fs::path dir = f.save(t.path, 4, 0);
    json st = json::parse(read(dir / "train_state.json"));
    std::string text = st.dump();
    const std::string from = "\"" + std::string(k.field) + "\":" + st[k.field].dump();
    text.replace(text.find(from), from.size(), "\"" + std::string(k.field) + "\":" + k.value);
    rewrite(dir, "train_state.json", text);
    Fixture g;
    const std::vector<float> before(g.m.flat_parameters().begin(), g.m.flat_parameters().end());
    const std::string e = data_error([&] { load_checkpoint(dir.string(), g.m, g.opt); });
    EXPECT_NE(e.find("train_state.json"), std::string::npos) << e;
    EXPECT_NE(e.find(std::string("'") + k.field + "'"), std::string::npos) << e;
    EXPECT_EQ(std::vector<float>(g.m.flat_parameters().begin(), g.m.flat_parameters().end()), before);
  }
}

TEST(CheckpointFaults, StepDirectoryNamesAreParsedStrictly) {
  EXPECT_EQ(checkpoint_step_from_name("step_00000012"), 12);
  EXPECT_EQ(checkpoint_step_from_name("step_9223372036854775807"), INT64_MAX);
  for (const char* bad : {"step_99999999999999999999999", "step_9223372036854775808", "step_-5", "step_+5",
                          "step_12abc", "step_ 7", "step_", "step", "xstep_1", ".step_00000001.tmp"})
    EXPECT_EQ(checkpoint_step_from_name(bad), std::nullopt) << bad;

  TempDir t;
  Fixture f;
  const std::string real = f.save(t.path, 3, 0);
  for (const char* bad : {"step_99999999999999999999999", "step_-5", "step_12abc"}) {
    fs::copy(real, t.path / bad, fs::copy_options::recursive);  // complete-looking, but not a name we write
  }
  EXPECT_EQ(latest_checkpoint(t.path.string()), real);
  EXPECT_EQ(latest_valid_checkpoint(t.path.string(), nullptr), real);
  f.save(t.path, 4, 1);  // prunes step 3 only, never the odd names
  EXPECT_EQ(entries(t.path), (std::vector<std::string>{"step_-5", "step_00000004", "step_12abc",
                                                       "step_99999999999999999999999"}));
}

// ---- 9. the model config must match, not only the tensor shapes ----------------------------

TEST(CheckpointFaults, AnotherModelConfigWithTheSameShapesIsRefused) {
  struct Case {
    std::map<std::string, ConfigValue> saved, running;
    const char* key;
  };
  const Case cases[] = {
      // 4 heads x 16 and 2 heads x 32: every tensor has the same shape.
      {{{"base_num_query_heads", int64_t(4)}, {"base_num_kv_heads", int64_t(2)}, {"head_dim", int64_t(16)}},
       {{"base_num_query_heads", int64_t(2)}, {"base_num_kv_heads", int64_t(1)}, {"head_dim", int64_t(32)}},
       "num_attention_heads"},
      {{{"rope_max_timescale", 10000.0}}, {{"rope_max_timescale", 500000.0}}, "rope_theta"},
      {{{"normalization_layer_epsilon", 1e-6}}, {{"normalization_layer_epsilon", 1e-5}}, "rms_norm_eps"},
      {{{"rope_use_scaling", true}}, {{"rope_use_scaling", false}}, "rope_scaling"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key);
    TempDir t;
    Fixture a(k.saved), b(k.running);
    const std::string dir = a.save(t.path, 1, 0);
    const std::string e = data_error([&] { load_checkpoint(dir, b.m, b.opt); });
    EXPECT_NE(e.find(std::string("'") + k.key + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
    EXPECT_EQ(b.opt.step(), 0);
  }
  // The same config loads (max_target_length may change on resume).
  TempDir t;
  Fixture a, b({{"max_target_length", int64_t(32)}});
  EXPECT_NO_THROW(load_checkpoint(a.save(t.path, 1, 0), b.m, b.opt));
}
