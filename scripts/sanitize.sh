#!/usr/bin/env bash
# Builds longctx and its tests with AddressSanitizer + UndefinedBehaviorSanitizer
# into build-asan/ and runs the unit tests and the 2-rank MPI tests
# there (1, 4 and 8 ranks run in the plain build only: CI time). Any
# sanitizer report fails the test that triggered it.
set -euo pipefail
cd "$(dirname "$0")/.."
# test_hf_models, test_tokenize and test_plan_frameworks are mostly Python (transformers,
# tokenizers, the frameworks whose settings plan --emit writes);
# the C++ readers they reach are fuzzed under ASan + UBSan (scripts/fuzz.sh).
# test_plan_measure times the quick profile's kernels (CI time under ASan);
# test_plan_auto runs the same measurement there.
# test_cluster's jobs run the code every 2-rank test runs, over TCP between
# network namespaces: 9 minutes under ASan for no other code (CI time).
skip="_np[148]$|^test_hf_models$|^test_tokenize$|^test_plan_measure$|^test_cluster$|^test_plan_frameworks$"
# SANITIZE_PHASE=build or test runs one half (scripts/test.sh builds while
# the plain tests run); unset: both.
phase=${SANITIZE_PHASE:-all}
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DLONGCTX_SANITIZE=ON ${LONGCTX_CMAKE_ARGS:-} >/dev/null
# Only what those tests run (CI time): their executables (a test's name less
# its _np<ranks> suffix), the longctx binary and the job test_watchdog_abort stalls.
tests=$(cd build-asan && ctest -N -E "$skip" | sed -n 's/^ *Test *#[0-9]*: *//p' | sed 's/_np[0-9]*$//' | sort -u)
[ "$phase" = test ] || cmake --build build-asan -j "$(nproc --all)" --target longctx watchdog_stall $tests
[ "$phase" = build ] && exit 0
# Open MPI keeps its allocations until exit: leak reports would be about it.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-asan
ctest --output-on-failure -j "$((2 * $(nproc --all)))" -E "$skip"  # -j: as scripts/test.sh
