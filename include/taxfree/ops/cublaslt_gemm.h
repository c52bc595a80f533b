// The cuBLASLt baseline GEMM, with taxfree::gemm's row-major semantics (ops/gemm.h): C[M, N] =
// A[M, K] * B for B as [N, K] or [K, N], bf16/fp16 in, fp32 accumulation, C in the input type, or
// (OutType::fp32) as the unrounded fp32 sums, for partials that are summed later (split-K), or
// (OutType::fp32_accumulate) added in fp32 to the fp32 C already there (C += A * B: a product over
// K in several calls, rounded once at the end by the caller).
//
// One cuBLASLt handle per device and a 32 MiB workspace per stream (shared with our GEMM's split-K
// workspace of that stream, gemm_detail.h; allocated stream-ordered at the stream's first call,
// kept until gemm::release_stream_workspace); the plan (descriptors + heuristic's algorithm) is cached per shape, strides
// and pointer alignment, so steady-state calls only enqueue. Calls on one device are serialised by
// a mutex (host side only); the GEMMs of different streams may run concurrently. Validation
// (ops/gemm.h: validate; for fp32 C: ldc a multiple of 4, C 16-byte aligned and apart from A and B)
// runs first and throws InvalidArgument.
#pragma once

#include <cuda_runtime_api.h>

#include "taxfree/ops/gemm.h"

namespace taxfree::gemm {

enum class OutType { same, fp32, fp32_accumulate };

// Validates, then enqueues. Throws InvalidArgument (validation), NotSupported (no cuBLASLt
// algorithm for the shape) or OutOfMemory (the stream's first call: its workspace) before
// enqueueing anything.
void cublaslt_launch(const GemmArgs& args, cudaStream_t stream, OutType out = OutType::same);

// Everything cublaslt_launch does before it enqueues (validation, the cached plan, `stream`'s
// workspace), for callers that enqueue other work first and must not throw half-way: a later
// cublaslt_launch of the same arguments (pointers included) on `stream` then only enqueues.
void cublaslt_prepare(const GemmArgs& args, cudaStream_t stream, OutType out = OutType::same);

}  // namespace taxfree::gemm
