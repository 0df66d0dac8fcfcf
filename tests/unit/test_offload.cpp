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
RunConfig run_config(const fs::path& out, const std::string& place, const std::string& target, int64_t budget) {
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
  RunConfig c = config_from_values(v);
  validate_config(c, 1);
  return c;
}

struct RunResult {
  std::vector<double> losses;
  size_t device_peak = 0, activations_peak = 0, host_peak = 0;
};

RunResult train(const RunConfig& c) {
  MemoryTracker& mt = MemoryTracker::global();
  const size_t device = mt.current_total(), activations = mt.current(MemCategory::activations),
               host = mt.host_current();
  mt.reset_peaks();
  RunResult r;
  {
    Trainer trainer(c, one_rank());
    for (int s = 0; s < 3; ++s) r.losses.push_back(trainer.train_step().loss);
  }
  r.device_peak = mt.peak_total() - device;
  r.activations_peak = mt.peak(MemCategory::activations) - activations;
  r.host_peak = mt.host_peak() - host;
  mt.set_budget(0);
  return r;
}

int64_t planned(const RunConfig& c, const std::string& category) {
  int64_t sum = 0;
  HardwareProfile hw;
  hw.name = "test";
  hw.peak_flops_fp32 = hw.peak_flops_bf16 = 1e10;
  hw.memory_bytes = int64_t{1} << 34;
  hw.memory_bandwidth = hw.p2p_bandwidth = hw.collective_bandwidth = hw.all_to_all_bandwidth = 1e9;
  hw.devices_per_node = 64;
  const StrategyPlan plan = plan_strategy(c, hw, PlanOptions{});
  for (const std::vector<MemoryLine>* lines : {&plan.memory, &plan.offload_memory})
    for (const MemoryLine& m : *lines)
      if (m.category == category) sum += m.bytes;
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
  EXPECT_EQ(int64_t(device.activations_peak), planned(run_config(t.path, "device", "host", 0), "activations"));
  EXPECT_EQ(int64_t(host.activations_peak), planned(run_config(t.path, "offload", "host", 0), "activations"));
  EXPECT_EQ(int64_t(host.host_peak), planned(run_config(t.path, "offload", "host", 0), "host"));

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
      EXPECT_GT(planned(c, "disk"), 0);
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
