// The 16-bit element types every op reads and writes (each accumulates in fp32), their names, and
// host conversions for callers that fill inputs or check outputs. One type for the whole library:
// taxfree::gemm::DType and taxfree::flash_decode::DType name this one.
#pragma once

#include <cstdint>
#include <string_view>

namespace taxfree {

enum class DType { bf16, fp16 };

// "bf16" / "fp16"; "unknown" for a value outside the enum (a cast integer).
const char* dtype_name(DType t);
bool valid_dtype(DType t);
// "bf16" -> bf16, "fp16" -> fp16; any other name: InvalidArgument naming `what` and the name.
DType parse_dtype(std::string_view name, std::string_view what);

// Host conversions, bit-exact with the device's: to float exactly; from float rounding to the
// nearest even (NaN stays NaN; out of range becomes infinity).
float bits_to_float(DType t, uint16_t bits);
uint16_t float_to_bits(DType t, float x);

}  // namespace taxfree
