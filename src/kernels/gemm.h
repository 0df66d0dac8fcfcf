#pragma once
// Row-major GEMM through oneDNN: C = alpha * op(A) op(B) + beta * C.
// The one way longctx multiplies matrices; called inside OpenMP regions it
// runs on the calling thread (nested parallelism is off).
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace longctx {

// Off by default: oneDNN threads each product itself, and its last bits
// depend on the thread count. On (deterministic_across_thread_counts), a
// product outside a parallel region is cut into pieces that depend only on
// its shape, so results are bit-identical at any thread count (src/kernels/gemm.cpp);
// for gemm_f32 and gemm_bf16 alike.
void set_gemm_thread_count_independent(bool on);
bool gemm_thread_count_independent();

void gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
              int64_t ldc);

// The same with bf16 inputs, fp32 accumulation and an fp32 C, on whichever
// of two paths is faster on this CPU (measured once per process:
// gemm.cpp, native_is_faster): oneDNN's bf16 matmul, which picks the
// CPU's matrix units by itself (AMX-BF16, AVX512-BF16), or the operands
// widened to fp32 (exactly) and dnnl_sgemm, where the CPU has no bf16
// matmul or its bf16 dot products are slower than its fp32 FMAs (AVX512-BF16
// without AMX on Intel: half the rate). Primitives are created once per
// shape and cached; safe to call from several threads at once (each runs
// on its calling thread).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// gemm_f32 or gemm_bf16 as the operands' dtype says (A and B both `dtype`;
// C fp32): what the model and the profile measurement call.
void gemm(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, float* C, int64_t ldc);

// What gemm_bf16 runs for an n x n x n product (e.g.
// "brg:avx512_core_amx_bf16", or "bf16 widened to fp32, dnnl_sgemm (faster
// here than brg:avx512_core_bf16)"): benchmarks and run headers print it.
std::string gemm_bf16_implementation(int64_t n);

// Whether gemm_bf16 runs on the CPU's bf16 dot products (oneDNN's bf16
// matmul) rather than widening, by the measured choice: oneDNN has a bf16
// matmul for this CPU (its effective ISA has AVX512-BF16 or AMX-BF16;
// oneDNN 2.6.3 requests the Linux AMX tile-data permission itself:
// amx::init() in src/cpu/x64/cpu_isa_traits.cpp calls
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) and mayiuse(amx_tile)
// is false when it is refused) and it beat the widened path on a 512^3
// product, timed once per process on one thread; the environment variable
// LONGCTX_BF16_GEMM=native|widened pins it instead (native still needs the
// bf16 matmul). force_gemm_bf16_path does not change the answer.
bool gemm_bf16_is_native();

// Tests only: a gemm_bf16 path instead of the measured choice, so both are
// tested on every CPU (native where oneDNN has no bf16 matmul for the CPU
// still widens); automatic restores the choice.
enum class Bf16GemmPath { automatic, native, widened };
void force_gemm_bf16_path(Bf16GemmPath path);
// Tests only: the widened path's scratch budget in floats (default 2^24),
// so small products exercise its cutting into blocks, and the size of the
// calling thread's widening scratch (floats) after its calls so far.
void set_gemm_bf16_widen_floats(int64_t floats);
int64_t gemm_bf16_widen_scratch_floats();

// The widest x86 vector ISA oneDNN runs here (its effective ISA: the CPU's,
// capped by ONEDNN_MAX_CPU_ISA): what sgemm runs on, and the cap of the
// attention kernel's own vector kernels, so that one setting caps both.
enum class VectorIsa { none, avx2, avx512 };
VectorIsa onednn_vector_isa();
// The bf16 instructions in oneDNN's effective ISA (capped the same way): the
// cap of the attention kernel's bf16 dot kernels (attention_dot.h).
enum class Bf16Isa { none, avx512_bf16, amx };
Bf16Isa onednn_bf16_isa();

// Measures the GEMM rate (GFLOP/s) of an n x n x n product in `dtype` with the
// current OpenMP thread count: the reference that benchmarks and MFU divide by.
double measure_gemm_gflops(DType dtype, int64_t n = 2048, double min_seconds = 0.5);

}  // namespace longctx
