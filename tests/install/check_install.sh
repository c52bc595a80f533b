#!/usr/bin/env bash
# taxfree used from another project: install BUILD_DIR into a temporary prefix, build
# tests/install (find_package(taxfree)) against it, and run it; its GEMM choice for a shape must be
# the installed CLI's. No GPU needed.
#   tests/install/check_install.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: check_install.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
quiet() {  # COMMAND...: its output only if it fails
  "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; echo "FAILED: $*" >&2; exit 1; }
}
quiet cmake --install "$build" --prefix "$tmp/prefix"
quiet cmake -S "$here" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix"
quiet cmake --build "$tmp/build"
ours=$("$tmp/build/consumer" 128 4096 8192)
cli=$("$tmp/prefix/bin/taxfree" gemm-choice --shape M=128,N=4096,K=8192)
[ "$cli" = "128 4096 8192 nk $ours" ] || { echo "FAILED: the library chose '$ours', the installed CLI '$cli'" >&2; exit 1; }
echo "installed taxfree found, built against and run: $ours"
