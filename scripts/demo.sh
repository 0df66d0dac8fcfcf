#!/usr/bin/env bash
# The demo: installs what it needs and builds (scripts/setup.sh), prepares the
# King James Bible corpus (one document per book, data/kjv), then trains the
# demo model (configs/demo.yml: ~0.8M parameters, byte-level, S = 4096) with
# ring context parallelism over 4 ranks in the zigzag layout, printing one
# line per 10 steps. About 1.5 minutes on two idle cores (under 5 when shared). Extra arguments are
# key=value overrides, e.g. scripts/demo.sh steps=40.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/prepare_corpus.sh
MPI_FLAGS=(--oversubscribe --bind-to none)
[ "$(id -u)" -eq 0 ] && MPI_FLAGS+=(--allow-run-as-root)
# 4 ranks share the cores: one OpenMP thread each.
OMP_NUM_THREADS=1 mpiexec "${MPI_FLAGS[@]}" -x OMP_NUM_THREADS -n 4 build/longctx train configs/demo.yml "$@"
