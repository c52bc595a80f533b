#!/usr/bin/env bash
# Builds the CPU tests and the CLI with AddressSanitizer and UndefinedBehaviorSanitizer into
# ./build-sanitize (host code only; kernels compile as usual) and runs the CPU tests there: any
# memory error, leak or undefined behaviour fails them. No GPU needed; CI runs it after the tests.
# ~6 min to build on 2 cores, ~2.5 min to run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Release -DTAXFREE_SANITIZE=address,undefined
cmake --build build-sanitize --target taxfree_cpu_tests taxfree_cli
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
ctest --test-dir build-sanitize -L cpu --output-on-failure
