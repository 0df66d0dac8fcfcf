#!/usr/bin/env bash
# Sets up, then runs the main job. Until the training engine lands this is the
# attention benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/longctx bench attention --seq 4096 --heads 8 --kv-heads 8 --head-dim 128 --mask causal
