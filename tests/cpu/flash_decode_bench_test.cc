// The decode benchmark descriptor is registered and reports KV-read bandwidth.
#include <gtest/gtest.h>

#include <algorithm>

#include "taxfree/bench/op_bench.h"

namespace taxfree::bench {
namespace {

TEST(FlashDecodeBench, RegisteredWithOneVariant) {
  const auto names = bench_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "decode"), names.end());
  const auto b = make_bench("decode");
  EXPECT_EQ(b->name(), "decode");
  EXPECT_EQ(b->variants(), std::vector<std::string>{"split-kv"});
  EXPECT_EQ(b->min_ranks(), 1);
  EXPECT_EQ(b->launches("split-kv"), 1);
}

TEST(FlashDecodeBench, FiguresAreKvBytesPerSecond) {
  const auto b = make_bench("decode");
  Case c;
  // batch 1, 96/12 heads, 32K tokens: K+V = 2 * 12 * 32768 * 128 * 2 bytes.
  const double kv_bytes = 2.0 * 12 * 32768 * 128 * 2;
  c.params = {{"batch", 1}, {"kv", 32768}, {"q_heads", 96}, {"kv_heads", 12}, {"head_dim", 128},
              {"kv_bytes", int64_t(kv_bytes)}};
  const Figures f = b->figures(c, 1e-4);
  EXPECT_DOUBLE_EQ(f.algbw_gbs, kv_bytes / 1e-4 / 1e9);
  EXPECT_DOUBLE_EQ(f.tflops, 4.0 * 96 * 32768 * 128 / 1e-4 / 1e12);
}

}  // namespace
}  // namespace taxfree::bench
