// What one strategy call allocates (cp_attention_workspace) and sends
// (CpCallTraffic), for the planner.
//
// cp_attention_workspace: the peak of the tracked buffers one strategy call
// allocates. Each rule follows the allocations of one strategy file, in the
// order they live, with the kernel's own scratch sizes and the ring's own
// chunk plan; tests/mpi/test_plan_memory.cpp holds it against the
// MemoryTracker of real training steps, so a change to a strategy's buffers
// that is not made here fails there.
#include <algorithm>

#include "cp/cp_attention.h"
#include "cp/layout.h"
#include "cp/strategies.h"
#include "cp/strategy.h"

namespace longctx {

namespace {

// A buffer gathered token-major over P ranks (gather_tokens, or an
// all-to-all followed by rank_major_to_batch_major): for B > 1 the reorder
// holds a second copy while it runs.
int64_t reorder_copies(const CpCallShape& s) { return s.B > 1 ? 2 : 1; }

// The activation dtype of a call (element_bytes 4 or 2).
DType activation_dtype(const CpCallShape& s) {
  if (s.element_bytes != 4 && s.element_bytes != 2)
    throw ConfigError("cp sizes: element_bytes must be 4 (fp32) or 2 (bf16), got " + std::to_string(s.element_bytes));
  return s.element_bytes == 2 ? DType::bf16 : DType::f32;
}

// RingAttention (ring_attention.cpp) over `tokens` local tokens of H, G
// heads: one chunk to send and two receiving; forward adds the partial O and
// LSE of one chunk (scratch), with a bf16 O its fp32 copy, and the kernel's
// scratch; backward the partial dK, dV going back (fp32, and its bf16 copy
// when e = 2), the one coming back (in e), and the kernel's scratch.
int64_t ring_call_peak(const CpCallShape& s, int64_t H, int64_t G, int64_t tokens, bool backward) {
  const RingChunks chunks(1, s.B, tokens, s.ring_chunk_tokens);
  const int64_t max_len = chunks.max_len(), e = s.element_bytes;
  const int64_t cap = ring_chunk_bytes(s.B, max_len, G, s.D, s.segments, e);
  const int64_t grad_elements = s.B * max_len * 2 * G * s.D;
  if (!backward)
    return 3 * cap + max_len * H * (s.D + 1) * 4 + (e != 4 ? s.B * tokens * H * s.D * 4 : 0) +
           attention_forward_scratch_bytes(s.D, s.threads, activation_dtype(s));
  return 3 * cap + grad_elements * (4 + (e != 4 ? e : 0) + e) +
         attention_backward_scratch_bytes(s.D, s.threads, activation_dtype(s));
}

}  // namespace

CpWorkspace cp_attention_workspace(const CpCallShape& s) {
  CpWorkspace w;
  const int64_t B = s.B, D = s.D, L = s.L, S = s.L * s.cp, seg_row = s.segments ? 4 : 0, e = s.element_bytes;
  const int64_t kernel_f = attention_forward_scratch_bytes(D, s.threads, activation_dtype(s));
  const int64_t kernel_b = attention_backward_scratch_bytes(D, s.threads, activation_dtype(s));
  const int64_t t = reorder_copies(s);
  const int64_t delta = B * L * s.H * 4;  // CpAttentionImpl::backward's "cp delta"
  if (s.cp == 1) {  // LocalAttention: the kernel alone
    w.bytes = std::max(kernel_f, delta + kernel_b);
    w.what = "kernel scratch and delta";
    return w;
  }
  if (cp_strategy_info(s.strategy).gathers_kv) {
    // gather_kv: the local K,V copy lives while K,V, positions, segments are gathered.
    const int64_t local = B * L * 2 * s.G * D * e;
    const int64_t kv = B * S * 2 * s.G * D * e, pos = B * S * 8, seg = B * S * seg_row;
    const int64_t gather = std::max({local + t * kv, local + kv + t * pos, local + kv + pos + t * seg});
    const int64_t gathered = kv + pos + seg;
    const int64_t fwd = std::max(gather, gathered + kernel_f);
    // Backward: full-sequence fp32 dK,dV, reordered rank-major, reduce-scattered into `mine`.
    const int64_t dkv = B * S * 2 * s.G * D * 4;
    const int64_t bwd = delta + std::max({gather, gathered + dkv + kernel_b, gathered + t * dkv, gathered + dkv + local});
    w.bytes = std::max(fwd, bwd);
    w.what = "gathered K,V [B, S, G, D] and their fp32 gradients";
    return w;
  }
  const int64_t U = s.ulysses, R = s.cp / U;
  const UlyssesHeads heads = ulysses_heads(U, s.H, s.G);
  const int64_t Hu = heads.Hu, Gu = heads.Gu;
  if (U == 1) {  // ring
    w.bytes = std::max(ring_call_peak(s, Hu, Gu, L, false), delta + ring_call_peak(s, Hu, Gu, L, true));
    w.what = "ring K,V chunks (1 send, 2 receive) and returning dK,dV";
    return w;
  }
  // ulysses (R = 1) or usp: UlyssesAttention around LocalAttention or RingAttention.
  const int64_t Sg = S / R;  // tokens after the all-to-all
  const int64_t pos = B * Sg * 8, seg = B * Sg * seg_row;
  const int64_t inner_f = R > 1 ? ring_call_peak(s, Hu, Gu, Sg, false) : kernel_f;
  const int64_t inner_b = R > 1 ? ring_call_peak(s, Hu, Gu, Sg, true) : kernel_b;
  // Forward: send + recv, reorder, gather positions/segments, O|LSE records
  // and LSE scratch around the inner call, reorder O back, receive it.
  const UlyssesRecords rec = ulysses_records(Hu, Gu, D, e, e, e);
  const int64_t q = B * Sg * rec.qkv, o = B * Sg * rec.o, lse = B * Sg * Hu * 4;
  const int64_t fwd = std::max({2 * q, t * q, q + t * pos, q + pos + t * seg, q + pos + seg + o + lse + inner_f,
                                pos + seg + t * o + lse, pos + seg + 2 * o + lse});
  // Backward: Q,K,V,dO,LSE,delta records, LSE and delta scratch, dQ,dK,dV records.
  const int64_t qb = B * Sg * rec.bwd, g = B * Sg * rec.grads;
  const int64_t bwd = delta + std::max({2 * qb, t * qb, qb + t * pos, qb + pos + t * seg,
                                        qb + pos + seg + 2 * lse + g + inner_b, pos + seg + 2 * lse + t * g,
                                        pos + seg + 2 * lse + 2 * g});
  w.bytes = std::max(fwd, bwd);
  w.what = R > 1 ? "all-to-all buffers [B, S/R, H/U, D] plus the inner ring's chunks"
                 : "all-to-all buffers [B, S, H/U, D] (Q,K,V,dO in; O or dQ,dK,dV out)";
  return w;
}

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
  activation_dtype(s);  // checks e
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
