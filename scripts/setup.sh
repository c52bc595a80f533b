#!/usr/bin/env bash
# Installs what the build needs (Debian/Ubuntu packages; the CUDA toolkit with NCCL and cuBLAS is
# expected under /usr/local/cuda) and builds everything into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
dpkg -s libcli11-dev >/dev/null 2>&1 || need+=(libcli11-dev)
dpkg -s nlohmann-json3-dev >/dev/null 2>&1 || need+=(nlohmann-json3-dev)
dpkg -s libgtest-dev >/dev/null 2>&1 || need+=(libgtest-dev)
dpkg -s libgmock-dev >/dev/null 2>&1 || need+=(libgmock-dev)
command -v ninja >/dev/null || need+=(ninja-build)
command -v cmake >/dev/null || need+=(cmake)
command -v ccache >/dev/null || need+=(ccache)  # CI's sanitized build reuses the kernel units
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "setup: nvcc not found (install the CUDA 13 toolkit)" >&2; exit 1; }

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
