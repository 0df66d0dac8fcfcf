#!/usr/bin/env bash
# Usage: scripts/framework_env.sh
# Makes (once) build/venv-frameworks: the frameworks whose settings
# `longctx plan --emit` writes, from PyPI at the versions the test checks
# against (tests/frameworks/validate.py), and prints its python on stdout:
#   maxtext 0.2.5 with jax 0.12.1 on CPU (config loading and mesh checks),
#   megatron-core 0.19.2 (it ships megatron/training/arguments.py: the real
#     argument parser and validate_args), with torch 2.15.0,
#   torchtitan 0.3.0 (its ConfigManager and ParallelDims).
# They need Python >= 3.12 (MaxText's and megatron-core's wheels say so);
# Debian 12's is 3.11. The first python3.12 or newer found is used:
# LONGCTX_FRAMEWORK_PYTHON, python3.13, python3.12 on PATH, pyenv's. None:
# exits non-zero saying so (the test then SKIPs). About 7 GB (PyPI's torch
# brings its CUDA libraries: PyPI has no CPU-only torch for Linux).
set -euo pipefail
cd "$(dirname "$0")/.."
py=""
for candidate in ${LONGCTX_FRAMEWORK_PYTHON:-} python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then py=$(command -v "$candidate"); break; fi
done
[ -n "$py" ] || { echo "framework_env.sh: no Python >= 3.12 here (MaxText and megatron-core need it; Debian 12 has 3.11): set LONGCTX_FRAMEWORK_PYTHON" >&2; exit 1; }
# MaxText's wheel lists its dependencies under extras for TPU and GPU only:
# the ones its config loading and mesh helpers import are named here.
# huggingface-hub < 2: transformers' newest wants 2.x, torchtitan's datasets < 2.
PYTHON=$py exec scripts/python_env.sh frameworks \
  maxtext==0.2.5 jax==0.12.1 jaxlib==0.12.1 flax==0.12.12 orbax-checkpoint etils omegaconf pydantic psutil \
  jinja2 absl-py pyyaml packaging pathwaysutils transformers grain drjax jaxtyping qwix aqtp 'huggingface-hub<2' \
  megatron-core==0.19.2 torch==2.15.0 torchtitan==0.3.0
