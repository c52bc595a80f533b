// Host helpers shared by gemm_launch.cuh (kernel launches in any .cu) and the library's GEMM code.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "taxfree/ops/gemm.h"

namespace taxfree::gemm::detail {

// 2-D tensor map over a row-major [outer, inner] matrix with 128 B swizzle and zero fill out of
// bounds; `ld` is the row stride in elements. Throws CudaError/NotSupported from the driver.
CUtensorMap make_tensor_map(const void* base, DType dtype, int64_t inner, int64_t outer, int64_t ld,
                            uint32_t box_inner, uint32_t box_outer);

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) once per kernel and device.
void allow_dynamic_smem(const void* kernel, int bytes);

}  // namespace taxfree::gemm::detail
