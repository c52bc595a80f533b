// The decode benchmark descriptor is registered and reports KV-read bandwidth.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../../src/ops/flash_decode/bench_inputs.h"
#include "expect_error.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/runtime/error.h"

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
  EXPECT_EQ(b->variants(), (std::vector<std::string>{"bsp", "bsp-plain", "fused", "fused-global", "fused-direct"}));
  EXPECT_EQ(b->baseline_count(), 2);
  EXPECT_EQ(b->min_ranks(), 1);
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
  r.per_launch_s = 3e-6;  // eager; --graph would pass graph_launch_s here
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

// --shape entries of both decode benches: named shapes of any length, filters of the issue shapes,
// forced split counts carried into the case params and back.
TEST(FlashDecodeBench, ShapeEntriesNameFilterAndForcePlans) {
  namespace bi = flash_decode::bench_inputs;
  EXPECT_EQ(bi::shapes_of({}).size(), bi::issue_shapes().size());

  auto s = bi::shapes_of({"batch=1,kv=12345,splits=7"});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].q_heads, 96);
  EXPECT_EQ(s[0].kv_heads, 12);
  EXPECT_EQ(s[0].head_dim, 128);
  EXPECT_EQ(s[0].kv, 12345);
  EXPECT_EQ(s[0].splits, 7);
  const bi::Shape back = bi::Shape::from(s[0].to_case("bf16", "").params);
  EXPECT_EQ(back.splits, 7);
  EXPECT_NE(s[0].to_case("bf16", "").label.find("splits=7"), std::string::npos);

  s = bi::shapes_of({"batch=3,kv=1,heads=64/8,head_dim=64"});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].q_heads, 64);
  EXPECT_EQ(s[0].head_dim, 64);
  EXPECT_EQ(s[0].splits, 0);

  s = bi::shapes_of({"kv=8192,splits=11"});  // every issue shape with 8K tokens: batch 1, 4, 16
  ASSERT_EQ(s.size(), 3u);
  for (const auto& x : s) {
    EXPECT_EQ(x.kv, 8192);
    EXPECT_EQ(x.splits, 11);
  }

  s = bi::shapes_of({"batch=2,kv=100,q_heads=32,kv_heads=32"});  // any head counts (MHA here)
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].q_heads, 32);
  EXPECT_EQ(s[0].kv_heads, 32);
  EXPECT_NE(s[0].to_case("bf16", "").label.find("heads=32/32"), std::string::npos);
  EXPECT_EQ(bi::shapes_of({"q_heads=64,kv=4096"}).size(), 3u);  // issue shapes with 64 query heads
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,heads=64/8,kv_heads=4"}), Error);  // two head counts
  // A filter selecting none of the default sweep is refused here, by the entry, even beside one
  // that selects shapes; the GQA rule holds for the head counts of a filter too.
  test::expect_invalid([] { bi::shapes_of({"kv=4096", "kv=4095"}); },
                       "--shape entry 'kv=4095' selects no shape of the default sweep");
  test::expect_invalid([] { bi::shapes_of({"q_heads=64,kv_heads=2"}); },
                       "q_heads=64 must be a multiple of kv_heads=2, at most 16 per KV head");
  test::expect_invalid([] { bi::shapes_of({"q_heads=60,kv_heads=8"}); }, "q_heads=60 must be a multiple");
  EXPECT_EQ(bi::shapes_of({"q_heads=64,kv_heads=8"}).size(), 9u);  // the 64/8 rows, every batch and kv

  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,splits=65"}), Error);
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,ring=deep"}), Error);  // the deep ring is gone
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,heads=7/3"}), Error);
  EXPECT_THROW(bi::shapes_of({"batch=0,kv=8192"}), Error);
  EXPECT_THROW(make_bench("decode")->check_options([] {
    Options o;
    o.shapes = {"batch=1,kv=8192,split=3"};
    return o;
  }()), Error);
}

// Shape numbers within flash_decode.h's limits (batch, kv_heads <= 65535, 2^30 tokens), named
// with their key: std::stoi once said only "stoi" (or, past int, nothing useful), and a cache past
// 2^64 bytes wrapped the allocation's size.
TEST(FlashDecodeBench, ShapeNumbersAreBoundedAndNamed) {
  namespace bi = flash_decode::bench_inputs;
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"batch=99999999999,kv=8192", "batch=99999999999 is not an integer in [1, 65535]"},
      {"batch=65536,kv=8192", "batch=65536 is not an integer in [1, 65535]"},
      {"batch=1,kv=2147483648", "kv=2147483648 is not an integer in [1, 1073741824]"},
      {"batch=1,kv=1073741825", "kv=1073741825 is not an integer"},
      {"batch=1,kv=8192,q_heads=16,kv_heads=65536", "kv_heads=65536 is not an integer in [1, 65535]"},
      {"batch=1,kv=8192,splits=65", "splits=65 is not an integer in [1, 64]"},
      {"batch=1,kv=+8192", "kv=+8192 is not an integer"},
      {"batch=1,kv=8192,batch=2", "key 'batch' given twice"},
      {"batch=65535,kv=1073741824,q_heads=65535,kv_heads=65535", "past the 2^50-byte limit"},
      // the op's GQA rule: whole groups of at most kMaxGqaRatio query heads
      {"batch=1,kv=1,q_heads=17,kv_heads=1", "q_heads=17 must be a multiple of kv_heads=1, at most 16 per KV head"},
      {"batch=1,kv=1,q_heads=5,kv_heads=3", "q_heads=5 must be a multiple of kv_heads=3"},
      {"batch=1,kv=1,q_heads=3,kv_heads=5", "q_heads=3 must be a multiple of kv_heads=5"},
      {"batch=1,kv=1,q_heads=8", "q_heads=8 must be a multiple of kv_heads=12"},
  };
  for (const auto& b : bad) test::expect_invalid([&] { bi::shapes_of({b.first}); }, b.second);
  for (const char* op : {"decode", "flash_decode"}) {
    Options o;
    o.shapes = {"batch=1,kv=2147483648"};
    test::expect_invalid([&] { make_bench(op)->check_options(o); }, "kv=2147483648");
  }
  const auto s = bi::shapes_of({"batch=65535,kv=16,q_heads=1,kv_heads=1", "batch=1,kv=1073741824"});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].batch, 65535);
  EXPECT_EQ(s[1].kv, 1 << 30);
}

// Paged caches and ragged batches: carried into the case params and back; both benches take both.
TEST(FlashDecodeBench, ShapeEntriesForPagedCachesAndRaggedBatches) {
  namespace bi = flash_decode::bench_inputs;
  auto s = bi::shapes_of({"batch=4,kv=8192,page=16,layout=nhd"});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].page, 16);
  EXPECT_TRUE(s[0].nhd);
  const Case c = s[0].to_case("bf16", "");
  EXPECT_NE(c.label.find("page=16 nhd"), std::string::npos) << c.label;
  const bi::Shape back = bi::Shape::from(c.params);
  EXPECT_EQ(back.page, 16);
  EXPECT_TRUE(back.nhd);
  EXPECT_EQ(back.kv_bytes(), s[0].kv_bytes());

  s = bi::shapes_of({"kv=8192,page=256"});  // issue shapes with 8K tokens, HND pages of 256
  ASSERT_EQ(s.size(), 3u);
  for (const auto& x : s) EXPECT_TRUE(x.page == 256 && !x.nhd);
  EXPECT_EQ(bi::Shape::from(bi::shapes_of({"batch=1,kv=64"})[0].to_case("bf16", "").params).page, 0);

  // Ragged batches: lengths in [1, kv], fixed per shape, KV bytes of the live tokens.
  s = bi::shapes_of({"batch=16,kv=65536,ragged=1"});
  ASSERT_EQ(s.size(), 1u);
  const std::vector<int32_t> lens = s[0].lens();
  ASSERT_EQ(lens.size(), 16u);
  int64_t tokens = 0;
  for (int32_t n : lens) {
    EXPECT_GE(n, 1);
    EXPECT_LE(n, 65536);
    tokens += n;
  }
  EXPECT_GT(*std::max_element(lens.begin(), lens.end()), *std::min_element(lens.begin(), lens.end()) + 1000);
  EXPECT_EQ(s[0].kv_bytes(), 2 * tokens * 12 * 128 * 2);
  const bi::Shape rb = bi::Shape::from(s[0].to_case("bf16", "").params);
  EXPECT_TRUE(rb.ragged);
  EXPECT_EQ(rb.lens(), lens);  // the same draw from the case params
  EXPECT_EQ(bi::shapes_of({"batch=16,kv=65536"})[0].lens(), std::vector<int32_t>(16, 65536));
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,ragged=2"}), Error);

  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,page=8"}), Error);     // below the 16-token tile
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,page=48"}), Error);    // not a power of two
  EXPECT_THROW(bi::shapes_of({"batch=1,kv=8192,layout=nhd"}), Error);  // layout without pages
  const auto options = [](const char* entry) {
    Options o;
    o.shapes = {entry};
    return o;
  };
  EXPECT_NO_THROW(make_bench("flash_decode")->check_options(options("batch=1,kv=8192,page=16,layout=nhd")));
  EXPECT_NO_THROW(make_bench("flash_decode")->check_options(options("batch=4,kv=8192,ragged=1")));
  EXPECT_NO_THROW(make_bench("decode")->check_options(options("batch=1,kv=8192,page=16")));

  // Figures count the live tokens: 4 x q_heads x head_dim FLOPs and 4 x kv_heads x head_dim bytes
  // per token, whichever bench.
  const Case rc = s[0].to_case("bf16", "");
  for (const char* op : {"decode", "flash_decode"}) {
    const Figures f = make_bench(op)->figures(rc, 1e-3);
    EXPECT_DOUBLE_EQ(f.algbw_gbs, double(tokens) * 4 * 12 * 128 / 1e-3 / 1e9) << op;
    EXPECT_DOUBLE_EQ(f.tflops, double(tokens) * 4 * 96 * 128 / 1e-3 / 1e12) << op;
  }
}

// The length-aware split plan on r204's ragged batches (lengths of `bench decode ... ragged=1`):
// at least the counts that measured 0.93-0.99 of the floor there, where the max_len plan read
// 0.77-0.90 (b=4: longest 1.29x the mean, 0.89 with 2 splits, 0.94 with 11); uniform and barely
// ragged batches keep the max_len plan.
TEST(FlashDecodeBench, RaggedBatchesOfR204GetEnoughSplits) {
  namespace bi = flash_decode::bench_inputs;
  using flash_decode::choose_splits;
  struct Case {
    const char* entry;
    int at_least;  // the fewest splits r204 measured within 0.05 of its best
  };
  for (const Case c : {Case{"batch=16,kv=65536,heads=96/12,ragged=1", 4}, Case{"batch=32,kv=32768,heads=64/8,ragged=1", 4},
                       Case{"batch=8,kv=65536,heads=64/8,ragged=1", 4}, Case{"batch=4,kv=32768,heads=96/12,ragged=1", 5}}) {
    const bi::Shape s = bi::shapes_of({c.entry})[0];
    const std::vector<int32_t> lens = s.lens();
    const int planned = choose_splits(s.kv_heads, lens, 132);
    EXPECT_GE(planned, c.at_least) << c.entry;
    EXPECT_LE(int64_t(s.batch) * s.kv_heads * planned, int64_t(flash_decode::kMaxSplitWaves) * 2 * 132) << c.entry;
    EXPECT_GE(*std::max_element(lens.begin(), lens.end()) / planned, 1024) << c.entry;
  }
  // Uniform or mildly ragged: the max_len plan.
  EXPECT_EQ(choose_splits(8, std::vector<int32_t>(8, 65536), 132), choose_splits(8, 8, 65536, 132));
  EXPECT_EQ(choose_splits(12, std::vector<int32_t>{30000, 32768, 29000, 31000}, 132), choose_splits(4, 12, 32768, 132));
  EXPECT_THROW(choose_splits(8, std::vector<int32_t>{}, 132), Error);
}

}  // namespace
}  // namespace taxfree::bench
