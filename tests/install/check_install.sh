#!/usr/bin/env bash
# taxfree used from another project (tests/install), no GPU needed:
#   tests/install/check_install.sh BUILD_DIR       install BUILD_DIR into a temporary prefix, build
#       the project against it (find_package) and run it; its GEMM choice for a shape must be the
#       installed CLI's.
#   tests/install/check_install.sh --subdirectory  configure the project with this tree added by
#       add_subdirectory: taxfree's tests, examples and tools must not be targets, the project's
#       CUDA source must compile, and its link line must hold libtaxfree.a and NCCL (the library
#       itself is not rebuilt).
set -euo pipefail
arg=${1:?usage: check_install.sh BUILD_DIR | --subdirectory}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
quiet() {  # COMMAND...: its output only if it fails
  "$@" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; echo "FAILED: $*" >&2; exit 1; }
}
fail() { echo "FAILED: $*" >&2; exit 1; }
configure() { quiet cmake -S "$here" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"; }

if [ "$arg" = --subdirectory ]; then
  configure -DTAXFREE_SOURCE_DIR="$(cd "$here/../.." && pwd)"
  targets=$(ninja -C "$tmp/build" -t targets all | cut -d: -f1)
  for t in consumer taxfree/libtaxfree.a; do
    grep -qx "$t" <<<"$targets" || fail "no target $t"
  done
  for t in taxfree_cpu_tests taxfree_gpu_tests tp_step load_probe; do
    ! grep -q "$t" <<<"$targets" || fail "taxfree's $t is a target of the project that added it"
  done
  quiet ninja -C "$tmp/build" CMakeFiles/consumer.dir/consumer.cu.o
  link=$(ninja -C "$tmp/build" -t commands consumer | tail -1)
  for lib in taxfree/libtaxfree.a libnccl; do
    grep -q "$lib" <<<"$link" || fail "the consumer's link line lacks $lib: $link"
  done
  echo "taxfree added with add_subdirectory: no tests built, consumer compiled, links libtaxfree.a and NCCL"
  exit 0
fi

build=$(cd "$arg" && pwd)
quiet cmake --install "$build" --prefix "$tmp/prefix"
configure -DCMAKE_PREFIX_PATH="$tmp/prefix"
quiet cmake --build "$tmp/build"
ours=$("$tmp/build/consumer" 128 4096 8192)
cli=$("$tmp/prefix/bin/taxfree" gemm-choice --shape M=128,N=4096,K=8192)
[ "$cli" = "128 4096 8192 nk $ours" ] || fail "the library chose '$ours', the installed CLI '$cli'"
echo "installed taxfree found, built against and run: $ours"
