#!/usr/bin/env bash
# The README's Planning example: the Llama 3.1 8B shape on 64 TPU v5p chips,
# tp = 8, bf16, causal, zigzag, remat_policy=full, from 64K to 14M tokens.
# One summary line per length (from `longctx plan --json`; "+ZeRO-1" where
# the planner had to turn on shard_optimizer_over_data), then the full table
# at 1M tokens with the recommended cp.
#   bench/results/plan_llama8b_tpu_v5p.sh [BUILD_DIR] > bench/results/plan_llama8b_tpu_v5p.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
ARGS=(configs/base.yml model_name=llama3.1-8b dtype=bfloat16 ici_data_parallelism=-1
      ici_tensor_parallelism=8 remat_policy=full --hardware tpu-v5p --devices 64)
printf '%-18s %-35s %s\n' "max_target_length" "recommendation" "predicted"
for S in 65536 131072 262144 524288 1048576 2097152 4194304 8388608 14680064; do
  "$BUILD/longctx" plan "${ARGS[@]}" max_target_length=$S --json | python3 -c '
import json, sys
j = json.load(sys.stdin); r = j["recommendation"]; S = j["max_target_length"]
if not r["found"]:
    print("%9d          nothing fits: %s  (planned in %.2f s)" % (S, r["reason"], j["plan_seconds"]))
else:
    p = r["plan"]
    rec = "%-10s cp=%d%s%s%s" % (r["strategy"], r["cp"], " U=%d" % r["ulysses"] if r["strategy"] == "usp" else "",
                                 "" if r["remat_policy"] == "full" else " remat=" + r["remat_policy"],
                                 " +ZeRO-1" if r.get("shard_optimizer_over_data") else "")
    print("%9d          %-35s %7.1f s/step  MFU %.1f%%  %6.2f GiB  (planned in %.2f s)"
          % (S, rec, p["step_seconds"], 100 * p["mfu"], p["memory_total_bytes"] / 2**30, j["plan_seconds"]))
'
done
echo
"$BUILD/longctx" plan "${ARGS[@]}" max_target_length=1048576 ici_context_parallelism=8 \
  | sed -n '/^strategy/,/^$/p;/^recommendation/,$p'
