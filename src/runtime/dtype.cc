// DType names, parsing and host conversions (runtime/dtype.h).
#include "taxfree/runtime/dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "taxfree/runtime/error.h"

namespace taxfree {

const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : t == DType::fp16 ? "fp16" : "unknown"; }

bool valid_dtype(DType t) { return t == DType::bf16 || t == DType::fp16; }

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::fp16;
  TF_THROW(Status::InvalidArgument, what << ": dtype '" << name << "' must be bf16 or fp16");
}

float bits_to_float(DType t, uint16_t bits) {
  if (t == DType::bf16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &bits, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &bits, 2);
  return __half2float(h);
}

uint16_t float_to_bits(DType t, float x) {
  uint16_t bits;
  if (t == DType::bf16) {
    const __nv_bfloat16 h = __float2bfloat16(x);
    std::memcpy(&bits, &h, 2);
  } else {
    const __half h = __float2half(x);
    std::memcpy(&bits, &h, 2);
  }
  return bits;
}

}  // namespace taxfree
