// ulysses: an all-to-all turns [B, L, H, D] sequence shards into
// [B, P*L, H/P, D] head shards, the inner attention runs on the whole
// (group's) sequence for H/P heads, and a second all-to-all brings O and LSE
// back. The gathered token order is rank-major; positions travel with the
// tokens, so any layout works.
//
// Dtypes: q, k, v travel in theirs, O back in o's, dO in its own (bf16: half
// the bytes); LSE, delta and the returning dQ, dK, dV are fp32
// (ulysses_records).
//
// GQA: rank j receives q heads [j*Hu, (j+1)*Hu). Its kv heads are
// [j*G/P, (j+1)*G/P) when P divides G (split), or the single kv head j/(P/G)
// when G divides P (replicated on P/G ranks; their gradients are summed).
#include <cstring>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
#include "core/error.h"
#include "cp/strategies.h"
#include "kernels/convert.h"

namespace longctx {

namespace {

int64_t align_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

UlyssesRecords ulysses_records(int64_t Hu, int64_t Gu, int64_t D, int64_t e, int64_t e_o, int64_t e_dout) {
  UlyssesRecords r;
  r.qkv = (Hu + 2 * Gu) * D * e;
  r.o = Hu * D * e_o + Hu * 4;
  r.bwd_q = 2 * Hu * 4;
  r.bwd_dout = align_up(r.bwd_q + r.qkv, e_dout);
  r.bwd = align_up(r.bwd_dout + Hu * D * e_dout, 4);
  r.grads = (Hu + 2 * Gu) * D * 4;
  return r;
}

void UlyssesAttention::forward(const AttentionArgs& local, const TensorView& o, float* lse) {
  LocalDims d = check_local_args(local);
  const int P = comm_.size();
  const UlyssesHeads hs = ulysses_heads(P, d.H, d.G);
  const int64_t S = P * d.L, D = d.D, Hu = hs.Hu, Gu = hs.Gu, e = d.e;
  const UlyssesRecords rec = ulysses_records(Hu, Gu, D, e, dtype_size(o.dtype), 4);

  // A meta device's buffers are counted, never touched (core/device.h).
  const bool counted = is_meta(local.q.data);
  Buffer send(MemCategory::communication, "ulysses qkv send", P * d.B * d.L * rec.qkv);  // [P, B, L, qkv]
  if (!counted)
    for (int j = 0; j < P; ++j)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t s = 0; s < d.L; ++s) {
          char* dst = send.as<char>() + ((j * d.B + b) * d.L + s) * rec.qkv;
          copy_heads(local.q, b, s, j * Hu, Hu, dst);
          copy_heads(local.k, b, s, hs.kv_head(j), Gu, dst + Hu * D * e);
          copy_heads(local.v, b, s, hs.kv_head(j), Gu, dst + (Hu + Gu) * D * e);
        }
  Buffer recv(MemCategory::communication, "ulysses qkv", send.size());
  comm_.all_to_all(send.data(), recv.data(), d.B * d.L * rec.qkv);
  send = Buffer();
  Buffer qkv = rank_major_to_batch_major(std::move(recv), P, d.B, d.L, rec.qkv);  // [B, S, qkv]
  Buffer pos = gather_tokens(comm_, local.q_pos, d.B, d.L, 8, "ulysses positions");
  Buffer seg;
  if (local.mask.same_segment) seg = gather_tokens(comm_, local.q_seg, d.B, d.L, 4, "ulysses segments");

  AttentionArgs heads = local;
  char* base = qkv.as<char>();
  heads.q = record_view(base, d.dtype, d.B, S, Hu, D, rec.qkv);
  heads.k = record_view(base + Hu * D * e, d.dtype, d.B, S, Gu, D, rec.qkv);
  heads.v = record_view(base + (Hu + Gu) * D * e, d.dtype, d.B, S, Gu, D, rec.qkv);
  heads.q_pos = heads.kv_pos = pos.as<int64_t>();
  heads.q_seg = heads.kv_seg = local.mask.same_segment ? seg.as<int32_t>() : nullptr;

  // O (o's dtype) and LSE of every token for Hu heads, one record per token: [B, S, o].
  const int64_t o_bytes = Hu * D * int64_t(dtype_size(o.dtype));  // where the LSE starts
  Buffer out(MemCategory::communication, "ulysses o", d.B * S * rec.o);
  Buffer lse_h(MemCategory::scratch, "ulysses lse", d.B * S * Hu * 4);  // [B, S, Hu]
  inner_->forward(heads, record_view(out.as<char>(), o.dtype, d.B, S, Hu, D, rec.o), lse_h.as<float>());
  qkv = Buffer();
  if (!counted)
    for (int64_t t = 0; t < d.B * S; ++t)
      std::memcpy(out.as<char>() + t * rec.o + o_bytes, lse_h.as<float>() + t * Hu, Hu * 4);
  Buffer back = batch_major_to_rank_major(std::move(out), P, d.B, d.L, rec.o);  // [P, B, L, o]
  Buffer mine(MemCategory::communication, "ulysses o back", back.size());
  comm_.all_to_all(back.data(), mine.data(), d.B * d.L * rec.o);
  const size_t o_row = D * dtype_size(o.dtype);
  if (!counted)
    for (int j = 0; j < P; ++j)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t s = 0; s < d.L; ++s) {
          const char* src = mine.as<char>() + ((j * d.B + b) * d.L + s) * rec.o;
          for (int64_t h = 0; h < Hu; ++h) {
            std::memcpy(element_ptr(o, {b, s, j * Hu + h}), src + h * o_row, o_row);
            std::memcpy(lse + (b * d.L + s) * d.H + j * Hu + h, src + o_bytes + h * 4, 4);
          }
        }
}

void UlyssesAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                           const float* lse, const float* delta,
                                           const TensorView& dq, const TensorView& dk,
                                           const TensorView& dv) {
  LocalDims d = check_local_args(local);
  const int P = comm_.size();
  const UlyssesHeads hs = ulysses_heads(P, d.H, d.G);
  const int64_t S = P * d.L, D = d.D, Hu = hs.Hu, Gu = hs.Gu, e = d.e;
  // lse, delta, q, k, v, dout of one token for one rank.
  const UlyssesRecords rec = ulysses_records(Hu, Gu, D, e, 4, dtype_size(dout.dtype));

  // A meta device's buffers are counted, never touched (core/device.h).
  const bool counted = is_meta(local.q.data);
  Buffer send(MemCategory::communication, "ulysses bwd send", P * d.B * d.L * rec.bwd);  // [P, B, L, bwd]
  if (!counted)
    for (int j = 0; j < P; ++j)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t s = 0; s < d.L; ++s) {
          char* dst = send.as<char>() + ((j * d.B + b) * d.L + s) * rec.bwd;
          const int64_t row = (b * d.L + s) * d.H + j * Hu;
          std::memcpy(dst, lse + row, Hu * 4);
          std::memcpy(dst + Hu * 4, delta + row, Hu * 4);
          copy_heads(local.q, b, s, j * Hu, Hu, dst + rec.bwd_q);
          copy_heads(local.k, b, s, hs.kv_head(j), Gu, dst + rec.bwd_q + Hu * D * e);
          copy_heads(local.v, b, s, hs.kv_head(j), Gu, dst + rec.bwd_q + (Hu + Gu) * D * e);
          copy_heads(dout, b, s, j * Hu, Hu, dst + rec.bwd_dout);
        }
  Buffer recv(MemCategory::communication, "ulysses bwd", send.size());
  comm_.all_to_all(send.data(), recv.data(), d.B * d.L * rec.bwd);
  send = Buffer();
  Buffer all = rank_major_to_batch_major(std::move(recv), P, d.B, d.L, rec.bwd);  // [B, S, bwd]
  Buffer pos = gather_tokens(comm_, local.q_pos, d.B, d.L, 8, "ulysses positions");
  Buffer seg;
  if (local.mask.same_segment) seg = gather_tokens(comm_, local.q_seg, d.B, d.L, 4, "ulysses segments");

  char* base = all.as<char>();
  AttentionArgs heads = local;
  heads.q = record_view(base + rec.bwd_q, d.dtype, d.B, S, Hu, D, rec.bwd);
  heads.k = record_view(base + rec.bwd_q + Hu * D * e, d.dtype, d.B, S, Gu, D, rec.bwd);
  heads.v = record_view(base + rec.bwd_q + (Hu + Gu) * D * e, d.dtype, d.B, S, Gu, D, rec.bwd);
  heads.q_pos = heads.kv_pos = pos.as<int64_t>();
  heads.q_seg = heads.kv_seg = local.mask.same_segment ? seg.as<int32_t>() : nullptr;
  Buffer lse_h(MemCategory::scratch, "ulysses lse", d.B * S * Hu * 4);  // [B, S, Hu]
  Buffer delta_h(MemCategory::scratch, "ulysses delta", d.B * S * Hu * 4);
  if (!counted)
    for (int64_t t = 0; t < d.B * S; ++t) {
      std::memcpy(lse_h.as<float>() + t * Hu, base + t * rec.bwd, Hu * 4);
      std::memcpy(delta_h.as<float>() + t * Hu, base + t * rec.bwd + Hu * 4, Hu * 4);
    }

  // dq, dk, dv (fp32) of every token for this rank's heads: [B, S, (Hu + 2Gu) * D].
  const int64_t grec = (Hu + 2 * Gu) * D;
  Buffer grads(MemCategory::communication, "ulysses grads", d.B * S * rec.grads);
  inner_->backward_with_delta(heads, record_view(base + rec.bwd_dout, dout.dtype, d.B, S, Hu, D, rec.bwd),
                              lse_h.as<float>(), delta_h.as<float>(),
                              record_view(grads.as<char>(), DType::f32, d.B, S, Hu, D, rec.grads),
                              record_view(grads.as<char>() + Hu * D * 4, DType::f32, d.B, S, Gu, D, rec.grads),
                              record_view(grads.as<char>() + (Hu + Gu) * D * 4, DType::f32, d.B, S, Gu, D,
                                          rec.grads));
  all = Buffer();
  Buffer back = batch_major_to_rank_major(std::move(grads), P, d.B, d.L, rec.grads);  // [P, B, L, grads]
  Buffer mine(MemCategory::communication, "ulysses grads back", back.size());
  comm_.all_to_all(back.data(), mine.data(), d.B * d.L * rec.grads);
  // Replicated kv heads come back from several ranks: sum them.
  zero_view(dk);
  zero_view(dv);
  if (!counted)
    for (int j = 0; j < P; ++j)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t s = 0; s < d.L; ++s) {
          const float* src = mine.as<float>() + ((j * d.B + b) * d.L + s) * grec;
          for (int64_t h = 0; h < Hu; ++h)
            std::memcpy(dq.at<float>({b, s, j * Hu + h}), src + h * D, D * 4);
          for (int64_t g = 0; g < Gu; ++g) {
            float* k = dk.at<float>({b, s, hs.kv_head(j) + g});
            float* v = dv.at<float>({b, s, hs.kv_head(j) + g});
            const float* sk = src + (Hu + g) * D;
            const float* sv = src + (Hu + Gu + g) * D;
            for (int64_t x = 0; x < D; ++x) {
              k[x] += sk[x];
              v[x] += sv[x];
            }
          }
        }
}

}  // namespace longctx
