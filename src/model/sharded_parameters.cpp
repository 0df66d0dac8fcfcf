#include "model/sharded_parameters.h"

#include <algorithm>
#include <cstring>

#include "core/device.h"
#include "core/error.h"
#include "kernels/ops.h"

namespace longctx {

namespace {

// One use of units in the model's schedule (sharded_parameters.h): the units
// whose weights (and gradients) it needs at once.
struct Use {
  std::vector<int> units;
  bool weights = true, grads = false;
};

std::vector<Use> schedule(int64_t layers, bool tied, bool training) {
  const int embed = 0, head = static_cast<int>(layers) + 1;
  auto layer = [](int64_t l) { return static_cast<int>(l) + 1; };
  std::vector<Use> uses;
  uses.push_back({{embed}});
  for (int64_t l = 0; l < layers; ++l) uses.push_back({{layer(l)}});
  Use loss{{head}, true, training};
  if (tied) loss.units.push_back(embed);
  uses.push_back(loss);
  if (!training) return uses;
  for (int64_t l = layers - 1; l >= 0; --l) uses.push_back({{layer(l)}, true, true});
  uses.push_back({{embed}, false, true});
  return uses;
}

// A unit's gathered fp32 copy, [R * block].
Buffer gathered_weights(const ParameterUnit& unit, int64_t R) {
  return Buffer(MemCategory::parameters, "FSDP gathered unit (fp32)", static_cast<size_t>(unit.block * R) * 4);
}

}  // namespace

int64_t compute_weight_copy_bytes(int64_t parameters, DType dtype) {
  return dtype == DType::bf16 ? parameters * static_cast<int64_t>(sizeof(bf16)) : 0;
}

std::array<int64_t, 2> gathered_peak_bytes(const LlamaConfig& c, int64_t tp, int64_t shards, DType compute,
                                           bool training) {
  if (shards <= 1) return {0, 0};
  // Layers are alike: two of them show every transition of the schedule.
  LlamaConfig small = c;
  small.num_layers = std::min<int64_t>(c.num_layers, 2);
  const std::vector<ParameterUnit> units = parameter_units(small, tp, shards);
  const int64_t copy16 = compute == DType::bf16 ? 2 : 0;  // bytes per element of the bf16 copy
  auto full = [&](int u) { return units[static_cast<size_t>(u)].block * shards; };
  const std::vector<Use> uses = schedule(small.num_layers, c.tie_embeddings, training);
  std::array<int64_t, 2> peak{0, 0};
  for (size_t i = 0; i < uses.size(); ++i) {
    int64_t params = 0, grads = 0;
    for (int u : uses[i].units) {
      if (uses[i].weights) params += full(u) * (4 + copy16);
      if (uses[i].grads) grads += full(u) * 4;
    }
    // The next use's fp32 weights, in flight (its first unit: the model
    // prefetches one unit; a second, the tied embedding, is gathered when used).
    if (i + 1 < uses.size() && uses[i + 1].weights) {
      const int next = uses[i + 1].units[0];
      if (std::find(uses[i].units.begin(), uses[i].units.end(), next) == uses[i].units.end())
        params += full(next) * 4;
    }
    peak[0] = std::max(peak[0], params);
    peak[1] = std::max(peak[1], grads);
  }
  return peak;
}

struct ShardedParameters::Resident {
  Buffer weights;  // fp32, [R * block]
  Buffer compute;  // bf16 copy, when the compute dtype is bf16
  Buffer grads;    // fp32, [R * block], between begin_gradients and reduce_gradients
  Request request; // the prefetch's all-gather
};

ShardedParameters::ShardedParameters(const LlamaConfig& c, int64_t tp, const Communicator& shards, DType compute,
                                     StateTier parameter_tier, const std::string& dir)
    : comm_(shards), gathers_(shards.duplicate(shards.name() + " (FSDP gathers)")), R_(shards.size()),
      rank_(shards.rank()), compute_(compute),
      units_(parameter_units(c, tp, R_)) {
  for (size_t u = 0; u < units_.size(); ++u) {
    const ParameterUnit& unit = units_[u];
    unit_of_.resize(static_cast<size_t>(unit.first_param + unit.num_params), static_cast<int>(u));
  }
  const std::vector<ParameterSpec> specs = parameter_table(c);
  offsets_.resize(specs.size());
  for (const ParameterUnit& unit : units_) {
    int64_t off = 0;
    for (int p = unit.first_param; p < unit.first_param + unit.num_params; ++p) {
      offsets_[static_cast<size_t>(p)] = off;
      off += specs[static_cast<size_t>(p)].local_elements(tp);
    }
  }
  shard_elements_ = units_.back().shard_begin + units_.back().block;
  const bool sharded = R_ > 1;
  check_shape(sharded || parameter_tier == StateTier::device,
              "parameters off the device need FSDP (a shard group of 2 or more)");
  // Its staging (disk) serves the optimizer's pass over the shard.
  param_shard_ = std::make_unique<StateStore>(parameter_tier, MemCategory::parameters, MemCategory::optimizer,
                                              sharded ? "model parameters (fp32, FSDP shard)" : "model parameters (fp32)",
                                              state_chunks(units_, 0, shard_elements_), dir);
  grad_shard_ = Buffer(MemCategory::gradients, sharded ? "model gradients (fp32, FSDP shard)" : "model gradients (fp32)",
                       static_cast<size_t>(shard_elements_) * 4);
  if (const int64_t bytes = sharded ? 0 : compute_weight_copy_bytes(shard_elements_, compute))
    compute_copy_ = Buffer(MemCategory::parameters, "bf16 compute copy of the parameters", static_cast<size_t>(bytes));
  resident_.resize(units_.size());
}

ShardedParameters::~ShardedParameters() { reset(); }

std::vector<ShardSegment> ShardedParameters::segments() const {
  std::vector<ShardSegment> out;
  for (const ParameterUnit& unit : units_) {
    const int64_t lo = rank_ * unit.block, hi = std::min(lo + unit.block, unit.elements);
    for (int p = unit.first_param; p < unit.first_param + unit.num_params; ++p) {
      const int64_t b = offset_in_unit(p);
      const int64_t e = p + 1 < unit.first_param + unit.num_params ? offset_in_unit(p + 1) : unit.elements;
      const int64_t from = std::max(b, lo), to = std::min(e, hi);
      if (from < to) out.push_back({unit.shard_begin + from - lo, to - from, p});
    }
  }
  return out;
}

void ShardedParameters::prefetch(int u) {
  if (R_ == 1 || resident_[static_cast<size_t>(u)]) return;
  if (prefetching_ >= 0) finish_prefetch();
  auto r = std::make_unique<Resident>();
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  r->weights = gathered_weights(unit, R_);
  if (Device::current().is_meta()) {
    // Counted (core/device.h): the copy takes its memory from here, as it
    // would; gather() counts the all-gather at the unit's use, one per use.
    resident_[static_cast<size_t>(u)] = std::move(r);
    meta_prefetched_ = u;
    return;
  }
  // This rank's block goes into its place in the gathered copy (on disk a
  // queued read), and the all-gather fills the rest around it, in place.
  float* mine = r->weights.as<float>() + rank_ * unit.block;
  const OffloadStore::Ticket read = param_shard_->read(unit.shard_begin, unit.block, mine);
  Resident* res = r.get();
  resident_[static_cast<size_t>(u)] = std::move(r);
  prefetching_ = u;
  // The helper thread waits for the read, posts the all-gather and drives
  // it (Open MPI moves a non-blocking collective only inside MPI calls)
  // while this thread computes. Only gathers use gathers_, posted one at a
  // time in the model's order, so every rank posts them in the same order
  // whichever thread does.
  if (!worker_) worker_ = std::make_unique<CommWorker>();
  const size_t bytes = static_cast<size_t>(unit.block) * 4;
  worker_->start([this, res, mine, bytes, read, posted = false]() mutable {
    if (!posted) {
      param_shard_->wait(read);
      res->request = gathers_.iall_gather(mine, res->weights.data(), bytes);
      posted = true;
    }
    return gathers_.test(res->request);
  });
}

void ShardedParameters::finish_prefetch() {
  worker_->finish(gathers_, CommOp::all_gather);
  prefetching_ = -1;
}

void ShardedParameters::gather(int u) {
  if (R_ == 1) return;
  auto& r = resident_[static_cast<size_t>(u)];
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  // Counted: a unit prefetched for a use the counted loop skipped (it runs
  // the first and the last of the alike layers) stood for this one.
  const bool counted_prefetch = meta_prefetched_ == u;
  if (meta_prefetched_ >= 0 && !counted_prefetch) release(meta_prefetched_);
  meta_prefetched_ = -1;
  if (prefetching_ == u) {
    finish_prefetch();
  } else if (!r || counted_prefetch) {
    if (prefetching_ >= 0) finish_prefetch();  // gathers_ takes one gather at a time
    if (!r) {
      r = std::make_unique<Resident>();
      r->weights = gathered_weights(unit, R_);
    }
    float* mine = r->weights.as<float>() + rank_ * unit.block;
    param_shard_->wait(param_shard_->read(unit.shard_begin, unit.block, mine));
    gathers_.all_gather(mine, r->weights.data(), static_cast<size_t>(unit.block) * 4);
  }
  if (compute_ == DType::bf16 && !r->compute.data()) {
    r->compute = Buffer(MemCategory::parameters, "FSDP gathered unit (bf16 compute copy)",
                        static_cast<size_t>(unit.block * R_) * sizeof(bf16));
    convert(TensorView(r->weights.data(), DType::f32, {1, unit.elements}),
            TensorView(r->compute.data(), DType::bf16, {1, unit.elements}));
  }
}

void ShardedParameters::release(int u) {
  if (R_ == 1 || prefetching_ == u) return;
  auto& r = resident_[static_cast<size_t>(u)];
  if (!r) return;
  r->weights = Buffer();
  r->compute = Buffer();
  if (!r->grads.data()) r.reset();
}

void ShardedParameters::begin_gradients(int u) {
  if (R_ == 1) return;
  auto& r = resident_[static_cast<size_t>(u)];
  if (!r) r = std::make_unique<Resident>();  // gradients without weights: the embedding's backward
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  r->grads = Buffer(MemCategory::gradients, "FSDP unit gradients (fp32)", static_cast<size_t>(unit.block * R_) * 4);
}

void ShardedParameters::reduce_gradients(int u) {
  if (R_ == 1) return;
  auto& r = resident_[static_cast<size_t>(u)];
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  // This rank's block of the sum is added to its shard: adding the shard
  // into our own block first lets the reduce-scatter write straight into it.
  float* mine = r->grads.as<float>() + rank_ * unit.block;
  float* shard = grad_shard_.as<float>() + unit.shard_begin;
  add_f32(shard, unit.block, mine);
  comm_.reduce_scatter_sum(r->grads.as<float>(), shard, static_cast<size_t>(unit.block));
  r->grads = Buffer();
  if (!r->weights.data()) r.reset();
}

void ShardedParameters::reset() {
  if (prefetching_ >= 0) {
    // A collective cannot be cancelled, and the other ranks post this one
    // too: let the helper post it and wait for it (watched by the
    // collective timeout), whatever else failed.
    try {
      finish_prefetch();
    } catch (...) {
      // The error that brought us here is the one to report.
    }
    prefetching_ = -1;
  }
  param_shard_->settle();  // a read into a copy freed below may still be queued
  for (auto& r : resident_) r.reset();
  meta_prefetched_ = -1;
}

void ShardedParameters::refresh_compute_copy() {
  if (!compute_copy_.data()) return;
  // Rows of 64Ki elements: convert's threads take rows.
  constexpr int64_t kRow = 1 << 16;
  const int64_t rows = shard_elements_ / kRow, tail = shard_elements_ % kRow;
  if (rows > 0)
    convert(TensorView(param_shard_->data(), DType::f32, {rows, kRow}),
            TensorView(compute_copy_.data(), DType::bf16, {rows, kRow}));
  if (tail > 0)
    convert(TensorView(param_shard_->data() + rows * kRow, DType::f32, {1, tail}),
            TensorView(compute_copy_.as<bf16>() + rows * kRow, DType::bf16, {1, tail}));
}

float* ShardedParameters::param(int p) const {
  const ParameterUnit& unit = units_[static_cast<size_t>(unit_of(p))];
  if (R_ == 1) return param_shard_->data() + unit.begin + offset_in_unit(p);
  const auto& r = resident_[static_cast<size_t>(unit_of(p))];
  check_shape(r && r->weights.data() && prefetching_ != unit_of(p), "FSDP: a parameter was used outside gather/release");
  return r->weights.as<float>() + offset_in_unit(p);
}

const void* ShardedParameters::weight(int p) const {
  if (compute_ != DType::bf16) return param(p);
  const ParameterUnit& unit = units_[static_cast<size_t>(unit_of(p))];
  if (R_ == 1) return compute_copy_.as<bf16>() + unit.begin + offset_in_unit(p);
  const auto& r = resident_[static_cast<size_t>(unit_of(p))];
  check_shape(r && r->compute.data(), "FSDP: a weight was used outside gather/release");
  return r->compute.as<bf16>() + offset_in_unit(p);
}

float* ShardedParameters::grad(int p) const {
  const ParameterUnit& unit = units_[static_cast<size_t>(unit_of(p))];
  if (R_ == 1) return grad_shard_.as<float>() + unit.begin + offset_in_unit(p);
  const auto& r = resident_[static_cast<size_t>(unit_of(p))];
  check_shape(r && r->grads.data(), "FSDP: a gradient was used outside begin_gradients/reduce_gradients");
  return r->grads.as<float>() + offset_in_unit(p);
}

std::vector<float> ShardedParameters::unshard(std::span<const float> shard) const {
  const ParameterUnit& last = units_.back();
  std::vector<float> flat(static_cast<size_t>(last.begin + last.elements));
  std::vector<float> all;
  for (const ParameterUnit& unit : units_) {
    all.resize(static_cast<size_t>(unit.block * R_));
    comm_.all_gather(shard.data() + unit.shard_begin, all.data(), static_cast<size_t>(unit.block) * 4);
    std::copy_n(all.data(), unit.elements, flat.data() + unit.begin);
  }
  return flat;
}

void ShardedParameters::reshard(std::span<const float> flat, std::span<float> shard) const {
  for (size_t u = 0; u < units_.size(); ++u) keep_block(static_cast<int>(u), flat.data() + units_[u].begin, shard);
}

// This rank's block of unit u's full values: its elements, then zero padding.
void ShardedParameters::copy_block(int u, const float* unit_values, float* block) const {
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  const int64_t lo = rank_ * unit.block, n = std::clamp<int64_t>(unit.elements - lo, 0, unit.block);
  std::copy_n(unit_values + lo, n, block);
  std::fill_n(block + n, unit.block - n, 0.0f);
}

void ShardedParameters::keep_block(int u, const float* unit_values, std::span<float> shard) const {
  copy_block(u, unit_values, shard.data() + units_[static_cast<size_t>(u)].shard_begin);
}

void ShardedParameters::keep_block(int u, const float* unit_values) {
  const ParameterUnit& unit = units_[static_cast<size_t>(u)];
  std::vector<float> block(static_cast<size_t>(unit.block));
  copy_block(u, unit_values, block.data());
  param_shard_->write(unit.shard_begin, block);
}

}  // namespace longctx
