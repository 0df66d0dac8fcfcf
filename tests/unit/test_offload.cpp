// Offload of saved activations (src/model/offload.h, src/core/offload_store.h):
// the store's tiers (host pool accounting, spill files checked, stale ones
// removed), and real training runs: a device budget that fails without
// offload passes with the saved tensors on the host or on disk, with losses
// bit-identical to an unbudgeted run, the activation peak the planner's, and
// a spill file corrupted between forward and backward named in the error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "core/memory.h"
#include "core/offload_store.h"
#include "core/state_store.h"
#include "plan/planner.h"
#include "train/trainer.h"
#include "error_text.h"
#include "temp_dir.h"
#include "train_run.h"

namespace fs = std::filesystem;
using namespace longctx;
using longctx::test::one_rank;

namespace {

std::vector<char> pattern(size_t n, unsigned seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return v;
}

size_t spill_files(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind("longctx-spill-", 0) == 0;
  return n;
}

}  // namespace

TEST(OffloadStore, DiskRoundTripsOddSizesAndRemovesItsFilesAndStaleOnes) {
  TempDir t;
  // A spill file of a process that no longer runs (pid above any pid_max).
  const fs::path stale = t.write("longctx-spill-2147483000-0-1.bin", "old");
  const fs::path other = t.write("notes.txt", "kept");
  const size_t bytes = (size_t{3} << 20) / 2 + 3;  // 1.5 MiB + 3: a partial CRC piece
  std::vector<char> a = pattern(bytes, 1), b = pattern(77, 2), back_a(bytes), back_b(77);
  {
    OffloadStore store(OffloadTarget::disk, t.path.string());
    EXPECT_FALSE(fs::exists(stale));
    EXPECT_TRUE(fs::exists(other));
    store.put(5, "a", a.data(), bytes);
    store.put(6, "b", b.data(), 77);
    store.get(6, back_b.data());
    store.wait(store.get(5, back_a.data()));
    EXPECT_EQ(back_a, a);
    EXPECT_EQ(back_b, b);
    EXPECT_EQ(spill_files(t.path), 2u);
  }
  EXPECT_EQ(spill_files(t.path), 0u);
}

TEST(OffloadStore, DiskReadChecksSizeAndCrc) {
  TempDir t;
  const size_t bytes = (size_t{5} << 20) / 2;
  std::vector<char> a = pattern(bytes, 3), back(bytes);
  for (int how = 0; how < 2; ++how) {
    OffloadStore store(OffloadTarget::disk, t.path.string());
    store.wait(store.put(1, "x of layer 1", a.data(), bytes));
    const std::string path = store.path_of(1);
    if (how == 0) {
      fs::resize_file(path, bytes - 1000);
    } else {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(bytes - 10));  // in the last (partial) piece
      f.put('\x5a' ^ a[bytes - 10]);
    }
    const std::string err = error_text<DataError>([&] { store.wait(store.get(1, back.data())); });
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find("x of layer 1"), std::string::npos) << err;
    EXPECT_NE(err.find(how == 0 ? "truncated or altered" : "CRC-32"), std::string::npos) << err;
  }
}

TEST(OffloadStore, HostBlocksCountInTheHostPoolNotTheDevice) {
  MemoryTracker& mt = MemoryTracker::global();
  const size_t device = mt.current_total(), host = mt.host_current();
  std::vector<char> a = pattern(4096, 4), back(4096);
  {
    OffloadStore store(OffloadTarget::host, "");
    store.put(0, "a", a.data(), a.size());
    store.wait(store.get(0, back.data()));
    EXPECT_EQ(back, a);
    EXPECT_EQ(mt.host_current(), host + 4096);
    EXPECT_EQ(mt.current_total(), device);
    mt.set_host_budget(host + 4096 + 100);
    const std::string err = error_text<OutOfMemoryError>([&] { store.put(1, "b", a.data(), 200); });
    EXPECT_NE(err.find("host_memory_budget"), std::string::npos) << err;
    mt.set_host_budget(0);
  }
  EXPECT_EQ(mt.host_current(), host);
}

namespace {

// 4 layers: of the layer inputs x[0..4] and each layer's qkv/context/mlpwi,
// the first two leave the device (the rest stay in their staging slots).
RunConfig run_config(const fs::path& out, const std::string& place, const std::string& target, int64_t budget,
                     const std::map<std::string, ConfigValue>& extra = {}) {
  std::map<std::string, ConfigValue> v = {
      {"base_emb_dim", int64_t(24)},         {"base_num_query_heads", int64_t(3)},
      {"base_num_kv_heads", int64_t(1)},     {"head_dim", int64_t(8)},
      {"base_mlp_dim", int64_t(40)},         {"base_num_decoder_layers", int64_t(4)},
      {"dataset_type", std::string("synthetic")},
      {"max_target_length", int64_t(37)},    {"per_device_batch_size", int64_t(2)},
      {"steps", int64_t(3)},                 {"learning_rate", 3e-3},
      {"peak_tflops_per_device", 1.0},       {"base_output_directory", out.string()},
      {"num_threads", int64_t(1)},           {"remat_policy", std::string("custom")},
      {"decoder_layer_input", place},        {"qkv_proj", place},
      {"context", place},                    {"mlpwi", place},
      {"offload_target", target},            {"device_memory_budget", budget}};
  for (const auto& [k, x] : extra) v[k] = x;
  RunConfig c = config_from_values(v);
  validate_config(c, 1);
  return c;
}

struct RunResult {
  std::vector<double> losses;
  size_t device_peak = 0, activations_peak = 0, optimizer_peak = 0, host_peak = 0;
};

RunResult train(const RunConfig& c) {
  MemoryTracker& mt = MemoryTracker::global();
  const size_t device = mt.current_total(), activations = mt.current(MemCategory::activations),
               optimizer = mt.current(MemCategory::optimizer), host = mt.host_current();
  mt.reset_peaks();
  RunResult r;
  {
    Trainer trainer(c, one_rank());
    for (int s = 0; s < 3; ++s) r.losses.push_back(trainer.train_step().loss);
  }
  r.device_peak = mt.peak_total() - device;
  r.activations_peak = mt.peak(MemCategory::activations) - activations;
  r.optimizer_peak = mt.peak(MemCategory::optimizer) - optimizer;
  r.host_peak = mt.host_peak() - host;
  mt.set_budget(0);
  return r;
}

StrategyPlan plan_of(const RunConfig& c) {
  HardwareProfile hw;
  hw.name = "test";
  hw.peak_flops_fp32 = hw.peak_flops_bf16 = 1e10;
  hw.memory_bytes = int64_t{1} << 34;
  hw.memory_bandwidth = hw.p2p_bandwidth = hw.collective_bandwidth = hw.all_to_all_bandwidth = 1e9;
  hw.devices_per_node = 64;
  return plan_strategy(c, hw, PlanOptions{});
}

// Device memory the planner predicts in `category`.
int64_t planned(const RunConfig& c, MemCategory category) {
  int64_t sum = 0;
  for (const MemoryLine& m : plan_of(c).memory)
    if (m.category == category) sum += m.bytes;
  return sum;
}

// What the planner puts in the host or disk tier: offloaded activations and state.
int64_t planned(const RunConfig& c, OffloadTarget tier) {
  const StrategyPlan plan = plan_of(c);
  int64_t sum = 0;
  if (plan.offload_target == tier)
    for (const OffloadLine& m : plan.offload_memory) sum += m.bytes;
  if (plan.state_offload_target == tier)
    for (const OffloadLine& m : plan.state_offload) sum += m.bytes;
  return sum;
}

}  // namespace

TEST(Offload, ABudgetThatFailsOnDevicePassesOffloadedWithIdenticalLosses) {
  TempDir t;
  const RunResult device = train(run_config(t.path, "device", "host", 0));
  const RunResult host = train(run_config(t.path, "offload", "host", 0));
  ASSERT_LT(host.device_peak, device.device_peak);
  EXPECT_EQ(host.losses, device.losses);
  EXPECT_GT(host.host_peak, 0u);
  EXPECT_EQ(device.host_peak, 0u);
  // The planner counts the same activation buffers, exactly.
  EXPECT_EQ(int64_t(device.activations_peak), planned(run_config(t.path, "device", "host", 0), MemCategory::activations));
  EXPECT_EQ(int64_t(host.activations_peak), planned(run_config(t.path, "offload", "host", 0), MemCategory::activations));
  EXPECT_EQ(int64_t(host.host_peak), planned(run_config(t.path, "offload", "host", 0), OffloadTarget::host));

  const int64_t budget = int64_t(host.device_peak + device.device_peak) / 2;
  EXPECT_THROW(train(run_config(t.path, "device", "host", budget)), OutOfMemoryError);
  MemoryTracker::global().set_budget(0);
  for (const char* target : {"host", "disk"}) {
    const RunConfig c = run_config(t.path, "offload", target, budget);
    const RunResult r = train(c);
    EXPECT_EQ(r.losses, device.losses) << target;
    EXPECT_LE(r.device_peak, size_t(budget)) << target;
    if (std::string(target) == "disk") {
      EXPECT_EQ(r.host_peak, 0u);
      EXPECT_GT(planned(c, OffloadTarget::disk), 0);
      EXPECT_EQ(spill_files(c.offload_dir), 0u);  // removed at exit
    }
  }
}

TEST(Offload, ASpillFileCorruptedBetweenForwardAndBackwardIsNamed) {
  TempDir t;
  for (int how = 0; how < 2; ++how) {
    const RunConfig c = run_config(t.path, "offload", "disk", 0);
    std::vector<std::string> corrupted;
    OffloadStore::set_after_write_hook([&](const std::string& path) {
      corrupted.push_back(path);
      if (how == 0) {
        fs::resize_file(path, fs::file_size(path) / 2);
      } else {
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(3);
        const char byte = static_cast<char>(f.get());
        f.seekp(3);
        f.put(static_cast<char>(byte ^ 1));
      }
    });
    const std::string err = error_text<DataError>([&] {
      Trainer trainer(c, one_rank());
      trainer.train_step();
    });
    OffloadStore::set_after_write_hook(nullptr);
    ASSERT_FALSE(corrupted.empty());
    bool named = false;
    for (const std::string& p : corrupted) named |= err.find(p) != std::string::npos;
    EXPECT_TRUE(named) << err;
    EXPECT_NE(err.find(how == 0 ? "truncated or altered" : "CRC-32"), std::string::npos) << err;
    EXPECT_EQ(spill_files(c.offload_dir), 0u);
  }
}

// The AdamW moments off the device (optimizer_memory_host_offload), in the
// host pool or on disk: a budget the plain run breaks is enough, the losses
// are bit-identical, and the device holds no moments, only (disk) the
// update's 2 staged chunks of each: the optimizer peak the planner predicts.
TEST(Offload, OptimizerStateOnHostOrDiskFitsABudgetThePlainRunBreaks) {
  TempDir t;
  const RunConfig plain = run_config(t.path, "device", "host", 0);
  const RunResult device = train(plain);
  EXPECT_EQ(int64_t(device.optimizer_peak), planned(plain, MemCategory::optimizer));
  auto offloaded = [&](const char* target, int64_t budget) {
    return run_config(t.path, "device", "host", budget,
                      {{"optimizer_memory_host_offload", true}, {"state_offload_target", std::string(target)}});
  };
  for (const char* target : {"host", "disk"}) {
    const RunResult free_run = train(offloaded(target, 0));
    EXPECT_EQ(free_run.losses, device.losses) << target;
    ASSERT_LT(free_run.device_peak, device.device_peak) << target;
    EXPECT_EQ(int64_t(free_run.optimizer_peak), planned(offloaded(target, 0), MemCategory::optimizer)) << target;
    EXPECT_EQ(int64_t(free_run.host_peak), planned(offloaded(target, 0), OffloadTarget::host)) << target;
    if (std::string(target) == "disk") {
      EXPECT_GT(free_run.optimizer_peak, 0u);  // the staged chunks
      EXPECT_LT(free_run.optimizer_peak, device.optimizer_peak);
      EXPECT_EQ(planned(offloaded(target, 0), OffloadTarget::disk), int64_t(device.optimizer_peak));  // the moments, on disk
    }
    const int64_t budget = int64_t(free_run.device_peak + device.device_peak) / 2;
    EXPECT_THROW(train(run_config(t.path, "device", "host", budget)), OutOfMemoryError) << target;
    MemoryTracker::global().set_budget(0);
    const RunConfig c = offloaded(target, budget);
    EXPECT_EQ(train(c).losses, device.losses) << target;
    if (std::string(target) == "disk") {
      EXPECT_EQ(spill_files(c.offload_dir), 0u);  // removed at exit
    }
  }
}

TEST(StateStore, ChunksCutAtUnitBlocksAndTheChunkLimit) {
  const int64_t K = kStateChunkElements;
  std::vector<ParameterUnit> units(3);
  units[0].block = 5, units[0].shard_begin = 0;
  units[1].block = 3, units[1].shard_begin = 5;
  units[2].block = 2 * K + 1, units[2].shard_begin = 8;
  auto as_pairs = [](const std::vector<StateChunk>& cs) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const StateChunk& c : cs) out.emplace_back(c.begin, c.size);
    return out;
  };
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(as_pairs(state_chunks(units, 0, 8 + 2 * K + 1)), (P{{0, 5}, {5, 3}, {8, K}, {8 + K, K}, {8 + 2 * K, 1}}));
  // A piece [4, 10) of the shard, relative to its start.
  EXPECT_EQ(as_pairs(state_chunks(units, 4, 6)), (P{{0, 1}, {1, 3}, {4, 2}}));
  EXPECT_EQ(largest_state_chunk(units, 0, 8 + 2 * K + 1), K);
  EXPECT_EQ(largest_state_chunk(units, 4, 6), 3);
}

// Every tier keeps what a pass writes (chunks not marked modified keep their
// old values), reads whole chunks anywhere, and counts its bytes where they
// live; on disk a pass stages exactly 2 x the largest chunk on the device.
TEST(StateStore, EveryTierKeepsWhatPassesWriteAndADiskPassStagesTwoChunks) {
  TempDir t;
  MemoryTracker& mt = MemoryTracker::global();
  const std::vector<StateChunk> chunks{{0, 3}, {3, 5}, {8, 1}, {9, 7}};
  for (StateTier tier : {StateTier::device, StateTier::host, StateTier::disk}) {
    const size_t params0 = mt.current(MemCategory::parameters), staging0 = mt.current(MemCategory::optimizer),
                 host0 = mt.host_current();
    StateStore s(tier, MemCategory::parameters, MemCategory::optimizer, "test state", chunks, t.path.string());
    EXPECT_EQ(mt.current(MemCategory::parameters) - params0, tier == StateTier::device ? 64u : 0u);
    EXPECT_EQ(mt.host_current() - host0, tier == StateTier::host ? 64u : 0u);
    std::vector<float> expected(16, 0.0f);
    EXPECT_EQ(s.read_all(), expected);
    for (int pass = 0; pass < 3; ++pass) {
      s.begin_pass();
      for (size_t k = 0; k < chunks.size(); ++k) {
        float* v = s.chunk(k);
        const bool modify = (k + pass) % 2 == 0;
        for (int64_t i = 0; i < chunks[k].size; ++i) {
          float& want = expected[size_t(chunks[k].begin + i)];
          EXPECT_EQ(v[i], want) << "tier " << int(tier) << " pass " << pass << " chunk " << k;
          if (modify) v[i] = want = float(pass * 100 + int(k) * 10 + i);
        }
        if (tier == StateTier::disk) {
          EXPECT_EQ(mt.current(MemCategory::optimizer) - staging0, 2u * 7 * 4);
        }
        s.done(k, modify);
      }
      s.end_pass();
      EXPECT_EQ(mt.current(MemCategory::optimizer), staging0);
    }
    EXPECT_EQ(s.read_all(), expected);
    const std::vector<float> middle{-1, -2, -3, -4, -5, -6};  // chunks 1 and 2
    s.write(3, middle);
    std::copy(middle.begin(), middle.end(), expected.begin() + 3);
    std::vector<float> back(6);
    s.wait(s.read(3, 6, back.data()));
    EXPECT_EQ(back, middle);
    EXPECT_EQ(s.read_all(), expected);
    EXPECT_THROW(s.read(4, 2, back.data()), ShapeError);  // not at a chunk's start
    EXPECT_THROW(s.read(3, 4, back.data()), ShapeError);  // not to a chunk's end
  }
  EXPECT_EQ(spill_files(t.path), 0u);
}

TEST(StateStore, ASpillFileAlteredBetweenPassesIsNamed) {
  TempDir t;
  const int64_t n = 300000;  // 1.2 MB: two CRC pieces
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float(i % 1000) * 0.5f;
  for (int how = 0; how < 2; ++how) {
    StateStore s(StateTier::disk, MemCategory::optimizer, MemCategory::optimizer, "adamw.exp_avg",
                 {{0, n}, {n, 1}}, t.path.string());
    s.write(0, std::span<const float>(values).first(n));
    const std::string path = s.path_of(0);
    if (how == 0) {
      fs::resize_file(path, fs::file_size(path) - 4);
    } else {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(4 * (n - 3));
      f.put('\x7f');
    }
    const std::string err = error_text<DataError>([&] {
      s.begin_pass();
      s.chunk(0);
    });
    EXPECT_NE(err.find(path), std::string::npos) << err;
    EXPECT_NE(err.find("adamw.exp_avg"), std::string::npos) << err;
    EXPECT_NE(err.find(how == 0 ? "truncated or altered" : "CRC-32"), std::string::npos) << err;
  }
}
