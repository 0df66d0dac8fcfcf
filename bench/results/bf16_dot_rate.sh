#!/usr/bin/env bash
# The CPU's bf16 dot-product rate against its fp32 FMA rate, one core, in
# registers only (12 independent accumulators, no memory traffic): why
# gemm_bf16 widens to fp32 on some AVX512-BF16 CPUs (src/kernels/gemm.cpp,
# native_is_faster). Prints GFLOP/s of each (vdpbf16ps zmm: 64 FLOP; 16-wide
# FMA: 32 FLOP; 8-wide FMA: 16 FLOP, the AVX2 code paths' ceiling) with the
# CPU model and flags; best of 5.
#   bench/results/bf16_dot_rate.sh
set -euo pipefail
grep -q -w avx512_bf16 /proc/cpuinfo || { echo "bf16_dot_rate: this CPU has no AVX512-BF16" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/rate.cpp" <<'CPP'
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
constexpr long kIters = 50000000;
template <class F> double gflops(F body, double flop_per_iter) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    float sink = body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sink == 42.0f) std::puts("");
    best = std::max(best, flop_per_iter * kIters / s / 1e9);
  }
  return best;
}
__attribute__((target("avx512f,avx512bf16"))) float dot() {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (long k = 0; k < kIters; ++k)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, x);
  float s = 0;
  for (auto& a : acc) s += _mm512_reduce_add_ps(a);
  return s;
}
__attribute__((target("avx512f"))) float fma() {
  __m512 acc[12];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
  for (long k = 0; k < kIters; ++k)
    for (auto& a : acc) a = _mm512_fmadd_ps(x, y, a);
  float s = 0;
  for (auto& a : acc) s += _mm512_reduce_add_ps(a);
  return s;
}
__attribute__((target("avx2,fma"))) float fma8() {
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_setzero_ps();
  const __m256 x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
  for (long k = 0; k < kIters; ++k)
    for (auto& a : acc) a = _mm256_fmadd_ps(x, y, a);
  float s = 0;
  for (auto& a : acc) {
    float lanes[8];
    _mm256_storeu_ps(lanes, a);
    for (float l : lanes) s += l;
  }
  return s;
}
int main() {
  const double d = gflops(dot, 12 * 64.0), f = gflops(fma, 12 * 32.0), f8 = gflops(fma8, 12 * 16.0);
  std::printf("| vdpbf16ps zmm | %.1f GFLOP/s |\n| vfmadd231ps zmm | %.1f GFLOP/s |\n| bf16 / fp32 | %.2f |\n", d, f, d / f);
  std::printf("| vfmadd231ps ymm (an AVX2 machine's peak rate at this clock) | %.1f GFLOP/s |\n", f8);
}
CPP
g++ -O2 -funroll-loops -o "$dir/rate" "$dir/rate.cpp"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); flags: $(grep -o -w -E 'avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "| one core, registers only | rate |"
echo "|---|---|"
"$dir/rate"
