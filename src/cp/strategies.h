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
  RingAttention(const Communicator& comm, int64_t chunk_tokens)
      : comm_(comm), chunk_tokens_(chunk_tokens) {}
  ~RingAttention() override;
  void forward(const AttentionArgs& local, const TensorView& o, float* lse) override;
  void backward_with_delta(const AttentionArgs& local, const TensorView& dout, const float* lse,
                           const float* delta, const TensorView& dq, const TensorView& dk,
                           const TensorView& dv) override;

 private:
  CommWorker& worker();  // started on first use, kept for every later call

  const Communicator& comm_;
  int64_t chunk_tokens_;
  std::unique_ptr<CommWorker> worker_;
};

// ---- helpers shared by the strategies (cp_common.cpp) ----

struct LocalDims {
  int64_t B, L, H, G, D;  // batch, local tokens, q heads, kv heads, head dim
};
// Checks the local args of a self-attention call: q and kv are the same L
// tokens (equal positions and segments), fp32, head dim contiguous.
LocalDims check_local_args(const AttentionArgs& a);

// Zeroes a (possibly strided) fp32 view.
void zero_view(const TensorView& v);

// Gathers every rank's [B, L, row_bytes] block into [B, P*L, row_bytes],
// token order rank-major within each batch row.
Buffer gather_tokens(const Communicator& comm, const void* local, int64_t B, int64_t L,
                     size_t row_bytes, const char* name);

// [P, B, L, row] <-> [B, P*L, row] (element = row_bytes). Returns `in` moved
// when B == 1 (the two layouts coincide), else a new buffer.
Buffer rank_major_to_batch_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes);
Buffer batch_major_to_rank_major(Buffer in, int P, int64_t B, int64_t L, size_t row_bytes);

}  // namespace longctx
