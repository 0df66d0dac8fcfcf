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

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/error.h"
#include "cp/strategies.h"

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

  Buffer send(MemCategory::communication, "ulysses qkv send", P * d.B * d.L * rec.qkv);  // [P, B, L, qkv]
  for (int j = 0; j < P; ++j) {
    char* block = send.as<char>() + j * d.B * d.L * rec.qkv;
    copy_view(head_slice(local.q, j * Hu, Hu), record_view(block, d.dtype, d.B, d.L, Hu, D, rec.qkv));
    copy_view(head_slice(local.k, hs.kv_head(j), Gu), record_view(block + Hu * D * e, d.dtype, d.B, d.L, Gu, D, rec.qkv));
    copy_view(head_slice(local.v, hs.kv_head(j), Gu),
              record_view(block + (Hu + Gu) * D * e, d.dtype, d.B, d.L, Gu, D, rec.qkv));
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
  copy_rows(lse_h.data(), Hu * 4, out.as<char>() + o_bytes, rec.o, d.B * S, Hu * 4);  // LSE into the records
  Buffer back = batch_major_to_rank_major(std::move(out), P, d.B, d.L, rec.o);  // [P, B, L, o]
  Buffer mine(MemCategory::communication, "ulysses o back", back.size());
  comm_.all_to_all(back.data(), mine.data(), d.B * d.L * rec.o);
  for (int j = 0; j < P; ++j) {
    char* block = mine.as<char>() + j * d.B * d.L * rec.o;
    copy_view(record_view(block, o.dtype, d.B, d.L, Hu, D, rec.o), head_slice(o, j * Hu, Hu));
    copy_rows(block + o_bytes, rec.o, lse + j * Hu, d.H * 4, d.B * d.L, Hu * 4);
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

  Buffer send(MemCategory::communication, "ulysses bwd send", P * d.B * d.L * rec.bwd);  // [P, B, L, bwd]
  for (int j = 0; j < P; ++j) {
    char* block = send.as<char>() + j * d.B * d.L * rec.bwd;
    copy_rows(lse + j * Hu, d.H * 4, block, rec.bwd, d.B * d.L, Hu * 4);
    copy_rows(delta + j * Hu, d.H * 4, block + Hu * 4, rec.bwd, d.B * d.L, Hu * 4);
    auto at = [&](int64_t offset, DType t, int64_t heads) {
      return record_view(block + offset, t, d.B, d.L, heads, D, rec.bwd);
    };
    copy_view(head_slice(local.q, j * Hu, Hu), at(rec.bwd_q, d.dtype, Hu));
    copy_view(head_slice(local.k, hs.kv_head(j), Gu), at(rec.bwd_q + Hu * D * e, d.dtype, Gu));
    copy_view(head_slice(local.v, hs.kv_head(j), Gu), at(rec.bwd_q + (Hu + Gu) * D * e, d.dtype, Gu));
    copy_view(head_slice(dout, j * Hu, Hu), at(rec.bwd_dout, dout.dtype, Hu));
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
  copy_rows(base, rec.bwd, lse_h.data(), Hu * 4, d.B * S, Hu * 4);
  copy_rows(base + Hu * 4, rec.bwd, delta_h.data(), Hu * 4, d.B * S, Hu * 4);

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
  for (int j = 0; j < P; ++j) {
    char* block = mine.as<char>() + j * d.B * d.L * grec * 4;
    auto at = [&](int64_t first, int64_t heads) {
      return record_view(block + first * D * 4, DType::f32, d.B, d.L, heads, D, grec * 4);
    };
    copy_view(at(0, Hu), head_slice(dq, j * Hu, Hu));
    add_view(at(Hu, Gu), head_slice(dk, hs.kv_head(j), Gu));
    add_view(at(Hu + Gu, Gu), head_slice(dv, hs.kv_head(j), Gu));
  }
}

}  // namespace longctx
