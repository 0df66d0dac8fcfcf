#!/usr/bin/env bash
# Regenerates bench/results/cluster_cpu.md: two hosts of scripts/cluster.sh
# (one rank each) joined by a rate-limited link; `plan --measure` across them
# learns the link, then `plan --validate` runs real steps across the hosts
# and, for the same 2 ranks, on one host (shared memory). The link's
# measured exposed time is the difference of the two steps; the planner's
# is its exposed communication with the measured profile.
#   bench/results/cluster_cpu.sh [RATE]    (default 1gbit; root; run from an idle machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${1:-1gbit}
OUT=bench/results/cluster_cpu.md
dir=build/cluster-bench
scripts/cluster.sh down --name lcb >/dev/null 2>&1 || true
scripts/cluster.sh up 2 --slots 1 --rate "$RATE" --dir "$dir" --name lcb
trap 'scripts/cluster.sh down --name lcb' EXIT
profile=$(realpath "$dir")/profile.yml
measured=$("$dir/mpiexec" -x OMP_NUM_THREADS=1 -n 2 build/longctx plan --measure --output "$profile")
local=(env OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none)
{
  echo "# Two hosts over a $RATE link: the planner against real steps"
  echo
  echo "Machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) vCPUs; flags:" \
       "$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "Hosts: \`scripts/cluster.sh up 2 --slots 1 --rate $RATE\` (network namespaces on one bridge, a tc tbf" \
       "token bucket on each host's egress), Open MPI 4.1 over TCP, 1 rank x 1 thread per host."
  echo "Command: \`bench/results/cluster_cpu.sh $RATE\` ($(date -u +%F))."
  echo
  echo "\`plan --measure\` across the hosts:"
  echo
  echo '```'
  echo "$measured" | grep -E 'between hosts|p2p'
  echo '```'
  echo
  echo "Each row: \`plan CONFIG --validate --steps 5 --hardware <that profile>\` across the 2 hosts, and the same"
  echo "2 ranks on one host (shared memory, the link out of the way). Measured exposed link time = the seconds"
  echo "rank 0 spent blocked in communication waits per step across the hosts, less the same on one host (waiting"
  echo "for the other rank's compute, and shared-memory copies); predicted = the plan's exposed communication."
  echo
  echo "| config | predicted step | measured step | error | predicted exposed comm | measured exposed link time | error |"
  echo "|---|---|---|---|---|---|---|"
} > "$OUT"
row() {  # NAME ARGS...
  local name=$1; shift
  local args=(plan configs/base.yml model_name=bench-512 dataset_type=synthetic packing=false remat_policy=none "$@"
              --validate --steps 5 --hardware "$profile")
  local across one
  across=$("$dir/mpiexec" -x OMP_NUM_THREADS=1 -n 2 build/longctx "${args[@]}")
  one=$("${local[@]}" -n 2 build/longctx "${args[@]}")
  echo "$across" | sed 's/^/    /' >&2
  python3 - "$name" "$across" "$one" >> "$OUT" <<'PY'
import re, sys
name, across, one = sys.argv[1:]
def grab(text, pattern):
    return float(re.search(pattern, text).group(1))
pred = grab(across, r"predicted ([0-9.]+) s/step")
pred_exposed = grab(across, r"exposed comm ([0-9.]+)")
meas = grab(across, r"measured  ([0-9.]+) s/step")
wait = grab(across, r"blocked in comm waits ([0-9.]+)")
wait_one = grab(one, r"blocked in comm waits ([0-9.]+)")
exposed = wait - wait_one
err = lambda p, m: f"{(p / m - 1) * 100:+.0f}%" if m > 0 else "n/a"
print(f"| {name} | {pred:.2f} s | {meas:.2f} s | {err(pred, meas)} | {pred_exposed:.2f} s | {exposed:.2f} s | {err(pred_exposed, exposed)} |")
PY
}
row "ring cp=2, S=8192, fp32" max_target_length=8192 ici_context_parallelism=2 context_parallel_strategy=ring
row "all_gather cp=2, S=8192, fp32" max_target_length=8192 ici_context_parallelism=2 context_parallel_strategy=all_gather
row "ulysses cp=2, S=8192, fp32" max_target_length=8192 ici_context_parallelism=2 context_parallel_strategy=ulysses
row "dp=2, S=4096, fp32" max_target_length=4096 ici_data_parallelism=2
cat "$OUT"
