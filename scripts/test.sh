#!/usr/bin/env bash
# Sets up, builds, and runs every test through ctest; then the unit and
# 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, build-asan/), then each fuzz target for a bounded time
# (scripts/fuzz.sh, build-fuzz/, 10 s each). Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
scripts/sanitize.sh
FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/fuzz.sh  # 10 s per target here; scripts/fuzz.sh alone: 20 s
