// device_gpc_layout on this GPU: the occupancy counts of cluster sizes 1..16 fit a layout of GPCs,
// which gives back every SM (the clustered fused plan's choice of size reads it).
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <sstream>

#include "gpu_env.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/gpc_layout.h"

namespace taxfree {
namespace {

TEST(GpcLayoutGpu, CountsOfThisDeviceFitALayoutOfItsSms) {
  TF_REQUIRE_GPUS(1);
  int dev = 0, sms = 0, major = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TF_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major != 9) GTEST_SKIP() << "the layout's facts are sm_90's; this is sm_" << major << "x";
  const std::vector<int> counts = device_cluster_counts(dev);
  std::ostringstream text;
  for (int n : counts) text << n << " ";
  ASSERT_EQ(counts.size(), size_t(GpcLayout::kMaxCluster)) << text.str();
  EXPECT_EQ(counts[0], sms) << text.str();
  for (size_t c = 1; c < counts.size(); ++c) EXPECT_LE(counts[c], counts[c - 1]) << "size " << c + 1 << ": " << text.str();
  const GpcLayout l = device_gpc_layout(dev);
  ASSERT_TRUE(l.known) << "counts " << text.str();
  int total = 0;
  for (int s = 1; s <= GpcLayout::kMaxSms; ++s) total += s * l.gpcs_of_size[size_t(s)];
  EXPECT_EQ(total, sms);
  EXPECT_EQ(l.holding(1), l.holding(2));  // S even: no GPC of one SM
  EXPECT_EQ(l.holding(16), counts[15]);   // no GPC holds two of 16
  EXPECT_EQ(device_cluster_counts(dev), counts);  // cached, the same
}

}  // namespace
}  // namespace taxfree
