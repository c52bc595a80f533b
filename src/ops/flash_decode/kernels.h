// Private: per-instantiation launchers of the flash_decode kernels, and the host helpers every
// launch path shares. Each (dtype, head_dim) instantiation lives in its own small .cu
// (decode_<dtype>_d<D>.cu, distributed_<dtype>_d<D>.cu) so they compile in parallel; host.cc and
// distributed.cc validate and dispatch to them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <utility>

#include "taxfree/kernels/attention/params.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/byte_range.h"

namespace taxfree::flash_decode::detail {

// Launch decode_partial_kernel<T, D, paged> with grid `grid`; throws on launch errors.
template <class T, int D>
void launch_decode_t(bool paged, const attention::DecodeParams& p, dim3 grid, cudaStream_t stream);

template <class T, int D>
void launch_combine_t(const attention::CombineParams& p, cudaStream_t stream);

// fused_decode_kernel<T, D, paged, schedule> with `grid` CTAs (fused_schedule.h: <= resident
// slots, or in clusters of p.cluster when it is not 0; the direct schedule when p.direct), the
// persistent (or direct) kernel's resident CTAs per SM on the current device (after its attributes
// are set), and how many clusters of `cluster` CTAs the device holds at once.
template <class T, int D>
void launch_fused_t(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream);
template <class T, int D>
int fused_ctas_per_sm_t(bool paged, bool direct);
template <class T, int D>
int fused_max_clusters_t(bool paged, int cluster);

// plan_decode and launch_decode_partial for arguments validate_decode_args has passed: the ops
// validate a launch's arguments once, then plan and launch without checking them again.
DecodePlan plan_validated(const DecodeArgs& a, const DecodeConfig& cfg);
void launch_validated(const DecodeArgs& a, const DecodePlan& plan, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

// The bytes each input of `a` spans (q, k, v, slice_len, slice_start, block_table; empty where
// null or unused), named: what no output may overlap.
std::array<std::pair<const char*, ByteRange>, 6> decode_input_ranges(const DecodeArgs& a);

// Kernel parameters of a validated DecodeArgs: KV view (strides per layout, slices), shape, scale,
// outputs, the split workspace sections (when num_splits > 1; `workspace` as sized by
// decode_workspace_bytes), and with `ordered` the batch order of a.host_slice_len (longest_first).
attention::DecodeParams make_decode_params(const DecodeArgs& a, int num_splits, void* workspace, bool ordered);

// f.template operator()<T, D>() for the instantiation of (dtype, head_dim); both validated.
template <class F>
decltype(auto) dispatch(DType dtype, int head_dim, F&& f) {
  if (dtype == DType::bf16)
    return head_dim == 64 ? f.template operator()<__nv_bfloat16, 64>() : f.template operator()<__nv_bfloat16, 128>();
  return head_dim == 64 ? f.template operator()<__half, 64>() : f.template operator()<__half, 128>();
}

}  // namespace taxfree::flash_decode::detail
