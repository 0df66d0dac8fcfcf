#include "plan/step_count.h"

#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <variant>

#include "comm/mesh.h"
#include "core/device.h"
#include "model/llama.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace longctx {

namespace {

StepCount run_step(const RunConfig& c, const MeshShape& shape, int64_t threads, KernelTarget target, int rank) {
  const std::unique_ptr<Device> meta = Device::make_meta(static_cast<int>(threads), counting_kernel_set(target));
  const DeviceScope on_meta(*meta);
  const Mesh mesh = Mesh::counting(shape, rank);

  // The batch's arrays, never read. The trainer's come from the data
  // loader, untracked: allocated first, and taken off the peaks below.
  const int64_t B = c.per_device_batch_size, L = c.max_target_length / c.cp, N = B * L;
  const char* const kBatch = "the batch's arrays (the data loader's)";
  const Buffer tokens(MemCategory::activations, kBatch, N * 4), targets(MemCategory::activations, kBatch, N * 4);
  const Buffer positions(MemCategory::activations, kBatch, N * 8);
  const Buffer segments(MemCategory::activations, kBatch, c.packing ? N * 4 : 0);
  const int64_t batch_bytes = int64_t(meta->tracker().current_total());
  LlamaModel model(c.model, model_options_from_config(c, mesh));
  AdamW optimizer(model, c, mesh);

  Batch batch;
  batch.batch = B;
  batch.seq_local = L;
  batch.tokens = tokens.as<int32_t>();
  batch.targets = targets.as<int32_t>();
  batch.positions = positions.as<int64_t>();
  if (c.packing) batch.segments = segments.as<int32_t>();

  // What Trainer::train_step runs.
  model.zero_gradients();
  const LossStats local = model.forward_backward(batch, 1.0f);
  double loss_sums[2] = {local.loss_sum, local.weight_sum};
  optimizer.reduce_gradients(model, loss_sums);
  optimizer.step(model, learning_rate_at(c, 0), optimizer.gradient_norm(model));

  StepCount out;
  for (MeshAxis a : kMeshAxes) out.axes[static_cast<size_t>(a)] = mesh.axis(a).counters();
  out.kernels = meta->counted();
  const MemoryTracker& tracked = meta->tracker();
  for (int i = 0; i < kNumMemCategories; ++i) {
    out.peaks[i] = int64_t(tracked.peak(static_cast<MemCategory>(i)));
    out.at_peak[i] = tracked.contents_at_peak(static_cast<MemCategory>(i));
  }
  const int activations = static_cast<int>(MemCategory::activations);
  out.peaks[activations] -= batch_bytes;
  std::erase_if(out.at_peak[activations], [&](const LiveBuffers& b) { return b.name == kBatch; });
  out.peak_total = int64_t(tracked.peak_total()) - batch_bytes;
  out.transient_peak = int64_t(tracked.transient_peak());
  out.transient_at_peak = tracked.transient_contents_at_peak();
  return out;
}

}  // namespace

StepCount count_step(const RunConfig& config, int64_t devices, int64_t threads, KernelTarget target, int rank) {
  RunConfig c = config;
  const MeshShape shape = c.mesh_shape(devices);
  c.dp = shape.dp;
  c.fsdp = shape.fsdp;
  // Each configuration once: the search asks again for the plans it compares.
  // The key is every config key's value (doubles by their bits), the
  // threads and the rank: built for every plan the search weighs, so plain.
  std::string key = std::to_string(threads) + " threads of " + counting_key(target) + " kernels, rank " +
                    std::to_string(rank);
  for (const ConfigKey& k : config_keys()) {
    key += '\n';
    key += k.name;
    key += '=';
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) key += x;
          else if constexpr (std::is_same_v<T, double>) key += std::to_string(std::bit_cast<uint64_t>(x));
          else key += std::to_string(x);
        },
        k.get(c));
  }
  static std::mutex mu;
  static std::map<std::string, StepCount> counted;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = counted.find(key);
    if (it != counted.end()) return it->second;
  }
  StepCount step = run_step(c, shape, threads, target, rank);
  std::lock_guard<std::mutex> lock(mu);
  return counted.emplace(key, std::move(step)).first->second;
}

}  // namespace longctx
