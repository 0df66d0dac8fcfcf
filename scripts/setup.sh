#!/usr/bin/env bash
# Installs every Debian package the build, tests and demo need (idempotent),
# then configures and builds longctx into build/.
#   scripts/setup.sh            packages, then the build
#   scripts/setup.sh packages   packages only
set -euo pipefail
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev: Debian's oneDNN CMake config requires OpenCL (its GPU
# runtime), which apt only recommends; without it find_package(dnnl) fails.
PACKAGES=(build-essential cmake g++ pkg-config libdnnl-dev ocl-icd-opencl-dev libopenmpi-dev openmpi-bin
          libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libomp-dev bible-kjv
          python3 python3-matplotlib python3-numpy python3-venv)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = packages ] && exit 0

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${LONGCTX_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$(nproc)"
