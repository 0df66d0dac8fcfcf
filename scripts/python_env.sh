#!/usr/bin/env bash
# Usage: scripts/python_env.sh NAME PACKAGE...
# Creates (once) a virtual environment build/venv-NAME with the given PyPI
# packages and prints the path of its python on stdout. Python packages from
# PyPI are only for helper scripts, test oracles and benchmark peers, never for
# the C++ build. Exits non-zero (with the reason on stderr) when the
# environment cannot be made, e.g. without network: callers skip loudly.
# PYTHON=/path/to/python3.X makes it with that interpreter (default: Debian's).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift
venv="$PWD/build/venv-$name"
stamp="$venv/.installed"
want="$*"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p build
if ! [ -x "$venv/bin/python" ]; then
  # Debian's python3 needs python3-venv for `-m venv`; fall back to any python3 that has it.
  for py in ${PYTHON:-/usr/bin/python3 python3}; do
    if "$py" -m venv "$venv" >/dev/null 2>&1; then break; fi
    rm -rf "$venv"
  done
  if ! [ -x "$venv/bin/python" ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" -eq 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >&2 || true
      /usr/bin/python3 -m venv "$venv" >&2 || true
    fi
  fi
  [ -x "$venv/bin/python" ] || { echo "python_env.sh: cannot create a virtual environment at $venv (install python3-venv)" >&2; exit 1; }
fi
# --no-compile: no bytecode for every file of every package up front (torch and
# transformers: ~10k files, ~35 CPU-s); Python compiles the modules it imports.
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile "$@" >&2; then
  echo "python_env.sh: pip could not install: $want (no network to PyPI?)" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "$venv/bin/python"
