#!/usr/bin/env bash
# The planner's memory and bytes from two builds, side by side: for a change
# that must leave them unchanged (a refactor of src/plan, or of what the
# counted step allocates). For each configuration below it runs
# `longctx plan ... --json` with both binaries and compares, per candidate,
# the device memory total, its sum per category (communication and scratch
# together: the transients), the bytes sent, the offload and state tiers
# and the recommendation (line names and times left out); for --longest,
# the length and the memory there and one granule on. Prints the
# differences; exits 1 if there are any.
#   scripts/plan_ab.sh OLD_LONGCTX NEW_LONGCTX
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/plan_ab.sh OLD_LONGCTX NEW_LONGCTX" >&2; exit 2; }
B="configs/base.yml dataset_type=synthetic packing=false num_threads=1"
L="configs/base.yml base_emb_dim=128 base_num_query_heads=2 base_num_kv_heads=1 head_dim=64 base_mlp_dim=256
   base_num_decoder_layers=3 attention_type=local sliding_window_size=512 num_threads=2 device_memory_budget=18GiB"
E8="configs/base.yml model_name=llama3.1-8b dtype=bfloat16 ici_data_parallelism=-1 remat_policy=full --devices 64"
CONFIGS=(
  "$B model_name=bench-512 max_target_length=1024 remat_policy=full"
  "$B model_name=bench-512 max_target_length=2048 remat_policy=none dtype=bfloat16"
  "$B model_name=demo max_target_length=8192 remat_policy=save_context attention_type=local sliding_window_size=1024"
  "$B model_name=demo max_target_length=8192 ici_context_parallelism=2 remat_policy=none --devices 2"
  "$B model_name=bench-512 max_target_length=1024 ici_data_parallelism=2 --devices 2"
  "$B model_name=bench-512 max_target_length=1024 ici_tensor_parallelism=2 tensor_sequence_parallelism=true --devices 2"
  "$B model_name=demo max_target_length=8192 ici_context_parallelism=4 ici_fsdp_parallelism=2 fsdp_over_context=true
     shard_optimizer_over_data=true ici_data_parallelism=2 --devices 16"
  "$B model_name=demo max_target_length=8192 remat_policy=custom decoder_layer_input=offload qkv_proj=offload
     context=offload out_proj=remat mlpwi=offload offload_target=host"
  "$B model_name=demo max_target_length=8192 remat_policy=custom decoder_layer_input=offload qkv_proj=offload
     offload_target=disk optimizer_memory_host_offload=true parameter_memory_host_offload=true ici_fsdp_parallelism=2 --devices 2"
  "$B model_name=demo max_target_length=8192 optimizer_memory_host_offload=true state_offload_target=disk
     layer_token_chunk=1000 dtype=bfloat16"
  "$B model_name=demo max_target_length=8192 optimizer_memory_host_offload=true parameter_memory_host_offload=true
     ici_fsdp_parallelism=2 shard_optimizer_over_data=true ici_data_parallelism=2 --devices 4"
  "$E8 ici_tensor_parallelism=8 --hardware tpu-v5p max_target_length=1048576"
  "$E8 ici_tensor_parallelism=1 --hardware tpu-v7 max_target_length=14680064"
  "$L remat_policy=custom decoder_layer_input=offload offload_target=disk --longest --granule 4096"
  "$L remat_policy=none layer_token_chunk=4096 --longest --granule 4096"
  "$L remat_policy=custom decoder_layer_input=device qkv_proj=offload context=offload out_proj=offload mlpwi=offload
     offload_target=host optimizer_memory_host_offload=true layer_token_chunk=4096 --longest --granule 4096"
)
summary() {  # BINARY: one line per candidate (or --longest row) per configuration
  for c in "${CONFIGS[@]}"; do
    echo "## $c" | tr -s ' \n' ' '
    echo
    # shellcheck disable=SC2086
    LONGCTX_BF16_ATTENTION=dot "$1" plan $c --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
def plan(p):
    if not p.get("valid", True): return "invalid: " + p.get("invalid_reason", "")
    cats = {}
    for m in p["memory"]:
        k = "transients" if m["category"] in ("communication", "scratch") else m["category"]
        cats[k] = cats.get(k, 0) + m["bytes"]
    tiers = {k: {f: v for f, v in p[k].items() if f in ("bytes", "moved_bytes_per_step", "target")}
             for k in ("offload", "state_offload") if k in p}
    return "%s cp=%d U=%d memory=%d sent=%d %s %s" % (p["strategy"], p["cp"], p["ulysses"], p["memory_total_bytes"],
                                                    p["comm_bytes_sent"], sorted(cats.items()), json.dumps(tiers, sort_keys=True))
if "candidates" in j:
    for p in j["candidates"]: print(plan(p))
    r = j["recommendation"]
    print("recommendation", r.get("found"), r.get("strategy"), r.get("cp"), r.get("levers"))
    if r.get("found"): print("recommended", plan(r["plan"]))
else:
    print("longest", j["longest_max_target_length"], j["host_pool_bytes"], plan(j["plan"]), json.dumps(j["next"], sort_keys=True))
'
  done
}
old=$(mktemp) new=$(mktemp)
trap 'rm -f "$old" "$new"' EXIT
summary "$1" > "$old"
summary "$2" > "$new"
if diff "$old" "$new"; then echo "plan_ab: memory and bytes identical in $(grep -c '^## ' "$new") configurations"; else exit 1; fi
