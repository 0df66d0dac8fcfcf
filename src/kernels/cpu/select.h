#pragma once
// Chooses each op's kernel for this CPU: the one place that does
// (select.cpp). It reads cpu_features() first and only then asks a file
// compiled for an ISA (attention/fused/avx2.cpp, ..._amx.cpp) for its
// kernels, so no instruction the CPU lacks ever runs.
#include <string>

#include "core/kernel_set.h"

namespace longctx {

// cpu_kernel_set() (core/kernel_set.h), defined here: the widest fused
// attention tiles and bf16 dot kernels this CPU and oneDNN's cap allow;
// bf16 attention and gemm_bf16 automatic (measured on first use, below).

// Each ISA's kernels where this CPU runs them, else null: what tests
// compare with the portable twins (the chooser asked, so never a SIGILL).
struct CpuIsaKernels {
  const attn::FusedTileKernels* fused_avx2 = nullptr;
  const attn::FusedTileKernels* fused_avx512 = nullptr;
  const attn::DotTileKernels* dot_avx512bf16 = nullptr;
  const attn::DotTileKernels* dot_amx = nullptr;
};
const CpuIsaKernels& cpu_isa_kernels();

// The automatic bf16 choices, each measured once per process on one thread
// (or pinned: LONGCTX_BF16_ATTENTION, LONGCTX_BF16_GEMM), with how they
// were made (benchmarks, plan --measure and longctx info print it).
AttentionTilePath measured_bf16_attention();
std::string bf16_attention_choice();
bool measured_gemm_bf16_native();
std::string gemm_bf16_choice();

// Where a counted step's kernels would run: this host's CPU kernels (a plan
// for this machine), or an accelerator's fused kernels (datasheet profiles:
// GPUs, TPUs), which keep their attention tiles on chip.
enum class KernelTarget { cpu, accelerator };
const char* kernel_target_name(KernelTarget target);
KernelTarget kernel_target_of(const std::string& name);  // ConfigError naming the choices
// A meta device's set: counts, and allocates the target's scratch (cpu:
// the calling thread's CPU device's kernels, the CPU's unless a test
// pinned others; accelerator: nothing of the host's).
KernelSet counting_kernel_set(KernelTarget target);
// What a count with `target` depends on, for the planner's memos: the
// target, and for a cpu target the scratch-relevant choices of the calling
// thread's CPU kernels.
std::string counting_key(KernelTarget target);

// One line per op: the kernel `set` runs and why (longctx info).
std::string describe_kernel_set(const KernelSet& set);

}  // namespace longctx
