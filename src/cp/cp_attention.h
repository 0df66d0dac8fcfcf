#pragma once
// The one interface the model uses for attention across a context-parallel
// group. The model never knows which strategy runs (DESIGN.md section 1).
//
// Every rank passes its LOCAL tokens: q [B, S_local, H_local, D] and k, v
// [B, S_local, G_local, D] (H_local, G_local: heads after tensor parallelism),
// with the global position (and segment id) of each local token in `args`.
// The layout (contiguous, zigzag, ...) is only a different set of positions.
//
// Strategies are stateless between forward and backward: backward receives
// q, k, v, o, lse again and redoes its communication, so nothing full-sequence
// outlives a call.
#include <memory>
#include <string>

#include "kernels/attention.h"

namespace longctx {

class Mesh;  // src/comm/mesh.h

enum class CpStrategy { all_gather, ulysses, ring, usp };
CpStrategy parse_cp_strategy(const std::string& name);  // ConfigError on unknown names
const char* cp_strategy_name(CpStrategy s);

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

// The strategy over the mesh's context-parallel group (ulysses x ring axes).
// With cp == 1 every strategy is the plain kernel.
std::unique_ptr<CpAttention> make_cp_attention(CpStrategy strategy, const Mesh& mesh);

}  // namespace longctx
