#!/usr/bin/env bash
# Sets up, builds, prints what it tests on (`longctx info`: the CPU, its
# features, each op's kernel), makes the transformers venv (build/venv-hf)
# and the frameworks' (build/venv-frameworks: MaxText, Megatron-Core, TorchTitan),
# runs every test through ctest; then the unit and
# 2-rank tests again under AddressSanitizer + UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, build-asan/), then each fuzz target for a bounded time
# (scripts/fuzz.sh, build-fuzz/, 10 s each), then the CPUs this machine is
# not: a portable build's smoke subset under QEMU (scripts/qemu_smoke.sh,
# build-portable/). Any failure fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
# Minutes since the start at each stage (CI's budget is 30 minutes on 2 cores).
stage() { echo "test.sh: $1 at $((SECONDS / 60)) min $((SECONDS % 60)) s" >&2; }
scripts/setup.sh packages
# The transformers oracle of tests/unit/test_hf_models.cpp (build/venv-hf,
# reused once made; PyPI's torch wheel is large: minutes the first time, so
# it downloads while the C++ builds). Without it (no network) those tests
# SKIP, saying why.
mkdir -p build
scripts/python_env.sh hf torch transformers safetensors > build/venv-hf.log 2>&1 &
venv=$!
# The frameworks `plan --emit` writes for (tests/frameworks, build/venv-frameworks):
# without them (no Python >= 3.12, no network) test_plan_frameworks SKIPs, saying why.
scripts/framework_env.sh > build/venv-frameworks.log 2>&1 &
frameworks=$!
scripts/setup.sh
build/longctx info
stage "built"
wait "$venv" || { echo "test.sh: no transformers venv (build/venv-hf.log): the transformers tests will SKIP" >&2; tail -3 build/venv-hf.log >&2; }
wait "$frameworks" || { echo "test.sh: no frameworks venv (build/venv-frameworks.log): test_plan_frameworks will SKIP" >&2; tail -3 build/venv-frameworks.log >&2; }
# Twice the cores: most tests wait (mpiexec start-up, Python, sleeps of the
# stop and watchdog tests) more than they compute (measured: 51 tests in 122 s
# at -j4 against ~170 s at -j2 on 2 cores); none is timed.
# Each next build compiles while the tests before it run (they mostly wait):
# the sanitizer build beside the plain tests, the fuzz build beside the
# sanitizer tests. Its log is shown if it fails.
background() {  # log command...
  local log=$1; shift
  "$@" >"$log" 2>&1 &
  job=$!
}
finish() {  # log
  wait "$job" || { tail -n 60 "$1" >&2; echo "test.sh: $1 failed" >&2; exit 1; }
}
trap '[ -n "${job:-}" ] && kill "$job" 2>/dev/null; true' EXIT
background build/sanitize-build.log env SANITIZE_PHASE=build scripts/sanitize.sh
(cd build && ctest --output-on-failure -j "$((2 * $(nproc --all)))" "$@")
stage "tests passed"
finish build/sanitize-build.log
stage "sanitizer build done"
background build/fuzz-build.log env FUZZ_BUILD_ONLY=1 scripts/fuzz.sh
SANITIZE_PHASE=test scripts/sanitize.sh
stage "sanitized tests passed"
finish build/fuzz-build.log
background build/qemu-build.log env QEMU_SMOKE_PHASE=build scripts/qemu_smoke.sh
FUZZ_SECONDS=${FUZZ_SECONDS:-10} scripts/fuzz.sh  # 10 s per target here; scripts/fuzz.sh alone: 20 s
finish build/qemu-build.log
job=
stage "fuzzed"
QEMU_SMOKE_PHASE=test scripts/qemu_smoke.sh
stage "emulated CPUs passed"
