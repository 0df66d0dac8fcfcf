#!/usr/bin/env bash
# A model projection [4096, w] -> [4096, w] (forward, weight gradient, input
# gradient over 8 activation sets, as plan --measure times it) in fp32 and
# through gemm_bf16, interleaved, best of 5 each, at the budgets the widened
# path may cut its copies to (src/kernels/gemm.cpp, widen_blocks). Links the
# build's library.   bench/results/projection_bf16.sh [BUILD_DIR]  (OMP_NUM_THREADS sets threads)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/proj.cpp" <<'CPP'
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "kernels/gemm.h"
#include "core/device.h"
#include "kernels/cpu/select.h"
#include <memory>
using namespace longctx;
int main(int argc, char** argv) {
  const int64_t T = 4096, w = std::atoi(argv[1]);
  const int sets = 8;
  std::vector<std::vector<float>> x32(sets, std::vector<float>(T * w, 0.5f)), y(sets, std::vector<float>(T * w)),
      dx(sets, std::vector<float>(T * w));
  std::vector<std::vector<bf16>> x16(sets, std::vector<bf16>(T * w, bf16(0.5f))),
      g16(sets, std::vector<bf16>(T * w, bf16(0.25f)));
  std::vector<float> W32(w * w, 0.01f), dW(w * w);
  std::vector<bf16> W16(w * w, bf16(0.01f));
  auto pass = [&](bool low) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < sets; ++i) {
      if (low) {
        gemm_bf16(false, true, T, w, w, 1, x16[i].data(), w, W16.data(), w, 0, y[i].data(), w);
        gemm_bf16(true, false, w, w, T, 1, g16[i].data(), w, x16[i].data(), w, 1, dW.data(), w);
        gemm_bf16(false, false, T, w, w, 1, g16[i].data(), w, W16.data(), w, 0, dx[i].data(), w);
      } else {
        gemm_f32(false, true, T, w, w, 1, x32[i].data(), w, W32.data(), w, 0, y[i].data(), w);
        gemm_f32(true, false, w, w, T, 1, y[i].data(), w, x32[i].data(), w, 1, dW.data(), w);
        gemm_f32(false, false, T, w, w, 1, y[i].data(), w, W32.data(), w, 0, dx[i].data(), w);
      }
    }
    return 6.0 * T * w * w * sets / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  for (int budget : {1 << 24, 1 << 21, 1 << 19}) {
    KernelSet set = cpu_kernel_set();  // the widening budget is the device's kernel set's
    set.gemm_widen_floats = budget;
    const std::unique_ptr<Device> device = Device::make_cpu(set);
    const DeviceScope on_device(*device);
    double b32 = 0, b16 = 0;
    pass(true), pass(false);
    for (int r = 0; r < 5; ++r) b16 = std::max(b16, pass(true)), b32 = std::max(b32, pass(false));
    std::printf("| %lld | %d | %.1f | %.1f | %.2f |\n", (long long)w, budget, b32, b16, b16 / b32);
  }
}
CPP
g++ -std=c++20 -O2 -fopenmp -Isrc "$dir/proj.cpp" "$BUILD/liblongctx_lib.a" -ldnnl -o "$dir/proj"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); threads: ${OMP_NUM_THREADS:-all}; gemm_bf16: see bench attention --dtype bf16"
echo "| w | widening budget (floats) | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |"
echo "|---|---|---|---|---|"
for w in 512 1024; do "$dir/proj" "$w"; done
