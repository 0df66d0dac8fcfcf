#!/usr/bin/env bash
# The fused tiles (src/kernels/attention/fused/fused.h), forward and backward,
# against oneDNN's sgemm on the same tiles, fp32 and bf16, 1 and 2 threads,
# interleaved in one run: `bench attention --tile-path` for each path, at
# issue 10's shape (S=8192, H=G=8, D=128, causal) and at the bench-model
# layer's (S=16384, H=8, G=2, D=64). Best forward and backward of 3 calls
# per run, best of ROUNDS runs.
# Prints the CPU model and flags, and a markdown table.
#   bench/results/attention_fused.sh [BUILD_DIR] [ROUNDS]
# ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN and the fused kernels alike (an AVX2
# machine's code paths on an AVX-512 one).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
ROUNDS=${2:-2}
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); flags: $(grep -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-unset}; $(uptime)"
best_of() {  # args: bench flags; prints the best forward and backward GFLOP/s and the run's GEMM GFLOP/s
  "$BUILD/longctx" bench attention --json --reps 3 "$@" |
    python3 -c 'import json,sys; j=json.loads(sys.stdin.read().splitlines()[-1]); print(j["fwd_best_gflops"], j["bwd_best_gflops"], j["gemm_gflops"])'
}
declare -A fwd bwd gemm
shapes=("--seq 8192 --heads 8 --kv-heads 8 --head-dim 128" "--seq 16384 --heads 8 --kv-heads 2 --head-dim 64")
for round in $(seq "$ROUNDS"); do
  for s in 0 1; do
    for t in 1 2; do
      for p in "fp32 gemm" "fp32 fused" "bf16 widened" "bf16 fused"; do
        set -- $p
        read -r f w g < <(best_of ${shapes[$s]} --threads "$t" --dtype "$1" --tile-path "$2")
        k="$s|$t|$p"
        fwd[$k]=$(python3 -c "print(max($f, ${fwd[$k]:-0}))")
        bwd[$k]=$(python3 -c "print(max($w, ${bwd[$k]:-0}))")
        gemm[$k]=$(python3 -c "print(max($g, ${gemm[$k]:-0}))")
      done
    done
  done
done
echo
echo "| shape | threads | dtype | gemm tiles fwd / bwd GFLOP/s (x GEMM) | fused fwd / bwd GFLOP/s (x GEMM) | fused / gemm tiles fwd / bwd |"
echo "|---|---|---|---|---|---|"
for s in 0 1; do
  for t in 1 2; do
    for d in "fp32 gemm|fp32 fused" "bf16 widened|bf16 fused"; do
      a=${d%|*}; b=${d#*|}
      python3 - "$s|$t|$a" "${fwd[$s|$t|$a]}" "${bwd[$s|$t|$a]}" "${gemm[$s|$t|$a]}" \
        "${fwd[$s|$t|$b]}" "${bwd[$s|$t|$b]}" "${gemm[$s|$t|$b]}" "${shapes[$s]}" "$t" <<'PY'
import sys
_, ka, fa, wa, ga, fb, wb, gb, shape, t = sys.argv
fa, wa, ga, fb, wb, gb = map(float, (fa, wa, ga, fb, wb, gb))
print(f"| {shape} | {t} | {ka.split('|')[2].split()[0]} | {fa:.1f} / {wa:.1f} ({fa/ga:.2f} / {wa/ga:.2f}) "
      f"| {fb:.1f} / {wb:.1f} ({fb/gb:.2f} / {wb/gb:.2f}) | {fb/fa:.2f} / {wb/wa:.2f} |")
PY
    done
  done
done
