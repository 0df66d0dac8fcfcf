// The whole model: gradients against central finite differences, remat
// policies against each other (same gradients, ordered memory), loss
// chunking, batching, parameter names and initialisation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "model/llama.h"

using namespace longctx;

namespace {

LlamaConfig tiny_config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 11;
  c.d_model = 16;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 6;  // H * D = 24 != d_model: catches mixed-up dimensions
  c.mlp_dim = 20;
  c.num_layers = 2;
  c.rope_theta = 100.0;
  c.tie_embeddings = tied;
  return c;
}

// Owns the arrays a Batch points to.
struct BatchData {
  int64_t B, S;
  std::vector<int32_t> tokens, targets, segments;
  std::vector<int64_t> positions;
  std::vector<float> weights;
  bool with_segments = false, with_weights = false;

  BatchData(int64_t b, int64_t s, int64_t vocab, uint32_t seed) : B(b), S(s) {
    std::mt19937 gen(seed);
    for (int64_t i = 0; i < B * S; ++i) {
      tokens.push_back(static_cast<int32_t>(gen() % vocab));
      targets.push_back(static_cast<int32_t>(gen() % vocab));
      positions.push_back(i % S);
      segments.push_back(static_cast<int32_t>((i % S) * 2 / S));  // two documents per row
      weights.push_back(static_cast<float>(gen() % 3) * 0.5f);     // includes 0 (padding)
    }
  }
  Batch batch() const {
    Batch b;
    b.batch = B;
    b.seq_local = S;
    b.tokens = tokens.data();
    b.targets = targets.data();
    b.positions = positions.data();
    b.segments = with_segments ? segments.data() : nullptr;
    b.loss_weights = with_weights ? weights.data() : nullptr;
    return b;
  }
};

// Larger-than-default weights so that every op works in its nonlinear range
// and gradients are far above finite-difference noise.
void randomise(LlamaModel& model, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const NamedTensor& p : model.parameters()) {
    float* v = p.local.f32();
    const bool norm = p.local.rank == 1;
    const float scale = norm ? 0.3f : 1.0f / std::sqrt(static_cast<float>(p.local.dim(1)));
    for (int64_t i = 0; i < p.local.numel(); ++i) v[i] = (norm ? 1.0f : 0.0f) + scale * dist(gen);
  }
}

std::vector<float> grads_copy(const LlamaModel& m) {
  auto g = m.flat_gradients();
  return {g.begin(), g.end()};
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// One forward/backward of a model initialised (seed 5) and randomised (seed 6).
struct StepResult {
  double loss;
  std::vector<float> grads;
  size_t activation_bytes;
};
StepResult one_step(const LlamaConfig& c, const ModelOptions& o, const BatchData& data) {
  LlamaModel model(c, o, 5);
  randomise(model, 6);
  const double loss = model.forward_backward(data.batch(), 1.0f).loss_sum;
  return {loss, grads_copy(model), model.peak_activation_bytes()};
}

ModelOptions reference_options(RematPolicy remat = RematPolicy::full) {
  ModelOptions o;
  o.remat = remat;
  o.impl = KernelImpl::reference;
  return o;
}

// For each parameter tensor, the directional derivative along a random
// direction: analytic (gradient . u) against central differences of the loss.
void check_gradients(const LlamaConfig& config, const BatchData& data, ModelOptions opt) {
  LlamaModel model(config, opt, 1);
  randomise(model, 2);
  const float scale = 0.01f;  // the trainer's 1 / tokens
  model.zero_gradients();
  model.forward_backward(data.batch(), scale);
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  double worst = 0.0;  // largest error as a fraction of the tolerance
  for (size_t t = 0; t < model.parameters().size(); ++t) {
    const NamedTensor& p = model.parameters()[t];
    const float* g = model.gradients()[t].local.f32();
    float* v = p.local.f32();
    const int64_t n = p.local.numel();
    std::vector<float> u(n), saved(v, v + n);
    double analytic = 0.0, unorm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      u[i] = dist(gen);
      unorm += static_cast<double>(u[i]) * u[i];
    }
    unorm = std::sqrt(unorm);
    for (int64_t i = 0; i < n; ++i) {
      u[i] = static_cast<float>(u[i] / unorm);
      analytic += static_cast<double>(g[i]) * u[i];
    }
    const double eps = 2e-3;
    auto loss_at = [&](double step) {
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(saved[i] + step * u[i]);
      return scale * model.forward(data.batch()).loss_sum;
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    std::copy(saved.begin(), saved.end(), v);
    const double tolerance = 2e-3 * std::abs(numeric) + 2e-5;
    worst = std::max(worst, std::abs(analytic - numeric) / tolerance);
    EXPECT_NEAR(analytic, numeric, tolerance)
        << p.name << ": analytic " << analytic << " numeric " << numeric;
  }
  std::printf("finite differences: worst error is %.3f of the tolerance\n", worst);
}

}  // namespace

TEST(Model, ParametersHaveHuggingFaceNamesAndCount) {
  for (bool tied : {false, true}) {
    LlamaConfig c = tiny_config(tied);
    LlamaModel model(c, reference_options());
    int64_t count = 0;
    for (const NamedTensor& p : model.parameters()) {
      count += p.local.numel();
      EXPECT_EQ(p.local.dim(0), p.full_shape[0]) << p.name;  // one rank: shard == full tensor
    }
    // Llama's count in closed form: per layer q, o [d, H D], k, v [d, G D],
    // gate, up, down [d, F] and two norms; the embedding, the final norm
    // and the LM head unless tied.
    const int64_t d = c.d_model, per_layer = 2 * d * c.num_heads * c.head_dim +
                                              2 * d * c.num_kv_heads * c.head_dim + 3 * d * c.mlp_dim + 2 * d;
    const int64_t expected = c.vocab_size * d * (tied ? 1 : 2) + c.num_layers * per_layer + d;
    EXPECT_EQ(count, expected);
    EXPECT_EQ(c.num_parameters(), expected);
    EXPECT_EQ(static_cast<int64_t>(model.flat_parameters().size()), expected);
    const auto& names = model.parameters();
    EXPECT_EQ(names.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(names[2].name, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(names[2].full_shape[0], c.num_heads * c.head_dim);
    EXPECT_EQ(names[2].split, TpSplit::dim0);
    EXPECT_EQ(names[5].name, "model.layers.0.self_attn.o_proj.weight");
    EXPECT_EQ(names[5].split, TpSplit::dim1);
    EXPECT_EQ(names.back().name, tied ? "model.norm.weight" : "lm_head.weight");
  }
}

TEST(Model, InitIsDeterministicPerSeed) {
  LlamaConfig c = tiny_config(false);
  LlamaModel a(c, reference_options(), 7), b(c, reference_options(), 7), d(c, reference_options(), 8);
  auto pa = a.flat_parameters(), pb = b.flat_parameters(), pd = d.flat_parameters();
  EXPECT_TRUE(std::equal(pa.begin(), pa.end(), pb.begin()));
  EXPECT_FALSE(std::equal(pa.begin(), pa.end(), pd.begin()));
  double ss = 0.0;  // q_proj ~ N(0, 0.02)
  const NamedTensor& q = a.parameters()[2];
  for (int64_t i = 0; i < q.local.numel(); ++i) ss += q.local.f32()[i] * q.local.f32()[i];
  EXPECT_NEAR(std::sqrt(ss / q.local.numel()), 0.02, 0.004);
  EXPECT_EQ(a.parameters()[1].local.f32()[0], 1.0f);  // norm weights start at 1
}

TEST(Model, InitialLossIsLogVocab) {
  LlamaConfig c = tiny_config(false);
  LlamaModel model(c, reference_options(), 1);
  BatchData data(2, 9, c.vocab_size, 4);
  LossStats s = model.forward(data.batch());
  EXPECT_EQ(s.weight_sum, 18.0);
  EXPECT_NEAR(s.loss_sum / s.weight_sum, std::log(static_cast<double>(c.vocab_size)), 0.05);
}

TEST(Model, GradientsMatchFiniteDifferences) {
  BatchData data(2, 7, 11, 5);
  check_gradients(tiny_config(false), data, reference_options());
}

TEST(Model, GradientsMatchFiniteDifferencesTiedWithDocumentsWeightsAndScaledRope) {
  LlamaConfig c = tiny_config(true);
  c.rope_llama3_scaling = true;
  c.rope_original_max_position = 16;
  BatchData data(1, 9, c.vocab_size, 6);
  data.with_segments = data.with_weights = true;
  for (int64_t i = 0; i < 9; ++i) data.positions[i] = 3 * i + 100;  // global, not from 0
  ModelOptions o = reference_options(RematPolicy::none);
  o.loss_chunk_rows = 4;
  check_gradients(c, data, o);
}

TEST(Model, RematPoliciesGiveSameGradientsAndOrderedMemory) {
  LlamaConfig c = tiny_config(false);
  c.num_layers = 3;
  BatchData data(2, 8, c.vocab_size, 7);
  struct Run { const char* name; std::vector<float> grads; double loss; size_t bytes; };
  std::vector<Run> runs;
  auto run = [&](ModelOptions o, const char* name) {
    LlamaModel model(c, o, 3);
    randomise(model, 4);
    LossStats s = model.forward_backward(data.batch(), 1.0f);
    runs.push_back({name, grads_copy(model), s.loss_sum, model.peak_activation_bytes()});
    std::printf("remat %-14s peak activations %zu bytes\n", name, model.peak_activation_bytes());
  };
  run(reference_options(RematPolicy::none), "none");
  run(reference_options(RematPolicy::minimal), "minimal");
  run(reference_options(RematPolicy::save_context), "save_context");
  run(reference_options(RematPolicy::full), "full");
  ModelOptions custom = reference_options(RematPolicy::custom);
  custom.custom_save = {true, true, false, false, true, false};  // qkv_proj and mlpwi
  run(custom, "custom");
  for (const Run& r : runs) {
    EXPECT_LT(max_rel_diff(r.grads, runs[0].grads), 1e-6) << r.name;
    EXPECT_NEAR(r.loss, runs[0].loss, 1e-6 * runs[0].loss) << r.name;
  }
  const size_t none = runs[0].bytes, minimal = runs[1].bytes, save_context = runs[2].bytes,
               full = runs[3].bytes, cust = runs[4].bytes;
  EXPECT_GT(none, minimal);
  EXPECT_GT(minimal, save_context);  // matmul outputs outweigh the context here
  EXPECT_GT(save_context, full);
  EXPECT_GT(minimal, cust);
  EXPECT_GT(cust, full);
}

TEST(Model, LossChunkingDoesNotChangeResults) {
  LlamaConfig c = tiny_config(true);
  BatchData data(2, 7, c.vocab_size, 8);
  std::vector<StepResult> runs;
  for (int64_t rows : {1, 5, 0}) {
    ModelOptions o = reference_options();
    o.loss_chunk_rows = rows;
    runs.push_back(one_step(c, o, data));
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_NEAR(runs[i].loss, runs[0].loss, 1e-5 * runs[0].loss);
    EXPECT_LT(max_rel_diff(runs[i].grads, runs[0].grads), 1e-5);
  }
}

// layer_token_chunk: the norms, projections, SwiGLU and RoPE a chunk of
// rows at a time. Chunks of 3 and 5 of the batch's 14 rows cross its row
// boundary and leave a short last chunk; with remat full everything is
// recomputed per chunk, with custom the saved tensors are whole and read at
// the chunk's rows (minimal and none: the bit-identity and planner tests).
// Finite differences are the oracle.
TEST(Model, TokenChunksMatchFiniteDifferencesWhenRecomputedAndWhenSaved) {
  BatchData data(2, 7, 11, 5);
  ModelOptions full = reference_options(RematPolicy::full);
  full.layer_token_chunk = 3;
  check_gradients(tiny_config(false), data, full);
  ModelOptions custom = reference_options(RematPolicy::custom);
  custom.custom_save = {true, false, true, true, true, false};  // context, out_proj, mlpwi
  custom.layer_token_chunk = 5;
  check_gradients(tiny_config(true), data, custom);
}

// Chunks change the order in which the weight gradients sum over tokens
// (and the rows of each GEMM), nothing else; their buffers shrink with the
// chunk and a chunk of all rows or more is the unchunked run.
// Bounds (fp32, u = 2^-24 = 6e-8): the forward is row-local, so only a
// GEMM's blocking can differ: a few u on the loss, which 1e-6 (17 u) covers.
// A weight gradient sums 14 rows; summed in another grouping it moves by at
// most 13 u of the sum of |terms| (Higham's bound for recursive summation),
// and the two layers' backward carries such changes through 2 x 6 GEMM and
// norm steps into the earlier gradients: 1e-5 (170 u) of the largest
// gradient is above 13 u x 12 with a margin for the gradients' cancellation.
TEST(Model, TokenChunksChangeOnlyTheSummationOrderAndShrinkTheTransients) {
  LlamaConfig c = tiny_config(false);
  BatchData data(2, 7, c.vocab_size, 9);
  auto run = [&](int64_t chunk) {
    ModelOptions o = reference_options(RematPolicy::full);
    o.layer_token_chunk = chunk;
    return one_step(c, o, data);
  };
  const StepResult all = run(0);
  size_t previous = 0;
  for (int64_t chunk : {1, 4, 13, 14, 100}) {
    const StepResult r = run(chunk);
    EXPECT_NEAR(r.loss, all.loss, 1e-6 * all.loss) << chunk;
    EXPECT_LT(max_rel_diff(r.grads, all.grads), 1e-5) << chunk;
    if (chunk < 14) {
      EXPECT_GT(r.activation_bytes, previous) << chunk;
      EXPECT_LT(r.activation_bytes, all.activation_bytes) << chunk;
    } else {
      EXPECT_EQ(r.activation_bytes, all.activation_bytes) << chunk;
    }
    previous = r.activation_bytes;
  }
}

TEST(Model, BatchOfTwoEqualsTwoBatchesOfOne) {
  // Checks the batch strides of every view (attention reads [B, S, H, D]).
  LlamaConfig c = tiny_config(false);
  BatchData both(2, 6, c.vocab_size, 9);
  LlamaModel model(c, reference_options(RematPolicy::none), 5);
  randomise(model, 7);
  double loss_both = model.forward_backward(both.batch(), 1.0f).loss_sum;
  auto g_both = grads_copy(model);
  model.zero_gradients();
  double loss_split = 0.0;
  for (int64_t row = 0; row < 2; ++row) {
    Batch b = both.batch();
    b.batch = 1;
    b.tokens += row * 6;
    b.targets += row * 6;
    b.positions += row * 6;
    loss_split += model.forward_backward(b, 1.0f).loss_sum;
  }
  EXPECT_NEAR(loss_both, loss_split, 1e-5 * loss_both);
  EXPECT_LT(max_rel_diff(grads_copy(model), g_both), 1e-5);
}

TEST(Model, GradientsAccumulateAndScale) {
  LlamaConfig c = tiny_config(false);
  BatchData data(1, 5, c.vocab_size, 10);
  LlamaModel model(c, reference_options(), 5);
  model.forward_backward(data.batch(), 0.5f);
  auto once = grads_copy(model);
  model.forward_backward(data.batch(), 1.5f);  // accumulates: total scale 2
  auto twice = grads_copy(model);
  for (float& g : once) g *= 4.0f;
  EXPECT_LT(max_rel_diff(twice, once), 1e-5);
}

TEST(Model, RejectsBadConfigs) {
  LlamaConfig c = tiny_config(false);
  c.num_kv_heads = 3;
  EXPECT_THROW(LlamaModel(c, reference_options()), ConfigError);
  ModelOptions o = reference_options(RematPolicy::custom);
  o.custom_save[0] = false;
  EXPECT_THROW(LlamaModel(tiny_config(false), o), ConfigError);
  EXPECT_THROW(parse_enum<RematPolicy>("nothing"), ConfigError);
  EXPECT_EQ(parse_enum<RematPolicy>("save_context"), RematPolicy::save_context);
  BatchData data(1, 4, 11, 1);
  data.tokens[2] = 11;
  LlamaModel model(tiny_config(false), reference_options());
  EXPECT_THROW(model.forward(data.batch()), DataError);
}

TEST(Model, FastAttentionKernelGivesReferenceResults) {
  // The model hands the kernel strided q/k/v views out of the fused
  // projection; S crosses the kernel's block sizes.
  LlamaConfig c = tiny_config(false);
  c.head_dim = 16;
  BatchData data(2, 150, c.vocab_size, 12);
  data.with_segments = true;
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (KernelImpl impl : {KernelImpl::reference, KernelImpl::fast}) {
    ModelOptions o = reference_options(RematPolicy::minimal);
    o.impl = impl;
    LlamaModel model(c, o, 5);
    randomise(model, 8);
    losses.push_back(model.forward_backward(data.batch(), 1.0f).loss_sum);
    grads.push_back(grads_copy(model));
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-5 * losses[0]);
  EXPECT_LT(max_rel_diff(grads[1], grads[0]), 1e-4);
}

// ---- dtype: bfloat16 ---------------------------------------------------------------
// The bf16 model against the fp32 model with the same weights. Each bf16
// activation or GEMM operand is one rounding to nearest, relative error at
// most u = 2^-8; fp32 accumulation adds nothing comparable. Along the longest
// forward path there are 8 roundings per layer (x, normed, qkv, context,
// out_proj, normed, mlpwi, SwiGLU output) plus the embedding and the loss
// hidden state; backward adds 5 per layer (dy twice, dgu, dO, dqkv) and the
// logits gradient. With every op's sensitivity near 1 (normalised
// activations), the relative error of the loss is at most (8L + 2) u and of
// the gradient vector (13L + 3) u, to first order, when the errors add up in
// the worst way (they mostly cancel: the measured errors are far smaller).
// A wrong weight, a missed term or a tensor read in the wrong precision is an
// O(1) error.
namespace {
constexpr double kBf16Unit = 1.0 / 256;

double norm_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}
}  // namespace

TEST(ModelBf16, TracksFp32WithinRoundingBounds) {
  for (bool tied : {false, true})
    for (KernelImpl impl : {KernelImpl::fast, KernelImpl::reference}) {
      LlamaConfig c = tiny_config(tied);
      c.num_layers = 3;
      BatchData data(2, 37, c.vocab_size, 31);  // 37: not a multiple of any tile
      data.with_segments = data.with_weights = tied;
      struct Result { double loss; std::vector<float> grads; size_t bytes; };
      auto run = [&](DType dtype, int64_t chunk) {
        ModelOptions o;
        o.impl = impl;
        o.dtype = dtype;
        o.layer_token_chunk = chunk;
        o.remat = RematPolicy::none;
        LlamaModel model(c, o, 3);
        randomise(model, 4);
        const double loss = model.forward_backward(data.batch(), 0.01f).loss_sum;
        return Result{loss, grads_copy(model), model.peak_activation_bytes()};
      };
      const Result f32 = run(DType::f32, 0), b16 = run(DType::bf16, 0);
      // Chunks (of 5: the 74 rows end in a short one) only reorder fp32 sums.
      const Result b16_chunked = run(DType::bf16, 5);
      const double L = static_cast<double>(c.num_layers);
      const double loss_err = std::abs(b16.loss - f32.loss) / std::abs(f32.loss);
      const double grad_err = norm_rel_diff(b16.grads, f32.grads);
      std::printf("bf16 vs fp32 (tied %d, %s kernel): loss %.2e (bound %.2e), gradients %.2e (bound %.2e)\n", tied,
                  name_of(impl), loss_err, (8 * L + 2) * kBf16Unit, grad_err, (13 * L + 3) * kBf16Unit);
      EXPECT_LE(loss_err, (8 * L + 2) * kBf16Unit);
      EXPECT_LE(grad_err, (13 * L + 3) * kBf16Unit);
      EXPECT_LE(std::abs(b16_chunked.loss - f32.loss) / std::abs(f32.loss), (8 * L + 2) * kBf16Unit);
      EXPECT_LE(norm_rel_diff(b16_chunked.grads, f32.grads), (13 * L + 3) * kBf16Unit);
      EXPECT_LT(b16_chunked.bytes, b16.bytes);
      EXPECT_GT(loss_err, 0.0) << "the bf16 run computed in fp32";
      EXPECT_LT(b16.bytes, f32.bytes);
    }
}

// Recomputation runs the same code as the forward pass, so it reproduces the
// same roundings: every policy gives bit-identical bf16 results, unchunked
// and in chunks of 6 of the 29 rows.
TEST(ModelBf16, RematPoliciesAreBitIdentical) {
  LlamaConfig c = tiny_config(false);
  BatchData data(1, 29, c.vocab_size, 41);
  for (int64_t chunk : {0, 6}) {
    std::vector<StepResult> runs;
    for (RematPolicy r : {RematPolicy::none, RematPolicy::minimal, RematPolicy::save_context, RematPolicy::full}) {
      ModelOptions o;
      o.dtype = DType::bf16;
      o.remat = r;
      o.layer_token_chunk = chunk;
      runs.push_back(one_step(c, o, data));
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      EXPECT_EQ(runs[i].loss, runs[0].loss) << "chunk " << chunk << " policy " << i;
      EXPECT_EQ(runs[i].grads, runs[0].grads) << "chunk " << chunk << " policy " << i;
    }
  }
}

// The bf16 weight copy follows the fp32 masters between calls (the
// optimizer changes them in place).
TEST(ModelBf16, WeightCopyFollowsTheMasters) {
  LlamaConfig c = tiny_config(true);
  BatchData data(1, 16, c.vocab_size, 51);
  ModelOptions o;
  o.dtype = DType::bf16;
  LlamaModel a(c, o, 7), b(c, o, 8);
  randomise(a, 9);
  a.forward(data.batch());  // a's copy now holds its old weights
  std::vector<float> flat(b.flat_parameters().begin(), b.flat_parameters().end());
  std::copy(flat.begin(), flat.end(), a.flat_parameters().begin());
  EXPECT_EQ(a.forward(data.batch()).loss_sum, b.forward(data.batch()).loss_sum);
}
