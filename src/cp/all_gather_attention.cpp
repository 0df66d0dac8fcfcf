// all_gather: every rank gathers the whole sequence's K, V (with positions
// and segments) and attends with its own queries; backward reduce-scatters
// the full-sequence dK, dV back to their owners. K, V travel in their own
// dtype (bf16: half the bytes); dK, dV are reduce-scattered in fp32.
#include <cstring>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
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
  if (!is_meta(local.data()))  // a meta device's buffers are counted, never touched (core/device.h)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.L; ++s) {
        char* dst = local.as<char>() + (b * d.L + s) * row;
        copy_heads(a.k, b, s, 0, d.G, dst);
        copy_heads(a.v, b, s, 0, d.G, dst + row / 2);
      }
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
  const float* m = mine.as<float>();
  if (is_meta(m)) return;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t s = 0; s < d.L; ++s)
      for (int64_t gh = 0; gh < d.G; ++gh) {
        const float* src = m + (b * d.L + s) * row;
        std::memcpy(dk.at<float>({b, s, gh}), src + gh * d.D, d.D * sizeof(float));
        std::memcpy(dv.at<float>({b, s, gh}), src + (d.G + gh) * d.D, d.D * sizeof(float));
      }
}

}  // namespace longctx
