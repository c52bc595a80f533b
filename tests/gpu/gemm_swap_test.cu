// GPU tests of the swap-AB GEMM (C^T = B^T A^T for skinny M): every compiled swap-AB tile against a
// double-precision host reference on fresh random inputs, M from 1 to 200 (one or several
// m-blocks, rows past M zero-filled; 150 and 200 for the 192-row tile), N not a multiple of the
// tile (3592, 1000), K with a partial k-block (8200) or under two k-blocks (72), both B layouts, bf16 and fp16, whole tiles, split-K
// and stream-K. Every config runs twice into poisoned C with guard bands: the runs must agree bit
// for bit (the second also checks that the split-K counters were left at zero). The add epilogue
// must add each element once. The A-ready hook with swap-AB: gemm_test.cu; swap-AB K clusters
// against split-K: gemm_split_test.cu.
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
#include "taxfree/ops/gemm_launch.cuh"

namespace taxfree::gemm {
namespace {

using device::Major;
using namespace test;

const ShapeCase kSwapShapes[] = {
    {1, 3592, 8192},  {7, 1000, 8200},  {16, 3592, 8200}, {33, 1000, 72},
    {64, 3592, 72},   {127, 1000, 8192}, {1, 1000, 72},   {33, 3592, 8200},
    {150, 1000, 8200}, {200, 3592, 72},
};

std::vector<GemmConfig> swap_configs() {
  std::vector<GemmConfig> out;
  for (const GemmConfig& c : compiled_configs())
    if (c.swap_ab && c.cluster_k == 1) out.push_back(c);
  return out;
}

struct Split {
  const char* name;
  int splits;
  SplitScope scope;
};
const Split kSplits[] = {{"whole", 1, SplitScope::all}, {"splitk5", 5, SplitScope::all}, {"streamk", 1, SplitScope::stream}};

class GemmSwap : public ::testing::TestWithParam<ShapeParam> {};

TEST_P(GemmSwap, EverySwapTileAndSplitMatchesReference) {
  TF_REQUIRE_GPUS(1);
  ASSERT_EQ(swap_configs().size(), 4u) << "a swap-AB tile was added or removed: update this test";
  const auto [shape_index, dtype, layout] = GetParam();
  const ShapeCase s = kSwapShapes[shape_index];
  StreamGuard st;
  const Problem p = make_problem(s.m, s.n, s.k, dtype, layout, 2024 + shape_index * 13 + int(dtype) * 3 + int(layout));
  Output out(p);
  for (GemmConfig cfg : swap_configs())
    for (const Split& sp : kSplits) {
      cfg.splits = sp.splits, cfg.split_scope = sp.scope, cfg.group_m = 2;
      const std::string what = label(s, dtype, layout) + " " + cfg.name();
      expect_repeatable(p, out, cfg, st.s, what);
    }
  // The heuristic's swap-AB choice through the plain entry point.
  GemmConfig chosen = choose_gemm_config(s.m, s.n, s.k, dtype, layout, device_sm_count(), KCuts::split, SwapAB::always);
  ASSERT_TRUE(chosen.swap_ab);
  out.poison(st.s);
  launch(p.args(out.c()), chosen, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  expect_matches(p, out.read(), label(s, dtype, layout) + " heuristic swap-AB " + chosen.name());
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmSwap,
                         ::testing::Combine(::testing::Range(0, int(std::size(kSwapShapes))),
                                            ::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::nk, BLayout::kn)),
                         shape_param_name(kSwapShapes));

// C2 += A * B through the add epilogue, whole tiles and stream-K (only the reducing part adds);
// C, the plain output, stays untouched.
template <class Shape, class T, Major kMajorB>
void expect_swap_adds_once(DType dtype, BLayout layout, SplitScope scope) {
  const Problem p = make_problem(33, 1030, 777, dtype, layout, 17 + int(scope));
  Output c(p), c2(p);
  StreamGuard st;
  const std::vector<uint16_t> init = fill_random(p, c2, 7);  // C2 += A * B on top of these
  c.poison(st.s);
  GemmConfig cfg;
  cfg.bm = Shape::BM, cfg.bn = Shape::BN, cfg.stages = Shape::kStages, cfg.swap_ab = true, cfg.split_scope = scope;
  launch_gemm<Shape, T, kMajorB, GroupedOrder, AlwaysReady, AddTo>(p.args(c.c()), cfg, {}, {}, {c2.c(), p.ldc}, st.s);
  TF_CUDA(cudaStreamSynchronize(st.s));
  const std::string what = std::string("swap-AB add into C2 ") + cfg.name() + " " + dtype_name(dtype) + " " +
                           layout_name(layout);
  expect_matches(p, c2.read(), what, &init);
  for (uint16_t v : c.read()) ASSERT_EQ(v, kPoison) << what << ": C was written although the epilogue targets C2";
}

TEST(GemmSwapHooks, AddIntoASecondBuffer) {
  TF_REQUIRE_GPUS(1);
  for (SplitScope scope : {SplitScope::all, SplitScope::stream}) {
    expect_swap_adds_once<TileShape<32, 128, 10, 1, true>, __nv_bfloat16, Major::K>(DType::bf16, BLayout::nk, scope);
    expect_swap_adds_once<TileShape<64, 128, 8, 1, true>, __half, Major::MN>(DType::fp16, BLayout::kn, scope);
  }
}

}  // namespace
}  // namespace taxfree::gemm
