// Host helpers shared by gemm_launch.cuh (kernel launches in any .cu) and the library's GEMM code.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/gemm.h"

namespace taxfree::gemm::detail {

// 2-D tensor map over a row-major [outer, inner] matrix with 128 B swizzle and zero fill out of
// bounds; `ld` is the row stride in elements. Throws CudaError/NotSupported from the driver.
CUtensorMap make_tensor_map(const void* base, DType dtype, int64_t inner, int64_t outer, int64_t ld,
                            uint32_t box_inner, uint32_t box_outer);

// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) once per kernel and device.
void allow_dynamic_smem(const void* kernel, int bytes);

// Clusters of `cluster` CTAs of `kernel` (threads, dynamic smem) that fit on the current device at
// once: the persistent grid size. Cached per kernel and device.
int resident_clusters(const void* kernel, int threads, int smem_bytes, int cluster);

// The work plan of a launch: tiles of bm * cluster_m x bn, the config's split-K (splits capped at
// the k-blocks, scope resolved against `clusters`, the clusters the persistent grid will have).
WorkPlan make_work_plan(const GemmArgs& args, const GemmConfig& cfg, int64_t clusters);

// Bytes of fp32 partials and number of counters a plan needs (0 without split tiles).
struct WorkspaceNeed {
  size_t partial_bytes = 0;
  size_t counters = 0;
};
WorkspaceNeed workspace_need(const WorkPlan& plan, const GemmConfig& cfg);

// The GEMM workspace of `stream` on the current device, grown to `need` if smaller (stream
// ordered; counters zeroed on allocation, kernels leave them zeroed): our GEMM's split-K partials
// and counters, cuBLASLt's workspace (partials). Launches on one stream run in order, so they may
// share it; two streams never do. Kept until release_stream_workspace (gemm.h).
struct Workspace {
  void* partials = nullptr;
  uint32_t* counters = nullptr;
};
Workspace stream_workspace(cudaStream_t stream, const WorkspaceNeed& need);

// choose_gemm_config keeps its answers (per argument set, up to a few thousand); this forgets them,
// so the next call ranks again (tests compare kept answers with fresh ones).
void forget_chosen_gemm_configs();

}  // namespace taxfree::gemm::detail
