#pragma once
// Checks a context-parallel strategy against the float64 single-rank
// reference on random data: every rank builds the same global problem from a
// seed, runs the strategy on its shard, and compares its o, lse, dq, dk, dv
// with the reference rows of its tokens. Used by `longctx selftest` and the
// MPI tests. Collective over mesh.world().
#include <cstdint>
#include <string>

#include "comm/mesh.h"
#include "cp/cp_attention.h"
#include "cp/layout.h"

namespace longctx {

struct CpCheckCase {
  CpStrategy strategy = CpStrategy::ring;
  LayoutKind layout = LayoutKind::contiguous;
  MaskSpec mask = MaskSpec::causal();
  int64_t batch = 1, seq_len = 64, heads = 4, kv_heads = 2, head_dim = 16;
  uint64_t seed = 1;
  CpOptions options;
  // bf16: q, k, v, o, dout in bf16 (inputs rounded to bf16 first), checked
  // against the single-rank bf16 kernel within bounds derived from bf16's
  // unit roundoff (cp_selfcheck.cpp).
  DType dtype = DType::f32;
};

struct CpCheckResult {
  // fp32: max |x - ref| / max |ref| over all ranks, per tensor, against the
  // float64 reference. bf16: max |x - x1| / bound over all ranks and
  // elements, against the single-rank bf16 result x1 (within the bound: <= 1).
  double err_o = 0, err_lse = 0, err_dq = 0, err_dk = 0, err_dv = 0;
  CommCounters counters;  // this rank, over the cp sub-communicators, one forward + backward
  double max_error() const;
};

// The global problem (every rank builds the same): positions are the token
// index, or, with segment masking, documents of random length whose positions
// restart at 0.
struct CpProblem {
  int64_t B, S, H, G, D;
  std::vector<float> q, k, v, dout;  // [B, S, H|G, D]
  std::vector<int64_t> pos;          // [B, S]
  std::vector<int32_t> seg;          // [B, S]
};
CpProblem make_cp_problem(const CpCheckCase& c);

CpCheckResult check_cp_strategy(const Mesh& mesh, const CpCheckCase& c);

}  // namespace longctx
