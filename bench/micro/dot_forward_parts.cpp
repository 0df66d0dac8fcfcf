// Where the bf16_dot forward's time goes, part by part, on one q block of
// 4 panels (128 rows) against a run of kv columns: the scores products, the
// softmax (exp2 into P's pairs), P V, the whole run (forward_run, which
// issues the next panel's scores inside the softmax where the CPU has
// tiles), and V's pack. TSC cycles per (q row, kv column) pair, best of 7;
// the operands are 64-byte aligned as the engine's scratch is (misaligned
// tile rows ran the scores 2x slower). Also whether the AMX tiles overlap
// the vector units: 4 tile products alone, FMAs alone, and both.
// Build (from the repository root, after the main build), then run:
//   g++ -O2 -std=c++20 -mamx-tile -mamx-bf16 -mavx512f -Isrc bench/micro/dot_forward_parts.cpp \
//     build/liblongctx_lib.a -fopenmp -lmpi_cxx -lmpi -ldnnl -lyaml-cpp -o build/dot_forward_parts \
//     -L/usr/lib/x86_64-linux-gnu/openmpi/lib
//   build/dot_forward_parts [D] [kv columns]      (default 128 256)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "kernels/attention/dot/dot.h"

using namespace longctx;

template <class T>
T* aligned(int64_t n) {
  T* p = static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
  std::fill(p, p + n, T{});
  return p;
}

template <class F>
double cycles_per(double pairs, F&& f) {
  double best = 1e300;
  for (int r = 0; r < 7; ++r) {
    const uint64_t t0 = __rdtsc();
    for (int i = 0; i < 200; ++i) f();
    best = std::min(best, double(__rdtsc() - t0) / 200);
  }
  return best / pairs;
}

// Tile products with and without 8 chains of AVX-512 FMAs beside them.
template <bool kTiles, int kFmas>
__attribute__((noinline)) float tiles_and_fmas(int n) {
  __m512 v[8];
  for (int j = 0; j < 8; ++j) v[j] = _mm512_set1_ps(1.0f + j * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999f), a = _mm512_set1_ps(1e-3f);
  for (int i = 0; i < n; ++i) {
    if (kTiles) {  // the intrinsics are asm statements: one per statement
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    for (int k = 0; k < kFmas / 8; ++k)
#pragma GCC unroll 8  // v stays in registers
      for (int j = 0; j < 8; ++j) v[j] = _mm512_fmadd_ps(v[j], m, a);
  }
  for (int j = 1; j < 8; ++j) v[0] = _mm512_add_ps(v[0], v[j]);
  return _mm512_reduce_add_ps(v[0]);
}

int main(int argc, char** argv) {
  const attn::DotTileKernels* k = attn::dot_tile_kernels();
  if (!k) return std::puts("this CPU runs no bf16 dot kernels (AVX512-BF16 or AMX-BF16)"), 0;
  const int64_t D = argc > 1 ? std::atoi(argv[1]) : 128, cols = argc > 2 ? std::atoi(argv[2]) : 256;
  constexpr int64_t P = attn::kDotPanel, panels = 4;
  const int64_t Dd = attn::round_up(D, k->d_align), s_panel = attn::round_up(cols, k->kv_align) * P;
  bf16 *qp = aligned<bf16>(panels * Dd * P), *kc = aligned<bf16>(cols * Dd), *v = aligned<bf16>(cols * D);
  bf16 *packed = aligned<bf16>(k->packed_elements(cols, D)), *p2 = aligned<bf16>(panels * s_panel);
  float *s = aligned<float>(panels * s_panel), *m = aligned<float>(panels * P), *l = aligned<float>(panels * P);
  float *alpha = aligned<float>(panels * P), *acc = aligned<float>(panels * D * P);
  std::mt19937 gen(1);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (int64_t i = 0; i < panels * Dd * P; ++i) qp[i] = bf16(0.3f * noise(gen));
  for (int64_t i = 0; i < cols * Dd; ++i) kc[i] = bf16(0.3f * noise(gen));
  for (int64_t i = 0; i < cols * D; ++i) v[i] = bf16(noise(gen));
  k->pack_kv(v, D, cols, D, packed);
  const float scale = 1.4426950f / std::sqrt(float(D));
  k->scores(qp, panels, kc, cols, Dd, s, s_panel);  // a running max above every score: the one pass
  for (int64_t j = 0; j < panels * P; ++j) {
    float top = -1e30f;
    for (int64_t c = 0; c < cols; ++c) top = std::max(top, s[(j / P) * s_panel + c * P + j % P] * scale);
    m[j] = top + 1.0f, alpha[j] = 1.0f;
  }
  const double pairs = double(panels * P * cols);
  std::printf("%s, D=%lld, %lld kv columns, 4 panels of %lld q rows: TSC cycles per (q, kv) pair\n", k->isa,
              (long long)D, (long long)cols, (long long)P);
  std::printf("  scores       %.3f\n", cycles_per(pairs, [&] { k->scores(qp, panels, kc, cols, Dd, s, s_panel); }));
  std::printf("  softmax      %.3f\n", cycles_per(pairs, [&] {
                k->softmax_to_pairs(s, panels, cols, s_panel, scale, k->kv_align, m, l, alpha, p2);
              }));
  std::printf("  P V          %.3f\n", cycles_per(pairs, [&] { k->pv(p2, panels, cols, s_panel, packed, D, alpha, acc); }));
  if (k->forward_run)
    std::printf("  forward_run  %.3f\n", cycles_per(pairs, [&] {
                  k->forward_run(qp, panels, kc, cols, Dd, s, s_panel, scale, k->kv_align, m, l, alpha, p2, packed, D,
                                 acc);
                }));
  std::printf("  V pack       %.3f\n", cycles_per(pairs, [&] { k->pack_kv(v, D, cols, D, packed); }));
  if (!__builtin_cpu_supports("amx-bf16") || syscall(SYS_arch_prctl, 0x1023, 18) != 0) return 0;
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, kc, 64);
  _tile_loadd(5, kc + 512, 64);
  _tile_loadd(6, qp, 64);
  _tile_loadd(7, qp + 512, 64);
  const auto per_step = [](auto f) { return cycles_per(20000.0, [&] { f(20000); }); };
  std::printf("AMX tiles beside the vector units: TSC cycles per step\n");
  std::printf("  4 tile products         %.1f\n", per_step(tiles_and_fmas<true, 0>));
  std::printf("  64 FMAs (8 chains)      %.1f\n", per_step(tiles_and_fmas<false, 64>));
  std::printf("  both                    %.1f\n", per_step(tiles_and_fmas<true, 64>));
  std::printf("  128 FMAs                %.1f\n", per_step(tiles_and_fmas<false, 128>));
  std::printf("  4 tile products + 128   %.1f\n", per_step(tiles_and_fmas<true, 128>));
  _tile_release();
}
