#pragma once
// The one interface the model uses for attention across a context-parallel
// group. The model never knows which strategy runs (CpStrategy, core/vocabulary.h).
//
// Every rank passes its LOCAL tokens: q [B, S_local, H_local, D] and k, v
// [B, S_local, G_local, D] (H_local, G_local: heads after tensor parallelism),
// with the global position (and segment id) of each local token in `args`.
// The layout (contiguous, zigzag, ...) is only a different set of positions.
//
// Strategies are stateless between forward and backward: backward receives
// q, k, v, o, lse again and redoes its communication, so nothing full-sequence
// outlives a call.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/mesh_shape.h"
#include "core/vocabulary.h"
#include "kernels/attention/attention.h"
#include "kernels/cpu/select.h"

namespace longctx {

class Mesh;  // src/comm/mesh.h


// Dtypes, as for the kernel (kernels/attention/attention.h): q, k, v all fp32 or all
// bf16; o and dout each fp32 or bf16; lse fp32; dq, dk, dv always fp32.
// What travels in which dtype (bf16 activations: half the bytes):
//   all_gather  K, V in their dtype; dK, dV reduce-scattered in fp32.
//   ulysses     Q, K, V in theirs, O back in o's, dO in its own; LSE, delta
//               and the returning dQ, dK, dV in fp32.
//   ring        K, V chunks and the partial dK, dV returned to their owner in
//               the dtype of k, v (a bf16 piece is rounded once, then added
//               in fp32); the partial outputs it merges stay fp32 (a bf16 O is
//               rounded once, at the end).
//   usp         ulysses around ring, each as above.
class CpAttention {
 public:
  virtual ~CpAttention() = default;
  // o [B, S_local, H_local, D] written; lse [B, S_local, H_local] written.
  virtual void forward(const AttentionArgs& local, const TensorView& o, float* lse) = 0;
  // dq, dk, dv (fp32, shapes of q, k, v) WRITTEN for the local tokens.
  virtual void backward(const AttentionArgs& local, const TensorView& o, const float* lse,
                        const TensorView& dout, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv) = 0;
};

// Tuning knobs; the defaults suit the CPU engine.
struct CpOptions {
  // ring/usp: K,V shards travel in chunks of about this many tokens (double
  // buffered), bounding ring memory to a few chunks instead of whole shards.
  // 0 (the default) picks it from the shard: cp_ring_auto_chunk_tokens.
  int64_t ring_chunk_tokens = 0;
  // A counted call (a meta device, core/device.h: the planner's) has no
  // positions to read: the ring takes every rank's chunk bounds from the
  // positions 0..S-1 laid out this way instead (S = its local tokens x its
  // ranks), which is what the planner predicts for. Unused on real data.
  LayoutKind counted_layout = LayoutKind::contiguous;
};

// The automatic chunk for a ring shard of `local_tokens` tokens: local/16
// rounded down to a multiple of the attention kernel's 128-token tile, at
// least one tile. The ring's buffers (3 K,V chunks + 2 dK,dV chunks) then
// stay at about 5/16 of the local K,V, i.e. a fixed small fraction of the
// attention's memory at any length (~4% of the per-rank peak at cp=4,
// S=16384, H=G=4), while chunks stay whole kernel tiles. The time per step
// does not depend on the chunk size between 128 and 4096 tokens (measured,
// bench/results/cp_cpu.md), so memory decides.
int64_t cp_ring_auto_chunk_tokens(int64_t local_tokens);

// The strategy over the mesh's context-parallel group: all_gather and
// ulysses use mesh.cp() as one group, ring mesh.ring() (all of cp), usp
// mesh.ulysses() for the all-to-all and mesh.ring() for the ring. With cp == 1 every strategy is the
// plain kernel. The mesh must outlive the returned object. Head and sequence
// rules (e.g. ulysses degree vs heads) are checked at each call, with the
// shapes: ConfigError naming the rule.
//
// Communication per rank per call (bytes; e = bytes per element of the
// activations q, k, v, o, dout: 4 for fp32, 2 for bf16; fp32 values (LSE,
// delta, dQ, dK, dV) count 4; P = group size; B batch; L = S/cp local
// tokens; H, G = local q and kv heads; D head dim; seg = 4 if the mask uses
// segments else 0; all counted as in src/comm/communicator.h):
//   all_gather  forward  all_gather: (P-1)*B*L*(2*e*G*D + 8 + seg)
//               backward the same, plus reduce_scatter (P-1)*B*L*8*G*D  (fp32)
//   ulysses     (Hu = H/P; Gu = G/P if P divides G, else 1: KV heads replicated)
//               forward  all_to_all (P-1)*B*L*e*(Hu + 2*Gu)*D     (q, k, v)
//                        all_to_all (P-1)*B*L*(e*Hu*D + 4*Hu)     (o, lse back)
//                        all_gather (P-1)*B*L*(8 + seg)           (positions, segments)
//               backward all_to_all (P-1)*B*L*(e*(2*Hu + 2*Gu)*D + 8*Hu)  (q, k, v, dout, lse, delta)
//                        all_to_all (P-1)*B*L*4*(Hu + 2*Gu)*D     (dq, dk, dv back, fp32)
//                        all_gather (P-1)*B*L*(8 + seg)
//               (ulysses_records in strategies.h; o and dout in another dtype
//               than q count their own e)
//   ring        every call all_gathers the shard summaries: (P-1)*B*n*32 bytes,
//               n = chunks per shard (cp_ring_chunks(L, ring_chunk_tokens)). Then for every (kv
//               owner o != q rank r, chunk c) whose mask is not empty:
//               forward  send/recv B*len_c*(2*e*G*D + 8 + seg) (K, V, positions)
//               backward the same, plus B*len_c*2*e*G*D back to the owner (dK, dV)
//               Fully masked (rank, chunk) pairs move nothing.
//   usp         ulysses over mesh.ulysses() with H, G, and ring over
//               mesh.ring() with Hu, Gu heads and U*L tokens.
std::unique_ptr<CpAttention> make_cp_attention(CpStrategy strategy, const Mesh& mesh,
                                               const CpOptions& options = {});

// Chunks per ring shard of `local_tokens` tokens: ceil(local / chunk_tokens),
// at least 2 (so each zigzag half is its own chunk) and even, at most
// local_tokens. chunk_tokens == 0: cp_ring_auto_chunk_tokens(local_tokens).
int64_t cp_ring_chunks(int64_t local_tokens, int64_t chunk_tokens);

// One attention call of a strategy on one rank: B sequences of L local
// tokens, H, G local q and kv heads of dim D (after tp).
struct CpCallShape {
  CpStrategy strategy = CpStrategy::all_gather;
  int64_t cp = 1, ulysses = 1;  // ulysses: the all-to-all degree (cp for ulysses, the usp factor)
  int64_t B = 1, L = 0, H = 0, G = 0, D = 0;
  bool segments = false;        // packed documents: segment ids travel with K,V
  int64_t threads = 1;          // kernel threads (per-thread attention scratch)
  KernelTarget kernels = KernelTarget::cpu;  // whose kernels the count stands for (kernels/cpu/select.h)
  int64_t ring_chunk_tokens = 0;  // CpOptions::ring_chunk_tokens
  int64_t element_bytes = 4;    // Q, K, V, O, dO (the activation dtype): 4 fp32, 2 bf16
  // For the ring's traffic: the mask, and positions 0..S-1 in this layout
  // (with packed documents, which pieces the ring skips depends on the data).
  MaskSpec mask = MaskSpec::causal();
  LayoutKind layout = LayoutKind::contiguous;
};
// One call of a strategy on one cp rank, counted by running it: its real
// forward and backward on a meta device (core/device.h) over a counting mesh
// (Mesh::counting), memoised per shape and rank (cp_count.cpp).
// - workspace: the peak bytes the call allocates (forward or backward,
//   whichever is larger), tracked as communication and scratch;
//   tests/mpi/test_plan_memory.cpp holds it against the MemoryTracker;
// - comm[pass][axis] (pass 0 forward, 1 backward; MeshAxis cp, ulysses,
//   ring): what it sends and receives, in the communicator's own counters
//   (the formulas above), the ring's skipped pieces decided by its own
//   chunk plan over the layout's positions (CpOptions::counted_layout);
//   tests/mpi/test_plan_comm.cpp holds them against real calls on every rank.
struct CpWorkspace {
  int64_t bytes = 0;
  std::string what;
};
struct CpCallCount {
  CpWorkspace workspace;
  std::array<std::array<CommCounters, kMeshAxes.size()>, 2> comm{};
};
const CpCallCount& count_cp_call(const CpCallShape& shape, int64_t cp_rank);
CpWorkspace cp_attention_workspace(const CpCallShape& shape);  // count_cp_call(shape, 0).workspace

}  // namespace longctx
