#!/usr/bin/env bash
# Llama 3.1 8B on 64 chips, 64K to 14M tokens per sequence, under
# `plan --emit maxtext` (the fastest plan MaxText 0.2.5 runs on that
# hardware) beside longctx's own best plan: the table a MaxText user compares
# with MaxText's published long-context results. Predictions from the
# datasheet profiles (configs/hardware), no hardware needed.
#   bench/results/emit_maxtext_8b.sh > bench/results/emit_maxtext_8b.md
set -euo pipefail
cd "$(dirname "$0")/../.."
longctx=${LONGCTX:-build/longctx}
echo "# Llama 3.1 8B, 64 chips: the plan MaxText runs vs longctx's own best"
echo
echo "\`bench/results/emit_maxtext_8b.sh\` ($($longctx --version 2>/dev/null | head -1)), $(date -u +%Y-%m-%d)."
echo "Predicted by the planner from the datasheet profiles (no device ran); batch: 1 sequence per data-parallel slice."
echo "\"MaxText runs\": \`plan --emit maxtext\`'s recommendation, which MaxText 0.2.5's own config checks accept"
echo "(tests/frameworks/test_plan_frameworks.sh); \"gap\": how much faster longctx's own best is, and why."
echo "Plans within 1% of each other count as equally fast: longctx's own pick is then the one with fewer memory"
echo "levers, so the MaxText plan's MFU can read a little higher."
echo
echo "| hardware | tokens | MaxText runs | MFU | longctx's own best | MFU | gap |"
echo "|---|---:|---|---:|---|---:|---|"
for hw in tpu-v5p tpu-v7 h100; do
  for L in 65536 131072 262144 524288 1048576 2097152 4194304 8388608 14680064; do
    args=(plan configs/base.yml model_name=llama3.1-8b dtype=bfloat16 max_target_length=$L ici_data_parallelism=-1
          context_parallel_strategy=auto --hardware $hw --devices 64 --json)
    own=$("$longctx" "${args[@]}" 2>/dev/null || true)
    framework=$("$longctx" "${args[@]}" --emit maxtext 2>&1 || true)
    python3 - "$hw" "$L" "$own" "$framework" <<'PY'
import json, sys
hw, L, own, fw = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def line(text):
    try:
        r = json.loads(text)["recommendation"]
    except Exception:
        last = text.strip().splitlines()[-1] if text.strip() else "no output"
        return None, last.split("lacks: ", 1)[-1].removesuffix("), so there is nothing to emit")
    if not r["found"]:
        return None, r["reason"][:160]
    p = r["plan"]
    name = f'{r["strategy"]} cp={r["cp"]}' + (f' ({r["ulysses"]}x{r["cp"] // r["ulysses"]})' if r["strategy"] == "usp" else "")
    name += f' tp={r["tp"]}, remat {r["remat_policy"]}'
    return r, (name, f'{100 * p["mfu"]:.1f}%')
o, own_text = line(own)
f, fw_text = line(fw)
tokens = f"{L // 1024}K" if L < 1048576 else f"{L / 1048576:g}M"
own_cols = " | ".join(own_text) if o else f"nothing fits | |"
if f:
    gap = f.get("framework_gap") or "none (MaxText runs longctx's own best, or one within 1%)"
    gap = gap.split(": ", 1)[1] if gap.startswith("longctx's own best") and ": " in gap else gap
    pct = ""
    if o and f.get("framework_gap"):
        pct = f'+{100 * (o["plan"]["tokens_per_second_per_device"] / f["plan"]["tokens_per_second_per_device"] - 1):.0f}%: '
    print(f"| {hw} | {tokens} | {fw_text[0]} | {fw_text[1]} | {own_cols} | {pct}{gap[:200]} |")
else:
    print(f"| {hw} | {tokens} | nothing MaxText runs fits | | {own_cols} | {fw_text[:200]} |")
PY
  done
done
