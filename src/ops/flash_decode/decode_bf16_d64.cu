// Instantiation: decode + combine kernels for bf16, head_dim 64 (see decode_instance.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode_instance.cuh"

namespace taxfree::flash_decode::detail {
TF_FLASH_DECODE_INSTANTIATE(__nv_bfloat16, 64)
}  // namespace taxfree::flash_decode::detail
