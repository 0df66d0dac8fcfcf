#pragma once
// What this CPU and this process can run, read once: the one place longctx
// asks the CPU (cpuid, xgetbv for the OS's saved vector state, Linux's
// permission for the AMX tile data), oneDNN's effective ISA (the CPU's,
// capped by ONEDNN_MAX_CPU_ISA) and the LONGCTX_* pins. Nothing else in
// longctx tests a CPU feature; src/kernels/cpu/select.cpp chooses each op's
// kernel from these answers, and only then calls into a file compiled for
// an ISA the build's target may lack.
#include <string>

namespace longctx::cpu {

// The widest x86 vector ISA oneDNN runs here: what sgemm runs on, and the
// cap of longctx's own vector kernels, so that one setting caps both.
enum class VectorIsa { none, avx2, avx512 };
// The bf16 instructions in oneDNN's effective ISA (capped the same way).
enum class Bf16Isa { none, avx512_bf16, amx };

struct CpuFeatures {
  std::string vendor, model;  // cpuid's vendor and brand strings ("" off x86)
  int family = 0, model_number = 0;
  // Each true only where the CPU has it AND the OS saves its registers
  // (XCR0: the YMM state for AVX*, opmask and ZMM for AVX-512, the tile
  // state for AMX; Linux also grants the tile data on request).
  bool sse4_2 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false;
  bool bmi1 = false, bmi2 = false;  // scalar bit instructions -march=native emits on its own
  bool amx_cpu = false;  // cpuid's AMX-BF16 and AMX-TILE, before the OS's say
  // oneDNN: its effective ISA's name and what it includes; the cap as set.
  std::string onednn_isa, onednn_cap;
  VectorIsa onednn_vector = VectorIsa::none;
  Bf16Isa onednn_bf16 = Bf16Isa::none;
  // LONGCTX_BF16_ATTENTION (dot|fused|native|widened) and LONGCTX_BF16_GEMM
  // (native|widened): "" where unset.
  std::string pin_bf16_attention, pin_bf16_gemm;

  // The ISAs longctx's own kernels may run here: the CPU's and oneDNN's cap.
  bool runs_avx2_fma() const { return avx2 && fma && onednn_vector != VectorIsa::none; }
  bool runs_avx512() const { return avx512f && runs_avx2_fma() && onednn_vector == VectorIsa::avx512; }
  bool runs_avx512_bf16() const {
    return runs_avx512() && avx512_bf16 && avx512bw && avx512dq && onednn_bf16 != Bf16Isa::none;
  }
  bool runs_amx_bf16() const {
    return runs_avx512_bf16() && avx512vl && amx_tile && amx_bf16 && onednn_bf16 == Bf16Isa::amx;
  }
  // "avx2 fma avx512f ..." as found (for longctx info and benchmark headers).
  std::string flags() const;
};

// Read on the first call (thread-safe), the same answers after.
const CpuFeatures& cpu_features();

// The instruction sets the build's own flags let the compiler use anywhere
// (build_target.cpp: -march=native, or a portable build's x86-64 baseline).
// Before any other code of longctx runs, features.cpp checks the CPU has
// them all, and otherwise exits with a message naming what is missing and
// the portable build (never SIGILL in code the compiler vectorized).
struct BuildTarget {
  bool sse4_2 = false, avx = false, avx2 = false, fma = false, f16c = false, bmi1 = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false, avx512_bf16 = false;
  bool amx_tile = false;
};
extern const BuildTarget kBuildTarget;
// "" where this CPU runs the build; else the instruction sets it lacks.
std::string missing_build_isas(const CpuFeatures& cpu, const BuildTarget& build);
// Whether the build is portable (no -march=native) or native: its flags' name.
const char* build_kind();

}  // namespace longctx::cpu
