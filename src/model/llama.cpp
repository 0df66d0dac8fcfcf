// The Llama 3 decoder: forward, backward with rematerialisation, chunked loss.
// See llama.h for the math and the API; this file is organised as
//   parameters (layout, names, init) -> activation workspace (what each remat
//   policy keeps) -> layer forward pieces -> loss head -> backward.
#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/mesh.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"

namespace longctx {

// ---- names ----------------------------------------------------------------------------

RematPolicy parse_remat_policy(const std::string& name) {
  if (name == "none") return RematPolicy::none;
  if (name == "minimal") return RematPolicy::minimal;
  if (name == "save_context") return RematPolicy::save_context;
  if (name == "full") return RematPolicy::full;
  if (name == "custom") return RematPolicy::custom;
  throw ConfigError("remat_policy '" + name +
                    "' is unknown: expected none, minimal, save_context, full or custom");
}

const char* remat_policy_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::none: return "none";
    case RematPolicy::minimal: return "minimal";
    case RematPolicy::save_context: return "save_context";
    case RematPolicy::full: return "full";
    case RematPolicy::custom: return "custom";
  }
  return "?";
}

const char* save_point_name(SavePoint p) {
  static const char* names[kNumSavePoints] = {"decoder_layer_input", "qkv_proj", "context",
                                              "out_proj",            "mlpwi",    "mlpwo"};
  return names[static_cast<int>(p)];
}

namespace {

// What a layer keeps for backward (the layer input is always kept).
struct SaveSet {
  bool qkv = false;      // q, k, v after RoPE             [N, (H+2G) D / tp]
  bool context = false;  // attention output and its LSE   [N, H D / tp], [N, H / tp]
  bool out_proj = false; // residual after attention, x2   [N, d]
  bool mlpwi = false;    // gate/up projection output      [N, 2 F / tp]
};

SaveSet save_set_for(const ModelOptions& o) {
  switch (o.remat) {
    case RematPolicy::none: return {true, true, true, true};
    case RematPolicy::minimal: return {true, false, true, true};
    case RematPolicy::save_context: return {false, true, false, false};
    case RematPolicy::full: return {false, false, false, false};
    case RematPolicy::custom: {
      const auto& s = o.custom_save;
      if (!s[static_cast<int>(SavePoint::decoder_layer_input)])
        throw ConfigError(
            "remat_policy custom: decoder_layer_input must be saved (the layer input is the "
            "recompute boundary)");
      return {s[static_cast<int>(SavePoint::qkv_proj)], s[static_cast<int>(SavePoint::context)],
              s[static_cast<int>(SavePoint::out_proj)], s[static_cast<int>(SavePoint::mlpwi)]};
    }
  }
  return {};
}

// Counter-based normal samples: the value of element i of a tensor depends on
// (seed, name, i) only, so every mesh initialises the same full model.
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

float normal_sample(uint64_t key, uint64_t i) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * i)), b = splitmix64(key ^ splitmix64(2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 0.5) / 9007199254740992.0;  // (0, 1)
  const double u2 = static_cast<double>(b >> 11) / 9007199254740992.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

constexpr float kInitStd = 0.02f;  // Hugging Face initializer_range

// Contiguous [rows, cols] view of a float array.
TensorView mat(float* p, int64_t rows, int64_t cols) {
  return TensorView(p, DType::f32, {rows, cols});
}

}  // namespace

namespace {

// Single-rank attention: exactly what every strategy does when cp == 1.
class SingleRankAttention : public CpAttention {
 public:
  explicit SingleRankAttention(KernelImpl impl) : impl_(impl) {}
  void forward(const AttentionArgs& a, const TensorView& o, float* lse) override {
    if (impl_ == KernelImpl::reference) attention_forward_reference(a, o, lse);
    else attention_forward(a, o, lse);
  }
  void backward(const AttentionArgs& a, const TensorView& o, const float* lse,
                const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv) override {
    std::vector<float> delta(o.dim(0) * o.dim(1) * o.dim(2));  // [B, S, H]
    attention_delta(o, dout, delta.data());
    for (const TensorView* t : {&dq, &dk, &dv}) zero(*t);  // the kernel accumulates
    if (impl_ == KernelImpl::reference)
      attention_backward_reference(a, dout, lse, delta.data(), dq, dk, dv);
    else
      attention_backward(a, dout, lse, delta.data(), dq, dk, dv);
  }

 private:
  static void zero(const TensorView& t) {  // [B, S, H, D], D contiguous
    for (int64_t b = 0; b < t.dim(0); ++b)
      for (int64_t s = 0; s < t.dim(1); ++s)
        for (int64_t h = 0; h < t.dim(2); ++h) std::memset(t.at<float>({b, s, h}), 0, t.dim(3) * 4);
  }
  KernelImpl impl_;
};

}  // namespace

// ---- implementation state ------------------------------------------------------------

// One activation tensor per layer when the policy saves it, else one scratch
// tensor that every layer overwrites (and backward recomputes into).
struct PerLayer {
  std::vector<Buffer> bufs;
  bool saved = false;
  float* at(int64_t layer) const { return bufs[saved ? layer : 0].as<float>(); }
};

struct Workspace {
  int64_t tokens = 0;
  bool training = false;
  SaveSet save;
  size_t bytes = 0;
  std::vector<Buffer> x;             // L + 1 residual streams, [N, d]; x[L] feeds the final norm
  PerLayer qkv;                      // [N, QKV] (q, k after RoPE)
  PerLayer ctx, lse;                 // [N, Hl D], [N, Hl]
  PerLayer x2;                       // [N, d]
  PerLayer gu;                       // [N, 2 Fl]: gate | up
  Buffer normed;                     // [N, d]: h1 or h2
  Buffer act;                        // [N, Fl]: swiglu output, then its gradient
  Buffer rope_cos, rope_sin;         // [N, D/2]
  Buffer dresid, dnorm, dctx, dqkv;  // backward: [N, d], [N, d], [N, Hl D], [N, QKV]
  Buffer head_in, head_dx, logits;   // loss chunk: [R, d], [R, d], [R, V]

  Buffer make(const char* name, int64_t floats) {
    bytes += static_cast<size_t>(floats) * 4;
    return Buffer(MemCategory::activations, name, static_cast<size_t>(floats) * 4);
  }
  PerLayer make_per_layer(const char* name, bool saved, int64_t layers, int64_t floats) {
    PerLayer p;
    p.saved = saved;
    for (int64_t l = 0; l < (saved ? layers : 1); ++l) p.bufs.push_back(make(name, floats));
    return p;
  }
};

struct LlamaModel::Impl {
  // Sizes after tensor parallelism.
  int64_t d, V, D, L, tp = 1, tp_rank = 0;
  int64_t Hl, Gl, Fl, qkv_cols;  // local heads, KV heads, MLP width; (Hl + 2 Gl) D
  double eps;
  RopeParams rope;
  SaveSet save;
  KernelImpl impl;
  MaskSpec mask;
  int64_t loss_chunk_rows;

  Buffer param_buf, grad_buf;  // flat, [total]
  int64_t total = 0;
  struct LayerIdx { int attn_norm, q, o, mlp_norm, gate, down; };
  std::vector<LayerIdx> layer;  // indices into params_/grads_ (k, v follow q; up follows gate)
  int embed = -1, final_norm = -1, lm_head = -1;

  std::unique_ptr<CpAttention> attention;
  std::unique_ptr<Workspace> ws;
  size_t peak_bytes = 0;
  StepProfile profile;
  const Batch* batch = nullptr;  // the batch of the current call

  // Row-parallel outputs and column-parallel input gradients are partial sums
  // over tp ranks.
  const Mesh* mesh = nullptr;
  void tp_all_reduce(float* data, int64_t n) {
    if (tp == 1) return;
    Timer t;
    mesh->tp().all_reduce_sum(data, static_cast<size_t>(n));
    profile.tp_comm += t.seconds();
  }

  // ---- layer pieces (forward; backward reuses them to recompute) ----
  void attention_args(const float* qkv, AttentionArgs& a) const;
};

void LlamaModel::Impl::attention_args(const float* qkv, AttentionArgs& a) const {
  const int64_t B = batch->batch, S = batch->seq_local;
  float* base = const_cast<float*>(qkv);
  // Strided views straight out of the fused projection: no transposes.
  a.q = TensorView::strided(base, DType::f32, {B, S, Hl, D}, {S * qkv_cols, qkv_cols, D, 1});
  a.k = TensorView::strided(base + Hl * D, DType::f32, {B, S, Gl, D},
                            {S * qkv_cols, qkv_cols, D, 1});
  a.v = TensorView::strided(base + (Hl + Gl) * D, DType::f32, {B, S, Gl, D},
                            {S * qkv_cols, qkv_cols, D, 1});
  a.q_pos = a.kv_pos = batch->positions;
  a.q_seg = a.kv_seg = batch->segments;
  a.mask = mask;
  a.mask.same_segment = mask.same_segment || batch->segments != nullptr;
  a.impl = impl;
}

// ---- construction, parameters ----------------------------------------------------

LlamaModel::LlamaModel(const LlamaConfig& config, const ModelOptions& options, uint64_t seed)
    : config_(config), options_(options), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const LlamaConfig& c = config_;
  if (c.vocab_size <= 0 || c.d_model <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 ||
      c.head_dim <= 0 || c.mlp_dim <= 0 || c.num_layers <= 0)
    throw ConfigError("model: vocab_size, base_emb_dim, heads, head_dim, base_mlp_dim and "
                      "layers must all be > 0");
  if (c.num_heads % c.num_kv_heads != 0)
    throw ConfigError("model: base_num_query_heads (" + std::to_string(c.num_heads) +
                      ") must be a multiple of base_num_kv_heads (" +
                      std::to_string(c.num_kv_heads) + ")");
  if (c.head_dim % 2 != 0) throw ConfigError("model: head_dim must be even for RoPE");
  if (options.mesh != nullptr) {
    m.mesh = options.mesh;
    m.tp = options.mesh->shape().tp;
    m.tp_rank = options.mesh->tp_rank();
  }
  if (options.loss_chunk_rows < 0) throw ConfigError("model: loss_chunk_rows must be >= 0");
  const int64_t tp = m.tp;
  auto divisible = [&](int64_t n, const char* what) {
    if (n % tp != 0)
      throw ConfigError(std::string("model: ") + what + " (" + std::to_string(n) +
                        ") must be divisible by ici_tensor_parallelism (" + std::to_string(tp) +
                        ")");
  };
  divisible(c.num_heads, "base_num_query_heads");
  divisible(c.num_kv_heads, "base_num_kv_heads");
  divisible(c.mlp_dim, "base_mlp_dim");

  m.d = c.d_model;
  m.V = c.vocab_size;
  m.D = c.head_dim;
  m.L = c.num_layers;
  m.Hl = c.num_heads / tp;
  m.Gl = c.num_kv_heads / tp;
  m.Fl = c.mlp_dim / tp;
  m.qkv_cols = (m.Hl + 2 * m.Gl) * m.D;
  m.eps = c.norm_eps;
  m.rope = RopeParams{c.rope_theta, c.rope_llama3_scaling, c.rope_scaling_factor,
                      c.rope_low_freq_factor, c.rope_high_freq_factor,
                      c.rope_original_max_position};
  m.save = save_set_for(options);
  m.impl = options.impl;
  m.mask = options.mask;
  m.loss_chunk_rows = options.loss_chunk_rows;
  // Local tokens in, local tokens out: the strategy hides the cp group.
  if (options.mesh)
    m.attention = make_cp_attention(options.cp_strategy, *options.mesh, options.cp_options);
  else
    m.attention = std::make_unique<SingleRankAttention>(options.impl);

  // Parameter table, Hugging Face order. Fused groups (q,k,v and gate,up)
  // are adjacent so that one GEMM computes each group.
  struct Spec { std::string name; int64_t rows, cols; TpSplit split; };
  std::vector<Spec> specs;
  const int64_t H = c.num_heads, G = c.num_kv_heads, F = c.mlp_dim, d = m.d;
  specs.push_back({"model.embed_tokens.weight", m.V, d, TpSplit::none});
  for (int64_t l = 0; l < m.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Impl::LayerIdx idx;
    idx.attn_norm = static_cast<int>(specs.size());
    specs.push_back({p + "input_layernorm.weight", d, 0, TpSplit::none});
    idx.q = static_cast<int>(specs.size());
    specs.push_back({p + "self_attn.q_proj.weight", H * m.D, d, TpSplit::dim0});
    specs.push_back({p + "self_attn.k_proj.weight", G * m.D, d, TpSplit::dim0});
    specs.push_back({p + "self_attn.v_proj.weight", G * m.D, d, TpSplit::dim0});
    idx.o = static_cast<int>(specs.size());
    specs.push_back({p + "self_attn.o_proj.weight", d, H * m.D, TpSplit::dim1});
    idx.mlp_norm = static_cast<int>(specs.size());
    specs.push_back({p + "post_attention_layernorm.weight", d, 0, TpSplit::none});
    idx.gate = static_cast<int>(specs.size());
    specs.push_back({p + "mlp.gate_proj.weight", F, d, TpSplit::dim0});
    specs.push_back({p + "mlp.up_proj.weight", F, d, TpSplit::dim0});
    idx.down = static_cast<int>(specs.size());
    specs.push_back({p + "mlp.down_proj.weight", d, F, TpSplit::dim1});
    m.layer.push_back(idx);
  }
  m.final_norm = static_cast<int>(specs.size());
  specs.push_back({"model.norm.weight", d, 0, TpSplit::none});
  if (!c.tie_embeddings) {
    m.lm_head = static_cast<int>(specs.size());
    specs.push_back({"lm_head.weight", m.V, d, TpSplit::none});
  }
  m.embed = 0;
  if (c.tie_embeddings) m.lm_head = m.embed;

  auto local_shape = [&](const Spec& s) {
    int64_t r = s.rows, k = s.cols;
    if (s.split == TpSplit::dim0) r /= tp;
    if (s.split == TpSplit::dim1) k /= tp;
    return std::pair<int64_t, int64_t>{r, k};
  };
  for (const Spec& s : specs) {
    auto [r, k] = local_shape(s);
    m.total += r * (k == 0 ? 1 : k);
  }
  m.param_buf = Buffer(MemCategory::parameters, "model parameters", m.total * 4);
  m.grad_buf = Buffer(MemCategory::gradients, "model gradients", m.total * 4);
  int64_t offset = 0;
  for (const Spec& s : specs) {
    auto [r, k] = local_shape(s);
    NamedTensor p;
    p.name = s.name;
    p.full_shape = {s.rows, s.cols};
    p.split = s.split;
    p.split_offset = s.split == TpSplit::dim0   ? m.tp_rank * r
                     : s.split == TpSplit::dim1 ? m.tp_rank * k
                                                : 0;
    NamedTensor g = p;
    float* pp = m.param_buf.as<float>() + offset;
    float* gp = m.grad_buf.as<float>() + offset;
    p.local = k == 0 ? TensorView(pp, DType::f32, {r}) : TensorView(pp, DType::f32, {r, k});
    g.local = k == 0 ? TensorView(gp, DType::f32, {r}) : TensorView(gp, DType::f32, {r, k});
    params_.push_back(p);
    grads_.push_back(g);
    offset += r * (k == 0 ? 1 : k);
  }
  init(seed);
}

LlamaModel::~LlamaModel() = default;

std::span<float> LlamaModel::flat_parameters() const {
  return {impl_->param_buf.as<float>(), static_cast<size_t>(impl_->total)};
}
std::span<float> LlamaModel::flat_gradients() const {
  return {impl_->grad_buf.as<float>(), static_cast<size_t>(impl_->total)};
}

void LlamaModel::init(uint64_t seed) {
  for (const NamedTensor& p : params_) {
    float* data = p.local.f32();
    if (p.local.rank == 1) {  // norm weights
      std::fill_n(data, p.local.numel(), 1.0f);
      continue;
    }
    const uint64_t key = splitmix64(seed ^ name_hash(p.name));
    const int64_t rows = p.local.dim(0), cols = p.local.dim(1), full_cols = p.full_shape[1];
    const int64_t row0 = p.split == TpSplit::dim0 ? p.split_offset : 0;
    const int64_t col0 = p.split == TpSplit::dim1 ? p.split_offset : 0;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k)
        data[r * cols + k] =
            kInitStd * normal_sample(key, static_cast<uint64_t>((row0 + r) * full_cols + col0 + k));
  }
}

void LlamaModel::zero_gradients() {
  std::memset(impl_->grad_buf.data(), 0, impl_->grad_buf.size());
}

size_t LlamaModel::peak_activation_bytes() const { return impl_->peak_bytes; }
const StepProfile& LlamaModel::last_step_profile() const { return impl_->profile; }

// ---- forward / backward -------------------------------------------------------------

namespace {

// Adds the seconds of its scope to one StepProfile field.
class ProfileScope {
 public:
  explicit ProfileScope(double& field) : field_(field) {}
  ~ProfileScope() { field_ += timer_.seconds(); }

 private:
  double& field_;
  Timer timer_;
};

// The pieces of a step, over the model's state. Kept in one place so that
// forward and the recomputation in backward run literally the same code.
struct Step {
  LlamaModel::Impl& m;
  const std::vector<NamedTensor>& P;
  const std::vector<NamedTensor>& Gr;
  Workspace& w;
  const Batch& b;
  int64_t N;

  float* param(int i) const { return P[i].local.f32(); }
  float* grad(int i) const { return Gr[i].local.f32(); }
  float* x(int64_t l) const { return w.x[l].as<float>(); }

  template <typename F>
  void elementwise(F&& f) {
    ProfileScope p(m.profile.elementwise);
    f();
  }
  void matmul(bool ta, bool tb, int64_t M, int64_t Nc, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    ProfileScope p(m.profile.matmul);
    gemm_f32(ta, tb, M, Nc, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  void norm1(int64_t l) {
    ProfileScope p(m.profile.elementwise);
    rmsnorm_forward(mat(x(l), N, m.d), param(m.layer[l].attn_norm), m.eps,
                    mat(w.normed.as<float>(), N, m.d));
  }
  void norm2(int64_t l) {
    ProfileScope p(m.profile.elementwise);
    rmsnorm_forward(mat(w.x2.at(l), N, m.d), param(m.layer[l].mlp_norm), m.eps,
                    mat(w.normed.as<float>(), N, m.d));
  }
  TensorView heads(float* qkv, int64_t first_col, int64_t n_heads) const {  // [N, n_heads, D]
    return TensorView::strided(qkv + first_col, DType::f32, {N, n_heads, m.D},
                               {m.qkv_cols, m.D, 1});
  }
  // qkv = h1 Wqkv^T, then RoPE on q and k. Needs normed = h1.
  void project_qkv(int64_t l) {
    float* qkv = w.qkv.at(l);
    matmul(false, true, N, m.qkv_cols, m.d, 1.0f, w.normed.as<float>(), m.d,
             param(m.layer[l].q), m.d, 0.0f, qkv, m.qkv_cols);
    ProfileScope p(m.profile.elementwise);
    rope_forward(heads(qkv, 0, m.Hl + m.Gl), w.rope_cos.as<float>(),
                 w.rope_sin.as<float>());  // q and k heads are adjacent
  }
  AttentionArgs attention_args(int64_t l) const {
    AttentionArgs a;
    m.attention_args(w.qkv.at(l), a);
    return a;
  }
  TensorView context_view(float* ctx) const {  // [B, S, Hl, D]
    return TensorView(ctx, DType::f32, {b.batch, b.seq_local, m.Hl, m.D});
  }
  void attend(int64_t l) {
    ProfileScope p(m.profile.attention);
    m.attention->forward(attention_args(l), context_view(w.ctx.at(l)), w.lse.at(l));
  }
  // x2 = x + ctx Wo^T (row-parallel: partial sums all-reduced over tp).
  void out_proj(int64_t l) {
    float* x2 = w.x2.at(l);
    matmul(false, true, N, m.d, m.Hl * m.D, 1.0f, w.ctx.at(l), m.Hl * m.D,
             param(m.layer[l].o), m.Hl * m.D, 0.0f, x2, m.d);
    m.tp_all_reduce(x2, N * m.d);
    add_into(x2, x(l));
  }
  // gu = h2 Wgu^T. Needs normed = h2.
  void mlp_in(int64_t l) {
    matmul(false, true, N, 2 * m.Fl, m.d, 1.0f, w.normed.as<float>(), m.d,
             param(m.layer[l].gate), m.d, 0.0f, w.gu.at(l), 2 * m.Fl);
  }
  TensorView gate(int64_t l) const {
    return TensorView::strided(w.gu.at(l), DType::f32, {N, m.Fl}, {2 * m.Fl, 1});
  }
  TensorView up(int64_t l) const {
    return TensorView::strided(w.gu.at(l) + m.Fl, DType::f32, {N, m.Fl}, {2 * m.Fl, 1});
  }
  void swiglu(int64_t l) {
    ProfileScope p(m.profile.elementwise);
    swiglu_forward(gate(l), up(l), mat(w.act.as<float>(), N, m.Fl));
  }
  // x[l+1] = x2 + act Wdown^T (row-parallel).
  void mlp_out(int64_t l) {
    float* y = x(l + 1);
    matmul(false, true, N, m.d, m.Fl, 1.0f, w.act.as<float>(), m.Fl, param(m.layer[l].down),
             m.Fl, 0.0f, y, m.d);
    m.tp_all_reduce(y, N * m.d);
    add_into(y, w.x2.at(l));
  }
  void add_into(float* dst, const float* src) const {
    ProfileScope p(m.profile.elementwise);
    const int64_t n = N * m.d;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  void forward_layer(int64_t l) {
    norm1(l);
    project_qkv(l);
    attend(l);
    out_proj(l);
    norm2(l);
    mlp_in(l);
    swiglu(l);
    mlp_out(l);
  }

  // Final norm, LM head and cross-entropy, a chunk of rows at a time; with
  // training, the LM head and final norm gradients and dresid = dL/dx[L].
  double loss_head(bool training, float grad_scale) {
    ProfileScope p(m.profile.loss);
    const int64_t R = w.head_in.size() / (4 * m.d);
    float* W = param(m.lm_head);
    float* x_last = x(m.L);
    float* hin = w.head_in.as<float>();
    float* z = w.logits.as<float>();
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += R) {
      const int64_t rows = std::min(R, N - r0);
      rmsnorm_forward(mat(x_last + r0 * m.d, rows, m.d), param(m.final_norm), m.eps,
                      mat(hin, rows, m.d));
      gemm_f32(false, true, rows, m.V, m.d, 1.0f, hin, m.d, W, m.d, 0.0f, z, m.V);
      TensorView zv = mat(z, rows, m.V);
      total += cross_entropy(zv, b.targets + r0, b.loss_weights ? b.loss_weights + r0 : nullptr,
                             grad_scale, training ? &zv : nullptr);
      if (!training) continue;
      float* dhin = w.head_dx.as<float>();
      gemm_f32(true, false, m.V, m.d, rows, 1.0f, z, m.V, hin, m.d, 1.0f, grad(m.lm_head), m.d);
      gemm_f32(false, false, rows, m.d, m.V, 1.0f, z, m.V, W, m.d, 0.0f, dhin, m.d);
      rmsnorm_backward(mat(x_last + r0 * m.d, rows, m.d), param(m.final_norm), m.eps,
                       mat(dhin, rows, m.d), mat(w.dresid.as<float>() + r0 * m.d, rows, m.d),
                       grad(m.final_norm));
    }
    return total;
  }

  // Recomputes what layer l did not save, then backpropagates dresid
  // (dL/dx[l+1] on entry, dL/dx[l] on exit).
  void backward_layer(int64_t l) {
    const LlamaModel::Impl::LayerIdx& li = m.layer[l];
    if (!m.save.qkv) { norm1(l); project_qkv(l); }
    if (!m.save.context) attend(l);
    if (!m.save.out_proj) out_proj(l);
    norm2(l);
    if (!m.save.mlpwi) mlp_in(l);
    swiglu(l);

    float* dy = w.dresid.as<float>();  // [N, d]
    float* act = w.act.as<float>();    // [N, Fl]
    float* dnorm = w.dnorm.as<float>();
    // MLP: down projection, SwiGLU (in place over gu), gate/up projection.
    matmul(true, false, m.d, m.Fl, N, 1.0f, dy, m.d, act, m.Fl, 1.0f, grad(li.down), m.Fl);
    matmul(false, false, N, m.Fl, m.d, 1.0f, dy, m.d, param(li.down), m.Fl, 0.0f, act, m.Fl);
    elementwise([&] { swiglu_backward(gate(l), up(l), mat(act, N, m.Fl), gate(l), up(l)); });
    float* dgu = w.gu.at(l);
    matmul(true, false, 2 * m.Fl, m.d, N, 1.0f, dgu, 2 * m.Fl, w.normed.as<float>(), m.d, 1.0f,
             grad(li.gate), m.d);
    matmul(false, false, N, m.d, 2 * m.Fl, 1.0f, dgu, 2 * m.Fl, param(li.gate), m.d, 0.0f,
             dnorm, m.d);
    m.tp_all_reduce(dnorm, N * m.d);
    elementwise([&] {
      rmsnorm_backward(mat(w.x2.at(l), N, m.d), param(li.mlp_norm), m.eps, mat(dnorm, N, m.d),
                       mat(dy, N, m.d), grad(li.mlp_norm));  // dy is now dL/dx2
    });

    // Attention: output projection, attention, RoPE, q/k/v projection.
    const int64_t hd = m.Hl * m.D;
    float* ctx = w.ctx.at(l);
    float* dctx = w.dctx.as<float>();
    matmul(true, false, m.d, hd, N, 1.0f, dy, m.d, ctx, hd, 1.0f, grad(li.o), hd);
    matmul(false, false, N, hd, m.d, 1.0f, dy, m.d, param(li.o), hd, 0.0f, dctx, hd);
    float* dqkv = w.dqkv.as<float>();
    AttentionArgs a = attention_args(l);
    AttentionArgs da;
    m.attention_args(dqkv, da);
    {
      ProfileScope p(m.profile.attention);
      m.attention->backward(a, context_view(ctx), w.lse.at(l), context_view(dctx), da.q, da.k,
                            da.v);
    }
    elementwise([&] {
      rope_backward(heads(dqkv, 0, m.Hl + m.Gl), w.rope_cos.as<float>(), w.rope_sin.as<float>());
    });
    norm1(l);  // normed = h1 again
    matmul(true, false, m.qkv_cols, m.d, N, 1.0f, dqkv, m.qkv_cols, w.normed.as<float>(), m.d,
             1.0f, grad(li.q), m.d);
    matmul(false, false, N, m.d, m.qkv_cols, 1.0f, dqkv, m.qkv_cols, param(li.q), m.d, 0.0f,
             dnorm, m.d);
    m.tp_all_reduce(dnorm, N * m.d);
    elementwise([&] {
      rmsnorm_backward(mat(x(l), N, m.d), param(li.attn_norm), m.eps, mat(dnorm, N, m.d),
                       mat(dy, N, m.d), grad(li.attn_norm));  // dy is now dL/dx[l]
    });
  }
};

void check_batch(const Batch& b) {
  check_shape(b.batch > 0 && b.seq_local > 0, "model: batch and seq_local must be > 0");
  check_shape(b.tokens && b.targets && b.positions,
              "model: batch needs tokens, targets and positions");
}

}  // namespace

// Allocates (or reuses) the activation workspace for this batch size.
static Workspace& workspace_for(LlamaModel::Impl& m, int64_t N, bool training) {
  // A training workspace serves evaluation too (it has every buffer).
  if (m.ws && m.ws->tokens == N && (m.ws->training || !training)) return *m.ws;
  m.ws.reset();
  auto w = std::make_unique<Workspace>();
  w->tokens = N;
  w->training = training;
  w->save = training ? m.save : SaveSet{};
  const int64_t L = m.L, d = m.d;
  for (int64_t l = 0; l <= L; ++l) w->x.push_back(w->make("x (layer input)", N * d));
  w->qkv = w->make_per_layer("qkv_proj", w->save.qkv, L, N * m.qkv_cols);
  w->ctx = w->make_per_layer("context", w->save.context, L, N * m.Hl * m.D);
  w->lse = w->make_per_layer("context lse", w->save.context, L, N * m.Hl);
  w->x2 = w->make_per_layer("out_proj residual", w->save.out_proj, L, N * d);
  w->gu = w->make_per_layer("mlpwi", w->save.mlpwi, L, N * 2 * m.Fl);
  w->normed = w->make("normed", N * d);
  w->act = w->make("mlp activation", N * m.Fl);
  w->rope_cos = w->make("rope cos", N * m.D / 2);
  w->rope_sin = w->make("rope sin", N * m.D / 2);
  if (training) {
    w->dresid = w->make("d residual", N * d);
    w->dnorm = w->make("d normed", N * d);
    w->dctx = w->make("d context", N * m.Hl * m.D);
    w->dqkv = w->make("d qkv", N * m.qkv_cols);
  }
  // Loss chunk: rows x vocab logits under 64 MiB unless asked otherwise.
  int64_t R = m.loss_chunk_rows > 0 ? m.loss_chunk_rows
                                    : std::max<int64_t>(1, (int64_t{64} << 20) / (4 * m.V));
  R = std::min(R, N);
  w->head_in = w->make("loss chunk hidden", R * d);
  w->head_dx = w->make("loss chunk d hidden", training ? R * d : 0);
  w->logits = w->make("loss chunk logits", R * m.V);
  m.ws = std::move(w);
  return *m.ws;
}

static LossStats run(LlamaModel::Impl& m, const std::vector<NamedTensor>& P,
                     const std::vector<NamedTensor>& Gr, const Batch& b, bool training,
                     float grad_scale) {
  check_batch(b);
  const int64_t N = b.batch * b.seq_local;
  Workspace& w = workspace_for(m, N, training);
  m.peak_bytes = w.bytes;
  m.batch = &b;
  Step s{m, P, Gr, w, b, N};
  m.profile = StepProfile{};

  s.elementwise([&] {
    rope_table(m.rope, m.D, b.positions, N, w.rope_cos.as<float>(), w.rope_sin.as<float>());
    embedding_forward(b.tokens, N, s.param(m.embed), m.V, mat(s.x(0), N, m.d));
  });
  for (int64_t l = 0; l < m.L; ++l) s.forward_layer(l);

  LossStats out;
  if (training) std::memset(w.dresid.data(), 0, w.dresid.size());
  out.loss_sum = s.loss_head(training, grad_scale);
  if (b.loss_weights) {
    for (int64_t i = 0; i < N; ++i) out.weight_sum += b.loss_weights[i];
  } else {
    out.weight_sum = static_cast<double>(N);
  }
  if (!training) return out;

  for (int64_t l = m.L - 1; l >= 0; --l) s.backward_layer(l);
  s.elementwise([&] {
    embedding_backward(b.tokens, N, mat(w.dresid.as<float>(), N, m.d), s.grad(m.embed), m.V);
  });
  m.batch = nullptr;
  return out;
}

LossStats LlamaModel::forward_backward(const Batch& batch, float grad_scale) {
  return run(*impl_, params_, grads_, batch, true, grad_scale);
}

LossStats LlamaModel::forward(const Batch& batch) {
  return run(*impl_, params_, grads_, batch, false, 1.0f);
}

}  // namespace longctx
