// Private: definitions of the fused kernel's launchers (kernels.h), included by one small .cu per
// (dtype, head_dim): distributed_<dtype>_d<D>.cu.
#pragma once

#include "decode_instance.cuh"
#include "taxfree/kernels/attention/fused_decode_kernel.h"

namespace taxfree::ops::flash_decode::detail {

template <class T, int D>
void launch_fused_t(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  if (paged) launch_prepared<&attention::fused_decode_kernel<T, D, true>, D>(p, grid, stream);
  else launch_prepared<&attention::fused_decode_kernel<T, D, false>, D>(p, grid, stream);
}

template <class T, int D>
int fused_ctas_per_sm_t(bool paged) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  return paged ? ctas_per_sm<&attention::fused_decode_kernel<T, D, true>, kSmem>()
               : ctas_per_sm<&attention::fused_decode_kernel<T, D, false>, kSmem>();
}

#define TF_FLASH_DECODE_FUSED_INSTANTIATE(T, D)                                                 \
  template void launch_fused_t<T, D>(bool, const attention::FusedDecodeParams&, int, cudaStream_t); \
  template int fused_ctas_per_sm_t<T, D>(bool);

}  // namespace taxfree::ops::flash_decode::detail
