#!/usr/bin/env bash
# Stages a built longctx for a machine without our Debian packages (and
# without network): build/device/ gets the executables named (default
# build/longctx and build/tests/test_attention), every shared library they
# load with the dynamic loader itself, and Open MPI's plugin folder.
# bench/results/cpu_bf16.sh runs from it when it is there:
#   build/device/run longctx bench attention ...
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/device
rm -rf "$out" && mkdir -p "$out/lib" "$out/bin"
bins=("$@")
((${#bins[@]})) || bins=(build/longctx build/tests/test_attention)
for b in "${bins[@]}"; do
  cp "$b" "$out/bin/"
  ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | while read -r lib; do
    [ -f "$lib" ] && cp -L "$lib" "$out/lib/"
  done
done
plugins=$(dirname "$(dpkg -L libopenmpi3 | grep '/mca_ess_singleton.so$' | head -1)")
cp -r "$plugins" "$out/ompi"
cat > "$out/run" <<'RUN'
#!/usr/bin/env bash
# build/device/run NAME ARGS...: a staged executable through the staged loader and libraries.
here=$(cd "$(dirname "$0")" && pwd)
name=$1; shift
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_mca_base_component_path="$here/ompi"
export OMPI_MCA_mca_base_component_show_load_errors=0
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/bin/$name" "$@"
RUN
chmod +x "$out/run"
du -sh "$out"
