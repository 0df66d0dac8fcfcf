#pragma once
// The ops the engine calls, and the set of kernels a device runs them with
// (the types, in core: a device owns its set; the kernels are src/kernels).
//
// Every op is a KernelId with its name (kKernelNames; the planner's prices
// and the measured profiles' tables are keyed by it). A device
// (core/device.h) holds one KernelSet: the CPU's is chosen once from what
// the CPU has (src/kernels/cpu/select.cpp), a test pins its own
// (Device::make_cpu), and a meta device holds a counting set, whose ops run
// nothing: they count their work and allocate the scratch the *target's*
// kernels would (the host's chosen set for a plan of this machine; none for
// an accelerator's fused kernels), so that a plan never depends on the
// kernels the planning host happens to have.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace longctx {

namespace attn {
struct FusedTileKernels;  // attention/fused/fused.h
struct DotTileKernels;    // attention/dot/dot.h
}  // namespace attn

enum class KernelId : uint8_t {
  attention_forward,
  attention_backward,
  attention_delta,
  attention_merge,
  gemm,
  rmsnorm_forward,
  rmsnorm_backward,
  rope,
  swiglu_forward,
  swiglu_backward,
  cross_entropy,
  residual_add,
  convert,
  optimizer,
  embedding_forward,
  embedding_backward,
  copy_view,
  add_view,
  zero_view,
  copy_rows,
  fill_f32,
  copy_f32,
  add_f32,
  scale_f32,
  sum_of_squares,
  count
};
inline constexpr std::size_t kNumKernels = static_cast<std::size_t>(KernelId::count);
inline constexpr const char* kKernelNames[] = {
    "attention_forward", "attention_backward", "attention_delta", "attention_merge", "gemm",
    "rmsnorm_forward",   "rmsnorm_backward",   "rope",            "swiglu_forward",  "swiglu_backward",
    "cross_entropy",     "residual_add",       "convert",         "optimizer",       "embedding_forward",
    "embedding_backward", "copy_view",         "add_view",        "zero_view",       "copy_rows",
    "fill_f32",          "copy_f32",           "add_f32",         "scale_f32",       "sum_of_squares"};
static_assert(std::size(kKernelNames) == kNumKernels, "one name per KernelId, in its order");
constexpr const char* kernel_name(KernelId id) { return kKernelNames[static_cast<std::size_t>(id)]; }
// The id of a name (a profile's table key); nullopt for none.
std::optional<KernelId> kernel_id(std::string_view name);

// How the attention kernel multiplies the tiles (attention.h says each).
enum class AttentionTilePath { f32, f32_fused, bf16_widened, bf16_native, bf16_fused, bf16_dot, automatic };
// How gemm_bf16 multiplies (gemm.h): oneDNN's bf16 matmul, or the operands
// widened to fp32 for dnnl_sgemm. automatic: the measured choice.
enum class Bf16GemmPath { automatic, native, widened };

struct KernelSet {
  // What the kernels are for (longctx info, errors): "cpu", "cpu (pinned by a test)",
  // "counting: ..." on a meta device.
  std::string name = "cpu";

  // A meta device's set: the ops count their work (Device::count) and
  // allocate the scratch of the target's kernels, and run nothing.
  bool counts = false;
  // Whether the target's attention allocates the CPU kernel's per-thread
  // tile scratch (a CPU target), or none of its own in device memory (an
  // accelerator's fused flash kernel keeps its tiles on chip).
  bool attention_tile_scratch = true;

  // Attention. f32 inputs run f32_attention, bf16 inputs bf16_attention
  // (automatic: the fastest of the bf16 paths this CPU has, timed once per
  // process by select.cpp). The vector kernels each path needs (null where
  // this CPU lacks them).
  AttentionTilePath f32_attention = AttentionTilePath::f32;
  AttentionTilePath bf16_attention = AttentionTilePath::bf16_widened;
  const attn::FusedTileKernels* fused = nullptr;
  const attn::DotTileKernels* dot = nullptr;
  // Tests: the backward's kv blocks per unit (fused: 1-4, bf16_dot: 1-8) and
  // the bf16_dot forward's q blocks per unit (1-8); 0: automatic.
  int64_t backward_kv_blocks = 0;
  int64_t dot_forward_q_blocks = 0;

  // GEMM. gemm_bf16's path (automatic: measured once per process).
  Bf16GemmPath gemm_bf16 = Bf16GemmPath::automatic;
  // A product outside a parallel region cut into pieces by its shape alone,
  // so its bits do not depend on the thread count (gemm.h; the run's
  // deterministic_across_thread_counts).
  bool gemm_thread_count_independent = false;
  // The widened bf16 path's scratch budget in floats (tests: small, to cut
  // small products into blocks).
  int64_t gemm_widen_floats = int64_t(1) << 24;

  // Per op: the kernel this set runs and why (longctx info); "" where the
  // op has one kernel.
  std::array<std::string, kNumKernels> why;

  // The path q, k, v in `dtype` run on (automatic resolved).
  AttentionTilePath attention_path(DType dtype) const;
  // gemm_bf16's path (automatic resolved): native or widened.
  Bf16GemmPath gemm_bf16_path() const;
};

// The CPU's kernel set, chosen on the first call (src/kernels/cpu/select.cpp
// defines it, and these methods: a build without the kernels, the fuzz
// targets, never asks).
const KernelSet& cpu_kernel_set();

}  // namespace longctx
