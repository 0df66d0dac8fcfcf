// What one strategy call sends (CpCallTraffic), for the planner. (What it
// allocates is counted by running it: cp_count.cpp.)
#include <algorithm>

#include "core/cp_strategy.h"
#include "cp/cp_attention.h"
#include "cp/layout.h"
#include "cp/strategies.h"

namespace longctx {

// The ring of R ranks, each holding the tokens of one ring position (for usp,
// its U ulysses ranks' tokens, gathered in order), cut by the ring's own
// chunk plan, with bounds from the layout's positions (CpLayout).
CpCallTraffic::CpCallTraffic(const CpCallShape& s) : s_(s) {
  const int64_t R = s.cp / s.ulysses;
  if (s.cp == 1 || R == 1 || cp_strategy_info(s.strategy).gathers_kv) return;
  const int64_t S = s.L * s.cp, L = S / R;
  RingChunks chunks(R, 1, L, s.ring_chunk_tokens);
  ring_chunks_ = chunks.n;
  if (S % R != 0 || (s.layout == LayoutKind::zigzag && S % (2 * R) != 0))
    throw ConfigError("ring traffic: the layout needs the sequence divisible by the ring (x2 for zigzag)");
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < chunks.n; ++c) {
      // Positions 0..S-1 increase along a ring rank's tokens in both layouts,
      // so a chunk's first and last token bound it.
      chunks.bounds[r * chunks.n + c] = {ring_shard_index(s.layout, S, R, r, chunks.begin[c]),
                                         ring_shard_index(s.layout, S, R, r, chunks.begin[c + 1] - 1), 0, 0};
    }
  chunks_needed_.assign(R * R, 0);
  tokens_needed_.assign(R * R, 0);
  for (int64_t q = 0; q < R; ++q)
    for (int64_t kv = 0; kv < R; ++kv)
      for (int64_t c = 0; q != kv && c < chunks.n; ++c)
        if (chunks.needs(s.mask, q, kv, c)) chunks_needed_[q * R + kv]++, tokens_needed_[q * R + kv] += chunks.len(c);
}

std::vector<CpTransfer> CpCallTraffic::transfers(bool backward, int64_t cp_rank) const {
  const CpCallShape& s = s_;
  std::vector<CpTransfer> out;
  auto add = [&](CommOp op, MeshAxis axis, const std::string& what, int64_t calls, int64_t sent,
                 int64_t received, int64_t hop_bytes = 0) {
    if (calls > 0) out.push_back({op, axis, what, calls, sent, received, hop_bytes});
  };
  if (s.cp == 1) return out;
  const int64_t B = s.B, D = s.D, L = s.L, e = s.element_bytes, seg = s.segments ? 4 : 0;
  if (e != 4 && e != 2)
    throw ConfigError("cp traffic: element_bytes must be 4 (fp32) or 2 (bf16), got " + std::to_string(e));
  if (cp_strategy_info(s.strategy).gathers_kv) {
    const int64_t P = s.cp, G = s.G;
    add(CommOp::all_gather, MeshAxis::cp, "K,V", 1, (P - 1) * B * L * 2 * G * D * e, (P - 1) * B * L * 2 * G * D * e);
    add(CommOp::all_gather, MeshAxis::cp, "positions", 1, (P - 1) * B * L * 8, (P - 1) * B * L * 8);
    if (seg) add(CommOp::all_gather, MeshAxis::cp, "segments", 1, (P - 1) * B * L * seg, (P - 1) * B * L * seg);
    if (backward)
      add(CommOp::reduce_scatter, MeshAxis::cp, "dK,dV (fp32)", 1, (P - 1) * B * L * 8 * G * D, (P - 1) * B * L * 8 * G * D);
    return out;
  }
  const UlyssesHeads heads = ulysses_heads(s.ulysses, s.H, s.G);
  const int64_t Hu = heads.Hu, Gu = heads.Gu, U = s.ulysses, R = s.cp / U;
  if (U > 1) {
    const int64_t P = U;
    const UlyssesRecords rec = ulysses_records(Hu, Gu, D, e, e, e);
    if (!backward) {
      int64_t qkv = (P - 1) * B * L * rec.qkv, o = (P - 1) * B * L * rec.o;
      add(CommOp::all_to_all, MeshAxis::ulysses, "Q,K,V", 1, qkv, qkv);
      add(CommOp::all_to_all, MeshAxis::ulysses, "O,LSE back", 1, o, o);
    } else {
      int64_t in = (P - 1) * B * L * rec.bwd;
      int64_t back = (P - 1) * B * L * rec.grads;
      add(CommOp::all_to_all, MeshAxis::ulysses, "Q,K,V,dO,LSE,delta", 1, in, in);
      add(CommOp::all_to_all, MeshAxis::ulysses, "dQ,dK,dV back (fp32)", 1, back, back);
    }
    add(CommOp::all_gather, MeshAxis::ulysses, "positions", 1, (P - 1) * B * L * 8, (P - 1) * B * L * 8);
    if (seg) add(CommOp::all_gather, MeshAxis::ulysses, "segments", 1, (P - 1) * B * L * seg, (P - 1) * B * L * seg);
  }
  if (R > 1) {
    const int64_t P = R, r = cp_rank / U;  // cp_rank = ring_rank * U + ulysses_rank
    const int64_t summary = (P - 1) * B * ring_chunks_ * int64_t(sizeof(RingChunkBounds));
    add(CommOp::all_gather, MeshAxis::ring, "chunk position ranges", 1, summary, summary);
    int64_t sends = 0, recvs = 0, sent_tokens = 0, recv_tokens = 0, sent_hops = 0, back_hops = 0;
    for (int64_t other = 0; other < P; ++other) {  // send own chunks to other, receive its
      const int64_t hops = std::min((other - r + P) % P, (r - other + P) % P);
      sends += chunks_needed_[other * P + r], sent_tokens += tokens_needed_[other * P + r];
      recvs += chunks_needed_[r * P + other], recv_tokens += tokens_needed_[r * P + other];
      sent_hops += tokens_needed_[other * P + r] * hops, back_hops += tokens_needed_[r * P + other] * hops;
    }
    const int64_t kv_row = 2 * Gu * D * e + 8 + seg, grad_row = 2 * Gu * D * e;
    add(CommOp::send, MeshAxis::ring, "K,V chunks", sends, B * sent_tokens * kv_row, 0, B * sent_hops * kv_row);
    add(CommOp::recv, MeshAxis::ring, "K,V chunks", recvs, 0, B * recv_tokens * kv_row);
    if (backward) {
      // Partial dK,dV of every received chunk go back to its owner.
      add(CommOp::send, MeshAxis::ring, "dK,dV back to owners", recvs, B * recv_tokens * grad_row, 0, B * back_hops * grad_row);
      add(CommOp::recv, MeshAxis::ring, "dK,dV back to owners", sends, 0, B * sent_tokens * grad_row);
    }
  }
  return out;
}

}  // namespace longctx
