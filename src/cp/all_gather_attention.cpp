// all_gather: every rank gathers the whole sequence's K, V (with positions
// and segments) and attends with its own queries; backward reduce-scatters
// the full-sequence dK, dV back to their owners. K, V travel in their own
// dtype (bf16: half the bytes); dK, dV are reduce-scattered in fp32.

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "cp/strategies.h"

namespace longctx {

namespace {

// K and V of the whole sequence, with positions and segments.
struct GatheredKv {
  Buffer kv;   // [B, S, 2, G, D] in the dtype of k, v: k then v per token
  Buffer pos;  // [B, S] int64
  Buffer seg;  // [B, S] int32 (empty without segment masking)
};

GatheredKv gather_kv(const Communicator& comm, const AttentionArgs& a, const LocalDims& d) {
  const size_t row = 2 * d.G * d.D * d.e;
  Buffer local(MemCategory::communication, "all_gather kv local", d.B * d.L * row);  // [B, L, 2, G, D]
  copy_view(a.k, record_view(local.as<char>(), d.dtype, d.B, d.L, d.G, d.D, row));
  copy_view(a.v, record_view(local.as<char>() + row / 2, d.dtype, d.B, d.L, d.G, d.D, row));
  GatheredKv out;
  out.kv = gather_tokens(comm, local.data(), d.B, d.L, row, "all_gather kv");
  out.pos = gather_tokens(comm, a.q_pos, d.B, d.L, sizeof(int64_t), "all_gather positions");
  if (a.mask.same_segment)
    out.seg = gather_tokens(comm, a.q_seg, d.B, d.L, sizeof(int32_t), "all_gather segments");
  return out;
}

AttentionArgs full_kv_args(const AttentionArgs& a, const LocalDims& d, const GatheredKv& g,
                           int64_t S) {
  AttentionArgs full = a;
  char* kv = g.kv.as<char>();
  const int64_t row = 2 * d.G * d.D * d.e;
  full.k = record_view(kv, d.dtype, d.B, S, d.G, d.D, row);
  full.v = record_view(kv + row / 2, d.dtype, d.B, S, d.G, d.D, row);
  full.kv_pos = g.pos.as<int64_t>();
  full.kv_seg = a.mask.same_segment ? g.seg.as<int32_t>() : nullptr;
  return full;
}

}  // namespace

void AllGatherAttention::forward(const AttentionArgs& local, const TensorView& o, float* lse) {
  LocalDims d = check_local_args(local);
  GatheredKv g = gather_kv(comm_, local, d);
  attention_forward(full_kv_args(local, d, g, d.L * comm_.size()), o, lse);
}

void AllGatherAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                             const float* lse, const float* delta,
                                             const TensorView& dq, const TensorView& dk,
                                             const TensorView& dv) {
  LocalDims d = check_local_args(local);
  const int P = comm_.size();
  const int64_t S = d.L * P, row = 2 * d.G * d.D;
  GatheredKv g = gather_kv(comm_, local, d);
  Buffer dkv_full(MemCategory::communication, "all_gather dkv", d.B * S * row * sizeof(float));  // [B, S, 2, G, D]
  float* dkv = dkv_full.as<float>();
  zero_view(dq);
  attention_backward(full_kv_args(local, d, g, S), dout, lse, delta, dq,
                     TensorView::strided(dkv, DType::f32, {d.B, S, d.G, d.D}, {S * row, row, d.D, 1}),
                     TensorView::strided(dkv + d.G * d.D, DType::f32, {d.B, S, d.G, d.D},
                                         {S * row, row, d.D, 1}));
  Buffer blocks = batch_major_to_rank_major(std::move(dkv_full), P, d.B, d.L, row * sizeof(float));  // [P, B, L, 2GD]
  Buffer mine(MemCategory::communication, "all_gather dkv local", d.B * d.L * row * sizeof(float));  // [B, L, 2GD]
  comm_.reduce_scatter_sum(blocks.as<float>(), mine.as<float>(), d.B * d.L * row);
  char* m = mine.as<char>();
  copy_view(record_view(m, DType::f32, d.B, d.L, d.G, d.D, row * 4), dk);
  copy_view(record_view(m + d.G * d.D * 4, DType::f32, d.B, d.L, d.G, d.D, row * 4), dv);
}

}  // namespace longctx
