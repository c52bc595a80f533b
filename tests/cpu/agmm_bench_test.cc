// The all_gather_matmul benchmark descriptor: variants, and the floor it reports (the largest of
// compute, NVLink and the GEMM's own HBM traffic).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "expect_error.h"
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

Options with_shapes(std::vector<std::string> shapes) {
  Options o;
  o.shapes = std::move(shapes);
  return o;
}

// Before any rank starts: M, N < 2^31 and K < 2^30 (all_gather_matmul.h); a larger size once
// passed here and was bounded only at setup, after allocating from it.
TEST(AgmmBench, CheckOptionsBoundsTheShapeToTheOpsLimits) {
  const auto b = make_bench("all_gather_matmul");
  EXPECT_NO_THROW(b->check_options(with_shapes({"M=2147483647,N=2147483640,K=1073741816,gather_dim=0"})));
  test::expect_invalid([&] { b->check_options(with_shapes({"M=2147483648,N=3584,K=8192,gather_dim=1"})); },
                       "M=2147483648 is not an integer in [1, 2147483647]");
  test::expect_invalid([&] { b->check_options(with_shapes({"M=8,N=99999999999999999999,K=8192,gather_dim=1"})); },
                       "N=99999999999999999999 is not an integer");
  test::expect_invalid([&] { b->check_options(with_shapes({"M=8,N=3584,K=1073741817,gather_dim=0"})); },
                       "K=1073741817 is not an integer in [1, 1073741816]");
  test::expect_invalid([&] { b->check_options(with_shapes({"M=8,M=16"})); }, "key 'M' given twice");
  // Dense operands: N and K multiples of 8, named before any rank starts (they once passed here and
  // failed every variant at launch).
  test::expect_invalid([&] { b->check_options(with_shapes({"M=1000,N=1001,K=1024,gather_dim=0"})); },
                       "N=1001 and K=1024 must be multiples of 8");
  test::expect_invalid([&] { b->check_options(with_shapes({"M=1000,N=1024,K=1001,gather_dim=0"})); },
                       "N=1024 and K=1001 must be multiples of 8");
  EXPECT_NO_THROW(b->check_options(with_shapes({"M=1001,N=1024,K=1000,gather_dim=0"})));  // odd M is fine
}

// TAXFREE_AGMM_* knobs: int-sized, read by check_options too (4294967300 once truncated to 4 at
// setup, on the GPU).
TEST(AgmmBench, CheckOptionsReadsTheTuningVariables) {
  const auto b = make_bench("all_gather_matmul");
  for (const char* name : {"TAXFREE_AGMM_PUSH_CTAS", "TAXFREE_AGMM_COL_CHUNK", "TAXFREE_AGMM_SIDE_CTAS"}) {
    for (const char* bad : {"4294967300", "-1", "12x", "99999999999999999999"}) {
      ::setenv(name, bad, 1);
      test::expect_invalid([&] { b->check_options(Options{}); },
                           std::string(name) + "=" + bad + " is not an integer in [0, 2147483647]");
    }
    ::setenv(name, "128", 1);
    EXPECT_NO_THROW(b->check_options(Options{})) << name;
    ::unsetenv(name);
  }
  // In range but against the op's rules (validate_agmm_config): refused here too, not by the ranks.
  ::setenv("TAXFREE_AGMM_COL_CHUNK", "100", 1);
  test::expect_invalid([&] { b->check_options(Options{}); },
                       "TAXFREE_AGMM_COL_CHUNK=100, TAXFREE_AGMM_SIDE_CTAS=0: [taxfree");
  test::expect_invalid([&] { b->check_options(Options{}); }, "col_chunk=100 must be a non-negative multiple of 64");
  ::unsetenv("TAXFREE_AGMM_COL_CHUNK");
  ::setenv("TAXFREE_AGMM_SIDE_CTAS", "5000", 1);
  test::expect_invalid([&] { b->check_options(Options{}); }, "TAXFREE_AGMM_SIDE_CTAS=5000: [taxfree");
  test::expect_invalid([&] { b->check_options(Options{}); }, "side_gather_ctas=5000 must be in [0, 1024]");
  ::unsetenv("TAXFREE_AGMM_SIDE_CTAS");
  // ksplit's path and exchange knobs: one of two words each, refused before any rank starts.
  for (const auto& [name, good] : {std::pair<const char*, const char*>{"TAXFREE_AGMM_KSPLIT_PATH", "bands"},
                                   {"TAXFREE_AGMM_KSPLIT_EXCHANGE", "owner-sums"}}) {
    ::setenv(name, "band", 1);
    test::expect_invalid([&] { b->check_options(Options{}); }, std::string(name) + "='band'");
    ::setenv(name, good, 1);
    EXPECT_NO_THROW(b->check_options(Options{})) << name;
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace taxfree::bench
