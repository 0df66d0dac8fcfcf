#!/usr/bin/env bash
# Regenerates bench/results/cp_sweep/*.json (the tables in cp_cpu.md):
# strategies x S at 2 ranks x 1 thread against 1 rank x 1 thread (measured in
# the same run), plus ring peak memory at cp=4. ~14 minutes on 2 EPYC cores.
# Usage: bench/results/cp_cpu_sweep.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build}/longctx
OUT=bench/results/cp_sweep
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
MPI=(mpiexec --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS)
COMMON=(--layout zigzag --heads 4 --head-dim 128 --mask causal --threads 1 --json)
run() {  # name np args...
  local name=$1 np=$2; shift 2
  echo "$(date +%T) $name: $(uptime)" | tee "$OUT/$name.uptime"
  "${MPI[@]}" -n "$np" "$BIN" bench cp "${COMMON[@]}" "$@" > "$OUT/$name.json"
  echo "$(date +%T) $name done: $(uptime)" | tee -a "$OUT/$name.uptime"
}
for S in 4096 8192 16384; do
  for s in ring ulysses all_gather; do
    rep=2; [ "$S" = 16384 ] && [ "$s" = all_gather ] && rep=1
    run "np2_${s}_S$S" 2 --strategy $s --seq $S --repeat $rep
  done
done
for s in ring ulysses all_gather; do run "np2_${s}_S32768" 2 --strategy $s --seq 32768; done
# S=65536: one 1-rank run (~3.5 min), shared by ulysses and all_gather through --no-single.
run np2_ring_S65536 2 --strategy ring --seq 65536
run np2_ulysses_S65536 2 --strategy ulysses --seq 65536 --no-single
run np2_all_gather_S65536 2 --strategy all_gather --seq 65536 --no-single
# Ring memory at cp=4 (4 ranks on 2 cores: only memory and CPU time mean anything).
run np4_ring_S16384 4 --strategy ring --seq 16384
run np4_ring_S16384_auto 4 --strategy ring --seq 16384 --ring-chunk-tokens 0
