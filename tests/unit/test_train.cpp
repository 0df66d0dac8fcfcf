// The trainer on one process (Mesh::single(), no MPI): schedule, AdamW weight decay,
// determinism, loss falling, and 10 steps == 5 + checkpoint + resume + 5,
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include <omp.h>

#include "comm/communicator.h"
#include "core/memory.h"
#include "kernels/gemm.h"
#include "train/trainer.h"
#include "temp_dir.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;

namespace {

RunConfig tiny(const fs::path& out, std::map<std::string, ConfigValue> extra = {}) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(32)},        {"base_num_query_heads", int64_t(2)},
      {"base_num_kv_heads", int64_t(1)},    {"head_dim", int64_t(16)},
      {"base_mlp_dim", int64_t(64)},        {"base_num_decoder_layers", int64_t(2)},
      {"dataset_type", std::string("synthetic")},
      {"max_target_length", int64_t(32)},   {"per_device_batch_size", int64_t(2)},
      {"steps", int64_t(10)},               {"learning_rate", 3e-3},
      {"peak_tflops_per_device", 1.0},      {"base_output_directory", out.string()},
      {"num_threads", int64_t(1)}};
  for (auto& [k, x] : extra) v[k] = x;
  RunConfig c = config_from_values(v);
  validate_config(c, 1);
  return c;
}

std::vector<float> params(LlamaModel& m) {
  auto s = m.flat_parameters();
  return {s.begin(), s.end()};
}

}  // namespace

TEST(Train, ScheduleWarmsUpThenFollowsTheCosine) {
  RunConfig c = config_from_values({{"steps", int64_t(100)}, {"learning_rate", 1.0},
                                    {"warmup_steps_fraction", 0.1}, {"cosine_learning_rate_final_fraction", 0.1}});
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 10), 1.0);
  EXPECT_NEAR(learning_rate_at(c, 55), 0.1 + 0.9 * 0.5, 1e-12);  // half way through the decay
  EXPECT_NEAR(learning_rate_at(c, 100), 0.1, 1e-12);
  for (int64_t s = 10; s < 100; ++s) EXPECT_LE(learning_rate_at(c, s + 1), learning_rate_at(c, s));
}

TEST(Train, AdamWDecaysMatricesOnly) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"adam_weight_decay", 0.5}});
  LlamaModel m(c.model, ModelOptions{}, 0);
  AdamW opt(m, c, one_rank());
  std::vector<std::vector<float>> before;
  for (const auto& p : m.parameters()) before.emplace_back(p.local.f32(), p.local.f32() + p.local.numel());
  m.zero_gradients();
  opt.update(m, 0.1);  // zero gradients: only the decay moves weights
  for (size_t i = 0; i < m.parameters().size(); ++i) {
    const auto& p = m.parameters()[i];
    const double factor = p.local.rank == 2 ? 1.0 - 0.1 * 0.5 : 1.0;
    for (int64_t j = 0; j < p.local.numel(); j += 7)
      EXPECT_NEAR(p.local.f32()[j], before[i][j] * factor, 1e-7) << p.name;
  }
}

TEST(Train, FlatPiecesAreContiguousNearEqualAndCoverEveryElement) {
  for (size_t n : {size_t(8), size_t(41312), size_t(42603), size_t(7)})
    for (int R : {1, 2, 3, 4, 7, 8}) {
      if (n < size_t(R)) continue;
      size_t next = 0;
      for (int r = 0; r < R; ++r) {
        const FlatPiece p = flat_piece(n, R, r);
        EXPECT_EQ(p.begin, next) << n << " / " << R << " piece " << r;
        EXPECT_EQ(p.block, n / R);
        EXPECT_EQ(p.size, n / R + (r == R - 1 ? n % R : 0));
        next = p.begin + p.size;
      }
      EXPECT_EQ(next, n) << n << " / " << R;
    }
}

TEST(Train, OnOneRankTheOptimizerIsNeverSharded) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"shard_optimizer_over_data", true}});
  LlamaModel m(c.model, ModelOptions{}, 0);
  const size_t before = MemoryTracker::global().current(MemCategory::optimizer);
  AdamW opt(m, c, one_rank());
  EXPECT_FALSE(opt.sharded());
  EXPECT_EQ(opt.piece().begin, 0u);
  EXPECT_EQ(opt.piece().size, m.flat_parameters().size());
  EXPECT_EQ(MemoryTracker::global().current(MemCategory::optimizer) - before, 8 * m.flat_parameters().size());
}

TEST(Train, SameConfigSameLossesAndTheLossFalls) {
  TempDir t;
  // A corpus with a pattern worth learning.
  fs::create_directories(t.path / "text");
  for (int d = 0; d < 4; ++d) {
    std::ofstream f(t.path / "text" / ("doc" + std::to_string(d) + ".txt"));
    for (int i = 0; i < 40; ++i) f << "the quick brown fox " << d << " jumps. ";
  }
  RunConfig c = tiny(t.path, {{"dataset_type", std::string("text")}, {"dataset_path", (t.path / "text").string()},
                              {"steps", int64_t(30)}, {"learning_rate", 1e-2}});
  Trainer a(c, one_rank()), b(c, one_rank());
  std::vector<double> la, lb;
  for (int i = 0; i < 30; ++i) {
    la.push_back(a.train_step().loss);
    lb.push_back(b.train_step().loss);
  }
  EXPECT_EQ(la, lb);  // bit-identical
  EXPECT_NEAR(la[0], std::log(259.0), 0.3);
  EXPECT_LT(la.back(), 0.6 * la.front()) << "first " << la.front() << " last " << la.back();
}

TEST(Train, TwoRunsAliveInOneThreadEndInEitherOrder) {
  // Each run allocates from, and steps on, its own device with its own
  // switches (SystemSettings): the first one ending while the second goes on
  // must neither free what the second holds, nor end the second's device,
  // nor leave it the thread count from before the first.
  TempDir t;
  const RunConfig c = tiny(t.path, {{"steps", int64_t(4)}});
  std::vector<double> alone;
  {
    Trainer solo(c, one_rank());
    for (int i = 0; i < 4; ++i) alone.push_back(solo.train_step().loss);
  }
  auto first = std::make_unique<Trainer>(c, one_rank());
  auto second = std::make_unique<Trainer>(c, one_rank());
  std::vector<double> interleaved;
  for (int i = 0; i < 2; ++i) {
    first->train_step();
    interleaved.push_back(second->train_step().loss);
  }
  first.reset();  // the one made first ends first
  for (int i = 0; i < 2; ++i) interleaved.push_back(second->train_step().loss);
  EXPECT_EQ(interleaved, alone);
}

TEST(Train, TenStepsEqualFivePlusResumePlusFive) {
  // At 1 and at 2 threads (each run against itself: see README, Determinism),
  // and in bf16 (the checkpoint holds the fp32 masters; the bf16 copy is
  // rounded from them at each step, so nothing else needs saving).
  for (const auto& [threads, dtype] : {std::pair<int64_t, const char*>{1, "float32"}, {2, "float32"}, {1, "bfloat16"}}) {
    SCOPED_TRACE("num_threads=" + std::to_string(threads) + " dtype=" + dtype);
    TempDir t;
    RunConfig c = tiny(t.path, {{"num_threads", threads}, {"dtype", std::string(dtype)}});
    std::vector<double> straight;
    std::vector<float> final_straight;
    {
      Trainer tr(c, one_rank());
      for (int i = 0; i < 10; ++i) straight.push_back(tr.train_step().loss);
      final_straight = params(tr.model());
    }
    RunConfig r = tiny(t.path, {{"checkpoint_dir", (t.path / "ckpt").string()}, {"num_threads", threads},
                                {"dtype", std::string(dtype)}});
    {
      Trainer first(r, one_rank());
      for (int i = 0; i < 5; ++i) EXPECT_EQ(first.train_step().loss, straight[i]);
      first.save();
    }
    Trainer second(r, one_rank());
    EXPECT_NE(second.resume(), "");
    EXPECT_EQ(second.step(), 5);
    EXPECT_EQ(second.data_cursor(), 10);
    for (int i = 5; i < 10; ++i) EXPECT_EQ(second.train_step().loss, straight[i]) << "step " << i;
    EXPECT_EQ(params(second.model()), final_straight);
  }
}

// Bit-identical losses and weights run to run at 1 and at 2 threads, on a
// sequence of 5 attention tiles (not a multiple of the tile), so that
// the kernel's dQ order, the norms' and the loss's sums are all exercised.
// And with deterministic_across_thread_counts at 1, 2 and 3 threads alike:
// every reduction, the GEMM's included (src/kernels/gemm.cpp), then has an
// order that does not depend on the threads.
TEST(Train, RepeatedRunsAreBitIdenticalAtAnyThreadCount) {
  std::vector<double> first_losses;
  std::vector<float> first_weights;
  for (int64_t threads : {1, 2, 3}) {
    SCOPED_TRACE("num_threads=" + std::to_string(threads));
    TempDir t;
    RunConfig c = tiny(t.path, {{"num_threads", threads}, {"max_target_length", int64_t(600)},
                                {"deterministic_across_thread_counts", true},
                                {"per_device_batch_size", int64_t(1)}, {"steps", int64_t(4)}});
    // Three runs: a timing-dependent order (the kernel's dQ once was) shows
    // up in most pairs of runs, not in every one.
    std::vector<std::vector<double>> losses(3);
    std::vector<std::vector<float>> weights(3);
    for (int run = 0; run < 3; ++run) {
      Trainer tr(c, one_rank());
      for (int i = 0; i < 4; ++i) losses[run].push_back(tr.train_step().loss);
      weights[run] = params(tr.model());
    }
    for (int run = 1; run < 3; ++run) {
      EXPECT_EQ(losses[run], losses[0]) << "run " << run;
      EXPECT_TRUE(weights[run] == weights[0]) << "run " << run;
    }
    if (first_losses.empty()) first_losses = losses[0], first_weights = weights[0];
    EXPECT_EQ(losses[0], first_losses) << "against 1 thread";
    EXPECT_TRUE(weights[0] == first_weights) << "against 1 thread";
  }
}

TEST(Train, RunWritesStepLinesMetricsAndAFinalCheckpoint) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"steps", int64_t(4)}, {"checkpoint_period", int64_t(2)}});
  fs::path log = t.path / "log.txt";
  {
    std::FILE* f = std::fopen(log.c_str(), "w");
    Trainer(c, one_rank()).run(f);
    std::fclose(f);
  }
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("step 4 |"), std::string::npos) << text;
  EXPECT_NE(text.find("MFU"), std::string::npos);
  EXPECT_NE(text.find("parameters"), std::string::npos);  // the memory report
  std::ifstream metrics(c.metrics_file);
  int lines = 0;
  for (std::string l; std::getline(metrics, l);) lines += l.find("\"tflops_per_device\"") != std::string::npos;
  EXPECT_EQ(lines, 4);
  EXPECT_TRUE(fs::exists(fs::path(c.checkpoint_dir) / "step_00000002" / "MANIFEST.json"));
  EXPECT_TRUE(fs::exists(fs::path(c.checkpoint_dir) / "step_00000004" / "MANIFEST.json"));
  // A second run resumes at the end and trains nothing more.
  Trainer again(c, one_rank());
  again.run(nullptr);
  EXPECT_EQ(again.step(), 4);
}

TEST(Train, KeepsOnlyTheNewestCheckpoints) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"steps", int64_t(5)},
                              {"checkpoint_period", int64_t(1)},
                              {"max_num_checkpoints_to_keep", int64_t(2)}});
  Trainer(c, one_rank()).run(nullptr);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(c.checkpoint_dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  // Two that steps have run from (3, 4), and the newest (5), which no step
  // has run from yet: a run that diverged finitely in its last update must
  // not have pushed the good ones out.
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000003", "step_00000004", "step_00000005"}));
  // A run resumes from the newest that is left.
  Trainer more(c, one_rank());
  EXPECT_NE(more.resume().find("step_00000005"), std::string::npos);
  EXPECT_EQ(more.step(), 5);
}

TEST(Train, DeviceMemoryBudgetIsEnforced) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"device_memory_budget", int64_t(64 * 1024)}});
  EXPECT_THROW(Trainer(c, one_rank()), OutOfMemoryError);
  EXPECT_EQ(MemoryTracker::global().budget(), 0u) << "a trainer that failed to build left its budget behind";
}

// A run's process-wide switches hold while a SystemSettings lives, with the
// run's device current, and the values from before it come back after, so
// that runs one after another in a process inherit nothing. A Trainer holds
// one for each of its calls only: between them the caller's values stand
// (the test above shows each call steps with its own).
TEST(Train, SystemSettingsHoldWhileTheyLiveAndTheTrainersOnlyDuringItsCalls) {
  TempDir t;
  RunConfig c = tiny(t.path, {{"num_threads", int64_t(1)},
                              {"device_memory_budget", int64_t(1) << 40},
                              {"host_memory_budget", int64_t(1) << 39},
                              {"collective_timeout_seconds", int64_t(123)},
                              {"deterministic_across_thread_counts", true}});
  const int threads_outside = omp_get_max_threads();
  omp_set_num_threads(2);
  const double timeout_before = collective_timeout_seconds();
  const bool gemm_before = current_kernels().gemm_thread_count_independent;
  const Device* device_before = &Device::current();
  const size_t budget_before = MemoryTracker::global().budget(), host_before = MemoryTracker::global().host_budget();
  const auto expect_callers = [&] {
    EXPECT_EQ(omp_get_max_threads(), 2);
    EXPECT_EQ(current_kernels().gemm_thread_count_independent, gemm_before);
    EXPECT_EQ(&Device::current(), device_before);
    EXPECT_EQ(MemoryTracker::global().budget(), budget_before);
    EXPECT_EQ(MemoryTracker::global().host_budget(), host_before);
    EXPECT_EQ(collective_timeout_seconds(), timeout_before);
  };
  {
    const std::unique_ptr<Device> run_device = make_run_device(c);
    const SystemSettings settings(c, *run_device);
    EXPECT_EQ(omp_get_max_threads(), 1);
    EXPECT_EQ(&Device::current(), run_device.get());
    EXPECT_TRUE(current_kernels().gemm_thread_count_independent);
    EXPECT_EQ(MemoryTracker::global().budget(), size_t(1) << 40);
    EXPECT_EQ(MemoryTracker::global().host_budget(), size_t(1) << 39);
    EXPECT_EQ(collective_timeout_seconds(), 123.0);
  }
  expect_callers();
  {
    Trainer trainer(c, one_rank());
    expect_callers();
    trainer.train_step();
    expect_callers();
  }
  expect_callers();
  omp_set_num_threads(threads_outside);
}
