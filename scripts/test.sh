#!/usr/bin/env bash
# Sets up, builds, makes the transformers venv (build/venv-hf), runs every
# test through ctest; then the unit and
# 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, build-asan/), then each fuzz target for a bounded time
# (scripts/fuzz.sh, build-fuzz/, 10 s each). Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh packages
# The transformers oracle of tests/unit/test_hf_models.cpp (build/venv-hf,
# reused once made; PyPI's torch wheel is large: minutes the first time, so
# it downloads while the C++ builds). Without it (no network) those tests
# SKIP, saying why.
mkdir -p build
scripts/python_env.sh hf torch transformers safetensors > build/venv-hf.log 2>&1 &
venv=$!
scripts/setup.sh
wait "$venv" || { echo "test.sh: no transformers venv (build/venv-hf.log): the transformers tests will SKIP" >&2; tail -3 build/venv-hf.log >&2; }
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
scripts/sanitize.sh
FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/fuzz.sh  # 10 s per target here; scripts/fuzz.sh alone: 20 s
