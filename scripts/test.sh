#!/usr/bin/env bash
# Sets up, builds, and runs every test through ctest; then the unit and
# 1-2 rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, build-asan/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
(cd build && ctest --output-on-failure -j "$(nproc)" "$@")
scripts/sanitize.sh
