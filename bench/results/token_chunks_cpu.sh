#!/usr/bin/env bash
# Regenerates bench/results/token_chunks_cpu.md: what layer_token_chunk costs
# and saves. One `longctx train` step pair per setting, back to back in one
# run: the longest_cpu.md model (d_model 128, 3 layers, local window 512,
# remat full, layer inputs on disk) at 131,072 tokens, 1 rank x 2 threads,
# fp32, without chunks and with chunks of 4096. PyTorch has no such lever
# (its peer would be the same step without it: the first row).
#   bench/results/token_chunks_cpu.sh [BUILD_DIR]   (default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
OUT=bench/results/token_chunks_cpu.md
WORK=$BUILD/token_chunks
mkdir -p "$WORK"
MODEL="configs/base.yml base_emb_dim=128 base_num_query_heads=2 base_num_kv_heads=1 head_dim=64 base_mlp_dim=256
  base_num_decoder_layers=3 vocab_size=259 attention_type=local sliding_window_size=512 dtype=float32
  dataset_type=synthetic packing=false steps=2 enable_checkpointing=false num_threads=2 remat_policy=custom
  qkv_proj=remat context=remat out_proj=remat mlpwi=remat decoder_layer_input=offload offload_target=disk
  max_target_length=131072 base_output_directory=$WORK run_name=chunks offload_dir=$WORK/spill"
before=$(uptime)
rows=()
for chunk in 0 4096; do
  # shellcheck disable=SC2086
  line=$("$BUILD/longctx" train $MODEL layer_token_chunk=$chunk metrics_file=$WORK/m$chunk.jsonl 2>&1 | grep '^step 2 ')
  rows+=("| $chunk | $(echo "$line" | awk -F'|' '{gsub(/ /, "", $2); print $2}') | $(echo "$line" | awk -F'|' '{print $6}') | $(echo "$line" | sed 's/.*peak //') |")
done
after=$(uptime)
{
  echo "# Token chunks (layer_token_chunk): step time and peak memory (CPU)"
  echo
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) vCPUs; CPU flags of interest:" \
       "$(grep -o -w -E 'avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "Command: \`bench/results/token_chunks_cpu.sh\` ($(date -u +%F)); load before: \`$before\`; after: \`$after\`."
  echo
  echo "| layer_token_chunk | step 2 (s) | tokens/s | peak tracked memory |"
  echo "|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} > "$OUT"
echo "wrote $OUT"
