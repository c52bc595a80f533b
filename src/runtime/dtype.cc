// DType names, parsing and host conversions (runtime/dtype.h).
#include "taxfree/runtime/dtype.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "taxfree/runtime/error.h"

namespace taxfree {

const char* dtype_name(DType t) { return t == DType::bf16 ? "bf16" : t == DType::fp16 ? "fp16" : "unknown"; }

bool valid_dtype(DType t) { return t == DType::bf16 || t == DType::fp16; }

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "bf16") return DType::bf16;
  if (name == "fp16") return DType::fp16;
  TF_THROW(Status::InvalidArgument, what << ": dtype '" << name << "' must be bf16 or fp16");
}

// Through the headers' raw structs (a memcpy into __nv_bfloat16 / __half draws -Wclass-memaccess).
float bits_to_float(DType t, uint16_t bits) {
  if (t == DType::bf16) return __bfloat162float(__nv_bfloat16(__nv_bfloat16_raw{bits}));
  return __half2float(__half(__half_raw{bits}));
}

uint16_t float_to_bits(DType t, float x) {
  if (t == DType::bf16) return __nv_bfloat16_raw(__float2bfloat16(x)).x;
  return __half_raw(__float2half(x)).x;
}

}  // namespace taxfree
