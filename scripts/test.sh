#!/usr/bin/env bash
# Sets up, builds, and runs every test through ctest; then the unit and
# 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, build-asan/), then each fuzz target for a bounded time
# (scripts/fuzz.sh, build-fuzz/). Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
scripts/sanitize.sh
scripts/fuzz.sh
