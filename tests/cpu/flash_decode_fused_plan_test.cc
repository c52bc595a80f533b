// plan_fused (no GPU): which fused schedule a launch gets for a given device share: the direct split
// merge where configured and it fits, the clustered one where every group's cluster is resident at
// once (shrinking the split count down to half for short slices), else the persistent grid; and the
// NotSupported errors where the share holds no CTA.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.h"
#include "taxfree/kernels/attention/fused_schedule.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

using taxfree::test::expect_error;
using SplitMerge = FlashDecodeConfig::SplitMerge;

// 96 query heads over 12 KV heads, head_dim 128, batch 1 (the paper's shape), `tokens` per slice.
DecodeArgs args(int tokens) {
  DecodeArgs a;
  a.batch = 1, a.q_heads = 96, a.kv_heads = 12, a.head_dim = 128;
  a.q = a.k = a.v = reinterpret_cast<const void*>(uintptr_t(0x10000000));
  a.slice_len = reinterpret_cast<const int32_t*>(uintptr_t(0x20000000));
  a.out = reinterpret_cast<void*>(uintptr_t(0x30000000));
  a.capacity = tokens, a.max_len = tokens;
  return a;
}

// Two ranks, 132 SMs, two fused CTAs per SM; clusters of up to 8 CTAs fit 16 at a time (none
// larger), as `clusters_up_to_8` says.
FusedDevice device(int num_sms = 132, int ctas_per_sm = 2, int direct_ctas_per_sm = 2) {
  FusedDevice d;
  d.world = 2, d.num_sms = num_sms, d.ctas_per_sm = ctas_per_sm, d.direct_ctas_per_sm = direct_ctas_per_sm;
  d.max_clusters = [](int c) { return c <= 8 ? 16 : 0; };
  return d;
}

FusedPlan plan(const DecodeArgs& a, SplitMerge merge, const FusedDevice& d, int num_splits = 0) {
  FlashDecodeConfig c;
  c.max_batch = a.batch, c.max_q_heads = a.q_heads, c.max_kv_heads = a.kv_heads, c.max_head_dim = a.head_dim;
  c.split_merge = merge, c.num_splits = num_splits;
  validate_flash_decode_args(a, c);
  DecodeConfig dc;
  dc.num_splits = num_splits, dc.num_sms = d.num_sms;
  return plan_fused(a, plan_decode(a, dc), c, flash_decode_buffers(c, d.world, d.num_sms), d);
}

TEST(FlashDecodeFusedPlan, ClusteredWhereEveryGroupsClusterFits) {
  // 11 splits per group (plan_decode on 132 SMs); clusters of 11 do not fit, so a short slice
  // shrinks to 8 (down to half is allowed), 12 clusters of 8 <= 16.
  const FusedPlan fp = plan(args(8192), SplitMerge::cluster, device());
  EXPECT_EQ(fp.cluster, 8);
  EXPECT_EQ(fp.num_splits, 8);
  EXPECT_EQ(fp.items, 96);
  EXPECT_EQ(fp.grid, 96);
  EXPECT_FALSE(fp.direct);
}

TEST(FlashDecodeFusedPlan, PersistentWhereNoClusterFits) {
  // A long slice keeps its 11 splits, which do not fit as clusters: the persistent grid. Past 16K
  // tokens already (clusters stream slower there, distributed.cc).
  EXPECT_EQ(plan(args(16384), SplitMerge::cluster, device()).cluster, 8);
  EXPECT_EQ(plan(args(16385), SplitMerge::cluster, device()).cluster, 0);
  FusedPlan fp = plan(args(65536), SplitMerge::cluster, device());
  EXPECT_EQ(fp.cluster, 0);
  EXPECT_EQ(fp.num_splits, 11);
  EXPECT_EQ(fp.items, 132);
  EXPECT_EQ(fp.resident, 264);
  EXPECT_EQ(fp.grid, attention::fused_grid(132, 264));
  // A forced split count is clustered only as it is: 16 splits, no cluster of 16 fits.
  fp = plan(args(8192), SplitMerge::cluster, device(), 16);
  EXPECT_EQ(fp.cluster, 0);
  EXPECT_EQ(fp.num_splits, 16);
  // Global merge: never clustered, even where clusters fit.
  fp = plan(args(8192), SplitMerge::global, device());
  EXPECT_EQ(fp.cluster, 0);
  EXPECT_EQ(fp.num_splits, 11);
  // A share of 40 SMs and 16 forced splits: 80 resident CTAs take the 192 items in turns.
  fp = plan(args(65536), SplitMerge::global, device(40), 16);
  EXPECT_EQ(fp.items, 192);
  EXPECT_EQ(fp.resident, 80);
  EXPECT_EQ(fp.grid, 80);
}

TEST(FlashDecodeFusedPlan, ClustersLandOnePerGpcWhereTheLayoutIsKnown) {
  // An H200's counts (r236): two GPCs of 18 SMs, five of 16, one of 8, four units of 2.
  static constexpr int kH200[16] = {132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7};
  FusedDevice d = device();
  d.max_clusters = [](int c) { return c >= 1 && c <= 16 ? kH200[c - 1] : 0; };
  auto args_of = [](int tokens) {
    DecodeArgs a = args(tokens);
    a.q_heads = 64, a.kv_heads = 8;  // 8 groups, 16 splits by plan_decode
    return a;
  };
  DecodeArgs a = args_of(4096);
  // Without the layout the largest size that fits: 9 clusters of 9 fit, 10 of 10 do not.
  EXPECT_EQ(plan(a, SplitMerge::cluster, d).cluster, 9);
  // With it, up to 7K tokens: 8 of 9 would put two on an 18-SM GPC; 8 of 8 land one on each GPC.
  d.gpcs = infer_gpc_layout(std::vector<int>(kH200, kH200 + 16));
  ASSERT_TRUE(d.gpcs.known);
  FusedPlan fp = plan(a, SplitMerge::cluster, d);
  EXPECT_EQ(fp.cluster, 8);
  EXPECT_EQ(fp.num_splits, 8);
  EXPECT_EQ(fp.grid, 64);
  EXPECT_EQ(plan(args_of(7168), SplitMerge::cluster, d).cluster, 8);
  // Past 7K tokens the largest that fits again (9 streams 1/9 faster per token, r237).
  EXPECT_EQ(plan(args_of(7169), SplitMerge::cluster, d).cluster, 9);
  // 12 groups land one per GPC at no size down to half the splits: the largest that fits, as before.
  EXPECT_EQ(plan(args(8192), SplitMerge::cluster, d).cluster, 8);
  // 7 groups: clusters of 16 fit and land one per GPC.
  a.q_heads = 56, a.kv_heads = 7;
  EXPECT_EQ(plan(a, SplitMerge::cluster, d).cluster, 16);
}

TEST(FlashDecodeFusedPlan, DirectWhereConfiguredAndResident) {
  FusedPlan fp = plan(args(8192), SplitMerge::direct, device());
  EXPECT_TRUE(fp.direct);
  EXPECT_EQ(fp.num_splits, 11);  // min(plan's 11, 16, 264 resident / 12 groups)
  EXPECT_EQ(fp.grid, 132);
  EXPECT_EQ(fp.items, 132);
  // 30 SMs, one direct CTA each: 30 / 12 groups = 2 splits per group.
  fp = plan(args(8192), SplitMerge::direct, device(30, 2, 1));
  EXPECT_TRUE(fp.direct);
  EXPECT_EQ(fp.num_splits, 2);
  EXPECT_EQ(fp.grid, 24);
  // Fewer SMs than groups: the direct merge does not apply; the clustered plan is next.
  fp = plan(args(8192), SplitMerge::direct, device(8));
  EXPECT_FALSE(fp.direct);
}

TEST(FlashDecodeFusedPlan, NotSupportedWhereTheShareHoldsNoCta) {
  expect_error([] { plan(args(8192), SplitMerge::direct, device(132, 2, 0)); }, Status::NotSupported,
               "the direct fused decode needs 12 resident CTAs; this device holds 0");
  expect_error([] { plan(args(8192), SplitMerge::global, device(132, 0, 2)); }, Status::NotSupported,
               "does not fit on an SM of this device");
}

}  // namespace
}  // namespace taxfree::flash_decode
