// The factory, LocalAttention, and helpers shared by the strategies.
#include <algorithm>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
#include "core/error.h"
#include "cp/strategies.h"
#include "kernels/simd/convert.h"

namespace longctx {

int64_t cp_ring_auto_chunk_tokens(int64_t local_tokens) {
  constexpr int64_t kTile = kAttentionTile;  // chunks stay whole kernel tiles
  return std::max<int64_t>(kTile, local_tokens / 16 / kTile * kTile);
}

int64_t cp_ring_chunks(int64_t local_tokens, int64_t chunk_tokens) {
  if (chunk_tokens < 0) throw ConfigError("ring_chunk_tokens must be >= 0 (0 = automatic)");
  if (chunk_tokens == 0) chunk_tokens = cp_ring_auto_chunk_tokens(local_tokens);
  int64_t n = std::max<int64_t>(2, (local_tokens + chunk_tokens - 1) / chunk_tokens);
  n += n % 2;
  return std::min(n, std::max<int64_t>(local_tokens, 1));
}

std::unique_ptr<CpAttention> make_cp_attention(CpStrategy strategy, const Mesh& mesh,
                                               const CpOptions& options) {
  if (mesh.cp().size() == 1) return std::make_unique<LocalAttention>();
  // No default: -Wswitch names a strategy without a case here.
  switch (strategy) {
    case CpStrategy::all_gather:
      return std::make_unique<AllGatherAttention>(mesh.cp());
    case CpStrategy::ulysses:
      return std::make_unique<UlyssesAttention>(mesh.cp(), std::make_unique<LocalAttention>());
    case CpStrategy::ring:
      return std::make_unique<RingAttention>(mesh.ring(), options);  // the whole of cp (ulysses = 1)
    case CpStrategy::usp: {
      // The ulysses all-to-all over the inner axis (mesh.ulysses()) around a
      // ring over the outer one (mesh.ring()); a degree of 1 drops its layer.
      std::unique_ptr<CpAttentionImpl> inner;
      if (mesh.ring().size() == 1)
        inner = std::make_unique<LocalAttention>();
      else
        inner = std::make_unique<RingAttention>(mesh.ring(), options);
      if (mesh.ulysses().size() == 1) return inner;
      return std::make_unique<UlyssesAttention>(mesh.ulysses(), std::move(inner));
    }
  }
  throw ConfigError("context_parallel_strategy '" + std::string(name_of(strategy)) +
                    "' has no constructor in make_cp_attention (cp_common.cpp)");
}

void CpAttentionImpl::backward(const AttentionArgs& local, const TensorView& o, const float* lse,
                               const TensorView& dout, const TensorView& dq, const TensorView& dk,
                               const TensorView& dv) {
  LocalDims d = check_local_args(local);
  Buffer delta(MemCategory::scratch, "cp delta", d.B * d.L * d.H * sizeof(float));  // [B, L, H]
  attention_delta(o, dout, delta.as<float>());
  backward_with_delta(local, dout, lse, delta.as<float>(), dq, dk, dv);
}

void LocalAttention::forward(const AttentionArgs& local, const TensorView& o, float* lse) {
  attention_forward(local, o, lse);
}

void LocalAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                         const float* lse, const float* delta,
                                         const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv) {
  zero_view(dq);
  zero_view(dk);
  zero_view(dv);
  attention_backward(local, dout, lse, delta, dq, dk, dv);
}

LocalDims check_local_args(const AttentionArgs& a) {
  check_shape(a.q.rank == 4 && a.k.rank == 4 && a.v.rank == 4,
              "cp attention: q, k, v must be [B, S_local, heads, D]");
  check_shape((a.q.dtype == DType::f32 || a.q.dtype == DType::bf16) && a.k.dtype == a.q.dtype &&
                  a.v.dtype == a.q.dtype,
              "cp attention: q, k and v must have one dtype (all fp32 or all bf16)");
  LocalDims d{a.q.dim(0), a.q.dim(1), a.q.dim(2), a.k.dim(2), a.q.dim(3), a.q.dtype,
              int64_t(dtype_size(a.q.dtype))};
  check_shape(a.k.dim(0) == d.B && a.k.dim(1) == d.L && a.v.dim(1) == d.L && a.v.dim(2) == d.G &&
                  a.k.dim(3) == d.D && a.v.dim(3) == d.D,
              "cp attention is self-attention: q " + a.q.shape_string() + ", k " +
                  a.k.shape_string() + " and v " + a.v.shape_string() +
                  " must hold the same local tokens");
  check_shape(a.q.stride[3] == 1 && a.k.stride[3] == 1 && a.v.stride[3] == 1,
              "cp attention: the head dim must be contiguous");
  check_shape(d.G > 0 && d.H % d.G == 0, "cp attention: q heads (" + std::to_string(d.H) +
                                             ") must be a multiple of kv heads (" +
                                             std::to_string(d.G) + ")");
  check_shape(a.q_pos && a.kv_pos, "cp attention: positions are required");
  if (is_meta(a.q_pos)) return d;  // counted (core/device.h): no values to compare
  check_shape(std::equal(a.q_pos, a.q_pos + d.B * d.L, a.kv_pos),
              "cp attention is self-attention: kv positions must equal q positions");
  if (a.mask.same_segment) {
    check_shape(a.q_seg && a.kv_seg, "cp attention: the mask needs segment ids");
    check_shape(std::equal(a.q_seg, a.q_seg + d.B * d.L, a.kv_seg),
                "cp attention is self-attention: kv segments must equal q segments");
  }
  return d;
}

TensorView head_slice(const TensorView& t, int64_t h0, int64_t n) {
  check_shape(t.rank == 4 && h0 >= 0 && h0 + n <= t.dim(2), "cp attention: head slice outside the view");
  return TensorView::strided(element_ptr(t, {0, 0, h0}), t.dtype, {t.dim(0), t.dim(1), n, t.dim(3)},
                             {t.stride[0], t.stride[1], t.stride[2], t.stride[3]});
}

TensorView token_slice(const TensorView& t, int64_t t0, int64_t n) {
  check_shape(t.rank == 4 && t0 >= 0 && t0 + n <= t.dim(1), "cp attention: token slice outside the view");
  return TensorView::strided(element_ptr(t, {0, t0}), t.dtype, {t.dim(0), n, t.dim(2), t.dim(3)},
                             {t.stride[0], t.stride[1], t.stride[2], t.stride[3]});
}

TensorView record_view(char* base, DType dtype, int64_t B, int64_t S, int64_t n, int64_t D, int64_t row_bytes) {
  const int64_t e = int64_t(dtype_size(dtype)), row = row_bytes / e;
  check_shape(row * e == row_bytes, "cp attention: a record is not a whole number of elements");
  return TensorView::strided(base, dtype, {B, S, n, D}, {S * row, row, D, 1});
}

namespace {

// [X, Y, row] -> [Y, X, row]
Buffer transpose_blocks(Buffer in, int64_t X, int64_t Y, size_t row_bytes, MemCategory category) {
  if (X == 1 || Y == 1) return in;
  Buffer out(category, "cp transpose", in.size());
  const int64_t row = int64_t(row_bytes);
  for (int64_t x = 0; x < X; ++x) copy_rows(in.as<char>() + x * Y * row, row, out.as<char>() + x * row, X * row, Y, row);
  return out;
}

}  // namespace

Buffer rank_major_to_batch_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes) {
  return transpose_blocks(std::move(in), P, B, L * row_bytes, MemCategory::communication);
}

Buffer batch_major_to_rank_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes) {
  return transpose_blocks(std::move(in), B, P, L * row_bytes, MemCategory::communication);
}

Buffer gather_tokens(const Communicator& comm, const void* local, int64_t B, int64_t L,
                     size_t row_bytes, const char* name) {
  const int P = comm.size();
  Buffer all(MemCategory::communication, name, P * B * L * row_bytes);  // [P, B, L, row]
  comm.all_gather(local, all.data(), B * L * row_bytes);
  return rank_major_to_batch_major(std::move(all), P, B, L, row_bytes);
}

}  // namespace longctx
