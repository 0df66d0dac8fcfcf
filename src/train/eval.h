#pragma once
// Evaluation by context position (`longctx eval`): the loss on held-out data,
// in buckets of the token's position in its sequence (its RoPE position:
// with packing, positions restart at each document), [0, first),
// [first, 2 first), [2 first, 4 first), ... the last one ending at
// max_target_length (first = eval_first_bucket, 1024 by default).
//
// It runs on the training mesh and strategies (any dp x cp x tp, every cp
// strategy and layout), so a sequence that only fits split over ranks is
// evaluated the same way it is trained; the model computes each token's loss
// in its loss chunks (LlamaModel::forward's token_losses) and every rank adds
// its tokens into the buckets, summed over the dp x cp replicas.
//
// Held-out data: eval_dataset_path when set (the same dataset_type; its
// sequences from the first), otherwise the LAST eval_steps global batches of
// dataset_path's epoch, which a run of fewer steps than an epoch never
// trains on (the training cursor starts at sequence 0).
#include <cstdint>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/config.h"

namespace longctx {

struct PositionBucket {
  int64_t begin = 0, end = 0;  // positions [begin, end)
  double loss_sum = 0.0;       // summed cross-entropy (nats) of the targets at these positions
  double tokens = 0.0;         // targets counted (padding excluded)
  double mean() const { return tokens > 0 ? loss_sum / tokens : 0.0; }
};

struct EvalResult {
  std::vector<PositionBucket> buckets;
  double loss_sum = 0.0, tokens = 0.0;  // over every bucket
  int64_t first_sequence = 0, sequences = 0;  // the dataset's sequences evaluated
  std::string weights;                        // where the weights came from
  double mean() const { return tokens > 0 ? loss_sum / tokens : 0.0; }
};

// [0, first), [first, 2 first), ... up to seq_len (the last one cut there).
std::vector<PositionBucket> position_buckets(int64_t seq_len, int64_t first);

// Collective over the mesh (every rank calls it; every rank gets the result).
// The config must be validated, with load_parameters_path's config.json
// applied (apply_hf_model_config); without load_parameters_path the model is
// the seeded random init.
EvalResult evaluate(const RunConfig& config, const Mesh& mesh);

// The table printed on stdout, and the JSON of eval_output.
std::string eval_table(const EvalResult& result);
std::string eval_json(const EvalResult& result, const RunConfig& config);

// eval_output, or <base_output_directory>/<run_name>/eval.json.
std::string eval_output_path(const RunConfig& config);

}  // namespace longctx
