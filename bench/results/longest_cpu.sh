#!/usr/bin/env bash
# Regenerates bench/results/longest_cpu.md: the longest sequence this machine
# trains, one step, with each memory lever added in MaxText's order (the
# order of memory_ladder in src/plan/planner.cpp), for 1 rank and for 2 ranks
# (cp=2 ring), as `longctx plan --longest` predicts it; then ONE real
# training step at the predicted length of the best 1-rank and the best
# 2-rank row, with the measured peak against the prediction and the time.
#   bench/results/longest_cpu.sh [BUILD_DIR]        (default: build)
#   PLAN_ONLY=1 ...    the planner's table only (seconds)
#   REUSE_LOGS=1 ...   reuse a real run's log in BUILD_DIR/longest/ when it finished at the same length
#
# The model: d_model 128, 2 query heads of 64 and 1 KV head (GQA), SwiGLU
# 256, 3 layers, byte vocabulary, local attention with a 512-token window,
# fp32. Its step costs about 7 MFLOP per token (3.6 in the projections with
# full remat, 3.5 in the windowed attention), so a multi-million-token step
# takes minutes on 2 cores; the window keeps the attention linear in S.
# Three layers, not two: an offloaded tensor keeps 3 (layer input) or 2
# (saved activations) staging slots on the device, so offload frees nothing
# in a model with fewer layers than slots.
# Budgets: this VM has 23 GiB (MemTotal), no swap, and is shared with other
# builds; 18 GiB goes to the tracked "device" memory of one rank, the rest to
# the OS, the untracked per-token data arrays (the synthetic corpus and the
# batch: about 0.35 KiB per token per rank) and MPI. Two ranks on this one
# machine get 9 GiB each.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=bench/results/longest_cpu.md
WORK=$BUILD/longest
mkdir -p "$WORK"
LONGCTX=$BUILD/longctx
GRANULE=4096
# The time column needs this machine's profile (memory does not: num_threads is set).
if [ ! -f configs/hardware/cpu-local.yml ] && [ -z "${LONGCTX_HARDWARE_DIR:-}" ]; then
  OMP_NUM_THREADS=2 "$LONGCTX" plan --measure >/dev/null
fi

MODEL="configs/base.yml base_emb_dim=128 base_num_query_heads=2 base_num_kv_heads=1 head_dim=64 base_mlp_dim=256
  base_num_decoder_layers=3 vocab_size=259 attention_type=local sliding_window_size=512 dtype=float32
  dataset_type=synthetic packing=false steps=1 enable_checkpointing=false progress_interval_seconds=60"
ONE="num_threads=2 device_memory_budget=18GiB"
TWO="ici_context_parallelism=2 context_parallel_strategy=ring num_threads=1 device_memory_budget=9GiB"
# Custom remat policies that save what the named policy saves, offloaded (the ladder's rungs).
OFF_NONE="remat_policy=custom decoder_layer_input=device qkv_proj=offload context=offload out_proj=offload mlpwi=offload"
OFF_MINIMAL="remat_policy=custom qkv_proj=offload context=remat out_proj=offload mlpwi=offload"
OFF_SAVE_CONTEXT="remat_policy=custom qkv_proj=remat context=offload out_proj=remat mlpwi=remat"
OFF_FULL="remat_policy=custom qkv_proj=remat context=remat out_proj=remat mlpwi=remat"

# Rungs: "label|keys added" (each keeps the keys of the ones before it).
RUNGS_ONE=(
  "remat none, nothing else|remat_policy=none"
  "+ ZeRO-1 (no-op at 1 rank: no replicas to shard over)|shard_optimizer_over_data=true"
  "+ layer token chunks of 4096|layer_token_chunk=4096"
  "+ offload saved activations (host)|$OFF_NONE offload_target=host"
  "+ optimizer state to host|optimizer_memory_host_offload=true"
  "+ layer inputs to host|decoder_layer_input=offload"
  "+ offload to disk instead of host|offload_target=disk"
  "+ remat minimal (its saved tensors on disk)|$OFF_MINIMAL"
  "+ remat save_context (its saved tensors on disk)|$OFF_SAVE_CONTEXT"
  "+ remat full (layer inputs on disk)|$OFF_FULL"
  "+ bf16 activations and saved tensors|dtype=bfloat16"
)
RUNGS_TWO=(
  "remat none, nothing else|remat_policy=none"
  "+ ZeRO-1 (moments split over the 2 cp ranks)|shard_optimizer_over_data=true"
  "+ FSDP over the cp ranks|fsdp_over_context=true"
  "+ layer token chunks of 4096|layer_token_chunk=4096"
  "+ offload saved activations (host)|$OFF_NONE offload_target=host"
  "+ optimizer state to host|optimizer_memory_host_offload=true"
  "+ layer inputs to host|decoder_layer_input=offload"
  "+ parameter shards to host|parameter_memory_host_offload=true"
  "+ offload to disk instead of host|offload_target=disk"
  "+ remat minimal (its saved tensors on disk)|$OFF_MINIMAL"
  "+ remat save_context (its saved tensors on disk)|$OFF_SAVE_CONTEXT"
  "+ remat full (layer inputs on disk)|$OFF_FULL"
  "+ bf16 activations and saved tensors|dtype=bfloat16"
)

gib() { /usr/bin/python3 -c "import sys; print(f'{int(sys.argv[1]) / 2**30:.2f}')" "$1"; }
# plan --longest --json -> "length memory_total host_pool step_seconds"
longest() {
  # shellcheck disable=SC2086
  "$LONGCTX" plan $MODEL "$@" --longest --granule $GRANULE --json |
    /usr/bin/python3 -c "import json, sys; j = json.load(sys.stdin); p = j['plan']
print(j['longest_max_target_length'], p['memory_total_bytes'], j['host_pool_bytes'], p['step_seconds'])"
}

declare -A BEST_KEYS BEST_LENGTH BEST_MEMORY BEST_STEP
table() {  # name, mesh keys, rungs...
  local name=$1 mesh=$2 keys="" best=0
  shift 2
  echo "| rung (cumulative) | longest S | tokens/rank | device memory (GiB) | host pool (GiB) | predicted step |"
  echo "|---|---:|---:|---:|---:|---:|"
  for rung in "$@"; do
    keys="$keys ${rung#*|}"
    # shellcheck disable=SC2086
    read -r length memory host step < <(longest $mesh $keys)
    local ranks=1
    [[ $mesh == *ici_context_parallelism=2* ]] && ranks=2
    printf "| %s | %d | %d | %s | %s | %.0f s |\n" "${rung%%|*}" "$length" $((length / ranks)) "$(gib "$memory")" \
      "$(gib "$host")" "$step"
    if ((length > best)); then
      best=$length
      BEST_KEYS[$name]="$mesh $keys"
      BEST_LENGTH[$name]=$length
      BEST_MEMORY[$name]=$memory
      BEST_STEP[$name]=$step
    fi
  done
}

# One real training step at the predicted length: measured peak (tracked, max over ranks), time, max RSS.
real_step() {  # name, ranks, threads
  local name=$1 ranks=$2 threads=$3 length=${BEST_LENGTH[$1]} log=$WORK/$1.log
  local keys="${BEST_KEYS[$1]} max_target_length=$length base_output_directory=$WORK/runs run_name=$name
    metrics_file=$WORK/$name.jsonl offload_dir=$WORK/spill-$name peak_tflops_per_device=0.03"
  # shellcheck disable=SC2086
  local cmd=(mpiexec --oversubscribe --allow-run-as-root --bind-to none -n "$ranks" -x OMP_NUM_THREADS="$threads"
             /usr/bin/time -f "rank maxrss_kib %M wall_s %e" nice -n 5 "$LONGCTX" train $MODEL $keys)
  printf '%q ' "${cmd[@]}" | fold -s -w 106 | sed 's/^/    /'
  echo
  if ! [[ ${REUSE_LOGS:-0} == 1 && -f $log ]] || ! grep -q "max_target_length=$length " "$log.cmd" 2>/dev/null; then
    printf '%q ' "${cmd[@]}" > "$log.cmd"
    echo "before: $(uptime)" > "$log"
    rm -f "$WORK/$name.jsonl"
    "${cmd[@]}" >> "$log" 2>&1 || echo "exit status $?" >> "$log"
    echo "after: $(uptime)" >> "$log"
  fi
  echo '```'
  grep -E "^(before|after):|^step 1 |maxrss|exit status|Error|error" "$log" || true
  echo '```'
  echo
  if [ -s "$WORK/$name.jsonl" ]; then
    /usr/bin/python3 - "$WORK/$name.jsonl" "${BEST_MEMORY[$1]}" "${BEST_STEP[$1]}" <<'EOF'
import json, sys
m = json.loads(open(sys.argv[1]).readline())
pred, step, peak = int(sys.argv[2]), float(sys.argv[3]), m["peak_memory_bytes"]
diff = "exact" if pred == peak else "%+.3f%%" % ((pred / peak - 1) * 100)
print(f"measured peak {peak} B = {peak / 2**30:.3f} GiB (tracked, max over ranks), predicted {pred} B ({diff}); "
      f"step {m['seconds']:.0f} s measured, {step:.0f} s predicted; loss {m['loss']:.4f}")
EOF
  else
    echo "no step finished: see $log"
  fi
}

{
  echo "# The longest sequence this machine trains, one step, lever by lever (CPU)"
  echo
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) vCPUs, flags: $(grep -o -w -E 'avx2|fma|avx512f|amx_tile|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 2^20}' /proc/meminfo), no swap; $(date -u +%F); load: $(uptime | sed 's/.*load average/load average/')"
  echo
  echo "Model (why: README \"Planning\"): d_model 128, 2 heads x 64, 1 KV head, SwiGLU 256, 3 layers, vocab 259,"
  echo "local attention window 512, fp32 (bf16 in the last rung), synthetic data unpacked. Granule $GRANULE tokens."
  echo "Device budget: 18 GiB for 1 rank; 9 GiB per rank for 2 ranks on this one machine (the 2-rank rows are"
  echo "what two such ranks train; machines of 18 GiB each, one rank per machine: the line below the table)."
  echo "The host pool column is memory the planner counts apart (a GPU's host RAM); on this CPU it is the same"
  echo "RAM, so a host row is runnable here only while device + host stays under the machine."
  echo
  echo "$LONGCTX plan $MODEL <mesh> <rung keys> --longest --granule $GRANULE [--json]" | tr -s ' \n' ' ' |
    fold -s -w 106 | sed 's/^/    /'
  echo
  echo
  echo "## 1 rank, 2 threads, device_memory_budget=18GiB"
  echo
  table one "$ONE" "${RUNGS_ONE[@]}"
  echo
  echo "## 2 ranks (cp=2 ring, zigzag), 1 thread each, device_memory_budget=9GiB per rank"
  echo
  table two "$TWO" "${RUNGS_TWO[@]}"
  # shellcheck disable=SC2086
  read -r l2 m2 h2 s2 < <(longest ${BEST_KEYS[two]//device_memory_budget=9GiB/device_memory_budget=18GiB})
  # shellcheck disable=SC2086
  read -r l4 m4 h4 s4 < <(longest ${BEST_KEYS[two]//device_memory_budget=9GiB/device_memory_budget=18GiB} \
    ici_context_parallelism=4 --devices 4)
  # shellcheck disable=SC2086
  read -r la ma ha sa < <(longest ${BEST_KEYS[two]//context_parallel_strategy=ring/context_parallel_strategy=all_gather})
  echo
  echo "Same last rung, all_gather instead of ring: $la tokens ($(gib "$ma") GiB). Machines of 18 GiB, one"
  echo "rank each (planner only): two $l2 tokens ($(gib "$m2") GiB per rank), four (cp=4) $l4 ($(gib "$m4") GiB)."
  echo
  echo "Memory per device at the 1-rank best row (\`plan --longest\` without --json):"
  echo
  echo '```'
  # shellcheck disable=SC2086
  "$LONGCTX" plan $MODEL ${BEST_KEYS[one]} --longest --granule $GRANULE | sed -n '2,$p'
  echo '```'
  if [[ ${PLAN_ONLY:-0} != 1 ]]; then
    echo
    echo "## One real step at the predicted length"
    echo
    echo "1 rank (best 1-rank row, S = ${BEST_LENGTH[one]}):"
    echo
    real_step one 1 2
    echo
    echo "2 ranks (best 2-rank row, S = ${BEST_LENGTH[two]}):"
    echo
    real_step two 2 1
  fi
} > "$OUT"
echo "wrote $OUT"
