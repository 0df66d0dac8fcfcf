#!/usr/bin/env bash
# `plan --emit` checked by the frameworks themselves: every plan of the table
# below is emitted for each framework named in its row, and
# tests/frameworks/validate.py hands it to that framework's own config code
# (MaxText 0.2.5, Megatron-Core 0.19.2, TorchTitan 0.3.0, from PyPI in
# build/venv-frameworks: scripts/framework_env.sh). Exit 77 (ctest SKIP),
# saying why, when they cannot be installed (no network, no Python >= 3.12).
#   tests/frameworks/test_plan_frameworks.sh LONGCTX_BINARY
set -uo pipefail
cd "$(dirname "$0")/../.."
longctx=${1:-build/longctx}
python=$(scripts/framework_env.sh 2> >(tail -3 >&2)) || {
  echo "test_plan_frameworks: SKIPPED: the frameworks could not be installed (above)"
  exit 77
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

L8="model_name=llama3.1-8b dtype=bfloat16"
L70="$L8 base_emb_dim=8192 base_num_query_heads=64 base_num_kv_heads=8 base_mlp_dim=28672 base_num_decoder_layers=80"
OPEN="ici_data_parallelism=-1 context_parallel_strategy=auto"  # the search chooses cp, strategy, levers
# The other rows pin the mesh (no -1) and name the strategy: the search keeps
# both and chooses only the remat policy and the levers.
# name | frameworks | hardware | devices | overrides
# (MaxText's rows on 16 or 64 devices: a JAX start per device count, CI time)
table="
v5p-8b-128k-auto      |maxtext                    |tpu-v5p|64|$L8 max_target_length=131072 $OPEN
v5p-8b-128k-ring8     |maxtext                    |tpu-v5p|64|$L8 max_target_length=131072 ici_data_parallelism=8 ici_context_parallelism=8 context_parallel_strategy=ring
v5p-8b-128k-usp16x4   |maxtext                    |tpu-v5p|64|$L8 max_target_length=131072 ici_data_parallelism=4 ici_context_parallelism=16 ici_context_usp_ulysses_parallelism=4 context_parallel_strategy=usp
v5p-8b-64k-ulysses8   |maxtext                    |tpu-v5p|64|$L8 max_target_length=65536 ici_data_parallelism=8 ici_context_parallelism=8 context_parallel_strategy=ulysses
v5p-8b-32k-window     |maxtext                    |tpu-v5p|16|$L8 max_target_length=32768 ici_data_parallelism=2 ici_context_parallelism=8 context_parallel_strategy=all_gather attention_type=local sliding_window_size=4096
v7-70b-1m-auto        |maxtext                    |tpu-v7 |64|$L70 max_target_length=1048576 $OPEN
h100-8b-128k-auto     |maxtext megatron torchtitan|h100   |64|$L8 max_target_length=131072 $OPEN
h100-8b-1m-auto       |maxtext megatron torchtitan|h100   |64|$L8 max_target_length=1048576 $OPEN
h100-70b-256k-auto    |maxtext megatron torchtitan|h100   |64|$L70 max_target_length=262144 $OPEN
h100-8b-64k-tp2sp     |megatron torchtitan        |h100   |16|$L8 max_target_length=65536 ici_data_parallelism=2 ici_context_parallelism=4 context_parallel_strategy=all_gather ici_tensor_parallelism=2 tensor_sequence_parallelism=true
h100-8b-64k-usp8x2    |megatron                   |h100   |8 |$L8 max_target_length=65536 ici_context_parallelism=8 ici_context_usp_ulysses_parallelism=2 context_parallel_strategy=usp
h100-8b-64k-ulysses8  |megatron                   |h100   |8 |$L8 max_target_length=65536 ici_context_parallelism=8 context_parallel_strategy=ulysses
h100-8b-128k-ring-win |maxtext megatron           |h100   |64|$L8 max_target_length=131072 ici_data_parallelism=8 ici_context_parallelism=8 context_parallel_strategy=ring attention_type=local sliding_window_size=4096
h100-8b-128k-fsdp     |maxtext megatron torchtitan|h100   |16|$L8 max_target_length=131072 ici_data_parallelism=1 ici_fsdp_parallelism=2 ici_context_parallelism=8 context_parallel_strategy=all_gather remat_policy=full
h100-8b-64k-zero1     |maxtext megatron           |h100   |16|$L8 max_target_length=65536 ici_data_parallelism=4 ici_context_parallelism=4 context_parallel_strategy=ring shard_optimizer_over_data=true remat_policy=full
h100-8b-512k-offload  |maxtext megatron           |h100   |16|$L8 max_target_length=524288 ici_data_parallelism=2 ici_context_parallelism=8 context_parallel_strategy=ring remat_policy=custom qkv_proj=offload context=offload out_proj=device mlpwi=remat optimizer_memory_host_offload=true
"
failed=0 plans=()
while IFS='|' read -r name frameworks hardware devices overrides; do
  name=$(echo $name) devices=$(echo $devices)
  [ -n "$name" ] || continue
  for f in $frameworks; do
    json="$out/$name.$f.json"
    # shellcheck disable=SC2086
    if ! "$longctx" plan configs/base.yml $overrides --hardware $hardware --devices "$devices" --emit "$f" --json \
        >"$json" 2>"$json.err"; then
      echo "FAIL $f $name: plan --emit refused it: $(tail -2 "$json.err")"
      failed=$((failed + 1))
      continue
    fi
    plans+=("$json")
  done
done <<<"$table"
"$python" tests/frameworks/validate.py "${plans[@]}" || failed=$((failed + 1))
if ((failed)); then
  echo "test_plan_frameworks: FAILED"
  exit 1
fi
echo "test_plan_frameworks: every plan passed its framework's own validation"
