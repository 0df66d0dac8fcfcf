#!/usr/bin/env bash
# Regenerates bench/results/offload_cpu.md: step-time overhead of offloading
# the saved layer inputs to disk at the bench model shape (d_model 512,
# 4 layers, S=16384, causal, fp32, 1 rank x 2 threads, remat full). Each run
# alternates steps of the offloaded model and the same model without offload
# in one process, so both see the same machine load; run twice.
#   bench/results/offload_cpu.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=bench/results/offload_cpu.md
export OMP_NUM_THREADS=2
{
  echo "# Disk offload of the saved layer inputs: step-time overhead (CPU)"
  echo
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) vCPUs; $(date -u +%F)"
  echo
  echo '    OMP_NUM_THREADS=2 '"$BUILD"'/longctx bench model --remat full --offload-layer-inputs disk \'
  echo '        --offload-dir '"$BUILD"'/bench/spill --threads 2 --steps 3'
  for run in 1 2; do
    echo
    echo "## Run $run"
    echo
    echo '```'
    echo "before: $(uptime)"
    "$BUILD/longctx" bench model --remat full --offload-layer-inputs disk --offload-dir "$BUILD/bench/spill" \
      --threads 2 --steps 3 | grep -E "^(step|offload|step time|peak)"
    echo "after: $(uptime)"
    echo '```'
  done
} > "$OUT"
echo "wrote $OUT"
