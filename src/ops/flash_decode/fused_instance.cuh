// Private: definitions of the fused kernel's launchers (kernels.h), included by one small .cu per
// (dtype, head_dim): distributed_<dtype>_d<D>.cu.
#pragma once

#include "decode_instance.cuh"
#include "taxfree/kernels/attention/fused_decode_kernel.h"

namespace taxfree::ops::flash_decode::detail {

template <class T, int D>
void launch_fused_t(bool paged, Ring ring, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  dispatch_ring(ring, [&]<int C>() {
    if (paged) launch_prepared<&attention::fused_decode_kernel<T, D, true, C>, D, C>(p, grid, stream);
    else launch_prepared<&attention::fused_decode_kernel<T, D, false, C>, D, C>(p, grid, stream);
  });
}

template <class T, int D>
int fused_ctas_per_sm_t(bool paged, Ring ring) {
  return dispatch_ring(ring, [&]<int C>() {
    constexpr int kSmem = attention::decode_smem_bytes<D, C>();
    return paged ? ctas_per_sm<&attention::fused_decode_kernel<T, D, true, C>, kSmem>()
                 : ctas_per_sm<&attention::fused_decode_kernel<T, D, false, C>, kSmem>();
  });
}

#define TF_FLASH_DECODE_FUSED_INSTANTIATE(T, D)                                                       \
  template void launch_fused_t<T, D>(bool, Ring, const attention::FusedDecodeParams&, int, cudaStream_t); \
  template int fused_ctas_per_sm_t<T, D>(bool, Ring);

}  // namespace taxfree::ops::flash_decode::detail
