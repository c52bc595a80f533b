// infer_gpc_layout (no GPU): GPC sizes back from the max-active-cluster counts of sizes 1..16,
// on the H200's counts (r236), on random layouts of even GPCs, and unknown where the counts fit none.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "test_seed.h"
#include "taxfree/runtime/gpc_layout.h"

namespace taxfree {
namespace {

// What cudaOccupancyMaxActiveClusters reports at one CTA per SM for GPCs of these sizes.
std::vector<int> counts_of(const std::vector<int>& gpc_sms) {
  std::vector<int> f;
  for (int c = 1; c <= GpcLayout::kMaxCluster; ++c) {
    int n = 0;
    for (int s : gpc_sms) n += s / c;
    f.push_back(n);
  }
  return f;
}

TEST(GpcLayout, H200CountsGiveItsGpcs) {
  const std::vector<int> h200 = {132, 66, 39, 30, 22, 17, 15, 15, 9, 7, 7, 7, 7, 7, 7, 7};  // r236
  const GpcLayout l = infer_gpc_layout(h200);
  ASSERT_TRUE(l.known);
  for (int s = 0; s <= GpcLayout::kMaxSms; ++s) {
    const int want = s == 18 ? 2 : s == 16 ? 5 : s == 8 ? 1 : s == 2 ? 4 : 0;
    EXPECT_EQ(l.gpcs_of_size[size_t(s)], want) << "GPCs of " << s << " SMs";
  }
  EXPECT_EQ(to_string(l), "2x18 5x16 1x8 4x2");
  // r236's placements: 8 clusters of 8 one per GPC, the 8th of 9 on a GPC that already has one.
  EXPECT_EQ(l.holding(8), 8);
  EXPECT_EQ(l.holding(9), 7);
  EXPECT_EQ(l.holding(16), 7);
  EXPECT_EQ(l.holding(2), 12);
  EXPECT_EQ(l.holding(17), 2);
  EXPECT_EQ(l.holding(19), 0);
  EXPECT_EQ(l.holding(0), 0);
}

TEST(GpcLayout, RandomEvenLayoutsRoundTrip) {
  SCOPED_TRACE(test::seed_trace());
  std::mt19937 rng(test::cpu_test_seed());
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int> sms(size_t(1 + rng() % 12));
    for (int& s : sms) s = 2 * int(1 + rng() % (GpcLayout::kMaxSms / 2));
    const GpcLayout l = infer_gpc_layout(counts_of(sms));
    ASSERT_TRUE(l.known) << "trial " << trial;
    for (int s = 1; s <= GpcLayout::kMaxSms; ++s)
      ASSERT_EQ(l.gpcs_of_size[size_t(s)], int(std::count(sms.begin(), sms.end(), s))) << "trial " << trial << " size " << s;
  }
}

TEST(GpcLayout, UnknownWhereTheCountsFitNoLayout) {
  EXPECT_FALSE(infer_gpc_layout(std::vector<int>{132, 66, 39}).known);  // too few sizes
  EXPECT_FALSE(infer_gpc_layout(counts_of({9, 16, 16})).known);        // a GPC of odd size
  EXPECT_FALSE(infer_gpc_layout(counts_of({20, 16})).known);           // larger than sm_90's
  // Half the H200's counts, as a share of half its SMs might scale them: no GPC sizes give these.
  EXPECT_FALSE(infer_gpc_layout(std::vector<int>{66, 33, 19, 15, 11, 8, 7, 7, 4, 3, 3, 3, 3, 3, 3, 3}).known);
  EXPECT_FALSE(infer_gpc_layout(std::vector<int>(16, 0)).known);  // nothing resident
  EXPECT_EQ(to_string(infer_gpc_layout(counts_of({9, 16, 16}))), "unknown");
}

}  // namespace
}  // namespace taxfree
