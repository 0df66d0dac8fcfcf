#pragma once
// The strategies behind make_cp_attention (internal to src/cp).
//
// Each implements backward through backward_with_delta, which takes the
// final LSE and delta = rowsum(dO * O) of its q rows: ulysses computes delta
// on the owning rank (H floats per token) and ships that instead of O.
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "cp/cp_attention.h"
#include "kernels/ops.h"

namespace longctx {

class CpAttentionImpl : public CpAttention {
 public:
  void backward(const AttentionArgs& local, const TensorView& o, const float* lse,
                const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv) override;
  // lse, delta [B, S_local, H_local]. dq, dk, dv WRITTEN.
  virtual void backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                   const float* lse, const float* delta, const TensorView& dq,
                                   const TensorView& dk, const TensorView& dv) = 0;
};

// cp == 1: the kernel itself.
class LocalAttention : public CpAttentionImpl {
 public:
  void forward(const AttentionArgs& local, const TensorView& o, float* lse) override;
  void backward_with_delta(const AttentionArgs& local, const TensorView& dout, const float* lse,
                           const float* delta, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv) override;
};

class AllGatherAttention : public CpAttentionImpl {
 public:
  explicit AllGatherAttention(const Communicator& comm) : comm_(comm) {}
  void forward(const AttentionArgs& local, const TensorView& o, float* lse) override;
  void backward_with_delta(const AttentionArgs& local, const TensorView& dout, const float* lse,
                           const float* delta, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv) override;

 private:
  const Communicator& comm_;
};

// All-to-all over `comm`, then `inner` attends over the gathered sequence
// with H/U heads (LocalAttention for ulysses, RingAttention for usp).
class UlyssesAttention : public CpAttentionImpl {
 public:
  UlyssesAttention(const Communicator& comm, std::unique_ptr<CpAttentionImpl> inner)
      : comm_(comm), inner_(std::move(inner)) {}
  void forward(const AttentionArgs& local, const TensorView& o, float* lse) override;
  void backward_with_delta(const AttentionArgs& local, const TensorView& dout, const float* lse,
                           const float* delta, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv) override;

 private:
  const Communicator& comm_;
  std::unique_ptr<CpAttentionImpl> inner_;
};

class RingAttention : public CpAttentionImpl {
 public:
  RingAttention(const Communicator& comm, const CpOptions& options) : comm_(comm), options_(options) {}
  ~RingAttention() override;
  void forward(const AttentionArgs& local, const TensorView& o, float* lse) override;
  void backward_with_delta(const AttentionArgs& local, const TensorView& dout, const float* lse,
                           const float* delta, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv) override;

 private:
  CommWorker& worker();  // started on first use, kept for every later call

  const Communicator& comm_;
  CpOptions options_;
  std::unique_ptr<CommWorker> worker_;
};

// ---- helpers shared by the strategies (cp_common.cpp) ----

struct LocalDims {
  int64_t B, L, H, G, D;  // batch, local tokens, q heads, kv heads, head dim
  DType dtype;            // of q, k, v
  int64_t e;              // its bytes per element: K, V (and Q) travel in it
};
// Checks the local args of a self-attention call: q and kv are the same L
// tokens (equal positions and segments), q, k, v all fp32 or all bf16, head
// dim contiguous.
LocalDims check_local_args(const AttentionArgs& a);

// Heads [h0, h0 + n) of a [B, S, heads, D] view, and tokens [t0, t0 + n)
// of one: views into it (the strategies' moves are kernels over views,
// kernels/ops.h copy_view, add_view, zero_view, copy_rows).
TensorView head_slice(const TensorView& t, int64_t h0, int64_t n);
TensorView token_slice(const TensorView& t, int64_t t0, int64_t n);

// [B, S, n, D] of `dtype` over records of `row_bytes` bytes per token
// starting at `base` (row_bytes a multiple of the element size).
TensorView record_view(char* base, DType dtype, int64_t B, int64_t S, int64_t n, int64_t D, int64_t row_bytes);

// What ulysses sends per token to one rank holding Hu q heads and Gu kv
// heads (bytes; the one layout of UlyssesAttention):
//   qkv    forward in:    q, k, v in their dtype (e)
//   o      forward back:  o in its dtype (e_o), then lse (fp32)
//   bwd    backward in:   lse, delta (fp32), q, k, v (e), dout (e_dout) at
//                         bwd_dout (aligned to e_dout), the record padded to
//                         4 bytes (padding only when e and e_dout differ and
//                         a section holds an odd number of elements)
//   grads  backward back: dq, dk, dv (fp32)
struct UlyssesRecords {
  int64_t qkv, o, bwd, bwd_q, bwd_dout, grads;
};
UlyssesRecords ulysses_records(int64_t Hu, int64_t Gu, int64_t D, int64_t e, int64_t e_o, int64_t e_dout);

// Gathers every rank's [B, L, row_bytes] block into [B, P*L, row_bytes],
// token order rank-major within each batch row.
Buffer gather_tokens(const Communicator& comm, const void* local, int64_t B, int64_t L,
                     size_t row_bytes, const char* name);

// [P, B, L, row] <-> [B, P*L, row] (element = row_bytes). Returns `in` moved
// when B == 1 (the two layouts coincide), else a new buffer.
Buffer rank_major_to_batch_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes);
Buffer batch_major_to_rank_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes);

}  // namespace longctx
