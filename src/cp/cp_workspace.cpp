// cp_attention_workspace: the peak of the tracked buffers one strategy call
// allocates. Each rule follows the allocations of one strategy file, in the
// order they live, with the kernel's own scratch sizes and the ring's own
// chunk plan; tests/mpi/test_plan_memory.cpp holds it against the
// MemoryTracker of real training steps, so a change to a strategy's buffers
// that is not made here fails there.
#include <algorithm>

#include "cp/cp_attention.h"

namespace longctx {

namespace {

// A buffer gathered token-major over P ranks (gather_tokens, or an
// all-to-all followed by rank_major_to_batch_major): for B > 1 the reorder
// holds a second copy while it runs.
int64_t reorder_copies(const CpCallShape& s) { return s.B > 1 ? 2 : 1; }

// RingAttention (ring_attention.cpp) over `tokens` local tokens of H, G
// heads: one chunk to send and two receiving; forward adds the partial O and
// LSE of one chunk (scratch) and the kernel's scratch, backward the returning
// dK, dV (one sending, two receiving) and the kernel's scratch.
int64_t ring_call_peak(const CpCallShape& s, int64_t H, int64_t G, int64_t tokens, bool backward) {
  const RingChunks chunks(1, s.B, tokens, s.ring_chunk_tokens);
  const int64_t max_len = chunks.max_len();
  const int64_t cap = ring_chunk_bytes(s.B, max_len, G, s.D, s.segments);
  const int64_t grad_cap = s.B * max_len * 2 * G * s.D * 4;
  if (!backward)
    return 3 * cap + s.B * tokens * H * (s.D + 1) * 4 + attention_forward_scratch_bytes(s.D, s.threads);
  return 3 * cap + 3 * grad_cap + attention_backward_scratch_bytes(s.D, s.threads);
}

}  // namespace

CpWorkspace cp_attention_workspace(const CpCallShape& s) {
  CpWorkspace w;
  const int64_t B = s.B, D = s.D, L = s.L, S = s.L * s.cp, seg_row = s.segments ? 4 : 0;
  const int64_t kernel_f = attention_forward_scratch_bytes(D, s.threads);
  const int64_t kernel_b = attention_backward_scratch_bytes(D, s.threads);
  const int64_t t = reorder_copies(s);
  const int64_t delta = B * L * s.H * 4;  // CpAttentionImpl::backward's "cp delta"
  if (s.cp == 1) {  // LocalAttention: the kernel alone
    w.bytes = std::max(kernel_f, delta + kernel_b);
    w.what = "kernel scratch and delta";
    return w;
  }
  if (s.strategy == CpStrategy::all_gather) {
    // gather_kv: the local K,V copy lives while K,V, positions, segments are gathered.
    const int64_t local = B * L * 2 * s.G * D * 4;
    const int64_t kv = B * S * 2 * s.G * D * 4, pos = B * S * 8, seg = B * S * seg_row;
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
  // Heads after the all-to-all: q heads split, KV heads split when the
  // degree divides them, else one replicated KV head.
  const int64_t U = s.ulysses, R = s.cp / U;
  const int64_t Hu = s.H / U, Gu = U == 1 ? s.G : s.G % U == 0 ? s.G / U : 1;
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
  const int64_t q = B * Sg * (Hu + 2 * Gu) * D * 4, o = B * Sg * Hu * (D + 1) * 4, lse = B * Sg * Hu * 4;
  const int64_t fwd = std::max({2 * q, t * q, q + t * pos, q + pos + t * seg, q + pos + seg + o + lse + inner_f,
                                pos + seg + t * o + lse, pos + seg + 2 * o + lse});
  // Backward: Q,K,V,dO,LSE,delta records, LSE and delta scratch, dQ,dK,dV records.
  const int64_t qb = B * Sg * ((2 * Hu + 2 * Gu) * D + 2 * Hu) * 4, g = B * Sg * (Hu + 2 * Gu) * D * 4;
  const int64_t bwd = delta + std::max({2 * qb, t * qb, qb + t * pos, qb + pos + t * seg,
                                        qb + pos + seg + 2 * lse + g + inner_b, pos + seg + 2 * lse + t * g,
                                        pos + seg + 2 * lse + 2 * g});
  w.bytes = std::max(fwd, bwd);
  w.what = R > 1 ? "all-to-all buffers [B, S/R, H/U, D] plus the inner ring's chunks"
                 : "all-to-all buffers [B, S, H/U, D] (Q,K,V,dO in; O or dQ,dK,dV out)";
  return w;
}

}  // namespace longctx
