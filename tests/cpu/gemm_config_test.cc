// GEMM host logic without a GPU: the heuristic's choices and launch()'s validation errors.
#include <gtest/gtest.h>

#include <string>

#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {
namespace {

bool is_compiled(const GemmConfig& c, BLayout layout) {
  for (const CompiledTile& t : kCompiledTiles)
    if (t.bm == c.bm && t.bn == c.bn && t.stages == c.stages && t.cluster == c.cluster_m)
      return t.kn || layout == BLayout::NK;
  return false;
}

const int64_t kSweepM[] = {1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384};
const int64_t kSweepN[] = {3584, 4096, 7168, 8192, 14336};

TEST(GemmHeuristic, ReturnsACompiledConfigForEveryShape) {
  for (BLayout layout : {BLayout::NK, BLayout::KN})
    for (int64_t m : {1, 2, 16, 64, 65, 127, 128, 512, 1000, 1024, 2048, 4096, 8192, 16384})
      for (int64_t n : {8, 64, 3584, 3592, 4096, 7168, 8192, 14336})
        for (int64_t k : {8, 64, 4096, 8192, 8200})
          for (int sms : {1, 78, 132}) {
            const GemmConfig c = choose_gemm_config(m, n, k, DType::bf16, layout, sms);
            EXPECT_TRUE(is_compiled(c, layout)) << c.name() << " M=" << m << " N=" << n << " layout=" << layout_name(layout);
            EXPECT_GE(c.group_m, 1);
            EXPECT_LE(c.group_m, std::max<int64_t>(1, (m + c.bm - 1) / c.bm));
            EXPECT_TRUE(c.cluster_m == 1 || m > c.bm) << c.name() << " M=" << m << ": a cluster CTA with only zero rows";
            EXPECT_GE(c.splits, 1);
            EXPECT_LE(c.splits, std::max<int64_t>(1, (k + 63) / 64)) << "a split with no k-block";
            EXPECT_EQ(c.max_ctas, 0);
          }
}

TEST(GemmHeuristic, LargeProblemsUseTheLargestTile) {
  for (BLayout layout : {BLayout::NK, BLayout::KN})
    for (int64_t m : {4096, 8192, 16384})
      for (int64_t n : {4096, 8192, 14336}) {
        const GemmConfig c = choose_gemm_config(m, n, 8192, DType::bf16, layout);
        EXPECT_EQ(c.bm, 128) << m << "x" << n;
        EXPECT_EQ(c.bn, 256) << m << "x" << n;
      }
  const GemmConfig c = choose_gemm_config(8192, 8192, 8192, DType::fp16, BLayout::NK);
  EXPECT_GT(c.group_m, 1) << "a wave of 132 tiles should share A panels";
}

TEST(GemmHeuristic, DecodeSizesStreamBOverManyCtas) {
  for (BLayout layout : {BLayout::NK, BLayout::KN})
    for (int64_t m : {1, 16, 64})
      for (int64_t n : kSweepN) {
        const GemmConfig c = choose_gemm_config(m, n, 8192, DType::bf16, layout);
        EXPECT_EQ(c.bm, 64) << "M=" << m << " N=" << n;
        // Tiles, or K ranges of split tiles, for most SMs.
        const int64_t units = (n + c.bn - 1) / c.bn * c.splits;
        EXPECT_GE(units, 100) << "M=" << m << " N=" << n << ": " << c.name() << " leaves SMs idle";
        EXPECT_GE(int64_t(c.stages) * c.bn * 128, 64 * 1024) << "too few B bytes in flight per SM for " << c.name();
      }
}

// A valid problem at fake, aligned addresses: validation never touches memory or CUDA.
GemmArgs valid_args() {
  GemmArgs a;
  a.a = reinterpret_cast<const void*>(uintptr_t(0x100000000));
  a.b = reinterpret_cast<const void*>(uintptr_t(0x200000000));
  a.c = reinterpret_cast<void*>(uintptr_t(0x300000000));
  a.m = 1000, a.n = 3592, a.k = 8200;
  a.lda = a.k, a.ldb = a.k, a.ldc = a.n;
  return a;
}

void expect_error(const GemmArgs& a, const GemmConfig& cfg, Status status, const std::string& needle) {
  try {
    launch(a, cfg, nullptr);
    ADD_FAILURE() << "launch() accepted " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GemmValidation, AcceptsOddButAlignedShapes) {
  for (const GemmConfig& cfg : compiled_configs()) {
    GemmArgs a = valid_args();
    if (cfg.bn % 64 == 0) {
      a.b_layout = BLayout::KN;
      a.ldb = a.n;
      EXPECT_NO_THROW(validate(a, cfg)) << cfg.name();
    }
    a = valid_args();
    a.m = 1;
    EXPECT_NO_THROW(validate(a, cfg)) << cfg.name();
  }
}

TEST(GemmValidation, NamesTheBrokenConstraint) {
  const GemmConfig cfg;
  GemmArgs a = valid_args();
  a.m = 0;
  expect_error(a, cfg, Status::InvalidArgument, "M=0");
  a = valid_args();
  a.k = -5;
  expect_error(a, cfg, Status::InvalidArgument, "K=-5");
  a = valid_args();
  a.lda = 8201;
  expect_error(a, cfg, Status::InvalidArgument, "lda=8201");
  a = valid_args();
  a.lda = 100;
  expect_error(a, cfg, Status::InvalidArgument, "must be >= K=8200");
  a = valid_args();
  a.ldb = 8204;
  expect_error(a, cfg, Status::InvalidArgument, "ldb=8204");
  a = valid_args();
  a.b_layout = BLayout::KN;  // ldb = K = 8200 < N? no: N = 3592, so make it too small
  a.ldb = 3584;
  expect_error(a, cfg, Status::InvalidArgument, "must be >= N=3592");
  a = valid_args();
  a.ldc = 3596;
  expect_error(a, cfg, Status::InvalidArgument, "ldc=3596");
  a = valid_args();
  a.ldc = 3000;
  expect_error(a, cfg, Status::InvalidArgument, "must be >= N=3592");
  a = valid_args();
  a.a = reinterpret_cast<const void*>(uintptr_t(0x100000008));
  expect_error(a, cfg, Status::InvalidArgument, "16-byte aligned");
  a = valid_args();
  a.c = reinterpret_cast<void*>(uintptr_t(0x300000002));
  expect_error(a, cfg, Status::InvalidArgument, "16-byte aligned");
  a = valid_args();
  a.b = nullptr;
  expect_error(a, cfg, Status::InvalidArgument, "B is null");
  a = valid_args();
  a.c = const_cast<void*>(a.a);
  expect_error(a, cfg, Status::InvalidArgument, "overlaps input A");
  a = valid_args();
  a.m = int64_t(1) << 31;
  expect_error(a, cfg, Status::InvalidArgument, "2^31");
}

TEST(GemmValidation, RejectsConfigsThatAreNotCompiled) {
  GemmConfig cfg;
  cfg.bn = 192;
  expect_error(valid_args(), cfg, Status::NotSupported, "128x192 s4 cluster_m=1 is not compiled");
  cfg = GemmConfig{};
  cfg.bn = 128, cfg.stages = 6, cfg.cluster_m = 2;
  expect_error(valid_args(), cfg, Status::NotSupported, "128x128 s6 cluster_m=2 is not compiled");
  cfg = GemmConfig{};
  cfg.splits = 0;
  expect_error(valid_args(), cfg, Status::InvalidArgument, "splits=0");
  cfg = GemmConfig{};
  cfg.group_m = 0;
  expect_error(valid_args(), cfg, Status::InvalidArgument, "group_m=0");
  cfg = GemmConfig{};
  cfg.bm = 64, cfg.bn = 32, cfg.stages = 18;  // dropped from the list: slower than 64 x 64
  expect_error(valid_args(), cfg, Status::NotSupported, "64x32 s18 cluster_m=1 is not compiled");
}

TEST(GemmValidation, HeuristicLaunchValidatesFirst) {
  GemmArgs a = valid_args();
  a.n = 0;
  try {
    launch(a, nullptr);
    ADD_FAILURE() << "accepted N=0";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("N=0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace taxfree::gemm
