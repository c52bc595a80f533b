// The decode benchmark descriptor is registered and reports KV-read bandwidth.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

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

TEST(FlashDecodeBench, DistributedVariantsPartsAndTaxes) {
  const auto b = make_bench("flash_decode");
  EXPECT_EQ(b->name(), "flash_decode");
  EXPECT_EQ(b->variants(), (std::vector<std::string>{"bsp", "bsp-plain", "fused"}));
  EXPECT_EQ(b->baseline_count(), 2);
  EXPECT_EQ(b->min_ranks(), 2);
  EXPECT_EQ(b->parts(), (std::vector<std::string>{"decode-only", "comm-only"}));
  EXPECT_EQ(b->launches("bsp"), 3);
  EXPECT_EQ(b->launches("fused"), 1);

  Case c;
  const double kv_bytes = 2.0 * 12 * 32768 * 128 * 2;  // local slice, batch 1, 96/12 heads
  c.params = {{"batch", 1}, {"kv", 32768}, {"q_heads", 96}, {"kv_heads", 12}, {"head_dim", 128},
              {"heads", "96/12"}, {"kv_bytes", int64_t(kv_bytes)}, {"world", 2}};
  MachineRates r;
  r.hbm_bytes_per_s = 4e12;
  r.launch_s = 3e-6;
  // Floor: the local KV at the HBM rate plus one flag latency (measured; 1.2 us when unknown).
  EXPECT_DOUBLE_EQ(b->floor(c, r).seconds, kv_bytes / 4e12 + 1.2e-6);
  r.flag_latency_s = 2e-6;
  EXPECT_DOUBLE_EQ(b->floor(c, r).seconds, kv_bytes / 4e12 + 2e-6);
  const std::map<std::string, double> t = {
      {"bsp", 40e-6}, {"bsp-plain", 45e-6}, {"fused", 25e-6}, {"decode-only", 22e-6}, {"comm-only", 9e-6}};
  const Taxes x = b->taxes(c, t, r);
  EXPECT_DOUBLE_EQ(x.bulk_synchronous, 40e-6 - 22e-6);  // the faster baseline - max(parts)
  EXPECT_DOUBLE_EQ(x.launch, 2 * 3e-6);                  // 3 kernels vs 1
  EXPECT_DOUBLE_EQ(x.data_locality, 2 * (2.0 * 96 * 129 * 4) / 4e12);
}

}  // namespace
}  // namespace taxfree::bench
