// Private: definitions behind kernels.h, included by one small .cu per (dtype, head_dim).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "taxfree/kernels/attention/decode_kernel.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launch_config.h"

namespace taxfree::flash_decode::detail {

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

// Prepares `kernel` (a decode-family kernel) and launches it with `grid` CTAs, as a dependent launch.
template <auto kKernel, int D, class P>
void launch_prepared(const P& p, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  prepare_kernel<kKernel, kSmem>();
  const LaunchConfig l(grid, attention::kThreads, kSmem, stream, true);
  TF_CUDA(cudaLaunchKernelEx(l.get(), kKernel, p));
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

}  // namespace taxfree::flash_decode::detail
