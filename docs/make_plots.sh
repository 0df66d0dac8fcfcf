#!/usr/bin/env bash
# Regenerates the README's plots (docs/*.png) on this machine:
#   docs/demo_metrics.png   the demo run (scripts/demo.sh's job): loss, tokens/s, MFU, peak memory per step
#   docs/cp_efficiency.png  CP parallel efficiency by sequence length and strategy (bench/results/cp_sweep)
# Needs build/longctx (scripts/setup.sh) and python3-matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prepare_corpus.sh
rm -rf runs/readme_demo
OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS -n 4 \
  build/longctx train configs/demo.yml run_name=readme_demo enable_checkpointing=false progress_interval_seconds=0
scripts/plot.py metrics runs/readme_demo/metrics.jsonl -o build/plots
scripts/plot.py bench -o build/plots
cp build/plots/metrics.png docs/demo_metrics.png
cp build/plots/cp_efficiency.png docs/cp_efficiency.png
