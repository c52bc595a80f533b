// The library's one DType: names, parsing, and the host conversions tests and benches check with.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "expect_error.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/dtype.h"

namespace taxfree {
namespace {

static_assert(std::is_same_v<gemm::DType, flash_decode::DType>, "one element type for every op");

TEST(DType, NamesParseBack) {
  for (DType t : {DType::bf16, DType::fp16}) {
    EXPECT_TRUE(valid_dtype(t));
    EXPECT_EQ(parse_dtype(dtype_name(t), "test"), t);
  }
  EXPECT_FALSE(valid_dtype(DType(7)));
  EXPECT_STREQ(dtype_name(DType(7)), "unknown");
  test::expect_invalid([] { parse_dtype("half", "gemm benchmarks"); }, "gemm benchmarks: dtype 'half'");
  test::expect_invalid([] { parse_dtype("", "decode benchmarks"); }, "decode benchmarks: dtype ''");
}

float from_word(uint32_t w) {
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}

TEST(DType, ConversionsRoundToNearestEven) {
  // bf16 keeps 8 significand bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 and rounds to the
  // even 1; 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 and rounds up to the even one.
  EXPECT_EQ(float_to_bits(DType::bf16, 1.0f), 0x3F80);
  EXPECT_EQ(float_to_bits(DType::bf16, 1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(float_to_bits(DType::bf16, 1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(float_to_bits(DType::bf16, 1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above halfway
  EXPECT_EQ(float_to_bits(DType::bf16, -2.0f), 0xC000);
  // fp16 keeps 11: 1 + 2^-11 rounds to 1, 1 + 3 * 2^-11 up to 1 + 2^-9; 65520 overflows to inf.
  EXPECT_EQ(float_to_bits(DType::fp16, 1.0f), 0x3C00);
  EXPECT_EQ(float_to_bits(DType::fp16, 1.0f + 0x1p-11f), 0x3C00);
  EXPECT_EQ(float_to_bits(DType::fp16, 1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(float_to_bits(DType::fp16, 65520.0f), 0x7C00);
  EXPECT_EQ(float_to_bits(DType::fp16, 0x1p-24f), 0x0001);  // the smallest subnormal
  for (DType t : {DType::bf16, DType::fp16}) {
    EXPECT_TRUE(std::isnan(bits_to_float(t, float_to_bits(t, std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_TRUE(std::isnan(bits_to_float(t, 0xFFFF))) << "the tests' poison value";
  }
  EXPECT_EQ(bits_to_float(DType::bf16, 0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_to_float(DType::fp16, 0x0001), 0x1p-24f);
}

TEST(DType, EveryValueRoundTrips) {
  // Every finite 16-bit value converts to float exactly and back to the same bits.
  for (DType t : {DType::bf16, DType::fp16}) {
    int finite = 0;
    for (uint32_t b = 0; b <= 0xFFFF; ++b) {
      const float f = bits_to_float(t, uint16_t(b));
      if (!std::isfinite(f)) continue;
      ++finite;
      ASSERT_EQ(float_to_bits(t, f), b) << dtype_name(t) << " bits 0x" << std::hex << b;
    }
    EXPECT_EQ(finite, 65536 - 2 * (t == DType::bf16 ? 128 : 1024)) << dtype_name(t);  // all-ones exponents are not
  }
  // bf16 is the top half of a float word: its conversion is exact truncation of those words.
  EXPECT_EQ(bits_to_float(DType::bf16, 0x4049), from_word(0x40490000u));
}

}  // namespace
}  // namespace taxfree
