// ranks: 2 4
// Byte counters after one forward + backward equal the formulas documented in
// src/cp/cp_attention.h, recomputed here from the shapes (and, for ring, from
// an exact pair-by-pair scan of which (rank, chunk) pieces the mask touches),
// in fp32 and in bf16 (e = 4 or 2 bytes per activation element; LSE, delta
// and the fp32 gradients stay 4), and equal what the planner counts on a meta
// device (count_cp_call).
#include <gtest/gtest.h>

#include <algorithm>

#include "comm/mesh.h"
#include "cp/cp_selfcheck.h"

namespace longctx {
namespace {

int world_size() {
  int n = 1;
  n = comm_world_size();
  return n;
}

const DType kDtypes[] = {DType::f32, DType::bf16};

// check_cp_strategy's error: relative to the reference (fp32), or to the derived bound (bf16).
double tolerance(const CpCheckCase& c) { return c.dtype == DType::bf16 ? 1.0 : 2e-5; }

CpCheckCase base_case(CpStrategy s, const char* mask, DType dtype = DType::f32) {
  CpCheckCase c;
  c.dtype = dtype;
  c.strategy = s;
  c.mask = MaskSpec::parse(mask);
  c.batch = 2;
  c.seq_len = 64;
  c.heads = 8;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.options.ring_chunk_tokens = 4;
  return c;
}

TEST(CpBytes, AllGather) {
  const int64_t P = world_size();
  Mesh mesh(1, P, 1, 1);
  for (DType dtype : kDtypes)
    for (const char* mask : {"causal", "causal+segments"}) {
      CpCheckCase c = base_case(CpStrategy::all_gather, mask, dtype);
      CpCheckResult r = check_cp_strategy(mesh, c);
      const int64_t L = c.seq_len / P, seg = c.mask.same_segment ? 4 : 0, e = dtype_size(dtype);
      const int64_t gathered = 2 * (P - 1) * c.batch * L * (2 * e * c.kv_heads * c.head_dim + 8 + seg);
      EXPECT_EQ(r.counters[CommOp::all_gather].bytes_sent, gathered) << mask;
      EXPECT_EQ(r.counters[CommOp::all_gather].bytes_received, gathered) << mask;
      const int64_t scattered = (P - 1) * c.batch * L * 8 * c.kv_heads * c.head_dim;
      EXPECT_EQ(r.counters[CommOp::reduce_scatter].bytes_sent, scattered) << mask;
      EXPECT_EQ(r.counters.bytes_sent(), gathered + scattered) << mask;
    }
}

TEST(CpBytes, Ulysses) {
  const int64_t P = world_size();
  Mesh mesh(1, P, 1, 1);
  for (DType dtype : kDtypes)
    for (int64_t kv_heads : {8, 2, 1}) {
      CpCheckCase c = base_case(CpStrategy::ulysses, "causal", dtype);
      c.kv_heads = kv_heads;
      CpCheckResult r = check_cp_strategy(mesh, c);
      const int64_t L = c.seq_len / P, D = c.head_dim, Hu = c.heads / P, e = dtype_size(dtype);
      const int64_t Gu = kv_heads % P == 0 ? kv_heads / P : 1;
      const int64_t bytes_per_token = e * (Hu + 2 * Gu) * D + e * Hu * D + 4 * Hu    // forward
                                      + e * (2 * Hu + 2 * Gu) * D + 4 * 2 * Hu       // backward in
                                      + 4 * (Hu + 2 * Gu) * D;                       // backward out
      EXPECT_EQ(r.counters[CommOp::all_to_all].bytes_sent, (P - 1) * c.batch * L * bytes_per_token)
          << "G=" << kv_heads << " " << name_of(dtype);
      EXPECT_EQ(r.counters[CommOp::all_gather].bytes_sent, 2 * (P - 1) * c.batch * L * 8)
          << "G=" << kv_heads;
      EXPECT_EQ(r.counters[CommOp::all_to_all].bytes_received, r.counters[CommOp::all_to_all].bytes_sent);
    }
}

// usp at (ulysses, ring) = (2, 2): the ulysses formula over the ulysses group
// (P = 2, L = S/4 local tokens, all heads), then the ring formula over the
// ring group with the ulysses-local heads and 2 * L tokens. Full mask: every
// ring piece moves.
TEST(CpBytes, Usp) {
  if (world_size() != 4) GTEST_SKIP() << "usp 2 x 2 needs 4 ranks";
  Mesh mesh(1, 4, 2, 1);
  for (DType dtype : kDtypes) {
    CpCheckCase c = base_case(CpStrategy::usp, "full", dtype);
    CpCheckResult r = check_cp_strategy(mesh, c);
    EXPECT_LE(r.max_error(), tolerance(c));
    const int64_t U = 2, R = 2, B = c.batch, D = c.head_dim, L = c.seq_len / 4, e = dtype_size(dtype);
    const int64_t Hu = c.heads / U, Gu = c.kv_heads / U;
    const int64_t a2a_bytes_per_token = e * (Hu + 2 * Gu) * D + e * Hu * D + 4 * Hu +
                                        e * (2 * Hu + 2 * Gu) * D + 4 * 2 * Hu + 4 * (Hu + 2 * Gu) * D;
    const int64_t a2a = (U - 1) * B * L * a2a_bytes_per_token;
    const int64_t positions = 2 * (U - 1) * B * L * 8;
    const int64_t Lr = U * L, n = cp_ring_chunks(Lr, c.options.ring_chunk_tokens);
    const int64_t summaries = 2 * (R - 1) * B * n * 32;
    const int64_t kv_row = 2 * e * Gu * D;
    const int64_t ring_p2p = (R - 1) * B * Lr * (2 * (kv_row + 8) + kv_row);
    EXPECT_EQ(r.counters[CommOp::all_to_all].bytes_sent, a2a) << name_of(dtype);
    EXPECT_EQ(r.counters[CommOp::all_gather].bytes_sent, positions + summaries) << name_of(dtype);
    EXPECT_EQ(r.counters[CommOp::send].bytes_sent, ring_p2p) << name_of(dtype);
    EXPECT_EQ(r.counters[CommOp::recv].bytes_received, ring_p2p) << name_of(dtype);
    EXPECT_EQ(r.counters.bytes_sent(), a2a + positions + summaries + ring_p2p) << name_of(dtype);
  }
}

// Ring bytes from an exact scan: piece (q rank, kv rank, chunk) moves iff some
// pair of tokens in it is allowed by the mask.
struct RingExpectation {
  int64_t sent = 0, received = 0, pieces = 0;
};

RingExpectation expected_ring_bytes(const CpCheckCase& c, int P, int rank) {
  CpProblem p = make_cp_problem(c);
  CpLayout layout(c.layout, c.seq_len, P);
  const int64_t L = layout.local_len(), n = cp_ring_chunks(L, c.options.ring_chunk_tokens);
  const int64_t seg = c.mask.same_segment ? 4 : 0, kv_row = 2 * dtype_size(c.dtype) * c.kv_heads * c.head_dim;
  auto piece_needed = [&](int q_rank, int kv_rank, int64_t chunk) {
    const auto& qi = layout.token_indices(q_rank);
    const auto& ki = layout.token_indices(kv_rank);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i : qi)
        for (int64_t j = chunk * L / n; j < (chunk + 1) * L / n; ++j) {
          int64_t qg = b * c.seq_len + i, kg = b * c.seq_len + ki[j];
          if (c.mask.allows(p.pos[qg], p.pos[kg], p.seg[qg], p.seg[kg])) return true;
        }
    return false;
  };
  RingExpectation e;
  // Shard summaries, all-gathered once per call (forward and backward).
  e.sent = e.received = 2 * (P - 1) * c.batch * n * 32;
  for (int s = 1; s < P; ++s)
    for (int64_t ch = 0; ch < n; ++ch) {
      const int64_t len = (ch + 1) * L / n - ch * L / n;
      if (piece_needed((rank + s) % P, rank, ch)) {  // my chunk goes out, its dK, dV come back
        e.sent += 2 * c.batch * len * (kv_row + 8 + seg);
        e.received += c.batch * len * kv_row;
      }
      if (piece_needed(rank, (rank - s + P) % P, ch)) {  // a chunk comes in, its dK, dV go back
        e.received += 2 * c.batch * len * (kv_row + 8 + seg);
        e.sent += c.batch * len * kv_row;
        ++e.pieces;
      }
    }
  return e;
}

TEST(CpBytes, Ring) {
  const int P = world_size();
  Mesh mesh(1, P, 1, 1);
  for (DType dtype : kDtypes)
    for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::zigzag})
      for (const char* mask : {"full", "causal", "local:3", "causal+segments"}) {
        CpCheckCase c = base_case(CpStrategy::ring, mask, dtype);
        c.layout = layout;
        CpCheckResult r = check_cp_strategy(mesh, c);
        EXPECT_LE(r.max_error(), tolerance(c));
        RingExpectation e = expected_ring_bytes(c, P, mesh.cp_rank());
        if (!c.mask.same_segment) {
          EXPECT_EQ(r.counters.bytes_sent(), e.sent) << name_of(layout) << " " << mask;
          EXPECT_EQ(r.counters.bytes_received(), e.received) << name_of(layout) << " " << mask;
        } else {
          // Positions restart per document, so chunk ranges are conservative:
          // at least the exact pieces move, at most all of them.
          EXPECT_GE(r.counters.bytes_sent(), e.sent) << name_of(layout);
          EXPECT_GE(r.counters.bytes_received(), e.received) << name_of(layout);
          const int64_t L = c.seq_len / P, n = cp_ring_chunks(L, c.options.ring_chunk_tokens);
          const int64_t kv_row = 2 * dtype_size(dtype) * c.kv_heads * c.head_dim;
          const int64_t everything = 2 * (P - 1) * c.batch * n * 32 +
                                     (P - 1) * c.batch * L * (2 * (kv_row + 8 + 4) + kv_row);
          EXPECT_LE(r.counters.bytes_sent(), everything) << name_of(layout);
        }
      }
}

// A window shorter than a chunk: a contiguous rank needs only the last chunk
// of its left neighbour, so every other piece, and every step s >= 2, moves
// nothing. Rank r receives that one chunk twice (forward, backward) unless it
// is rank 0, and the dK, dV of its own last chunk back from rank r+1 unless
// it is the last rank.
TEST(CpBytes, SlidingWindowSkipsRingSteps) {
  const int P = world_size();
  Mesh mesh(1, P, 1, 1);
  for (DType dtype : kDtypes) {
    CpCheckCase c = base_case(CpStrategy::ring, "local:3", dtype);
    CpCheckResult r = check_cp_strategy(mesh, c);
    EXPECT_LE(r.max_error(), tolerance(c));
    const int rank = mesh.cp_rank();
    const int64_t L = c.seq_len / P, n = cp_ring_chunks(L, c.options.ring_chunk_tokens);
    const int64_t len = L - (n - 1) * L / n;  // the last chunk
    const int64_t kv_row = 2 * dtype_size(dtype) * c.kv_heads * c.head_dim;  // K, V and their gradients
    const int64_t kv = c.batch * len * (kv_row + 8);
    const int64_t grad = c.batch * len * kv_row;
    EXPECT_EQ(r.counters[CommOp::recv].calls, (rank > 0 ? 2 : 0) + (rank < P - 1 ? 1 : 0));
    EXPECT_EQ(r.counters[CommOp::recv].bytes_received,
              (rank > 0 ? 2 * kv : 0) + (rank < P - 1 ? grad : 0));
    EXPECT_EQ(r.counters[CommOp::send].bytes_sent,
              (rank < P - 1 ? 2 * kv : 0) + (rank > 0 ? grad : 0));
  }
}

// The counted call (count_cp_call: what the planner reads, from one rank on a
// meta device) against the counters of one real forward + backward on every
// rank, per operation, for every strategy in fp32 and bf16.
TEST(CpBytes, CountedCallEqualsTheRealCounters) {
  const int P = world_size();
  struct Strategy {
    CpStrategy strategy;
    int ulysses;
  };
  std::vector<Strategy> strategies = {{CpStrategy::all_gather, 1}, {CpStrategy::ulysses, P}, {CpStrategy::ring, 1}};
  if (P == 4) strategies.push_back({CpStrategy::usp, 2});
  for (const Strategy& st : strategies)
    for (DType dtype : kDtypes)
      for (const char* mask : {"causal", "local:3"}) {
        Mesh mesh(1, P, st.ulysses, 1);
        CpCheckCase c = base_case(st.strategy, mask, dtype);
        CpCheckResult r = check_cp_strategy(mesh, c);
        CpCallShape shape;
        shape.strategy = st.strategy;
        shape.cp = P, shape.ulysses = st.ulysses;
        shape.B = c.batch, shape.L = c.seq_len / P, shape.H = c.heads, shape.G = c.kv_heads, shape.D = c.head_dim;
        shape.ring_chunk_tokens = c.options.ring_chunk_tokens;
        shape.element_bytes = dtype_size(dtype);
        shape.mask = c.mask;
        shape.layout = c.layout;
        CommCounters predicted;
        for (const auto& pass : count_cp_call(shape, mesh.cp_rank()).comm)
          for (const CommCounters& axis : pass) predicted += axis;
        for (CommOp op : {CommOp::send, CommOp::recv, CommOp::all_gather, CommOp::all_to_all, CommOp::reduce_scatter}) {
          EXPECT_EQ(r.counters[op].bytes_sent, predicted[op].bytes_sent)
              << name_of(st.strategy) << " " << name_of(dtype) << " " << mask << " " << comm_op_name(op);
          EXPECT_EQ(r.counters[op].bytes_received, predicted[op].bytes_received)
              << name_of(st.strategy) << " " << name_of(dtype) << " " << mask << " " << comm_op_name(op);
          EXPECT_EQ(r.counters[op].calls, predicted[op].calls)
              << name_of(st.strategy) << " " << name_of(dtype) << " " << mask << " " << comm_op_name(op);
        }
      }
}

}  // namespace
}  // namespace longctx
