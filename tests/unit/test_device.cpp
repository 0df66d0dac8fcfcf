// The device seam (core/device.h): a meta device counts buffers and never
// backs them, and the workspace of one strategy call, counted on a meta
// device (cp_attention_workspace, src/cp/cp_count.cpp), equals the
// peak the same call really allocates on the CPU. The oracle runs each
// strategy for real, with real buffers and kernels, over a counting mesh
// (one rank of cp; its peers' bytes never arrive, so it computes on zeros:
// the buffers are what is measured) and reads the process's MemoryTracker.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
#include "core/tensor.h"
#include "cp/cp_attention.h"
#include "kernels/cpu/select.h"
#include "kernels/ops.h"

namespace longctx {
namespace {

TEST(Device, MetaBuffersAreCountedAndNeverBacked) {
  const size_t global_before = MemoryTracker::global().current_total();
  const std::unique_ptr<Device> meta = Device::make_meta(3, counting_kernel_set(KernelTarget::cpu));
  {
    const DeviceScope scope(*meta);
    Buffer big(MemCategory::activations, "a terabyte", size_t{1} << 40);  // never allocated
    Buffer small(MemCategory::scratch, "small", 100);
    EXPECT_TRUE(is_meta(big.data()));
    EXPECT_TRUE(is_meta(small.as<char>() + 99));
    EXPECT_EQ(meta->tracker().current_total(), (size_t{1} << 40) + 100);
    EXPECT_EQ(meta->tracker().current(MemCategory::scratch), 100u);
    EXPECT_EQ(MemoryTracker::global().current_total(), global_before);
    {
      const DeviceScope cpu(Device::cpu());  // scopes nest
      Buffer real(MemCategory::scratch, "real", 64);
      EXPECT_FALSE(is_meta(real.data()));
      EXPECT_EQ(MemoryTracker::global().current_total(), global_before + 64);
    }
    Buffer moved = std::move(big);
    EXPECT_EQ(meta->tracker().current_total(), (size_t{1} << 40) + 100);
  }
  EXPECT_EQ(meta->tracker().current_total(), 0u);
  EXPECT_EQ(meta->tracker().peak_total(), (size_t{1} << 40) + 100);
  EXPECT_EQ(&Device::current(), &Device::cpu());
  Buffer after(MemCategory::scratch, "after the scope", 8);
  EXPECT_FALSE(is_meta(after.data()));
}

TEST(Device, AKernelGivenMetaDataOutsideItsScopeIsRefused) {
  const std::unique_ptr<Device> meta = Device::make_meta(1, counting_kernel_set(KernelTarget::cpu));
  Tensor q, o;
  std::vector<int64_t> pos(8);
  {
    const DeviceScope scope(*meta);
    q = Tensor({1, 8, 1, 16}, DType::f32, MemCategory::activations, "q");
    o = Tensor({1, 8, 1, 16}, DType::f32, MemCategory::activations, "o");
  }
  AttentionArgs a;
  a.q = a.k = a.v = q.view();
  a.q_pos = a.kv_pos = pos.data();
  float lse[8];
  EXPECT_THROW(attention_forward(a, o.view(), lse), Error);
}

// A view carries its device: a Tensor's its Buffer's, a view over raw
// storage device_of it (a meta device's storage: the current device, which
// must be a meta device). A kernel given views counts on its output view's
// own device, not on whichever device is current: here a view of device a
// handed to a kernel inside b's scope counts on a (a mutant that counted on
// the current device fails it).
TEST(Device, ViewsCarryTheirDeviceAndKernelsCountOnIt) {
  const std::unique_ptr<Device> a = Device::make_meta(1, counting_kernel_set(KernelTarget::cpu)),
                                b = Device::make_meta(1, counting_kernel_set(KernelTarget::cpu));
  Tensor y;
  {
    const DeviceScope scope(*a);
    y = Tensor({4, 8}, DType::f32, MemCategory::activations, "y");
    EXPECT_EQ(y.view().device, a.get());
    EXPECT_EQ(TensorView(y.f32() + 8, DType::f32, {3, 8}).device, a.get());  // a sub-view over its storage
  }
  std::vector<float> host(32), w(8, 1.0f);
  const TensorView x(host.data(), DType::f32, {4, 8});
  EXPECT_EQ(x.device, &Device::cpu());
  EXPECT_EQ(y.view().device, a.get());  // still a's after its scope
  EXPECT_THROW(TensorView(y.f32(), DType::f32, {4, 8}), Error);  // meta storage, no meta device current
  {
    const DeviceScope scope(*b);
    rmsnorm_forward(x, w.data(), 1e-5, y.view());
  }
  EXPECT_EQ(a->counted()[size_t(KernelId::rmsnorm_forward)], 32.0);
  for (double amount : b->counted()) EXPECT_EQ(amount, 0.0);
  EXPECT_TRUE(std::all_of(host.begin(), host.end(), [](float v) { return v == 0.0f; }));  // x untouched
}

struct Case {
  CpStrategy strategy;
  int64_t cp, ulysses, B, L, H, G, D;
  bool segments;
  DType dtype;
  int64_t ring_chunk_tokens;
};

// The peak (above its inputs) of one real forward and one real backward of
// the strategy on rank 0 of a counting mesh, on the CPU.
int64_t real_peak(const Case& c) {
  MeshShape shape;
  shape.cp = static_cast<int>(c.cp);
  shape.ulysses = static_cast<int>(c.ulysses);
  const Mesh mesh = Mesh::counting(shape, 0);
  const std::unique_ptr<CpAttention> attention = make_cp_attention(c.strategy, mesh, CpOptions{c.ring_chunk_tokens});
  Tensor q({c.B, c.L, c.H, c.D}, c.dtype, MemCategory::activations, "q");
  Tensor k({c.B, c.L, c.G, c.D}, c.dtype, MemCategory::activations, "k");
  Tensor v({c.B, c.L, c.G, c.D}, c.dtype, MemCategory::activations, "v");
  Tensor o({c.B, c.L, c.H, c.D}, c.dtype, MemCategory::activations, "o");
  Tensor dout({c.B, c.L, c.H, c.D}, c.dtype, MemCategory::activations, "dout");
  Tensor dq({c.B, c.L, c.H, c.D}, DType::f32, MemCategory::gradients, "dq");
  Tensor dk({c.B, c.L, c.G, c.D}, DType::f32, MemCategory::gradients, "dk");
  Tensor dv({c.B, c.L, c.G, c.D}, DType::f32, MemCategory::gradients, "dv");
  std::vector<float> lse(c.B * c.L * c.H);
  std::vector<int64_t> pos(c.B * c.L);
  std::vector<int32_t> seg(c.B * c.L);
  for (int64_t i = 0; i < c.B * c.L; ++i) pos[i] = i % c.L, seg[i] = static_cast<int32_t>(i % c.L / 20);
  AttentionArgs a;
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.q_pos = a.kv_pos = pos.data();
  a.mask = MaskSpec::causal();
  a.mask.same_segment = c.segments;
  if (c.segments) a.q_seg = a.kv_seg = seg.data();
  MemoryTracker& tracker = MemoryTracker::global();
  const size_t inputs = tracker.current_total();
  tracker.reset_peaks();
  attention->forward(a, o.view(), lse.data());
  const size_t forward = tracker.peak_total() - inputs;
  tracker.reset_peaks();
  attention->backward(a, o.view(), lse.data(), dout.view(), dq.view(), dk.view(), dv.view());
  const size_t backward = tracker.peak_total() - inputs;
  return static_cast<int64_t>(std::max(forward, backward));
}

TEST(Device, TheCountedWorkspaceOfEveryStrategyIsTheRealCallsPeak) {
  const int threads = omp_get_max_threads();
  std::vector<Case> cases;
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool segments : {false, true}) {
      // Odd local lengths (not multiples of the 128-token tile), B = 2 (the
      // reorders' second copy), GQA 4:2, a head dim of 40 and 64.
      cases.push_back({CpStrategy::ring, 1, 1, 2, 75, 4, 2, 40, segments, dtype, 0});
      cases.push_back({CpStrategy::all_gather, 4, 1, 2, 75, 4, 2, 64, segments, dtype, 0});
      cases.push_back({CpStrategy::ulysses, 2, 1, 2, 75, 4, 2, 40, segments, dtype, 0});
      cases.push_back({CpStrategy::ulysses, 4, 1, 1, 75, 4, 2, 64, segments, dtype, 0});  // kv heads replicated
      cases.push_back({CpStrategy::ring, 4, 1, 2, 75, 4, 2, 64, segments, dtype, 0});
      cases.push_back({CpStrategy::ring, 2, 1, 1, 300, 4, 2, 40, segments, dtype, 64});  // 5 chunks of 60
      cases.push_back({CpStrategy::usp, 4, 2, 2, 75, 4, 2, 64, segments, dtype, 0});
      cases.push_back({CpStrategy::usp, 8, 4, 1, 33, 8, 2, 40, segments, dtype, 32});
    }
  for (const Case& c : cases) {
    const std::string what = std::string(name_of(c.strategy)) + " cp=" + std::to_string(c.cp) + " U=" +
                             std::to_string(c.ulysses) + " B=" + std::to_string(c.B) + " L=" + std::to_string(c.L) +
                             " D=" + std::to_string(c.D) + (c.segments ? " segments" : "") + " " + name_of(c.dtype);
    SCOPED_TRACE(what);
    CpCallShape s;
    s.strategy = c.strategy;
    s.cp = c.cp;
    s.ulysses = c.strategy == CpStrategy::ulysses ? c.cp : c.ulysses;
    s.B = c.B, s.L = c.L, s.H = c.H, s.G = c.G, s.D = c.D;
    s.segments = c.segments;
    s.mask = MaskSpec::causal();
    s.mask.same_segment = c.segments;
    s.threads = threads;
    s.ring_chunk_tokens = c.ring_chunk_tokens;
    s.element_bytes = static_cast<int64_t>(dtype_size(c.dtype));
    const int64_t counted = cp_attention_workspace(s).bytes;
    EXPECT_GT(counted, 0);
    EXPECT_EQ(counted, real_peak(c)) << what;
  }
}

}  // namespace
}  // namespace longctx
