// Private: definitions of the fused kernel's launchers (kernels.h), included by one small .cu per
// (dtype, head_dim): distributed_<dtype>_d<D>.cu.
#pragma once

#include "decode_instance.cuh"
#include "taxfree/kernels/attention/fused_decode_kernel.h"

namespace taxfree::ops::flash_decode::detail {

template <class T, int D>
void launch_fused_t(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  if (paged) {
    prepare_kernel<&attention::fused_decode_kernel<T, D, true>, D>();
    attention::fused_decode_kernel<T, D, true><<<grid, attention::kThreads, kSmem, stream>>>(p);
  } else {
    prepare_kernel<&attention::fused_decode_kernel<T, D, false>, D>();
    attention::fused_decode_kernel<T, D, false><<<grid, attention::kThreads, kSmem, stream>>>(p);
  }
  TF_CUDA(cudaGetLastError());
}

template <class T, int D>
int fused_ctas_per_sm_t(bool paged) {
  return paged ? ctas_per_sm<&attention::fused_decode_kernel<T, D, true>, D>()
               : ctas_per_sm<&attention::fused_decode_kernel<T, D, false>, D>();
}

#define TF_FLASH_DECODE_FUSED_INSTANTIATE(T, D)                                                       \
  template void launch_fused_t<T, D>(bool, const attention::FusedDecodeParams&, int, cudaStream_t); \
  template int fused_ctas_per_sm_t<T, D>(bool);

}  // namespace taxfree::ops::flash_decode::detail
