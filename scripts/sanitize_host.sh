#!/usr/bin/env bash
# Builds the CPU tests and the CLI with the compiler's sanitizers and runs the CPU tests under them:
# any report fails them. Host code only (kernels compile as usual; the kernel units, CMakeLists.txt's
# TAXFREE_KERNEL_UNITS, are not instrumented, so after a plain build ccache serves them); no GPU needed.
#
#   scripts/sanitize_host.sh [SANITIZERS]    (default address,undefined; e.g. thread)
#
# Builds into ./build-sanitize-SANITIZERS: ~11 min on 2 cores without a warm compiler cache, then
# ~1.5-2.5 min of tests. CI runs the default after the plain tests.
set -euo pipefail
cd "$(dirname "$0")/.."
san=${1:-address,undefined}
dir=build-sanitize-${san//,/-}
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAXFREE_SANITIZE="$san"
cmake --build "$dir" --target taxfree_cpu_tests taxfree_cli
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1
export TSAN_OPTIONS=second_deadlock_stack=1
ctest --test-dir "$dir" -L cpu --output-on-failure
