// What this build's own code may execute: the instruction sets its compiler
// flags allowed (-march=native on the build machine, or the x86-64
// baseline of a portable build), as constant data that needs no
// instruction to read. cpu/features.cpp compares it with the CPU before
// anything else of longctx runs.
#include "kernels/cpu/features.h"

namespace longctx::cpu {

extern constinit const BuildTarget kBuildTarget = {
#if defined(__SSE4_2__)
    .sse4_2 = true,
#endif
#if defined(__AVX__)
    .avx = true,
#endif
#if defined(__AVX2__)
    .avx2 = true,
#endif
#if defined(__FMA__)
    .fma = true,
#endif
#if defined(__F16C__)
    .f16c = true,
#endif
#if defined(__BMI__)
    .bmi1 = true,
#endif
#if defined(__BMI2__)
    .bmi2 = true,
#endif
#if defined(__AVX512F__)
    .avx512f = true,
#endif
#if defined(__AVX512BW__)
    .avx512bw = true,
#endif
#if defined(__AVX512DQ__)
    .avx512dq = true,
#endif
#if defined(__AVX512VL__)
    .avx512vl = true,
#endif
#if defined(__AVX512BF16__)
    .avx512_bf16 = true,
#endif
#if defined(__AMX_TILE__)
    .amx_tile = true,
#endif
};

}  // namespace longctx::cpu
