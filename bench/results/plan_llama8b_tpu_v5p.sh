#!/usr/bin/env bash
# The README's Planning example: the Llama 3.1 8B shape on 64 TPU v5p and
# 64 TPU v7 chips, bf16, causal, zigzag, remat_policy=full asked, tp = 1 and
# tp = 8, from 64K to 14M tokens. One summary line per length (from
# `longctx plan --json`): the recommendation and the memory levers the
# planner had to add, in MaxText's order (ZeRO-1, FSDP over dp x cp,
# sequence parallelism, token chunks, offload of saved activations, optimizer state, layer
# inputs, parameters, heavier remat); then the full table at 1M tokens, v5p, tp = 8.
#   bench/results/plan_llama8b_tpu_v5p.sh [BUILD_DIR] > bench/results/plan_llama8b_tpu_v5p.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
for HW in tpu-v5p tpu-v7; do
  for TP in 1 8; do
    ARGS=(configs/base.yml model_name=llama3.1-8b dtype=bfloat16 ici_data_parallelism=-1
          ici_tensor_parallelism=$TP remat_policy=full --hardware $HW --devices 64)
    echo "== $HW x 64, tp=$TP"
    printf '%-9s  %-18s %-52s %s\n' "S" "recommendation" "levers added" "predicted"
    for S in 65536 131072 262144 524288 1048576 2097152 4194304 8388608 14680064; do
      "$BUILD/longctx" plan "${ARGS[@]}" max_target_length=$S --json | python3 -c '
import json, sys
j = json.load(sys.stdin); r = j["recommendation"]; S = j["max_target_length"]
if not r["found"]:
    print("%9d  nothing fits with every lever" % S)
else:
    p = r["plan"]; lv = r.get("levers", "")
    names = [("ZeRO-1", "shard_optimizer_over_data"), ("FSDP", "fsdp_over_context"), ("SP", "tensor_sequence_parallelism"), ("chunks", "layer_token_chunk")]
    added = [n for n, key in names if key in lv]
    # The offloaded tensors: the last custom remat rung holds them all.
    custom = [part.split(" (")[0] for part in lv.split("; ") if part.startswith("remat_policy=custom")]
    off = [kv.split("=")[0] for kv in (custom[-1].split()[1:] if custom else []) if kv.endswith("=offload")]
    acts = [t for t in off if t != "decoder_layer_input"]
    if acts: added.append("offload " + "+".join(acts))
    if "optimizer_memory_host_offload" in lv: added.append("offload optimizer")
    if "decoder_layer_input" in off: added.append("offload inputs")
    if "parameter_memory_host_offload" in lv: added.append("offload params")
    for part in lv.split("; "):
        if part.startswith("remat_policy=") and not part.startswith("remat_policy=custom"):
            added.append(part.split(" ")[0])
    rec = "%s cp=%d%s" % (r["strategy"], r["cp"], " U=%d" % r["ulysses"] if r["strategy"] == "usp" else "")
    print("%9d  %-18s %-52s %8.1f s/step  MFU %.1f%%  %6.2f GiB"
          % (S, rec, ", ".join(added) or "-", p["step_seconds"], 100 * p["mfu"], p["memory_total_bytes"] / 2**30))
'
    done
    echo
  done
done
"$BUILD/longctx" plan configs/base.yml model_name=llama3.1-8b dtype=bfloat16 ici_data_parallelism=-1 \
  ici_tensor_parallelism=8 remat_policy=full --hardware tpu-v5p --devices 64 max_target_length=1048576 \
  ici_context_parallelism=8 | sed -n '/^strategy/,/^$/p;/^recommendation/,$p'
