// cp_attention_workspace: the peak of the buffers one strategy call
// allocates, read by running the strategy's own forward and backward on a
// meta device (core/device.h) over a counting mesh (Mesh::counting): every
// buffer is counted where the strategy allocates it, and kernels count the
// scratch they would take, so nothing here restates a strategy's buffers.
// tests/mpi/test_plan_memory.cpp holds the result against the MemoryTracker
// of real training steps.
#include <map>
#include <mutex>
#include <tuple>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
#include "core/tensor.h"
#include "cp/cp_attention.h"

namespace longctx {

namespace {

// The inputs of one call on the current (meta) device: q, k, v, o, dO in the
// activation dtype, LSE and dQ, dK, dV in fp32, positions and segments.
struct CallTensors {
  Tensor q, k, v, o, dout, dq, dk, dv, lse;
  Buffer pos, seg;
  CallTensors(const CpCallShape& s, DType dtype)
      : q({s.B, s.L, s.H, s.D}, dtype, MemCategory::activations, "q"),
        k({s.B, s.L, s.G, s.D}, dtype, MemCategory::activations, "k"),
        v({s.B, s.L, s.G, s.D}, dtype, MemCategory::activations, "v"),
        o({s.B, s.L, s.H, s.D}, dtype, MemCategory::activations, "o"),
        dout({s.B, s.L, s.H, s.D}, dtype, MemCategory::activations, "dout"),
        dq({s.B, s.L, s.H, s.D}, DType::f32, MemCategory::gradients, "dq"),
        dk({s.B, s.L, s.G, s.D}, DType::f32, MemCategory::gradients, "dk"),
        dv({s.B, s.L, s.G, s.D}, DType::f32, MemCategory::gradients, "dv"),
        lse({s.B, s.L, s.H}, DType::f32, MemCategory::activations, "lse"),
        pos(MemCategory::activations, "positions", s.B * s.L * sizeof(int64_t)),
        seg(MemCategory::activations, "segments", s.segments ? s.B * s.L * sizeof(int32_t) : 0) {}
};

CpCallCount count_call(const CpCallShape& s, int64_t cp_rank) {
  if (s.element_bytes != 4 && s.element_bytes != 2)
    throw ConfigError("cp call count: element_bytes must be 4 (fp32) or 2 (bf16), got " +
                      std::to_string(s.element_bytes));
  const DType dtype = s.element_bytes == 2 ? DType::bf16 : DType::f32;
  const std::unique_ptr<Device> meta = Device::make_meta(static_cast<int>(s.threads), counting_kernel_set(s.kernels));
  const DeviceScope on_meta(*meta);
  MeshShape shape;
  shape.cp = static_cast<int>(s.cp);
  shape.ulysses = cp_strategy_info(s.strategy).takes_usp_factor ? static_cast<int>(s.ulysses) : 1;
  const Mesh mesh = Mesh::counting(shape, static_cast<int>(cp_rank));  // tp = 1: world rank = cp rank
  const std::unique_ptr<CpAttention> attention =
      make_cp_attention(s.strategy, mesh, CpOptions{s.ring_chunk_tokens, s.layout});

  CallTensors t(s, dtype);
  AttentionArgs args;
  args.q = t.q.view();
  args.k = t.k.view();
  args.v = t.v.view();
  args.q_pos = args.kv_pos = t.pos.as<int64_t>();
  args.mask = s.mask;
  args.mask.same_segment = s.segments;  // segment ids travel with K,V exactly when the mask compares them
  if (s.segments) args.q_seg = args.kv_seg = t.seg.as<int32_t>();

  CpCallCount out;
  auto counters = [&](int pass) {
    for (MeshAxis a : kMeshAxes) out.comm[pass][static_cast<size_t>(a)] = mesh.axis(a).counters();
    mesh.reset_counters();
  };
  MemoryTracker& tracker = meta->tracker();
  const size_t inputs = tracker.current_total();
  tracker.reset_peaks();
  attention->forward(args, t.o.view(), t.lse.f32());
  const size_t forward = tracker.peak_total() - inputs;
  counters(0);
  tracker.reset_peaks();
  attention->backward(args, t.o.view(), t.lse.f32(), t.dout.view(), t.dq.view(), t.dk.view(), t.dv.view());
  const size_t backward = tracker.peak_total() - inputs;
  counters(1);
  out.workspace = {static_cast<int64_t>(std::max(forward, backward)),
                   "forward " + format_bytes(forward) + ", backward " + format_bytes(backward) + ", counted on a meta device"};
  return out;
}

}  // namespace

const CpCallCount& count_cp_call(const CpCallShape& s, int64_t cp_rank) {
  // The planner asks for the same call many times (every lever rung of a
  // strategy and cp): count each once.
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t,
                         int64_t, std::string, int, int64_t, std::string>;
  const Key key{static_cast<int>(s.strategy), s.cp, s.ulysses, s.B, s.L, s.H, s.G, s.D, s.segments, s.threads,
                s.ring_chunk_tokens, s.element_bytes, s.mask.to_string(), static_cast<int>(s.layout), cp_rank,
                counting_key(s.kernels)};
  static std::mutex mu;
  static std::map<Key, CpCallCount> counted;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = counted.find(key);
    if (it != counted.end()) return it->second;
  }
  CpCallCount c = count_call(s, cp_rank);
  std::lock_guard<std::mutex> lock(mu);
  return counted.emplace(key, std::move(c)).first->second;
}

CpWorkspace cp_attention_workspace(const CpCallShape& s) { return count_cp_call(s, 0).workspace; }

}  // namespace longctx
