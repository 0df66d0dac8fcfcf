#!/usr/bin/env bash
# The CPUs CI does not have, run under QEMU's user-mode emulation (Debian's
# qemu-user; QEMU 7.2 emulates up to AVX2, no AVX-512): a portable build
# (LONGCTX_NATIVE=OFF, into build-portable/) runs a smoke subset as
#   Haswell-v4   AVX2/FMA without AVX-512 (the fused AVX2 tiles)
#   Nehalem      SSE4.2, no AVX: below AVX2 (oneDNN's SSE4.1 sgemm tiles)
# and the native build (build/) must refuse, naming what is missing, on a CPU
# below its own target (no SIGILL). Each CPU model's kernel choice is checked
# against what that model has (longctx info), then: attention forward and
# backward, fp32 and bf16, against the float64 reference; a 2-step train in
# fp32 and bf16; plan on a datasheet profile, and (Nehalem) plan --measure
# (--smoke: every measurement, smallest sizes) then a plan on what it
# measured; selftest on 2 ranks; bench attention at a tiny size. Any instruction the emulated CPU lacks is a SIGILL: a failure.
#   scripts/qemu_smoke.sh            build, then run every CPU model
#   QEMU_CPUS="Haswell-v4" scripts/qemu_smoke.sh
#   QEMU_SMOKE_PHASE=build|test      one half (scripts/test.sh overlaps the build with other tests)
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${QEMU_SMOKE_PHASE:-all}
build=build-portable

if [ "$phase" != test ]; then
  if ! command -v qemu-x86_64 >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-user
  fi
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLONGCTX_NATIVE=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target longctx test_attention
  [ "$phase" = build ] && exit 0
fi

[ "$(uname -m)" = x86_64 ] || { echo "qemu_smoke: SKIPPED: not an x86-64 host"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0
fail() { echo "qemu_smoke: FAIL ($cpu): $*" >&2; failures=$((failures + 1)); }
# QEMU warns once per CPUID feature TCG lacks (pcid, x2apic, ...): noise.
quiet() { grep -v '^qemu-x86_64: warning: TCG doesn'"'"'t support' || true; }
run() {  # name, command...: runs it under the CPU model, shows its tail on failure
  local name=$1 log="$out/$cpu.$1.log" rc=0 started=$SECONDS
  shift
  # Passive: an idle OpenMP thread spinning at a barrier costs emulated
  # instructions (half the time of plan --measure --smoke under QEMU).
  env OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive "$@" >"$log" 2>&1 || rc=$?
  quiet <"$log" >"$log.shown"
  if [ "$rc" -ne 0 ]; then
    tail -n 25 "$log.shown" >&2
    fail "$name exited $rc$([ "$rc" -eq 132 ] && echo ' (SIGILL)')"
  fi
  times+=" $name $((SECONDS - started))"
  return 0
}

# What each model must choose: the vector ISA it has, nothing wider.
expect_choice() {
  case "$1" in
    Haswell-v4 | EPYC-Rome) echo "fp32: fused AVX2/FMA tiles" ;;
    *) echo "fp32: fp32 tiles on oneDNN's sgemm: no AVX2/FMA here" ;;
  esac
}

# peak_tflops_per_device: MFU against a given peak, not a start-up GEMM (a
# minute under emulation); plan --measure --smoke and bench --gemm-size
# likewise keep every measurement but at the smallest sizes.
T="$build/longctx train configs/base.yml model_name=tiny dataset_type=synthetic max_target_length=256 steps=2"
T+=" peak_tflops_per_device=1"
attention_tests="Attention.GroupedQueryAttentionMatchesReference:Attention.HeadDimsMatchReference"
attention_tests+=":Attention.FullyMaskedRowsGiveZeroOutputAndNoNaN:AttentionBf16.FullyMaskedRowsGive*"
attention_tests+=":AttentionBf16.NaNInputsReachTheOutputNeverLookMasked:AttentionBf16.ScratchBytesFollowTheTilePath"
attention_tests+=":FusedTiles.EveryWidthGivesTheSameBits"
for cpu in ${QEMU_CPUS:-Haswell-v4 Nehalem}; do
  started=$SECONDS times=""
  q="qemu-x86_64 -cpu $cpu"
  run info $q "$build/longctx" info
  grep -qF "$(expect_choice "$cpu")" "$out/$cpu.info.log.shown" ||
    fail "kernel choice: expected '$(expect_choice "$cpu")' in: $(grep 'attention_forward   fp32' "$out/$cpu.info.log.shown")"
  run attention $q "$build/tests/test_attention" --gtest_filter="$attention_tests" --gtest_brief=1
  run train_fp32 $q $T base_output_directory="$out/$cpu-fp32"
  run train_bf16 $q $T dtype=bfloat16 base_output_directory="$out/$cpu-bf16"
  run plan $q "$build/longctx" plan configs/base.yml model_name=tiny max_target_length=4096 dtype=bfloat16 --hardware h100
  # plan --measure (every kernel and path it times, at the smallest sizes)
  # on the lowest model only: its AVX2 kernels under TCG took 113-140 s on
  # Haswell-v4 (CI time), and Haswell runs each of them in the steps above.
  if [ "$cpu" = Nehalem ]; then
    run measure $q "$build/longctx" plan --measure --smoke --output "$out/$cpu.yml"
    run plan_measured $q "$build/longctx" plan configs/base.yml model_name=tiny max_target_length=4096 --hardware "$out/$cpu.yml"
  fi
  run selftest mpiexec --allow-run-as-root --oversubscribe -n 2 $q "$build/longctx" selftest
  run bench $q "$build/longctx" bench attention --seq 300 --heads 2 --kv-heads 1 --head-dim 64 --dtype bf16 --reps 1 --gemm-size 128
  echo "qemu_smoke: $cpu: $(grep -m1 '^cpu:' "$out/$cpu.info.log.shown"), $((SECONDS - started)) s (seconds each:$times)"
done

# The native build on a CPU below its target: a clear error before any of
# its code runs (exit 78), never SIGILL. Only where the build needs more than
# Nehalem has (a native build on any AVX2 machine does).
if [ -x build/longctx ]; then
  cpu=Nehalem rc=0
  qemu-x86_64 -cpu Nehalem build/longctx info >"$out/native.log" 2>&1 || rc=$?
  if grep -q "this binary was built for another CPU" "$out/native.log"; then
    [ "$rc" -eq 78 ] || fail "native build refused with exit $rc, not 78"
  elif [ "$rc" -ne 0 ]; then
    quiet <"$out/native.log" | tail -5 >&2
    fail "native build on Nehalem exited $rc without saying why"
  fi
fi

if ((failures)); then
  echo "qemu_smoke: $failures failure(s)" >&2
  exit 1
fi
echo "qemu_smoke: all passed on ${QEMU_CPUS:-Haswell-v4 Nehalem}"
