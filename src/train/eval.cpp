#include "train/eval.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "cp/layout.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/trainer.h"

namespace longctx {

namespace fs = std::filesystem;

std::vector<PositionBucket> position_buckets(int64_t seq_len, int64_t first) {
  if (first < 1) throw ConfigError("eval_first_bucket must be >= 1 (got " + std::to_string(first) + ")");
  std::vector<PositionBucket> out;
  for (int64_t begin = 0, end = first; begin < seq_len; begin = end, end = std::min(seq_len, end) * 2) {
    PositionBucket b;
    b.begin = begin;
    b.end = std::min(end, seq_len);
    out.push_back(b);
  }
  return out;
}

EvalResult evaluate(const RunConfig& c, const Mesh& mesh) {
  const std::unique_ptr<Device> device = make_run_device(c);
  const SystemSettings settings(c, *device);
  RunConfig data_config = c;
  if (!c.eval_dataset_path.empty()) data_config.dataset_path = c.eval_dataset_path;
  const Dataset data(load_corpus(data_config), c.max_target_length, c.packing);
  const int64_t global_batch = c.per_device_batch_size * c.mesh_shape().batch_slices();
  const int64_t sequences = checked_mul(c.eval_steps, global_batch, "eval_steps x global batch");
  // Never wrap around: past its end the data repeats (and, without
  // eval_dataset_path, runs into the training sequences before the tail).
  if (sequences > data.num_sequences())
    throw ConfigError("eval_steps " + std::to_string(c.eval_steps) + " x global batch " + std::to_string(global_batch) +
                      " = " + std::to_string(sequences) + " sequences, but the eval data holds only " +
                      std::to_string(data.num_sequences()) + " of max_target_length " +
                      std::to_string(c.max_target_length) +
                      " tokens: an evaluation reads each sequence at most once (lower eval_steps)");
  const CpLayout layout(c.layout(), c.max_target_length, static_cast<int>(c.cp), mesh.shape().ulysses);
  const MaskSpec mask = c.mask();
  LlamaModel model(c.model, model_options_from_config(c, mesh), static_cast<uint64_t>(c.init_weights_seed));
  EvalResult r;
  r.weights = c.load_parameters_path.empty() ? "random init (init_weights_seed " + std::to_string(c.init_weights_seed) + ")"
                                             : c.load_parameters_path;
  if (!c.load_parameters_path.empty()) load_hf_parameters(c.load_parameters_path, model);

  r.sequences = sequences;
  r.first_sequence = c.eval_dataset_path.empty() ? std::max<int64_t>(0, data.num_sequences() - r.sequences) : 0;
  r.buckets = position_buckets(c.max_target_length, c.eval_first_bucket);
  // Bucket of each position: the first whose end is past it.
  auto bucket_of = [&](int64_t pos) {
    size_t i = 0;
    while (i + 1 < r.buckets.size() && pos >= r.buckets[i].end) ++i;
    return i;
  };
  std::vector<double> sums(2 * r.buckets.size(), 0.0);  // loss, tokens per bucket
  std::vector<double> token_losses;
  for (int64_t step = 0; step < c.eval_steps; ++step) {
    const LocalBatch batch = make_local_batch(data, r.first_sequence + step * global_batch, c.per_device_batch_size,
                                              c.mesh_shape().batch_slices(), mesh.data_rank(), layout, mesh.cp_rank(), mask);
    token_losses.assign(batch.tokens.size(), 0.0);
    model.forward(batch.view(), token_losses.data());
    for (size_t i = 0; i < token_losses.size(); ++i) {
      if (batch.weights[i] == 0.0f) continue;  // padding
      const size_t b = bucket_of(batch.positions[i]);
      sums[2 * b] += token_losses[i];
      sums[2 * b + 1] += batch.weights[i];
    }
  }
  // Every dp x fsdp x cp rank holds other tokens; the tp ranks of one hold the same ones.
  mesh.data().all_reduce_sum(sums.data(), sums.size());
  for (size_t b = 0; b < r.buckets.size(); ++b) {
    r.buckets[b].loss_sum = sums[2 * b];
    r.buckets[b].tokens = sums[2 * b + 1];
    r.loss_sum += sums[2 * b];
    r.tokens += sums[2 * b + 1];
  }
  return r;
}

namespace {

std::string position_text(int64_t p) {
  char buf[32];
  if (p >= 1024 && p % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%lldK", static_cast<long long>(p / 1024));
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(p));
  return buf;
}

std::string bucket_label(const PositionBucket& b) { return position_text(b.begin) + "-" + position_text(b.end); }

}  // namespace

std::string eval_table(const EvalResult& r) {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-16s %12s %12s %10s\n", "positions", "tokens", "loss", "ppl");
  out += line;
  auto row = [&](const std::string& label, double tokens, double mean) {
    std::snprintf(line, sizeof line, "%-16s %12.0f %12.4f %10.3f\n", label.c_str(), tokens, mean,
                  tokens > 0 ? std::exp(mean) : 0.0);
    out += line;
  };
  for (const PositionBucket& b : r.buckets) row(bucket_label(b), b.tokens, b.mean());
  row("all", r.tokens, r.mean());
  return out;
}

std::string eval_json(const EvalResult& r, const RunConfig& c) {
  nlohmann::json j = {{"weights", r.weights},
                      {"dataset_path", c.eval_dataset_path.empty() ? c.dataset_path : c.eval_dataset_path},
                      {"first_sequence", r.first_sequence},
                      {"sequences", r.sequences},
                      {"max_target_length", c.max_target_length},
                      {"loss", r.mean()},
                      {"tokens", r.tokens},
                      {"buckets", nlohmann::json::array()}};
  for (const PositionBucket& b : r.buckets)
    j["buckets"].push_back({{"label", bucket_label(b)}, {"begin", b.begin}, {"end", b.end}, {"tokens", b.tokens},
                            {"loss_sum", b.loss_sum}, {"loss", b.tokens > 0 ? nlohmann::json(b.mean()) : nlohmann::json()}});
  return j.dump(2) + "\n";
}

std::string eval_output_path(const RunConfig& c) {
  return c.eval_output.empty() ? (fs::path(c.base_output_directory) / c.run_name / "eval.json").string() : c.eval_output;
}

}  // namespace longctx
