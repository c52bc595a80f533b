// Private: definitions behind kernels.h, included by one small .cu per (dtype, head_dim).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "taxfree/kernels/attention/decode_kernel.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode::detail {

namespace {
// 96 KB of dynamic shared memory need an opt-in, and two CTAs per SM the largest carveout. Done once per process and kernel: one process drives one GPU (DESIGN.md), and
// attributes are per function, not per launch. Shared by every kernel of the decode family.
template <auto kKernel, int kSmem>
void prepare_kernel() {
  static const bool done = [] {
    const void* fn = reinterpret_cast<const void*>(kKernel);
    TF_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    TF_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
    return true;
  }();
  (void)done;
}

// Resident CTAs per SM of a prepared kernel of the decode family.
template <auto kKernel, int kSmem>
int ctas_per_sm() {
  prepare_kernel<kKernel, kSmem>();
  int n = 0;
  TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, attention::kThreads, kSmem));
  return n;
}

// A programmatic dependent launch of `grid` CTAs of kThreads threads (the kernel calls
// dev::wait_prior_grid before it touches memory), with `extra` attributes (a cluster shape) first.
struct DependentLaunch {
  cudaLaunchAttribute attr[2]{};
  cudaLaunchConfig_t cfg{};
  DependentLaunch(dim3 grid, int smem, cudaStream_t stream, const cudaLaunchAttribute* extra = nullptr) {
    int n = 0;
    if (extra != nullptr) attr[n++] = *extra;
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = grid;
    cfg.blockDim = dim3(attention::kThreads);
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = unsigned(n);
  }
  DependentLaunch(const DependentLaunch&) = delete;  // cfg points into attr
  DependentLaunch& operator=(const DependentLaunch&) = delete;
};

// Prepares `kernel` (a decode-family kernel) and launches it with `grid` CTAs, dependent launch.
template <auto kKernel, int D, class P, class G>
void launch_prepared(const P& p, G grid, cudaStream_t stream) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  prepare_kernel<kKernel, kSmem>();
  const DependentLaunch l(dim3(grid), kSmem, stream);
  TF_CUDA(cudaLaunchKernelEx(&l.cfg, kKernel, p));
}
}  // namespace

template <class T, int D>
void launch_decode_t(bool paged, const attention::DecodeParams& p, dim3 grid, cudaStream_t stream) {
  if (paged) launch_prepared<&attention::decode_partial_kernel<T, D, true>, D>(p, grid, stream);
  else launch_prepared<&attention::decode_partial_kernel<T, D, false>, D>(p, grid, stream);
}

template <class T, int D>
void launch_combine_t(const attention::CombineParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.rows + attention::kCombineRows - 1) / attention::kCombineRows;
  attention::combine_kernel<T, D><<<dim3(unsigned(blocks)), attention::kThreads, 0, stream>>>(p);
  TF_CUDA(cudaGetLastError());
}

#define TF_FLASH_DECODE_INSTANTIATE(T, D)                                                     \
  template void launch_decode_t<T, D>(bool, const attention::DecodeParams&, dim3, cudaStream_t); \
  template void launch_combine_t<T, D>(const attention::CombineParams&, cudaStream_t);

}  // namespace taxfree::ops::flash_decode::detail
