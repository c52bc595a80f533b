// Private: per-instantiation launchers of the decode and combine kernels. Each (dtype, head_dim)
// instantiation lives in its own .cu (decode_<dtype>_d<D>.cu) so they compile in parallel; host.cc
// validates and dispatches to them.
#pragma once

#include <cuda_runtime_api.h>

#include "taxfree/kernels/attention/params.h"

namespace taxfree::ops::flash_decode::detail {

// Launch decode_partial_kernel<T, D, paged> with grid `grid`; throws on launch errors.
template <class T, int D>
void launch_decode_t(bool paged, const attention::DecodeParams& p, dim3 grid, cudaStream_t stream);

// Resident CTAs per SM of that kernel on the current device (after its attributes are set).
template <class T, int D>
int decode_ctas_per_sm_t(bool paged);

template <class T, int D>
void launch_combine_t(const attention::CombineParams& p, cudaStream_t stream);

}  // namespace taxfree::ops::flash_decode::detail
