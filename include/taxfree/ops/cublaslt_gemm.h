// The cuBLASLt baseline GEMM, with taxfree::gemm's row-major semantics (ops/gemm.h): C[M, N] =
// A[M, K] * B for B as [N, K] or [K, N], bf16/fp16 in, fp32 accumulation, C in the input type, or
// (OutType::fp32) as the unrounded fp32 sums, for partials that are summed later (split-K), or
// (OutType::fp32_accumulate) added in fp32 to the fp32 C already there (C += A * B: a product over
// K in several calls, rounded once at the end by the caller).
//
// One cuBLASLt handle per device and a workspace per stream, of which cuBLASLt may use 32 MiB (the
// stream's buffer of our GEMM's split-K partials, gemm_detail.h: grown to 1.5x a request, 48 MiB
// at the first cuBLASLt call; allocated stream-ordered, kept until gemm::release_stream_workspace); the plan (descriptors + heuristic's algorithm) is cached per shape, strides
// and pointer alignment, so steady-state calls only enqueue. Calls on one device are serialised by
// a mutex (host side only); the GEMMs of different streams may run concurrently. Validation
// (ops/gemm.h: validate; for fp32 C: ldc a multiple of 4, C 16-byte aligned and apart from A and B)
// runs first and throws InvalidArgument.
#pragma once

#include <cuda_runtime_api.h>

#include "taxfree/ops/gemm.h"

namespace taxfree::gemm {

enum class OutType { same, fp32, fp32_accumulate };

// The thread-block clusters the GEMM may launch. `any`: the heuristic's pick (on H200, clusters of
// 8 CTAs even for small shapes, r279). `small`: at most 2 CTAs per cluster (the first such algorithm
// among the heuristic's candidates, else its first candidate forced to 1x1x1), for a GEMM that
// shares the GPU with grids that wait: a cluster is placed only when that many SMs of one GPC are
// free at once, which waiting grids spread over every GPC may never leave, and while a cluster grid
// waits to be placed, no grid launched after it is scheduled either (r279: with 90 of 132 SMs held,
// an 8-CTA-cluster GEMM and a one-warp kernel behind it both stalled; with 60 both ran).
enum class Clusters { any, small };

// Validates, then enqueues. Throws InvalidArgument (validation), NotSupported (no cuBLASLt
// algorithm for the shape, or none with small clusters) or OutOfMemory (the stream's first call:
// its workspace) before enqueueing anything.
void cublaslt_launch(const GemmArgs& args, cudaStream_t stream, OutType out = OutType::same,
                     Clusters clusters = Clusters::any);

// Everything cublaslt_launch does before it enqueues (validation, the cached plan, `stream`'s
// workspace), for callers that enqueue other work first and must not throw half-way: a later
// cublaslt_launch of the same arguments (pointers included) on `stream` then only enqueues.
void cublaslt_prepare(const GemmArgs& args, cudaStream_t stream, OutType out = OutType::same,
                      Clusters clusters = Clusters::any);

// Whether a cuBLASLt cluster shape (cublasLtClusterShape_t) has at most 2 CTAs. Pure.
bool cublaslt_small_cluster(int cluster_shape_id);

}  // namespace taxfree::gemm
