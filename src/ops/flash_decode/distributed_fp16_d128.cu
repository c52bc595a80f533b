// Instantiation: the fused multi-rank decode kernel for fp16, head_dim 128 (see fused_instance.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fused_instance.cuh"

namespace taxfree::flash_decode::detail {
TF_FLASH_DECODE_FUSED_INSTANTIATE(__half, 128)
}  // namespace taxfree::flash_decode::detail
