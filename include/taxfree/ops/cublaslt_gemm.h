// The cuBLASLt baseline GEMM, with taxfree::gemm's row-major semantics (ops/gemm.h): C[M, N] =
// A[M, K] * B for B as [N, K] or [K, N], bf16/fp16 in and out, fp32 accumulation.
//
// One cuBLASLt handle and a 32 MiB workspace per device, created on first use and kept for the
// process; the plan (descriptors + heuristic's algorithm) is cached per shape, strides and pointer
// alignment, so steady-state calls only enqueue. Calls on one device are serialised by a mutex
// (host side only); the workspace is shared, so do not run two calls concurrently on different
// streams of one device. Validation (ops/gemm.h: validate) runs first.
#pragma once

#include <cuda_runtime_api.h>

#include "taxfree/ops/gemm.h"

namespace taxfree::gemm {

void cublaslt_launch(const GemmArgs& args, cudaStream_t stream);

}  // namespace taxfree::gemm
