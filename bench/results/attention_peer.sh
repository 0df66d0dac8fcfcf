#!/usr/bin/env bash
# longctx's attention kernel and PyTorch's CPU SDPA, same shapes, same run, one
# after the other (fp32, causal, D=128): 1 thread H=G=8 S=8192, 2 threads H=G=2
# S=16384. PyTorch is installed from PyPI into build/peer, never a dependency of
# the build. Usage: bench/results/attention_peer.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
[ -x "$build/peer/bin/python" ] || { python3 -m venv "$build/peer" && "$build/peer/bin/pip" install -q torch; }
lscpu | grep -E "^Model name|^Flags"
uptime
for cfg in "1 8 8192" "2 2 16384"; do
  read -r T H S <<<"$cfg"
  OMP_NUM_THREADS=$T "$build/longctx" bench attention --json --mask causal --threads "$T" --heads "$H" --seq "$S"
  "$build/peer/bin/python" bench/results/sdpa_peer.py --threads "$T" --heads "$H" --seq "$S"
done
