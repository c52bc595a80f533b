// Private: definitions behind kernels.h, included by one small .cu per (dtype, head_dim).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "taxfree/kernels/attention/decode_kernel.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode::detail {

namespace {
// 96 KB of dynamic shared memory needs an opt-in, and two CTAs per SM need the largest carveout.
// Done once per process and kernel: one process drives one GPU (DESIGN.md), and attributes are
// per function, not per launch. Shared by every kernel of the decode family (same shared memory).
template <auto kKernel, int D>
void prepare_kernel() {
  static const bool done = [] {
    const void* fn = reinterpret_cast<const void*>(kKernel);
    TF_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 attention::decode_smem_bytes<D>()));
    TF_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 int(cudaSharedmemCarveoutMaxShared)));
    return true;
  }();
  (void)done;
}

// Resident CTAs per SM of a prepared kernel of the decode family.
template <auto kKernel, int D>
int ctas_per_sm() {
  prepare_kernel<kKernel, D>();
  int n = 0;
  TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, attention::kThreads,
                                                        attention::decode_smem_bytes<D>()));
  return n;
}
}  // namespace

template <class T, int D>
void launch_decode_t(bool paged, const attention::DecodeParams& p, dim3 grid, cudaStream_t stream) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  if (paged) {
    prepare_kernel<&attention::decode_partial_kernel<T, D, true>, D>();
    attention::decode_partial_kernel<T, D, true><<<grid, attention::kThreads, kSmem, stream>>>(p);
  } else {
    prepare_kernel<&attention::decode_partial_kernel<T, D, false>, D>();
    attention::decode_partial_kernel<T, D, false><<<grid, attention::kThreads, kSmem, stream>>>(p);
  }
  TF_CUDA(cudaGetLastError());
}

template <class T, int D>
int decode_ctas_per_sm_t(bool paged) {
  return paged ? ctas_per_sm<&attention::decode_partial_kernel<T, D, true>, D>()
               : ctas_per_sm<&attention::decode_partial_kernel<T, D, false>, D>();
}

template <class T, int D>
void launch_combine_t(const attention::CombineParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.rows + attention::kCombineRows - 1) / attention::kCombineRows;
  attention::combine_kernel<T, D><<<dim3(unsigned(blocks)), attention::kThreads, 0, stream>>>(p);
  TF_CUDA(cudaGetLastError());
}

#define TF_FLASH_DECODE_INSTANTIATE(T, D)                                                     \
  template void launch_decode_t<T, D>(bool, const attention::DecodeParams&, dim3, cudaStream_t); \
  template int decode_ctas_per_sm_t<T, D>(bool);                                              \
  template void launch_combine_t<T, D>(const attention::CombineParams&, cudaStream_t);

}  // namespace taxfree::ops::flash_decode::detail
