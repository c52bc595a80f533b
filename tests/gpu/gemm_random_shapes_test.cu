// The GEMM on shapes nobody listed: every run draws fresh random shapes (M, N, K log-uniform from
// 1 to a few thousand, so tiny, odd and tile-straddling sizes all come up), dtype and B layout, and
// checks the heuristic's config for each, then drawn configs, against the double-precision
// reference, twice into poisoned C (the two runs bitwise equal). The seed is printed with every
// failure; TAXFREE_TEST_SEED=N repeats a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "random_draws.h"
#include "taxfree/ops/gemm.h"

namespace taxfree::gemm {
namespace {

using namespace test;
using ::taxfree::test::Draws;

struct DrawnShape {
  int64_t m, n, k;
  DType dtype;
  BLayout layout;
};

DrawnShape draw_shape(Draws& rnd) {
  const int64_t m = rnd.log_uni(1, 3000), n = rnd.log_uni(1, 6000);
  int64_t k = rnd.log_uni(1, 9000);
  // The host reference covers every row up to M = 96, then ~2 per 64-row band: keep it < ~0.4 G
  // multiply-adds a shape.
  const double ref_rows = m <= 96 ? double(m) : 2.0 * double(m) / 64 + double(m) / 97 + 2;
  k = std::max<int64_t>(1, std::min<int64_t>(k, int64_t(4e8 / (ref_rows * double(n)))));
  const DType dtype = rnd.coin() ? DType::bf16 : DType::fp16;
  return {m, n, k, dtype, rnd.coin() ? BLayout::nk : BLayout::kn};
}

TEST(GemmRandomShapes, HeuristicConfigMatchesReference) {
  TF_REQUIRE_GPUS(1);
  Draws rnd;
  StreamGuard st;
  const int sms = device_sm_count();
  for (int i = 0; i < 24; ++i) {
    const DrawnShape s = draw_shape(rnd);
    const Problem p = make_problem(s.m, s.n, s.k, s.dtype, s.layout, rnd.bits());
    Output out(p);
    const GemmConfig cfg = choose_gemm_config(s.m, s.n, s.k, s.dtype, s.layout, sms);
    expect_repeatable(p, out, cfg, st.s,
                      label({s.m, s.n, s.k}, s.dtype, s.layout) + " " + cfg.name() + " " + rnd.where(i));
    if (HasFatalFailure()) return;
  }
}

// The engine on shapes and configs nobody listed: a compiled tile drawn at random (any tile, not
// only what the heuristic picks for a whole GPU: the ops' plans pick for fewer SMs), with split-K
// over all tiles or the tail wave, stream-K, or a K cluster's own cut, a raster group and a CTA cap
// drawn too, on shapes drawn as above; each run twice into poisoned C against the reference.
TEST(GemmRandomShapes, RandomCompiledConfigsMatchReference) {
  TF_REQUIRE_GPUS(1);
  Draws rnd;
  const std::vector<GemmConfig> configs = compiled_configs();
  StreamGuard st;
  const int sms = device_sm_count();
  for (int i = 0; i < 24; ++i) {
    DrawnShape s = draw_shape(rnd);
    GemmConfig cfg;
    do cfg = configs[size_t(rnd.uni(0, int(configs.size()) - 1))];
    while (s.layout == BLayout::kn && cfg.bn % 64 != 0);  // [K, N] B loads whole 64-column boxes
    if (cfg.cluster_k == 1) {
      const int cut = rnd.uni(0, 3);  // whole, split-K, tail split, stream-K
      cfg.splits = cut == 1 || cut == 2 ? std::vector<int>{2, 3, 4, 8, 16}[size_t(rnd.uni(0, 4))] : 1;
      cfg.split_scope = cut == 2 ? SplitScope::tail : cut == 3 ? SplitScope::stream : SplitScope::all;
    } else if ((s.k + 63) / 64 < cfg.cluster_k) {
      s.k = int64_t(cfg.cluster_k) * 64;  // a K cluster needs a k-block per CTA
    }
    cfg.group_m = rnd.uni(1, 16);
    const int cluster = cfg.cluster_m * cfg.cluster_k;
    if (rnd.uni(0, 2) == 0) cfg.max_ctas = cluster * rnd.uni(1, std::max(1, sms / cluster));
    const Problem p = make_problem(s.m, s.n, s.k, s.dtype, s.layout, rnd.bits());
    Output out(p);
    const std::string what = label({s.m, s.n, s.k}, s.dtype, s.layout) + " " + cfg.name() +
                             (cfg.max_ctas ? " on " + std::to_string(cfg.max_ctas) + " CTAs " : " ") + rnd.where(i);
    std::printf("%s\n", what.c_str());
    expect_repeatable(p, out, cfg, st.s, what);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace taxfree::gemm
