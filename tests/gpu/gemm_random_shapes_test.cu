// The heuristic's GEMM on shapes nobody listed: every run draws fresh random shapes (M, N, K
// log-uniform from 1 to a few thousand, so tiny, odd and tile-straddling sizes all come up), dtype
// and B layout, and checks the config the heuristic picks for each against the double-precision
// reference, twice into poisoned C (the two runs bitwise equal). The seed is printed with every
// failure; TAXFREE_TEST_SEED=N repeats a run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

#include "gemm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/gemm.h"

namespace taxfree::gemm {
namespace {

using namespace test;

TEST(GemmRandomShapes, HeuristicConfigMatchesReference) {
  TF_REQUIRE_GPUS(1);
  const uint64_t seed = ::taxfree::test::test_seed();
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto log_uniform = [&](double lo, double hi) {
    return int64_t(std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1))(rng)));
  };
  StreamGuard st;
  const int sms = device_sm_count();
  for (int i = 0; i < 24; ++i) {
    const int64_t m = log_uniform(1, 3000), n = log_uniform(1, 6000);
    int64_t k = log_uniform(1, 9000);
    // The host reference covers every row up to M = 96, then ~2 per 64-row band: keep it < ~0.4 G
    // multiply-adds a shape.
    const double ref_rows = m <= 96 ? double(m) : 2.0 * double(m) / 64 + double(m) / 97 + 2;
    k = std::max<int64_t>(1, std::min<int64_t>(k, int64_t(4e8 / (ref_rows * double(n)))));
    const DType dtype = rng() % 2 ? DType::bf16 : DType::fp16;
    const BLayout layout = rng() % 2 ? BLayout::NK : BLayout::KN;
    const Problem p = make_problem(m, n, k, dtype, layout, rng());
    Output out(p);
    const GemmConfig cfg = choose_gemm_config(m, n, k, dtype, layout, sms);
    expect_repeatable(p, out, cfg, st.s,
                      label({m, n, k}, dtype, layout) + " " + cfg.name() + " (seed " + std::to_string(seed) +
                          ", shape " + std::to_string(i) + ")");
    if (HasFatalFailure()) return;
  }
}

// The engine on shapes and configs nobody listed: a compiled tile drawn at random (any tile, not
// only what the heuristic picks for a whole GPU: the ops' plans pick for fewer SMs), with split-K
// over all tiles or the tail wave, stream-K, or a K cluster's own cut, a raster group and a CTA cap
// drawn too, on shapes drawn as above; each run twice into poisoned C against the reference.
TEST(GemmRandomShapes, RandomCompiledConfigsMatchReference) {
  TF_REQUIRE_GPUS(1);
  const uint64_t seed = ::taxfree::test::test_seed();
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto log_uniform = [&](double lo, double hi) {
    return int64_t(std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1))(rng)));
  };
  const std::vector<GemmConfig> configs = compiled_configs();
  StreamGuard st;
  const int sms = device_sm_count();
  for (int i = 0; i < 24; ++i) {
    const int64_t m = log_uniform(1, 3000), n = log_uniform(1, 6000);
    int64_t k = log_uniform(1, 9000);
    const double ref_rows = m <= 96 ? double(m) : 2.0 * double(m) / 64 + double(m) / 97 + 2;
    k = std::max<int64_t>(1, std::min<int64_t>(k, int64_t(4e8 / (ref_rows * double(n)))));
    const DType dtype = uni(0, 1) ? DType::bf16 : DType::fp16;
    const BLayout layout = uni(0, 1) ? BLayout::NK : BLayout::KN;
    GemmConfig cfg;
    do cfg = configs[size_t(uni(0, int(configs.size()) - 1))];
    while (layout == BLayout::KN && cfg.bn % 64 != 0);  // [K, N] B loads whole 64-column boxes
    const int k_blocks = int((k + 63) / 64);
    if (cfg.cluster_k == 1) {
      const int cut = uni(0, 3);  // whole, split-K, tail split, stream-K
      cfg.splits = cut == 1 || cut == 2 ? std::vector<int>{2, 3, 4, 8, 16}[size_t(uni(0, 4))] : 1;
      cfg.split_scope = cut == 2 ? SplitScope::tail : cut == 3 ? SplitScope::stream : SplitScope::all;
    } else if (k_blocks < cfg.cluster_k) {
      k = int64_t(cfg.cluster_k) * 64;  // a K cluster needs a k-block per CTA
    }
    cfg.group_m = uni(1, 16);
    const int cluster = cfg.cluster_m * cfg.cluster_k;
    if (uni(0, 2) == 0) cfg.max_ctas = cluster * uni(1, std::max(1, sms / cluster));
    const Problem p = make_problem(m, n, k, dtype, layout, rng());
    Output out(p);
    const std::string what = label({m, n, k}, dtype, layout) + " " + cfg.name() +
                             (cfg.max_ctas ? " on " + std::to_string(cfg.max_ctas) + " CTAs" : "") + " (seed " +
                             std::to_string(seed) + ", shape " + std::to_string(i) + ")";
    std::printf("%s\n", what.c_str());
    expect_repeatable(p, out, cfg, st.s, what);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace taxfree::gemm
