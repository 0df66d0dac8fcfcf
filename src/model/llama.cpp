// The Llama 3 decoder: forward, backward with rematerialisation, chunked loss.
// See llama.h for the math and the API; this file is organised as
//   parameters (layout, names, init) -> activation workspace (what each remat
//   policy keeps) -> layer forward pieces -> loss head -> backward.
#include "model/llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "comm/mesh.h"
#include "core/device.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "model/offload.h"
#include "model/sharded_parameters.h"
#include "model/step_position.h"

namespace longctx {

namespace {

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

// ---- implementation state ------------------------------------------------------------

// The buffers of activation_table(), each `copies` times; a tensor the
// policy does not save has one copy that every layer overwrites (and
// backward recomputes into).
struct Workspace {
  int64_t tokens = 0;
  bool training = false;
  SaveSet save;
  size_t bytes = 0;
  int64_t loss_rows = 0;  // rows of one loss chunk
  std::array<std::vector<Buffer>, kNumActivations> bufs;
  std::array<DType, kNumActivations> dtype{};
  std::array<bool, kNumActivations> per_chunk{};  // ActivationBuffer::per_chunk
  int64_t rope_r0 = 0, rope_n = 0;  // the rows whose RoPE cos and sin the tables hold

  void* at(Activation a, int64_t layer = 0) const {
    const std::vector<Buffer>& v = bufs[static_cast<int>(a)];
    return v[v.size() > 1 ? layer % v.size() : 0].data();  // offloaded: staging slot layer % slots
  }
  float* f32(Activation a, int64_t layer = 0) const {
    check_shape(dtype[static_cast<int>(a)] == DType::f32, "model: an fp32 buffer was expected");
    return static_cast<float*>(at(a, layer));
  }
  // Rows [r0, r0 + rows) of the buffer seen as [*, cols], in its dtype.
  TensorView rows(Activation a, int64_t layer, int64_t cols, int64_t r0, int64_t rows) const {
    const DType t = dtype[static_cast<int>(a)];
    char* base = static_cast<char*>(at(a, layer)) + r0 * cols * static_cast<int64_t>(dtype_size(t));
    return TensorView(base, t, {rows, cols});
  }
  size_t size(Activation a) const { return bufs[static_cast<int>(a)][0].size(); }
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
  int64_t layer_token_chunk;  // ModelOptions::layer_token_chunk
  DType dtype;  // activations and GEMM operands
  bool seq_parallel = false;  // residual stream sharded over tp along the tokens (llama.h)

  std::unique_ptr<ShardedParameters> store;  // parameters, gradients, FSDP gathers
  struct LayerIdx { int attn_norm, q, o, mlp_norm, gate, down; };
  std::vector<LayerIdx> layer;  // indices into params_/grads_ (k, v follow q; up follows gate)
  int embed = -1, final_norm = -1, lm_head = -1;

  std::unique_ptr<CpAttention> attention;
  std::unique_ptr<Workspace> ws;
  std::unique_ptr<ActivationOffload> offload;  // null: nothing offloaded
  size_t peak_bytes = 0;
  StepProfile profile;
  const Batch* batch = nullptr;  // the batch of the current call

  // Row-parallel outputs and column-parallel input gradients are partial sums
  // over tp ranks. Without a mesh in the options the model owns a
  // single-process one: one code path for one rank and many.
  std::unique_ptr<Mesh> own_mesh;
  const Mesh* mesh = nullptr;
  template <typename T>  // float or double
  void tp_all_reduce(T* data, int64_t n) {
    if (tp == 1) return;
    Timer t;
    mesh->tp().all_reduce_sum(data, static_cast<size_t>(n));
    profile.tp_comm += t.seconds();
  }
  // Sequence parallelism: each tp rank's block of rows, in tp-rank order.
  void tp_all_gather(const void* local, void* full, int64_t bytes_per_rank) {
    Timer t;
    mesh->tp().all_gather(local, full, static_cast<size_t>(bytes_per_rank));
    profile.tp_comm += t.seconds();
  }
  void tp_reduce_scatter(const float* full, float* local, int64_t count_per_rank) {
    Timer t;
    mesh->tp().reduce_scatter_sum(full, local, static_cast<size_t>(count_per_rank));
    profile.tp_comm += t.seconds();
  }

  // ---- layer pieces (forward; backward reuses them to recompute) ----
  // q, k, v views of a fused [N, qkv_cols] buffer of dtype t.
  void attention_args(void* qkv, DType t, AttentionArgs& a) const;
};

void LlamaModel::Impl::attention_args(void* qkv, DType t, AttentionArgs& a) const {
  const int64_t B = batch->batch, S = batch->seq_local;
  char* base = static_cast<char*>(qkv);
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  // Strided views straight out of the fused projection: no transposes.
  a.q = TensorView::strided(base, t, {B, S, Hl, D}, {S * qkv_cols, qkv_cols, D, 1});
  a.k = TensorView::strided(base + Hl * D * e, t, {B, S, Gl, D}, {S * qkv_cols, qkv_cols, D, 1});
  a.v = TensorView::strided(base + (Hl + Gl) * D * e, t, {B, S, Gl, D}, {S * qkv_cols, qkv_cols, D, 1});
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
  if (!options.mesh) m.own_mesh = std::make_unique<Mesh>(Mesh::single());
  m.mesh = options.mesh ? options.mesh : m.own_mesh.get();
  m.tp = m.mesh->shape().tp;
  m.tp_rank = m.mesh->tp_rank();
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
  m.save = save_set_for(options.remat, options.custom_save, options.custom_offload);
  if (std::find(m.save.offload.begin(), m.save.offload.end(), true) != m.save.offload.end())
    m.offload = std::make_unique<ActivationOffload>(m.save, c.num_layers, options.offload_target, options.offload_dir);
  m.impl = options.impl;
  m.mask = options.mask;
  m.loss_chunk_rows = options.loss_chunk_rows;
  if (options.layer_token_chunk < 0) throw ConfigError("model: layer_token_chunk must be >= 0");
  m.layer_token_chunk = options.layer_token_chunk;
  m.dtype = options.dtype;
  m.seq_parallel = options.sequence_parallel;
  if (m.seq_parallel && tp == 1)
    throw ConfigError("model: tensor_sequence_parallelism needs ici_tensor_parallelism > 1");
  // Local tokens in, local tokens out: the strategy hides the cp group
  // (with cp == 1 it is the kernel itself).
  m.attention = make_cp_attention(options.cp_strategy, *m.mesh, options.cp_options);

  // The parameter table (core/model_shape.h), in its order: fused groups
  // (q,k,v and gate,up) are adjacent so that one GEMM computes each group.
  const std::vector<ParameterSpec> specs = parameter_table(c);
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < specs.size(); ++i)
      if (specs[i].name == name) return static_cast<int>(i);
    throw Error("model: no parameter " + name);
  };
  for (int64_t l = 0; l < m.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m.layer.push_back({index_of(p + "input_layernorm.weight"), index_of(p + "self_attn.q_proj.weight"),
                       index_of(p + "self_attn.o_proj.weight"), index_of(p + "post_attention_layernorm.weight"),
                       index_of(p + "mlp.gate_proj.weight"), index_of(p + "mlp.down_proj.weight")});
  }
  m.embed = index_of("model.embed_tokens.weight");
  m.final_norm = index_of("model.norm.weight");
  m.lm_head = c.tie_embeddings ? m.embed : index_of("lm_head.weight");
  m.store = std::make_unique<ShardedParameters>(c, tp, m.mesh->shards(), m.dtype, options.parameter_tier,
                                                options.offload_dir);
  const bool whole = m.store->shards() == 1;  // views into the flat vector exist only unsharded
  int64_t offset = 0;
  for (const ParameterSpec& s : specs) {
    const auto [r, k] = s.local_shape(tp);
    NamedTensor p;
    p.name = s.name;
    p.full_shape = {s.rows, s.cols};
    p.split = s.split;
    p.split_offset = s.split == TpSplit::dim0   ? m.tp_rank * r
                     : s.split == TpSplit::dim1 ? m.tp_rank * k
                                                : 0;
    p.offset = offset;
    NamedTensor g = p;
    float* pp = whole ? m.store->param_store().data() + offset : nullptr;
    float* gp = whole ? m.store->grads().data() + offset : nullptr;
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
  StateStore& store = impl_->store->param_store();
  check_shape(store.data() != nullptr,
              "flat_parameters: the parameters live on disk (state_offload_target: disk); read them with "
              "parameter_store()");
  return {store.data(), static_cast<size_t>(store.size())};
}
StateStore& LlamaModel::parameter_store() const { return impl_->store->param_store(); }
void LlamaModel::load_flat_parameters(std::span<const float> flat) {
  ShardedParameters& store = *impl_->store;
  for (size_t u = 0; u < store.units().size(); ++u)
    store.keep_block(static_cast<int>(u), flat.data() + store.units()[u].begin);
}
std::span<float> LlamaModel::flat_gradients() const { return impl_->store->grads(); }
int64_t LlamaModel::shards() const { return impl_->store->shards(); }
int64_t LlamaModel::tp() const { return impl_->tp; }
std::vector<ShardSegment> LlamaModel::shard_segments() const { return impl_->store->segments(); }
std::vector<float> LlamaModel::unshard(std::span<const float> shard) const { return impl_->store->unshard(shard); }
void LlamaModel::reshard(std::span<const float> flat, std::span<float> shard) const {
  impl_->store->reshard(flat, shard);
}

void LlamaModel::init(uint64_t seed) {
  if (Device::current().is_meta()) return;  // counted (core/device.h): no values to make
  // A unit at a time: its full values, of which this rank keeps its block.
  ShardedParameters& store = *impl_->store;
  std::vector<float> values;
  for (size_t u = 0; u < store.units().size(); ++u) {
    const ParameterUnit& unit = store.units()[u];
    values.assign(static_cast<size_t>(unit.elements), 0.0f);
    for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
      const NamedTensor& p = params_[static_cast<size_t>(i)];
      float* data = values.data() + (p.offset - unit.begin);
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
    store.keep_block(static_cast<int>(u), values.data());
  }
}

void LlamaModel::zero_gradients() {
  const std::span<float> g = impl_->store->grads();
  fill_f32(g.data(), static_cast<int64_t>(g.size()), 0.0f);
}

size_t LlamaModel::peak_activation_bytes() const { return impl_->peak_bytes; }
const StepProfile& LlamaModel::last_step_profile() const { return impl_->profile; }

// ---- forward / backward -------------------------------------------------------------

namespace {

// Adds the seconds of its scope to one StepProfile field.
// (Not on a meta device: a counted step has no time, and the clock reads
// would be most of its cost.)
class ProfileScope {
 public:
  explicit ProfileScope(double& field) : field_(Device::current().is_meta() ? nullptr : &field) {
    if (field_) start_ = std::chrono::steady_clock::now();
  }
  ~ProfileScope() {
    if (field_) *field_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double* field_;
  std::chrono::steady_clock::time_point start_;
};

// A chunk of the rank's tokens that a layer's token-wise parts (norms,
// projections, SwiGLU, RoPE, residual adds) process at once
// (ModelOptions::layer_token_chunk): rows [r0, r0 + n) of this rank's
// residual stream. Its GEMM rows, `pieces` x n, are those rows of every tp
// rank with sequence parallelism (piece p: rows p Nr + r0 ... of the N;
// what the all-gather over tp assembles, in tp-rank order), else the same
// rows (one piece). Attention always sees all N rows.
struct Chunk {
  int64_t r0 = 0, n = 0, pieces = 1;
  int64_t rows() const { return pieces * n; }  // GEMM rows
};

// The pieces of a step, over the model's state. Kept in one place so that
// forward and the recomputation in backward run literally the same code.
//
// Buffers and a chunk's rows in them: residual-stream buffers (x,
// out_proj, normed, d_resid, d_normed) hold this rank's Nr rows or one
// chunk's n (ActivationBuffer::per_chunk); the others hold all N rows or
// one chunk's rows() (pieces in order). A chunk's rows of an all-N buffer
// are its pieces, apart with sequence parallelism, so what touches those
// buffers (q/k/v, context, dO, dq/dk/dv, a saved gate/up) runs piece by piece.
struct Step {
  LlamaModel::Impl& m;
  const std::vector<NamedTensor>& P;
  const std::vector<NamedTensor>& Gr;
  Workspace& w;
  const Batch& b;
  int64_t N;   // tokens of the batch: rows of the attention and of the tp-split GEMMs
  int64_t Nr;  // rows of the residual stream on this rank: N / tp with sequence parallelism, else N
  int64_t r0;  // the first of them in the batch
  int64_t Cr;  // residual rows of a chunk (Nr: one chunk)

  bool bf16_compute() const { return m.dtype == DType::bf16; }
  // The chunks of Cr rows, then the shorter rest (counted alike on a meta device: core/device.h).
  template <typename F>
  void for_each_chunk(F&& f) {
    const int64_t pieces = m.seq_parallel ? m.tp : 1, whole = Nr / Cr, rest = Nr % Cr;
    for_each_alike(whole, [&](int64_t i) { f(Chunk{i * Cr, Cr, pieces}); });
    if (rest > 0) f(Chunk{whole * Cr, rest, pieces});
  }
  Chunk all() const { return Chunk{0, Nr, m.seq_parallel ? m.tp : 1}; }
  // Parameter i while its unit is gathered (model/sharded_parameters.h).
  float* param(int i) const { return m.store->param(i); }  // fp32 master (norms, embedding lookup)
  float* grad(int i) const { return m.store->grad(i); }
  // Weight i as a GEMM operand: its bf16 copy or the master.
  const void* weight(int i) const { return m.store->weight(i); }
  bool per_chunk(Activation a) const { return w.per_chunk[static_cast<int>(a)]; }
  // Piece p of chunk c in activation a of layer l seen as [*, cols], in its dtype.
  TensorView piece(Activation a, int64_t l, int64_t cols, Chunk c, int64_t p) const {
    return w.rows(a, l, cols, per_chunk(a) ? p * c.n : p * Nr + c.r0, c.n);
  }
  // All rows of chunk c as [rows(), cols]: in a one-chunk buffer, with one
  // piece, or for the one chunk of all rows (its pieces are adjacent).
  TensorView gathered(Activation a, int64_t l, int64_t cols, Chunk c) const {
    check_shape(per_chunk(a) || c.pieces == 1 || c.n == Nr, "model: a chunk's pieces are apart in this buffer");
    return w.rows(a, l, cols, per_chunk(a) ? 0 : c.r0, c.rows());
  }
  // Residual-stream activation a (x, out_proj, normed, d_resid, d_normed) of
  // layer l: this rank's rows of chunk c.
  TensorView resid(Activation a, int64_t l, Chunk c) const {
    return w.rows(a, l, m.d, per_chunk(a) ? 0 : c.r0, c.n);
  }
  TensorView x(int64_t l, Chunk c) const { return resid(Activation::x, l, c); }
  float* staging(int64_t cols, Chunk c, int64_t p) const {  // the fp32 GEMM staging (bf16)
    return piece(Activation::matmul_out, 0, cols, c, p).f32();
  }
  // Where an fp32 GEMM output of piece p goes before its consumer: the
  // activation itself (fp32 compute) or the fp32 staging buffer (bf16
  // compute: it is then rotated, reduced over tp and/or rounded into the
  // activation).
  float* gemm_out(Activation a, int64_t l, int64_t cols, Chunk c, int64_t p) const {
    return bf16_compute() ? staging(cols, c, p) : piece(a, l, cols, c, p).f32();
  }
  // Same for a residual-stream output (this rank's n rows).
  float* resid_gemm_out(Activation a, int64_t l, Chunk c) const {
    return bf16_compute() ? staging(m.d, c, 0) : resid(a, l, c).f32();
  }
  // An fp32 gradient [n, cols] (piece p of a chunk) as a GEMM operand:
  // itself, or its bf16 copy at piece p of the gradient operand buffer.
  const void* grad_operand(float* g, int64_t cols, Chunk c, int64_t p) const {
    if (!bf16_compute()) return g;
    const TensorView op = piece(Activation::grad_operand, 0, cols, c, p);
    convert(mat(g, c.n, cols), op);
    return op.data;
  }
  // The normed input of chunk c's rows(), operand of the column-parallel GEMMs.
  const char* normed_operand(Chunk c) const {
    return static_cast<const char*>(gathered(m.seq_parallel ? Activation::normed_gathered : Activation::normed, 0,
                                             m.d, c).data);
  }
  const char* normed_operand(Chunk c, int64_t p) const {
    return normed_operand(c) + p * c.n * m.d * static_cast<int64_t>(dtype_size(m.dtype));
  }
  // dL/dx of chunk c's rows() as a GEMM operand (sequence parallelism:
  // all-gathered in fp32 from the ranks' rows into tp_partial, free until
  // the next GEMM that needs a reduction).
  const char* resid_grad_operand(Chunk c) {
    float* dy = resid(Activation::d_resid, 0, c).f32();
    if (m.seq_parallel) {
      float* all = gathered(Activation::tp_partial, 0, m.d, c).f32();
      m.tp_all_gather(dy, all, c.n * m.d * 4);
      dy = all;
    }
    Chunk whole = c;  // all rows() as one piece
    whole.n = c.rows();
    whole.pieces = 1;
    return static_cast<const char*>(grad_operand(dy, m.d, whole, 0));
  }
  // Row-parallel outputs and column-parallel input gradients are [rows(), d]
  // fp32 partial sums over tp: the GEMMs write them to partial_sums(dst),
  // and sum_over_tp(dst) leaves this rank's n rows of the sum in dst
  // (all-reduce in place, or with sequence parallelism a reduce-scatter:
  // piece q of the sums is rank q's rows).
  float* partial_sums(float* dst, Chunk c) const {
    return m.seq_parallel ? gathered(Activation::tp_partial, 0, m.d, c).f32() : dst;
  }
  void sum_over_tp(float* dst, Chunk c) {
    if (m.seq_parallel)
      m.tp_reduce_scatter(gathered(Activation::tp_partial, 0, m.d, c).f32(), dst, c.n * m.d);
    else
      m.tp_all_reduce(dst, c.n * m.d);
  }
  // RoPE's cos and sin of chunk c's rows(), piece by piece (computed when
  // the chunk changes: once per call with one chunk).
  std::pair<const float*, const float*> rope_rows(Chunk c) {
    float* cos = gathered(Activation::rope_cos, 0, m.D / 2, c).f32();
    float* sin = gathered(Activation::rope_sin, 0, m.D / 2, c).f32();
    if (w.rope_r0 != c.r0 || w.rope_n != c.n) {
      for (int64_t p = 0; p < c.pieces; ++p)
        rope_table(m.rope, m.D, b.positions + p * Nr + c.r0, c.n, cos + p * c.n * m.D / 2, sin + p * c.n * m.D / 2);
      w.rope_r0 = c.r0;
      w.rope_n = c.n;
    }
    return {cos, sin};
  }
  // RoPE forward (sign +1) or backward (-1) on piece p's q and k heads of a [n, qkv_cols] fp32 buffer.
  void rope_piece(float* qkv, Chunk c, int64_t p, bool forward) {
    const auto [cos, sin] = rope_rows(c);
    const TensorView qk = TensorView::strided(qkv, DType::f32, {c.n, m.Hl + m.Gl, m.D}, {m.qkv_cols, m.D, 1});
    const int64_t off = p * c.n * m.D / 2;
    if (forward)
      rope_forward(qk, cos + off, sin + off);
    else
      rope_backward(qk, cos + off, sin + off);
  }

  template <typename F>
  void elementwise(F&& f) {
    ProfileScope p(m.profile.elementwise);
    f();
  }
  // C (fp32) = alpha op(A) op(B) + beta C; A and B in the compute dtype.
  void matmul(bool ta, bool tb, int64_t M, int64_t Nc, int64_t K, float alpha, const void* A,
              int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    ProfileScope p(m.profile.matmul);
    gemm(m.dtype, ta, tb, M, Nc, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  void norm1(int64_t l, Chunk c) { norm(x(l, c), m.layer[l].attn_norm, c); }
  void norm2(int64_t l, Chunk c) { norm(resid(Activation::out_proj, l, c), m.layer[l].mlp_norm, c); }
  // normed = rmsnorm(in), then (sequence parallelism) all-gathered over tp.
  void norm(const TensorView& in, int weight, Chunk c) {
    const TensorView local = resid(Activation::normed, 0, c);
    elementwise([&] { rmsnorm_forward(in, param(weight), m.eps, local); });
    if (m.seq_parallel)
      m.tp_all_gather(local.data, gathered(Activation::normed_gathered, 0, m.d, c).data,
                      local.numel() * static_cast<int64_t>(dtype_size(local.dtype)));
  }
  // qkv = h1 Wqkv^T, then RoPE on q and k (in fp32, before any rounding). Needs normed = h1.
  void project_qkv(int64_t l, Chunk c) {
    for (int64_t p = 0; p < c.pieces; ++p) {
      float* out = gemm_out(Activation::qkv, l, m.qkv_cols, c, p);
      matmul(false, true, c.n, m.qkv_cols, m.d, 1.0f, normed_operand(c, p), m.d, weight(m.layer[l].q), m.d, 0.0f,
             out, m.qkv_cols);
      ProfileScope s(m.profile.elementwise);
      rope_piece(out, c, p, true);
      if (bf16_compute()) convert(mat(out, c.n, m.qkv_cols), piece(Activation::qkv, l, m.qkv_cols, c, p));
    }
  }
  AttentionArgs attention_args(int64_t l) const {
    AttentionArgs a;
    m.attention_args(w.at(Activation::qkv, l), w.dtype[static_cast<int>(Activation::qkv)], a);
    return a;
  }
  // [B, S, Hl, D] view of a context-shaped buffer of all N rows.
  TensorView context_view(Activation a, int64_t l) const {
    return TensorView(w.at(a, l), w.dtype[static_cast<int>(a)], {b.batch, b.seq_local, m.Hl, m.D});
  }
  void attend(int64_t l) {
    ProfileScope p(m.profile.attention);
    m.attention->forward(attention_args(l), context_view(Activation::context, l),
                         w.f32(Activation::context_lse, l));
  }
  // x2 = x + ctx Wo^T (row-parallel: partial sums reduced over tp, in fp32).
  void out_proj(int64_t l, Chunk c) {
    const int64_t hd = m.Hl * m.D;
    float* o = resid_gemm_out(Activation::out_proj, l, c);
    float* sums = partial_sums(o, c);
    for (int64_t p = 0; p < c.pieces; ++p)
      matmul(false, true, c.n, m.d, hd, 1.0f, piece(Activation::context, l, hd, c, p).data, hd,
             weight(m.layer[l].o), hd, 0.0f, sums + p * c.n * m.d, m.d);
    sum_over_tp(o, c);
    elementwise([&] { residual_add(x(l, c), mat(o, c.n, m.d), resid(Activation::out_proj, l, c)); });
  }
  // gu = h2 Wgu^T. Needs normed = h2.
  void mlp_in(int64_t l, Chunk c) {
    for (int64_t p = 0; p < c.pieces; ++p) {
      float* out = gemm_out(Activation::mlpwi, l, 2 * m.Fl, c, p);
      matmul(false, true, c.n, 2 * m.Fl, m.d, 1.0f, normed_operand(c, p), m.d, weight(m.layer[l].gate), m.d, 0.0f,
             out, 2 * m.Fl);
      if (bf16_compute())
        elementwise([&] { convert(mat(out, c.n, 2 * m.Fl), piece(Activation::mlpwi, l, 2 * m.Fl, c, p)); });
    }
  }
  // Gate (first_col 0) or up (Fl) of piece p: [n, Fl].
  TensorView mlpwi_half(int64_t l, Chunk c, int64_t p, int64_t first_col) const {
    const TensorView gu = piece(Activation::mlpwi, l, 2 * m.Fl, c, p);
    char* base = static_cast<char*>(gu.data) + first_col * static_cast<int64_t>(dtype_size(gu.dtype));
    return TensorView::strided(base, gu.dtype, {c.n, m.Fl}, {2 * m.Fl, 1});
  }
  TensorView gate(int64_t l, Chunk c, int64_t p) const { return mlpwi_half(l, c, p, 0); }
  TensorView up(int64_t l, Chunk c, int64_t p) const { return mlpwi_half(l, c, p, m.Fl); }
  void swiglu(int64_t l, Chunk c) {
    ProfileScope s(m.profile.elementwise);
    for (int64_t p = 0; p < c.pieces; ++p)
      swiglu_forward(gate(l, c, p), up(l, c, p), piece(Activation::mlp_act, 0, m.Fl, c, p));
  }
  // x[l+1] = x2 + act Wdown^T (row-parallel).
  void mlp_out(int64_t l, Chunk c) {
    float* o = resid_gemm_out(Activation::x, l + 1, c);
    matmul(false, true, c.rows(), m.d, m.Fl, 1.0f, gathered(Activation::mlp_act, 0, m.Fl, c).data, m.Fl,
           weight(m.layer[l].down), m.Fl, 0.0f, partial_sums(o, c), m.d);
    sum_over_tp(o, c);
    elementwise([&] { residual_add(resid(Activation::out_proj, l, c), mat(o, c.n, m.d), x(l + 1, c)); });
  }

  void forward_layer(int64_t l) {
    for_each_chunk([&](Chunk c) {
      norm1(l, c);
      project_qkv(l, c);
    });
    attend(l);
    for_each_chunk([&](Chunk c) {
      out_proj(l, c);
      norm2(l, c);
      mlp_in(l, c);
      swiglu(l, c);
      mlp_out(l, c);
    });
  }

  // Final norm, LM head and cross-entropy, a chunk of rows at a time; with
  // training, the LM head and final norm gradients and dresid = dL/dx[L].
  // Logits, the loss and dlogits are fp32; dlogits is rounded to the compute
  // dtype only as an operand of the two backward GEMMs. token_losses: each
  // row's weighted loss, or nullptr. Over this rank's Nr rows (starting at
  // batch row s.r0): token_losses and the sum cover them only.
  double loss_head(bool training, float grad_scale, double* token_losses) {
    ProfileScope p(m.profile.loss);
    const int64_t R = w.loss_rows;
    float* z = w.f32(Activation::loss_logits);
    double total = 0.0;
    const int32_t* targets = b.targets + this->r0;
    const float* weights = b.loss_weights ? b.loss_weights + this->r0 : nullptr;
    // Chunks of R rows, then the shorter rest (counted alike on a meta device: core/device.h).
    const int64_t whole = Nr / R;
    auto chunk = [&](int64_t r0, int64_t rows) {
      const TensorView x_rows = w.rows(Activation::x, m.L, m.d, r0, rows);
      const TensorView hin = w.rows(Activation::loss_hidden, 0, m.d, 0, rows);
      rmsnorm_forward(x_rows, param(m.final_norm), m.eps, hin);
      matmul(false, true, rows, m.V, m.d, 1.0f, hin.data, m.d, weight(m.lm_head), m.d, 0.0f, z, m.V);
      TensorView zv = mat(z, rows, m.V);
      total += cross_entropy(zv, targets + r0, weights ? weights + r0 : nullptr,
                             grad_scale, training ? &zv : nullptr, token_losses ? token_losses + r0 : nullptr);
      if (!training) return;
      const void* dz = z;
      if (bf16_compute()) {
        const TensorView dz16 = w.rows(Activation::loss_d_logits, 0, m.V, 0, rows);
        convert(zv, dz16);
        dz = dz16.data;
      }
      float* dhin = w.f32(Activation::loss_d_hidden);
      matmul(true, false, m.V, m.d, rows, 1.0f, dz, m.V, hin.data, m.d, 1.0f, grad(m.lm_head), m.d);
      matmul(false, false, rows, m.d, m.V, 1.0f, dz, m.V, weight(m.lm_head), m.d, 0.0f, dhin, m.d);
      rmsnorm_backward(x_rows, param(m.final_norm), m.eps, mat(dhin, rows, m.d),
                       w.rows(Activation::d_resid, 0, m.d, r0, rows), grad(m.final_norm));
    };
    for_each_alike(whole, [&](int64_t i) { chunk(i * R, R); });
    if (Nr % R > 0) chunk(whole * R, Nr % R);
    return total;
  }

  // Recomputes what layer l did not save, then backpropagates dresid
  // (dL/dx[l+1] on entry, dL/dx[l] on exit), a chunk of rows at a time
  // around the attention, which needs all of dL/dcontext first. Gradients
  // of activations are fp32 GEMM outputs; the ones that feed GEMMs pass
  // through grad_operand().
  void backward_layer(int64_t l) {
    if (!m.save.qkv)
      for_each_chunk([&](Chunk c) {
        norm1(l, c);
        project_qkv(l, c);
      });
    if (!m.save.context) attend(l);
    for_each_chunk([&](Chunk c) { backward_mlp_and_out_proj(l, c); });
    // dO enters attention in the compute dtype, as O does (bf16: its rounded
    // copy, which is what ulysses sends).
    AttentionArgs a = attention_args(l);
    AttentionArgs da;
    m.attention_args(w.f32(Activation::d_qkv), DType::f32, da);
    {
      ProfileScope p(m.profile.attention);
      m.attention->backward(a, context_view(Activation::context, l), w.f32(Activation::context_lse, l),
                            context_view(Activation::d_context, 0), da.q, da.k, da.v);
    }
    for_each_chunk([&](Chunk c) { backward_qkv(l, c); });
  }

  // The MLP of chunk c (recomputed up to SwiGLU, then down projection,
  // SwiGLU in place over gu, gate/up projection, norm: dresid becomes
  // dL/dx2), then the attention's output projection: dL/dcontext of its rows.
  void backward_mlp_and_out_proj(int64_t l, Chunk c) {
    const LlamaModel::Impl::LayerIdx& li = m.layer[l];
    const int64_t g = c.rows(), e = static_cast<int64_t>(dtype_size(m.dtype));
    if (!m.save.out_proj) out_proj(l, c);
    norm2(l, c);
    if (!m.save.mlpwi) mlp_in(l, c);
    swiglu(l, c);

    float* dy = resid(Activation::d_resid, 0, c).f32();
    float* dnorm = resid(Activation::d_normed, 0, c).f32();
    const char* dy_op = resid_grad_operand(c);
    matmul(true, false, m.d, m.Fl, g, 1.0f, dy_op, m.d, gathered(Activation::mlp_act, 0, m.Fl, c).data, m.Fl, 1.0f,
           grad(li.down), m.Fl);
    // Over the activation once its gradient GEMM has read it.
    float* dact = bf16_compute() ? staging(m.Fl, c, 0) : gathered(Activation::mlp_act, 0, m.Fl, c).f32();
    matmul(false, false, g, m.Fl, m.d, 1.0f, dy_op, m.d, weight(li.down), m.Fl, 0.0f, dact, m.Fl);
    float* sums = partial_sums(dnorm, c);
    for (int64_t p = 0; p < c.pieces; ++p) {
      elementwise([&] {
        swiglu_backward(gate(l, c, p), up(l, c, p), mat(dact + p * c.n * m.Fl, c.n, m.Fl), gate(l, c, p),
                        up(l, c, p));
      });
      const void* dgu = piece(Activation::mlpwi, l, 2 * m.Fl, c, p).data;
      matmul(true, false, 2 * m.Fl, m.d, c.n, 1.0f, dgu, 2 * m.Fl, normed_operand(c, p), m.d, 1.0f, grad(li.gate),
             m.d);
      matmul(false, false, c.n, m.d, 2 * m.Fl, 1.0f, dgu, 2 * m.Fl, weight(li.gate), m.d, 0.0f,
             sums + p * c.n * m.d, m.d);
    }
    sum_over_tp(dnorm, c);
    elementwise([&] {
      rmsnorm_backward(resid(Activation::out_proj, l, c), param(li.mlp_norm), m.eps, mat(dnorm, c.n, m.d),
                       mat(dy, c.n, m.d), grad(li.mlp_norm));  // dy is now dL/dx2
    });

    const int64_t hd = m.Hl * m.D;
    dy_op = resid_grad_operand(c);
    for (int64_t p = 0; p < c.pieces; ++p) {
      const char* dy_p = dy_op + p * c.n * m.d * e;
      matmul(true, false, m.d, hd, c.n, 1.0f, dy_p, m.d, piece(Activation::context, l, hd, c, p).data, hd, 1.0f,
             grad(li.o), hd);
      float* dctx = gemm_out(Activation::d_context, 0, hd, c, p);
      matmul(false, false, c.n, hd, m.d, 1.0f, dy_p, m.d, weight(li.o), hd, 0.0f, dctx, hd);
      if (bf16_compute()) convert(mat(dctx, c.n, hd), piece(Activation::d_context, 0, hd, c, p));
    }
  }

  // RoPE, the q/k/v projection and the first norm of chunk c, after the
  // attention's backward: dresid becomes dL/dx[l].
  void backward_qkv(int64_t l, Chunk c) {
    const LlamaModel::Impl::LayerIdx& li = m.layer[l];
    norm1(l, c);  // normed = h1 again
    float* dnorm = resid(Activation::d_normed, 0, c).f32();
    float* sums = partial_sums(dnorm, c);
    for (int64_t p = 0; p < c.pieces; ++p) {
      float* dqkv = piece(Activation::d_qkv, 0, m.qkv_cols, c, p).f32();
      elementwise([&] { rope_piece(dqkv, c, p, false); });
      const void* dqkv_op = grad_operand(dqkv, m.qkv_cols, c, p);
      matmul(true, false, m.qkv_cols, m.d, c.n, 1.0f, dqkv_op, m.qkv_cols, normed_operand(c, p), m.d, 1.0f,
             grad(li.q), m.d);
      matmul(false, false, c.n, m.d, m.qkv_cols, 1.0f, dqkv_op, m.qkv_cols, weight(li.q), m.d, 0.0f,
             sums + p * c.n * m.d, m.d);
    }
    sum_over_tp(dnorm, c);
    elementwise([&] {
      rmsnorm_backward(x(l, c), param(li.attn_norm), m.eps, mat(dnorm, c.n, m.d), resid(Activation::d_resid, 0, c),
                       grad(li.attn_norm));  // dy is now dL/dx[l]
    });
  }
};

void check_batch(const Batch& b) {
  check_shape(b.batch > 0 && b.seq_local > 0, "model: batch and seq_local must be > 0");
  check_shape(b.tokens && b.targets && b.positions,
              "model: batch needs tokens, targets and positions");
}

}  // namespace

// The residual rows of a chunk: layer_token_chunk (0 = all) GEMM rows
// split over the tp ranks whose rows a GEMM row of a chunk gathers
// (`pieces`: tp with sequence parallelism, else 1), at least 1, at most Nr.
static int64_t chunk_residual_rows(int64_t layer_token_chunk, int64_t pieces, int64_t Nr) {
  if (layer_token_chunk <= 0) return Nr;
  return std::clamp<int64_t>(layer_token_chunk / pieces, 1, Nr);
}

std::array<ActivationBuffer, kNumActivations> activation_table(const LlamaConfig& c, int64_t tp,
                                                               const SaveSet& save, int64_t N, bool training,
                                                               int64_t loss_chunk_rows, DType dtype,
                                                               bool sequence_parallel, int64_t layer_token_chunk) {
  const int64_t d = c.d_model, D = c.head_dim, L = c.num_layers, Hl = c.num_heads / tp;
  const int64_t qkv = (Hl + 2 * c.num_kv_heads / tp) * D, Fl = c.mlp_dim / tp;
  const SaveSet kept = training ? save : SaveSet{};  // evaluation recomputes nothing
  const int64_t t = training ? 1 : 0;  // backward buffers only when training
  const bool low = dtype == DType::bf16;
  const int64_t staged = low ? 1 : 0;  // the bf16-only buffers
  const int64_t sp = sequence_parallel ? 1 : 0;  // the sequence-parallel-only buffers
  const int64_t Nr = sequence_parallel ? N / tp : N;  // rows of the residual stream on this rank
  // A chunk of the layer's token-wise parts: its residual rows and its GEMM
  // rows (those of every tp rank with sequence parallelism).
  const int64_t pieces = sequence_parallel ? tp : 1;
  const int64_t Cr = chunk_residual_rows(layer_token_chunk, pieces, Nr), C = pieces * Cr;
  // Loss chunk: rows x vocab fp32 logits under 64 MiB unless asked otherwise.
  int64_t R = loss_chunk_rows > 0 ? loss_chunk_rows : std::max<int64_t>(1, (int64_t{64} << 20) / (4 * c.vocab_size));
  R = std::min(R, Nr);
  std::array<ActivationBuffer, kNumActivations> table;
  // `act`: an activation or GEMM operand, stored in the compute dtype.
  // fp32 always: the gradients of the residual stream and of the attention
  // (accumulated over layers and kv shards), GEMM outputs before their
  // consumers, the LSE, RoPE tables and the loss chunk's logits.
  const DType act = dtype, f32 = DType::f32;
  // All rows: one copy per layer when saved (a few staging slots when
  // offloaded), else one that every layer reuses.
  auto set = [&](Activation a, const char* name, int64_t elements, DType type, int64_t copies = 1) {
    const int point = offload_save_point(a);
    if (point >= 0 && kept.offload[point]) copies = std::min(copies, offload_staging_slots(a));
    table[static_cast<int>(a)] = {name, elements, copies, type};
  };
  // One chunk's rows (the whole tensor when it is saved for backward).
  auto set_chunk = [&](Activation a, const char* name, int64_t rows, int64_t all_rows, int64_t cols, DType type,
                       bool saved = false) {
    set(a, name, (saved ? all_rows : rows) * cols, type, saved ? L : 1);
    table[static_cast<int>(a)].per_chunk = !saved && rows < all_rows;
  };
  set(Activation::x, "x (layer input)", Nr * d, act, L + 1);
  set(Activation::qkv, "qkv_proj", N * qkv, act, kept.qkv ? L : 1);
  set(Activation::context, "context", N * Hl * D, act, kept.context ? L : 1);
  set(Activation::context_lse, "context lse", N * Hl, f32, kept.context ? L : 1);
  set_chunk(Activation::out_proj, "out_proj residual", Cr, Nr, d, act, kept.out_proj);
  set_chunk(Activation::mlpwi, "mlpwi", C, N, 2 * Fl, act, kept.mlpwi);
  set_chunk(Activation::normed, "normed", Cr, Nr, d, act);
  set_chunk(Activation::mlp_act, "mlp activation", C, N, Fl, act);
  set_chunk(Activation::rope_cos, "rope cos", C, N, D / 2, f32);
  set_chunk(Activation::rope_sin, "rope sin", C, N, D / 2, f32);
  set(Activation::d_resid, "d residual", t * Nr * d, f32);
  set_chunk(Activation::d_normed, "d normed", t * Cr, Nr, d, f32);
  set(Activation::d_context, "d context", t * N * Hl * D, act);  // dO: an operand of the attention's backward
  set(Activation::d_qkv, "d qkv", t * N * qkv, f32);
  set(Activation::loss_hidden, "loss chunk hidden", R * d, act);
  set(Activation::loss_d_hidden, "loss chunk d hidden", t * R * d, f32);
  set(Activation::loss_logits, "loss chunk logits", R * c.vocab_size, f32);
  set_chunk(Activation::normed_gathered, "normed, all-gathered over tp", sp * C, N, d, act);
  set_chunk(Activation::tp_partial, "fp32 partial sums over tp (reduce-scatter input)", sp * C, N, d, f32);
  set_chunk(Activation::matmul_out, "fp32 GEMM output", staged * C, N, std::max({qkv, 2 * Fl, d}), f32);
  set_chunk(Activation::grad_operand, "bf16 gradient operand", staged * t * C, N, std::max(qkv, d), act);
  set(Activation::loss_d_logits, "loss chunk d logits (bf16)", staged * t * R * c.vocab_size, act);
  return table;
}

// Allocates (or reuses) the activation workspace for this batch size.
static Workspace& workspace_for(LlamaModel::Impl& m, const LlamaConfig& c, int64_t N, bool training) {
  // A training workspace serves evaluation too (it has every buffer).
  if (m.ws && m.ws->tokens == N && (m.ws->training || !training)) return *m.ws;
  m.ws.reset();
  auto w = std::make_unique<Workspace>();
  w->tokens = N;
  w->training = training;
  w->save = training ? m.save : SaveSet{};
  const auto table = activation_table(c, m.tp, m.save, N, training, m.loss_chunk_rows, m.dtype, m.seq_parallel,
                                      m.layer_token_chunk);
  for (int a = 0; a < kNumActivations; ++a) {
    const ActivationBuffer& t = table[a];
    w->dtype[a] = t.dtype;
    w->per_chunk[a] = t.per_chunk;
    if (t.elements == 0) continue;
    // The name the planner's memory lines show (they list what a counted step held).
    const std::string name =
        std::string(t.name) + (t.per_chunk ? " (one chunk of " + std::to_string(m.layer_token_chunk) + " tokens)" : "");
    for (int64_t i = 0; i < t.copies; ++i) {
      w->bufs[a].emplace_back(MemCategory::activations, name, static_cast<size_t>(t.bytes()));
      w->bytes += static_cast<size_t>(t.bytes());
    }
  }
  w->loss_rows = table[static_cast<int>(Activation::loss_hidden)].elements / c.d_model;
  for (int a = 0; a < kNumActivations && m.offload && training; ++a) {
    if (!m.offload->offloads(static_cast<Activation>(a))) continue;
    std::vector<void*> slots;
    for (const Buffer& buf : w->bufs[a]) slots.push_back(buf.data());
    m.offload->bind(static_cast<Activation>(a), table[a].name, std::move(slots), static_cast<size_t>(table[a].bytes()));
  }
  m.ws = std::move(w);
  return *m.ws;
}

static LossStats run(LlamaModel::Impl& m, const LlamaConfig& c, const std::vector<NamedTensor>& P,
                     const std::vector<NamedTensor>& Gr, const Batch& b, bool training,
                     float grad_scale, double* token_losses = nullptr) {
  check_batch(b);
  const int64_t N = b.batch * b.seq_local;
  if (m.seq_parallel && N % m.tp != 0)
    throw ConfigError("model: tensor_sequence_parallelism needs the local tokens (batch x seq_local = " +
                      std::to_string(N) + ") divisible by ici_tensor_parallelism (" + std::to_string(m.tp) + ")");
  Workspace& w = workspace_for(m, c, N, training);
  m.peak_bytes = w.bytes;
  m.batch = &b;
  const int64_t Nr = m.seq_parallel ? N / m.tp : N;
  Step s{m, P, Gr, w, b, N, Nr, m.seq_parallel ? m.tp_rank * Nr : 0,
         chunk_residual_rows(m.layer_token_chunk, m.seq_parallel ? m.tp : 1, Nr)};
  w.rope_n = 0;  // new positions
  m.profile = StepProfile{};
  // FSDP (model/sharded_parameters.h): a unit's weights are used only
  // between gather and release, the next unit's prefetched meanwhile; its
  // gradients accumulate from begin_gradients to reduce_gradients. With one
  // shard these do nothing. This order is the schedule gathered_peak_bytes()
  // counts.
  ShardedParameters& st = *m.store;
  st.reset();  // nothing left from a call that threw
  const int embed_unit = 0, head_unit = static_cast<int>(m.L) + 1;
  auto layer_unit = [](int64_t l) { return static_cast<int>(l) + 1; };
  const bool tied = c.tie_embeddings, sharded = st.shards() > 1;
  // Sequence parallelism: each tp rank adds only its rows' share to the
  // gradients of the tp-replicated parameters (norms, embedding, LM head),
  // which are then all-reduced over tp: sharded, per unit before its
  // reduce-scatter (each use starts from zero); unsharded, at the end, and
  // until then only tp rank 0 keeps what was accumulated before this call,
  // so that it counts once.
  auto all_reduce_replicated = [&](int first, int count) {
    for (int i = first; i < first + count; ++i)
      if (Gr[static_cast<size_t>(i)].split == TpSplit::none) m.tp_all_reduce(st.grad(i), Gr[static_cast<size_t>(i)].local.numel());
  };
  auto reduce_unit = [&](int u) {
    const ParameterUnit& unit = st.units()[static_cast<size_t>(u)];
    if (sharded && m.seq_parallel) all_reduce_replicated(unit.first_param, unit.num_params);
    st.reduce_gradients(u);
  };
  if (training && m.seq_parallel && !sharded && m.tp_rank != 0)
    for (const NamedTensor& g : Gr)
      if (g.split == TpSplit::none) fill_f32(g.local.f32(), g.local.numel(), 0.0f);

  st.gather(embed_unit);
  st.prefetch(layer_unit(0));
  s.elementwise([&] {
    // The bf16 weights of this call (unsharded: gathered units round their own).
    st.refresh_compute_copy();
    embedding_forward(b.tokens + s.r0, Nr, s.param(m.embed), m.V, s.x(0, s.all()));
  });
  st.release(embed_unit);
  // Offload (training only: evaluation keeps nothing for backward).
  ActivationOffload* off = training ? m.offload.get() : nullptr;
  // Layers are alike: a meta device counts one for all (core/device.h).
  for_each_alike(m.L, [&](int64_t l) {
    publish_step_position(StepPass::forward, l);
    st.gather(layer_unit(l));
    st.prefetch(l + 1 < m.L ? layer_unit(l + 1) : head_unit);
    if (off) off->before_forward(l);
    s.forward_layer(l);
    if (off) off->after_forward(l);
    st.release(layer_unit(l));
  });

  LossStats out;
  if (training) fill_f32(w.f32(Activation::d_resid), int64_t(w.size(Activation::d_resid) / 4), 0.0f);
  publish_step_position(StepPass::loss);
  st.gather(head_unit);
  if (tied) st.gather(embed_unit);
  if (training) {
    st.prefetch(layer_unit(m.L - 1));
    st.begin_gradients(head_unit);
    if (tied) st.begin_gradients(embed_unit);
  }
  std::vector<double> local_losses(m.seq_parallel && token_losses ? Nr : 0);
  out.loss_sum = s.loss_head(training, grad_scale, m.seq_parallel && token_losses ? local_losses.data() : token_losses);
  if (training) {
    reduce_unit(head_unit);
    if (tied) reduce_unit(embed_unit);
  }
  st.release(head_unit);
  if (tied) st.release(embed_unit);
  if (m.seq_parallel) {  // the loss of the other ranks' rows
    m.tp_all_reduce(&out.loss_sum, 1);
    if (token_losses) m.tp_all_gather(local_losses.data(), token_losses, Nr * static_cast<int64_t>(sizeof(double)));
  }
  if (b.loss_weights) {
    for (int64_t i = 0; i < N; ++i) out.weight_sum += b.loss_weights[i];
  } else {
    out.weight_sum = static_cast<double>(N);
  }
  if (!training) return out;

  for_each_alike(m.L, [&](int64_t i) {
    const int64_t l = m.L - 1 - i;
    publish_step_position(StepPass::backward, l);
    st.gather(layer_unit(l));
    if (l > 0) st.prefetch(layer_unit(l - 1));
    st.begin_gradients(layer_unit(l));
    if (off) off->before_backward(l);
    s.backward_layer(l);
    reduce_unit(layer_unit(l));
    st.release(layer_unit(l));
  });
  if (off) off->finish();
  st.begin_gradients(embed_unit);
  s.elementwise([&] {
    embedding_backward(b.tokens + s.r0, Nr, mat(w.f32(Activation::d_resid), Nr, m.d), s.grad(m.embed), m.V);
  });
  reduce_unit(embed_unit);
  if (m.seq_parallel && !sharded) all_reduce_replicated(0, static_cast<int>(Gr.size()));
  m.batch = nullptr;
  return out;
}

LossStats LlamaModel::forward_backward(const Batch& batch, float grad_scale) {
  return run(*impl_, config_, params_, grads_, batch, true, grad_scale);
}

LossStats LlamaModel::forward(const Batch& batch, double* token_losses) {
  return run(*impl_, config_, params_, grads_, batch, false, 1.0f, token_losses);
}

}  // namespace longctx
