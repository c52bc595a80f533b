// The all_gather_matmul benchmark descriptor: variants, and the floor it reports (the largest of
// compute, NVLink and the GEMM's own HBM traffic).
#include <gtest/gtest.h>

#include <string>

#include "taxfree/bench/op_bench.h"

namespace taxfree::bench {
namespace {

Case agmm_case(int64_t m, int64_t n, int64_t k, int gather_dim) {
  Case c;
  c.params = {{"M", m}, {"N", n}, {"K", k}, {"gather_dim", gather_dim}, {"layout", "nk"}};
  return c;
}

TEST(AgmmBench, RegisteredWithBspFirst) {
  const auto b = make_bench("all_gather_matmul");
  EXPECT_EQ(b->name(), "all_gather_matmul");
  ASSERT_FALSE(b->variants().empty());
  EXPECT_EQ(b->variants().front(), "bsp");
  EXPECT_EQ(b->min_ranks(), 1);
}

// Without a measured GEMM rate (no GPU here) the floor is NVLink or HBM; 2 ranks (the default
// before a run sets its own).
TEST(AgmmBench, FloorIsTheLargestOfNvlinkAndTheGemmsHbmTraffic) {
  const auto b = make_bench("all_gather_matmul");
  MachineRates r;
  r.hbm_bytes_per_s = 4e12;
  r.nvlink_bytes_per_s = 4e11;
  // M = 1 (decode): this rank's half of the replicated B is the floor, not the FLOPs or the 8 KB
  // of A.
  Floor f = b->floor(agmm_case(1, 3584, 8192, 1), r);
  EXPECT_EQ(f.bound, "hbm");
  EXPECT_DOUBLE_EQ(f.seconds, (8192.0 * 3584 / 2 + 3584 + 8192.0 / 2) * 2 / 4e12);
  EXPECT_GT(f.seconds, 7e-6);
  // M = 8192 (prefill): the peer's half of A over NVLink.
  f = b->floor(agmm_case(8192, 4096, 8192, 0), r);
  EXPECT_EQ(f.bound, "nvlink");
  EXPECT_DOUBLE_EQ(f.seconds, 8192.0 * 8192 * 2 / 2 / 4e11);
  // No rates measured: no floor claimed.
  EXPECT_EQ(b->floor(agmm_case(1, 3584, 8192, 1), MachineRates{}).seconds, 0);
}

}  // namespace
}  // namespace taxfree::bench
