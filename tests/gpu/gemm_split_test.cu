// GPU tests of the GEMM's cut work and clusters: split-K over all tiles, tail-wave splits and
// stream-K (fp32 partials summed by the last part of a tile to finish), 2-CTA clusters sharing
// B by multicast, and K clusters (a tile's K ranges summed in distributed shared memory; the same
// bits as split-K over the same ranges, and split-K on top of them refused). Odd M/N tails (a cluster's second CTA wholly past M, multicast halves of B wholly
// past N), K shorter than the splits, both layouts, several tiles per CTA, the add epilogue.
// Every config runs twice into poisoned C: the second run checks that the workspace counters were
// left at zero, and both must agree bit for bit (partials are summed in a fixed order).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {
namespace {

using device::Major;
using namespace test;

struct SplitShape {
  int64_t m, n, k;
};
const SplitShape kSplitShapes[] = {
    {1, 3592, 8200},    // decode: every tile cut; 129 k-blocks
    {127, 3590, 1001},  // odd M, N not a multiple of 8, odd K
    {300, 1000, 100},   // 2 k-blocks: 3 or 16 splits are capped at 2; stream-K ranges of one k-block
    {1100, 2056, 704},  // 9 m-blocks of 128 (a cluster's second CTA past M), many tiles per CTA
};

struct Variant {
  const char* name;
  int splits;
  SplitScope scope;
  int max_ctas;  // 14: the tail of 14 (or 7 cluster) waves is cut, with whole tiles before it
};
const Variant kVariants[] = {
    {"whole", 1, SplitScope::all, 0},         {"splitk3", 3, SplitScope::all, 0},
    {"splitk16", 16, SplitScope::all, 0},     {"tail2", 2, SplitScope::tail, 0},
    {"tail3 on 14 ctas", 3, SplitScope::tail, 14}, {"streamk", 1, SplitScope::stream, 0},
    {"streamk on 14 ctas", 1, SplitScope::stream, 14},
};

class GemmSplit : public ::testing::TestWithParam<std::tuple<int, BLayout>> {};

TEST_P(GemmSplit, EveryCompiledTileAndSplitMatchesReference) {
  TF_REQUIRE_GPUS(1);
  const auto [shape_index, layout] = GetParam();
  const SplitShape s = kSplitShapes[shape_index];
  const DType dtype = layout == BLayout::nk ? DType::bf16 : DType::fp16;
  const Problem p = make_problem(s.m, s.n, s.k, dtype, layout, 4321 + shape_index * 7 + int(layout));
  Output out(p);
  StreamGuard st;
  for (GemmConfig cfg : compiled_configs()) {
    if (layout == BLayout::kn && cfg.bn % 64 != 0) continue;
    for (const Variant& v : kVariants) {
      cfg.splits = v.splits, cfg.split_scope = v.scope, cfg.max_ctas = v.max_ctas, cfg.group_m = 2;
      const std::string what = "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" +
                               std::to_string(s.k) + " " + layout_name(layout) + " " + cfg.name() + " (" + v.name + ")";
      if (cfg.cluster_k > 1 && (cfg.splits_k() || (s.k + 63) / 64 < cfg.cluster_k)) {
        // K clusters cut K themselves: split-K on top, or fewer k-blocks than CTAs, is refused.
        try {
          launch(p.args(out.c()), cfg, st.s);
          ADD_FAILURE() << what << ": accepted";
        } catch (const Error& e) {
          EXPECT_EQ(e.status(), cfg.splits_k() ? Status::NotSupported : Status::InvalidArgument) << e.what();
        }
        continue;
      }
      if (v.max_ctas > 0) {  // the hybrid plans must really have whole tiles and cut ones
        const WorkPlan plan = detail::make_work_plan(p.args(nullptr), cfg, v.max_ctas / cfg.cluster_m);
        if (s.m > 1000) EXPECT_GT(plan.dp_tiles, 0) << what;
        EXPECT_GT(plan.split_tiles(), 0) << what;
      }
      expect_repeatable(p, out, cfg, st.s, what);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmSplit,
                         ::testing::Combine(::testing::Range(0, int(std::size(kSplitShapes))),
                                            ::testing::Values(BLayout::nk, BLayout::kn)),
                         [](const auto& info) {
                           const SplitShape s = kSplitShapes[std::get<0>(info.param)];
                           return "M" + std::to_string(s.m) + "_N" + std::to_string(s.n) + "_K" + std::to_string(s.k) +
                                  "_" + layout_name(std::get<1>(info.param));
                         });

// Every compiled K-cluster tile (128 x 128; 16 x 128 swap-AB, summed by CTA 0) against split-K
// over the same K ranges: the same fp32 additions in the same order, so the same bits, and both
// against the reference. Shapes: the sizes the tiles are for (M = 128 N = 3584: 28 plain tiles,
// one per cluster; M = 7 N = 3592: 29 swap-AB tiles); M and N tails (rows and columns past the
// edge) with odd K; one k-block per CTA; and many tiles per cluster (the ring is refilled only
// after each exchange).
TEST(GemmSplit, KClustersMatchSplitKBitForBit) {
  TF_REQUIRE_GPUS(1);
  const SplitShape shapes[] = {{128, 3584, 8192}, {7, 3592, 8200}, {300, 1000, 1001}, {1, 520, 256}, {1100, 2056, 704}};
  std::vector<GemmConfig> clustered;
  for (const GemmConfig& c : compiled_configs())
    if (c.cluster_k > 1) clustered.push_back(c);
  ASSERT_EQ(clustered.size(), 4u) << "a K-cluster tile was added or removed: update this test's comment";
  StreamGuard st;
  for (const SplitShape& s : shapes)
    for (const BLayout layout : {BLayout::nk, BLayout::kn}) {
      const DType dtype = layout == BLayout::nk ? DType::bf16 : DType::fp16;
      const Problem p = make_problem(s.m, s.n, s.k, dtype, layout, 99 + int(s.m + s.k) + int(layout));
      Output out(p);
      for (GemmConfig cfg : clustered) {
        const int ck = cfg.cluster_k;
        cfg.group_m = 2;
        const std::string what = "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" +
                                 std::to_string(s.k) + " " + layout_name(layout) + " " + cfg.name();
        expect_repeatable(p, out, cfg, st.s, what);
        const std::vector<uint16_t> clustered = out.read();
        cfg.cluster_k = 1, cfg.splits = ck;
        out.poison(st.s);
        launch(p.args(out.c()), cfg, st.s);
        TF_CUDA(cudaStreamSynchronize(st.s));
        EXPECT_TRUE(out.read() == clustered) << what << " differs from " << cfg.name();
      }
    }
}

// Stream-K into an add epilogue: C += A * B once per element (only the reducing part adds).
template <int kCluster>
void expect_stream_k_adds_once() {
  const Problem p = make_problem(257, 1030, 777, DType::bf16, BLayout::nk, 13);
  Output c2(p);
  StreamGuard st;
  const std::vector<uint16_t> init = fill_random(p, c2, 5);  // C2 += A * B on top of these
  GemmConfig cfg;  // 128 x 256 s4
  cfg.cluster_m = kCluster, cfg.split_scope = SplitScope::stream;
  launch_gemm<TileShape<128, 256, 4, kCluster>, __nv_bfloat16, Major::K, GroupedOrder, AlwaysReady, AddTo>(
      p.args(nullptr), cfg, {}, {}, {c2.c(), p.ldc}, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, c2.read(), "stream-K add into C2, cluster " + std::to_string(kCluster), &init);
}

TEST(GemmSplit, StreamKAddsEachElementOnce) {
  TF_REQUIRE_GPUS(1);
  expect_stream_k_adds_once<1>();
  expect_stream_k_adds_once<2>();
}

// A Ready policy sees only its own K range of a cut tile: launch refuses split-K with one.
struct TestReady {
  struct Params {};
  __device__ static void wait(const Params&, TileCoord, int) {}
};

TEST(GemmSplit, SplitKNeedsAlwaysReady) {
  GemmArgs args;
  args.a = args.b = reinterpret_cast<const void*>(uintptr_t(0x100000000));
  args.m = 64, args.n = 256, args.k = 128, args.lda = args.ldb = 128;
  GemmConfig cfg;
  cfg.bm = 64, cfg.bn = 64, cfg.stages = 13, cfg.splits = 2;
  try {
    launch_gemm<TileShape<64, 64, 13>, __nv_bfloat16, Major::K, GroupedOrder, TestReady, StoreTo>(
        args, cfg, {}, {}, {reinterpret_cast<void*>(uintptr_t(0x200000000)), 256}, nullptr);
    ADD_FAILURE() << "split-K accepted a Ready policy";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NotSupported) << e.what();
  }
}

}  // namespace
}  // namespace taxfree::gemm
