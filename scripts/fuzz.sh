#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) into
# build-fuzz/ and runs each for FUZZ_SECONDS (default 20) from its seed corpus
# in tests/fuzz/corpus/<target>/. Fails on any finding: a crash, a sanitizer
# report, or an exception other than the project's ConfigError / DataError /
# ShapeError; the reproducer is left in build-fuzz/findings/.
#   scripts/fuzz.sh                     every target, 20 s each
#   FUZZ_SECONDS=60 scripts/fuzz.sh config checkpoint
# Reproduce: build-fuzz/fuzz_<target> build-fuzz/findings/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-20}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config checkpoint token_file train_state)

if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev \
    cmake make libyaml-cpp-dev nlohmann-json3-dev >/dev/null
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-fuzz -DLONGCTX_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
  -DLONGCTX_NATIVE=OFF "${launcher[@]}" >/dev/null
cmake --build build-fuzz -j "$(nproc --all)" --target "${targets[@]/#/fuzz_}"
[ -n "${FUZZ_BUILD_ONLY:-}" ] && exit 0  # scripts/test.sh builds while the sanitizer tests run

failed=()
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t" findings="build-fuzz/findings/$t"
  mkdir -p "$work" "$findings"
  echo "== fuzz_$t: ${seconds} s"
  # New inputs go to build-fuzz/corpus/<target>; the committed seeds are read only.
  if ! build-fuzz/fuzz_$t "$work" "tests/fuzz/corpus/$t" -max_total_time="$seconds" -max_len=4096 \
       -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1 \
       >"build-fuzz/fuzz_$t.log" 2>&1; then
    failed+=("$t")
    tail -n 40 "build-fuzz/fuzz_$t.log"
  fi
  grep -E "^stat::number_of_executed_units|^Done" "build-fuzz/fuzz_$t.log" || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FINDINGS in ${failed[*]} (reproducers in build-fuzz/findings/)" >&2
  exit 1
fi
echo "fuzz: no findings in ${targets[*]} (${seconds} s each)"
