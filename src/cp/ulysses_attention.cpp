// ulysses: an all-to-all turns [B, L, H, D] sequence shards into
// [B, P*L, H/P, D] head shards, the inner attention runs on the whole
// (group's) sequence for H/P heads, and a second all-to-all brings O and LSE
// back. The gathered token order is rank-major; positions travel with the
// tokens, so any layout works.
//
// GQA: rank j receives q heads [j*Hu, (j+1)*Hu). Its kv heads are
// [j*G/P, (j+1)*G/P) when P divides G (split), or the single kv head j/(P/G)
// when G divides P (replicated on P/G ranks; their gradients are summed).
#include <cstring>

#include "core/error.h"
#include "cp/strategies.h"

namespace longctx {

namespace {

struct HeadSplit {
  int64_t Hu, Gu;       // q and kv heads per rank after the all-to-all
  int64_t kv_per_rank;  // ranks sharing one kv head (1 when split)
  int64_t kv_head(int j) const { return kv_per_rank == 1 ? j * Gu : j / kv_per_rank; }
};

HeadSplit split_heads(int P, int64_t H, int64_t G) {
  if (H % P != 0)
    throw ConfigError("ulysses: the ulysses degree (" + std::to_string(P) +
                      ") must divide the query heads (" + std::to_string(H) + ")");
  if (G % P == 0) return {H / P, G / P, 1};
  if (P % G == 0) return {H / P, 1, P / G};
  throw ConfigError("ulysses: the kv heads (" + std::to_string(G) + ") and the ulysses degree (" +
                    std::to_string(P) +
                    ") must divide one another (G % U == 0 splits kv heads, U % G == 0 "
                    "replicates them)");
}

// n heads from h0 of token (b, s): [n, D] contiguous at dst.
void copy_heads(const TensorView& t, int64_t b, int64_t s, int64_t h0, int64_t n, float* dst) {
  for (int64_t h = 0; h < n; ++h)
    std::memcpy(dst + h * t.dim(3), t.at<float>({b, s, h0 + h}), t.dim(3) * sizeof(float));
}

TensorView heads_view(float* base, int64_t B, int64_t S, int64_t n, int64_t D, int64_t row) {
  return TensorView::strided(base, DType::f32, {B, S, n, D}, {S * row, row, D, 1});
}

}  // namespace

void UlyssesAttention::forward(const AttentionArgs& local, const TensorView& o, float* lse) {
  LocalDims d = check_local_args(local);
  const int P = comm_.size();
  HeadSplit hs = split_heads(P, d.H, d.G);
  const int64_t S = P * d.L, D = d.D;
  const int64_t rec = (hs.Hu + 2 * hs.Gu) * D;  // q, k, v of one token for one rank

  Buffer send(MemCategory::communication, "ulysses qkv send", P * d.B * d.L * rec * 4);  // [P, B, L, rec]
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.L; ++s) {
        float* dst = send.as<float>() + ((j * d.B + b) * d.L + s) * rec;
        copy_heads(local.q, b, s, j * hs.Hu, hs.Hu, dst);
        copy_heads(local.k, b, s, hs.kv_head(j), hs.Gu, dst + hs.Hu * D);
        copy_heads(local.v, b, s, hs.kv_head(j), hs.Gu, dst + (hs.Hu + hs.Gu) * D);
      }
  Buffer recv(MemCategory::communication, "ulysses qkv", send.size());
  comm_.all_to_all(send.data(), recv.data(), d.B * d.L * rec * 4);
  send = Buffer();
  Buffer qkv = rank_major_to_batch_major(std::move(recv), P, d.B, d.L, rec * 4);  // [B, S, rec]
  Buffer pos = gather_tokens(comm_, local.q_pos, d.B, d.L, 8, "ulysses positions");
  Buffer seg;
  if (local.mask.same_segment) seg = gather_tokens(comm_, local.q_seg, d.B, d.L, 4, "ulysses segments");

  AttentionArgs heads = local;
  float* base = qkv.as<float>();
  heads.q = heads_view(base, d.B, S, hs.Hu, D, rec);
  heads.k = heads_view(base + hs.Hu * D, d.B, S, hs.Gu, D, rec);
  heads.v = heads_view(base + (hs.Hu + hs.Gu) * D, d.B, S, hs.Gu, D, rec);
  heads.q_pos = heads.kv_pos = pos.as<int64_t>();
  heads.q_seg = heads.kv_seg = local.mask.same_segment ? seg.as<int32_t>() : nullptr;

  // O and LSE of every token for Hu heads, one record per token: [B, S, Hu*(D+1)].
  const int64_t orec = hs.Hu * (D + 1);
  Buffer out(MemCategory::communication, "ulysses o", d.B * S * orec * 4);
  Buffer lse_h(MemCategory::scratch, "ulysses lse", d.B * S * hs.Hu * 4);  // [B, S, Hu]
  inner_->forward(heads, heads_view(out.as<float>(), d.B, S, hs.Hu, D, orec), lse_h.as<float>());
  qkv = Buffer();
  for (int64_t t = 0; t < d.B * S; ++t)
    std::memcpy(out.as<float>() + t * orec + hs.Hu * D, lse_h.as<float>() + t * hs.Hu, hs.Hu * 4);
  Buffer back = batch_major_to_rank_major(std::move(out), P, d.B, d.L, orec * 4);  // [P, B, L, orec]
  Buffer mine(MemCategory::communication, "ulysses o back", back.size());
  comm_.all_to_all(back.data(), mine.data(), d.B * d.L * orec * 4);
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.L; ++s) {
        const float* src = mine.as<float>() + ((j * d.B + b) * d.L + s) * orec;
        for (int64_t h = 0; h < hs.Hu; ++h) {
          std::memcpy(o.at<float>({b, s, j * hs.Hu + h}), src + h * D, D * 4);
          lse[(b * d.L + s) * d.H + j * hs.Hu + h] = src[hs.Hu * D + h];
        }
      }
}

void UlyssesAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                           const float* lse, const float* delta,
                                           const TensorView& dq, const TensorView& dk,
                                           const TensorView& dv) {
  LocalDims d = check_local_args(local);
  const int P = comm_.size();
  HeadSplit hs = split_heads(P, d.H, d.G);
  const int64_t S = P * d.L, D = d.D, Hu = hs.Hu, Gu = hs.Gu;
  // q, k, v, dout, lse, delta of one token for one rank.
  const int64_t rec = (2 * Hu + 2 * Gu) * D + 2 * Hu;
  const int64_t o_dout = (Hu + 2 * Gu) * D, o_lse = o_dout + Hu * D, o_delta = o_lse + Hu;

  Buffer send(MemCategory::communication, "ulysses bwd send", P * d.B * d.L * rec * 4);  // [P, B, L, rec]
  for (int j = 0; j < P; ++j)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.L; ++s) {
        float* dst = send.as<float>() + ((j * d.B + b) * d.L + s) * rec;
        copy_heads(local.q, b, s, j * Hu, Hu, dst);
        copy_heads(local.k, b, s, hs.kv_head(j), Gu, dst + Hu * D);
        copy_heads(local.v, b, s, hs.kv_head(j), Gu, dst + (Hu + Gu) * D);
        copy_heads(dout, b, s, j * Hu, Hu, dst + o_dout);
        const int64_t row = (b * d.L + s) * d.H + j * Hu;
        std::memcpy(dst + o_lse, lse + row, Hu * 4);
        std::memcpy(dst + o_delta, delta + row, Hu * 4);
      }
  Buffer recv(MemCategory::communication, "ulysses bwd", send.size());
  comm_.all_to_all(send.data(), recv.data(), d.B * d.L * rec * 4);
  send = Buffer();
  Buffer all = rank_major_to_batch_major(std::move(recv), P, d.B, d.L, rec * 4);  // [B, S, rec]
  Buffer pos = gather_tokens(comm_, local.q_pos, d.B, d.L, 8, "ulysses positions");
  Buffer seg;
  if (local.mask.same_segment) seg = gather_tokens(comm_, local.q_seg, d.B, d.L, 4, "ulysses segments");

  float* base = all.as<float>();
  AttentionArgs heads = local;
  heads.q = heads_view(base, d.B, S, Hu, D, rec);
  heads.k = heads_view(base + Hu * D, d.B, S, Gu, D, rec);
  heads.v = heads_view(base + (Hu + Gu) * D, d.B, S, Gu, D, rec);
  heads.q_pos = heads.kv_pos = pos.as<int64_t>();
  heads.q_seg = heads.kv_seg = local.mask.same_segment ? seg.as<int32_t>() : nullptr;
  Buffer lse_h(MemCategory::scratch, "ulysses lse", d.B * S * Hu * 4);  // [B, S, Hu]
  Buffer delta_h(MemCategory::scratch, "ulysses delta", d.B * S * Hu * 4);
  for (int64_t t = 0; t < d.B * S; ++t) {
    std::memcpy(lse_h.as<float>() + t * Hu, base + t * rec + o_lse, Hu * 4);
    std::memcpy(delta_h.as<float>() + t * Hu, base + t * rec + o_delta, Hu * 4);
  }

  // dq, dk, dv of every token for this rank's heads: [B, S, (Hu + 2Gu) * D].
  const int64_t grec = (Hu + 2 * Gu) * D;
  Buffer grads(MemCategory::communication, "ulysses grads", d.B * S * grec * 4);
  float* gb = grads.as<float>();
  inner_->backward_with_delta(heads, heads_view(base + o_dout, d.B, S, Hu, D, rec), lse_h.as<float>(),
                              delta_h.as<float>(), heads_view(gb, d.B, S, Hu, D, grec),
                              heads_view(gb + Hu * D, d.B, S, Gu, D, grec),
                              heads_view(gb + (Hu + Gu) * D, d.B, S, Gu, D, grec));
  all = Buffer();
  Buffer back = batch_major_to_rank_major(std::move(grads), P, d.B, d.L, grec * 4);  // [P, B, L, grec]
  Buffer mine(MemCategory::communication, "ulysses grads back", back.size());
  comm_.all_to_all(back.data(), mine.data(), d.B * d.L * grec * 4);
  // Replicated kv heads come back from several ranks: sum them.
  zero_view(dk);
  zero_view(dv);
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
