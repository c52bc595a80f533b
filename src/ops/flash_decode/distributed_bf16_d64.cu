// Instantiation: the fused multi-rank decode kernel for bf16, head_dim 64 (see fused_instance.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused_instance.cuh"

namespace taxfree::flash_decode::detail {
TF_FLASH_DECODE_FUSED_INSTANTIATE(__nv_bfloat16, 64)
}  // namespace taxfree::flash_decode::detail
