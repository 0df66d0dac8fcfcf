#!/usr/bin/env bash
# Everything issue 22 measures, in one command, on the machine it runs on
# (made for an AMX Xeon; runs on any x86 CPU): the bf16 attention paths at
# the bench model's shape (S=16384, H=8, G=2, D=64) and at S=8192, H=G=8,
# D=128, causal, forward and backward against the same-run bf16 GEMM; the
# training step in bf16 and fp32; the PyTorch peers where torch imports.
# Also the bf16 kernels' correctness tests where they were carried. Prints
# the CPU model and flags first.
#   bench/results/cpu_bf16.sh [THREADS...]      (default: 1 2)
# From a build staged by scripts/stage_build.sh (build/device: no Debian
# packages or network needed there), else from build/.
set -uo pipefail
cd "$(dirname "$0")/../.."
threads=("$@")
((${#threads[@]})) || threads=(1 2)
if [ -x build/device/run ]; then
  lc() { build/device/run longctx "$@"; }
  unit() { build/device/run test_attention "$@"; }
else
  lc() { build/longctx "$@"; }
  unit() { build/tests/test_attention "$@"; }
fi
echo "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1); $(nproc) cores"
echo "flags: $(grep -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "date: $(date -u +%FT%TZ); $(uptime)"
echo
echo "## correctness: the bf16 paths (every one this CPU runs, and the portable twins) against the float64 oracle"
unit --gtest_filter='AttentionBf16.*' 2>&1 | grep -E '^\[  (PASSED|FAILED) |FAILED|Failure' | head -20
echo
shapes=("--seq 16384 --heads 8 --kv-heads 2 --head-dim 64" "--seq 8192 --heads 8 --kv-heads 8 --head-dim 128")
for s in "${shapes[@]}"; do
  for t in "${threads[@]}"; do
    for p in dot native fused; do
      echo "## attention bf16 $s --threads $t --tile-path $p"
      lc bench attention --dtype bf16 $s --threads "$t" --tile-path "$p" --reps 2 2>&1 | grep -E 'tile path|automatic|forward|backward|gemm|error'
    done
  done
done
echo
for dtype in bf16 fp32; do
  echo "## training step: bench model --dtype $dtype --seq 16384 --threads 2"
  lc bench model --dtype "$dtype" --seq 16384 --threads 2 --steps 2 2>&1 | tail -12
done
echo
if python3 -c 'import torch' 2>/dev/null; then
  for s in "--seq 16384 --heads 8 --kv-heads 2 --head-dim 64" "--seq 8192 --heads 8 --kv-heads 8 --head-dim 128"; do
    python3 bench/peers/attention_peer.py --dtypes bf16 $s --threads "$(IFS=,; echo "${threads[*]}")"
  done
  python3 bench/peers/model_peer.py --threads 2 --dtypes bf16 --steps 2  # the floor: bf16, 2 threads
else
  echo "## PyTorch peers: SKIPPED (no python3 with torch on this machine)"
fi
