#!/usr/bin/env bash
# Same-run A/B of two longctx binaries on the kernels' benchmarks: each
# benchmark runs old, new, old, new (rounds alternate, so a shared machine's
# drift lands on both), and the table keeps each side's best. Writes the CPU
# model and flags first.
#   bench/results/ab_binaries.sh OLD_BINARY NEW_BINARY [ROUNDS]
# An old binary of another commit:
#   git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/old/build -DCMAKE_BUILD_TYPE=Release \
#     && cmake --build /tmp/old/build -j"$(nproc)" --target longctx
set -uo pipefail
old=$1 new=$2 rounds=${3:-2}
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx2\|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "old: $old ($("$old" --version 2>/dev/null | head -1 || echo 'no --version'))"
echo "new: $new ($("$new" --version | head -1))"
echo
echo "| benchmark | old | new | new / old |"
echo "|---|---|---|---|"
run() {  # binary args... -> prints "forward backward" GFLOP/s (bench attention) or tokens/s (bench model); "0 0" if it died
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "0 0"
  elif grep -q '^forward' <<<"$out"; then
    awk '/^forward/ {f=$4} /^backward/ {b=$4} END {print f, b}' <<<"$out"
  else
    awk '/^tokens\/s:/ {print $2, $2}' <<<"$out"
  fi
}
bench() {  # label, args...
  local label=$1 best_old_f=0 best_old_b=0 best_new_f=0 best_new_b=0 f b
  shift
  for ((r = 0; r < rounds; r++)); do
    read -r f b < <(run "$old" "$@")
    best_old_f=$(awk -v a="$best_old_f" -v b="$f" 'BEGIN {print (b > a ? b : a)}')
    best_old_b=$(awk -v a="$best_old_b" -v b="$b" 'BEGIN {print (b > a ? b : a)}')
    read -r f b < <(run "$new" "$@")
    best_new_f=$(awk -v a="$best_new_f" -v b="$f" 'BEGIN {print (b > a ? b : a)}')
    best_new_b=$(awk -v a="$best_new_b" -v b="$b" 'BEGIN {print (b > a ? b : a)}')
  done
  if [ "$best_old_f" = 0 ]; then  # the old binary died (SIGILL on a CPU it did not check, say)
    awk -v l="$label" -v n="$best_new_f" 'BEGIN {printf "| %s | died | %.1f | - |\n", l, n}'
  elif [ "$best_old_f" = "$best_old_b" ]; then
    awk -v l="$label" -v o="$best_old_f" -v n="$best_new_f" 'BEGIN {printf "| %s | %.1f | %.1f | %.3f |\n", l, o, n, n / o}'
  else
    awk -v l="$label forward GFLOP/s" -v o="$best_old_f" -v n="$best_new_f" 'BEGIN {printf "| %s | %.1f | %.1f | %.3f |\n", l, o, n, n / o}'
    awk -v l="$label backward GFLOP/s" -v o="$best_old_b" -v n="$best_new_b" 'BEGIN {printf "| %s | %.1f | %.1f | %.3f |\n", l, o, n, n / o}'
  fi
}
for t in 1 2; do
  bench "attention fp32, S=4096 H=G=8 D=128 causal, $t thread(s)" bench attention --seq 4096 --threads "$t" --dtype fp32
  bench "attention bf16, S=4096 H=G=8 D=128 causal, $t thread(s)" bench attention --seq 4096 --threads "$t" --dtype bf16
  bench "attention bf16, S=8192 H=8 G=2 D=64 causal, $t thread(s)" bench attention --seq 8192 --heads 8 --kv-heads 2 --head-dim 64 --threads "$t" --dtype bf16
done
bench "training step fp32 tokens/s, bench-512 x 4 layers, S=4096" bench model --seq 4096
bench "training step bf16 tokens/s, bench-512 x 4 layers, S=4096" bench model --seq 4096 --dtype bf16
