#pragma once
// The floating-point environment every longctx process runs in.

namespace longctx {

// Flushes subnormal floats to zero (x86 MXCSR FTZ + DAZ) on the calling
// thread and on every thread it creates afterwards (OpenMP workers inherit
// it). Why: an operation that produces or reads a subnormal costs ~100x a
// normal one, and the compiler's vector code makes them where the source has
// none: in SwiGLU it evaluates g / (1 + exp(88)) ~ 1e-38 for every lane of a
// saturated-exp branch before discarding it, which made the kernel 6x slower
// (1.7 vs 10 GB/s). Values below 1.2e-38 are far under anything training
// resolves in fp32. Call first thing in main(), before any thread starts.
void flush_subnormals_to_zero();

}  // namespace longctx
