// CUDA driver entry points, fetched through the runtime (cudaGetDriverEntryPointByVersion).
//
// Why: linking libcuda directly makes every binary, CPU tests included, fail to start on machines
// without a driver (CI). The runtime loads the driver lazily, so binaries start anywhere and fail
// with a typed NotSupported error only when a GPU is actually needed.
#pragma once

#include <cuda.h>

namespace taxfree::driver {

// Returns the entry point `name` (e.g. "cuMemCreate") at CUDA ABI version 12000 or newer; throws
// NotSupported if the driver lacks it. Results are cached by the caller (function-local static).
void* entry_point(const char* name, int cuda_version = 12000);

template <class Fn>
Fn get(const char* name, int cuda_version = 12000) {
  return reinterpret_cast<Fn>(entry_point(name, cuda_version));
}

// cuGetErrorName through the entry point; "CUresult <n>" when the driver is absent.
const char* error_name(CUresult r);

}  // namespace taxfree::driver
