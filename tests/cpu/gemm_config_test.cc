// GEMM host logic without a GPU: the heuristic's choices and launch()'s validation errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cublasLt.h>

#include "expect_error.h"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {
namespace {

bool is_compiled(const GemmConfig& c, BLayout layout) {
  for (const CompiledTile& t : kCompiledTiles)
    if (t.bm == c.bm && t.bn == c.bn && t.stages == c.stages && t.cluster == c.cluster_m && t.swap == c.swap_ab &&
        t.cluster_k == c.cluster_k)
      return t.kn || layout == BLayout::nk;
  return false;
}

TEST(GemmLayout, NamesParseBack) {
  for (BLayout l : {BLayout::nk, BLayout::kn}) EXPECT_EQ(parse_layout(layout_name(l), "test"), l);
  EXPECT_STREQ(layout_name(BLayout(7)), "unknown");
  test::expect_invalid([] { parse_layout("NK", "gemm benchmarks"); }, "gemm benchmarks: B layout 'NK' must be nk or kn");
  test::expect_invalid([] { parse_layout("", "all_gather_matmul benchmarks"); }, "all_gather_matmul benchmarks: B layout ''");
}

const int64_t kSweepM[] = {1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384};
const int64_t kSweepN[] = {3584, 4096, 7168, 8192, 14336};

TEST(GemmHeuristic, ReturnsACompiledConfigForEveryShape) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
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
            EXPECT_LE(c.cluster_m * c.cluster_k, sms) << c.name() << ": a cluster larger than the SMs it may fill";
            if (c.cluster_k > 1) EXPECT_GE((k + 63) / 64, c.cluster_k) << c.name() << ": a K-cluster CTA with no k-block";
          }
}

// choose_gemm_config keeps its answers: a kept answer must be the one a fresh ranking gives for
// exactly those arguments. Each pair below differs in one argument and ranks differently, so a key
// that left that argument out would hand one's answer to the other.
TEST(GemmHeuristic, KeptAnswersEqualFreshRankingForEveryArgument) {
  struct Call {
    int64_t m, n, k;
    BLayout layout;
    int sms;
    KCuts cuts;
    SwapAB swap;
    EpilogueOutput out;
  };
  const Call base{64, 3584, 8192, BLayout::nk, 132, KCuts::split_or_cluster, SwapAB::choose, EpilogueOutput::bits16};
  std::vector<std::pair<Call, Call>> pairs;
  const auto vary = [&](auto set) {
    Call a = base, b = base;
    set(a, b);
    pairs.push_back({a, b});
  };
  vary([](Call& a, Call& b) { a.m = 64, b.m = 8192; });
  vary([](Call& a, Call& b) { a.m = b.m = 1024, a.n = 3584, b.n = 4096; });
  vary([](Call& a, Call& b) { a.k = 8192, b.k = 256; });
  vary([](Call& a, Call& b) { a.m = b.m = 1024, a.layout = BLayout::nk, b.layout = BLayout::kn; });
  vary([](Call& a, Call& b) { a.sms = 132, b.sms = 1; });
  vary([](Call& a, Call& b) { a.cuts = KCuts::split_or_cluster, b.cuts = KCuts::none; });
  vary([](Call& a, Call& b) { a.m = b.m = 16, a.swap = SwapAB::choose, b.swap = SwapAB::never; });
  vary([](Call& a, Call& b) { a.m = b.m = 16, a.out = EpilogueOutput::bits16, b.out = EpilogueOutput::fp32; });
  const auto choose = [](const Call& c) {
    const GemmConfig g = choose_gemm_config(c.m, c.n, c.k, DType::bf16, c.layout, c.sms, c.cuts, c.swap, c.out);
    return g.name() + " max_ctas " + std::to_string(g.max_ctas);
  };
  const auto fresh = [&](const Call& c) {
    detail::forget_chosen_gemm_configs();
    return choose(c);
  };
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto& [a, b] = pairs[i];
    const std::string fa = fresh(a), fb = fresh(b);
    ASSERT_NE(fa, fb) << "pair " << i << " ranks alike: it cannot show a key that misses its argument";
    // Kept answers, both orders: the second call of each is a lookup.
    detail::forget_chosen_gemm_configs();
    EXPECT_EQ(choose(a), fa) << "pair " << i;
    EXPECT_EQ(choose(b), fb) << "pair " << i;
    EXPECT_EQ(choose(a), fa) << "pair " << i;
    detail::forget_chosen_gemm_configs();
    EXPECT_EQ(choose(b), fb) << "pair " << i;
    EXPECT_EQ(choose(a), fa) << "pair " << i;
    EXPECT_EQ(choose(b), fb) << "pair " << i;
  }
}

// Launches on several host threads ask at once (one per GPU, or a serving engine's workers): each
// must get its own shape's answer while others fill and empty the kept set.
TEST(GemmHeuristic, KeptAnswersHoldUnderConcurrentCallers) {
  std::vector<int64_t> ms;
  for (int64_t m = 1; m <= 4096; m = m * 3 / 2 + 1) ms.push_back(m);
  std::vector<std::string> want;
  for (int64_t m : ms) want.push_back(choose_gemm_config(m, 3584, 8192, DType::bf16, BLayout::nk).name());
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < ms.size(); ++i) {
          const size_t j = (i * 7 + size_t(t) * 5 + size_t(round)) % ms.size();
          if (t == 0 && i % 16 == 0) detail::forget_chosen_gemm_configs();
          wrong[size_t(t)] += choose_gemm_config(ms[j], 3584, 8192, DType::bf16, BLayout::nk).name() != want[j];
        }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(wrong[size_t(t)], 0) << "thread " << t;
}

TEST(GemmHeuristic, LargeProblemsUseTheLargestTile) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {4096, 8192, 16384})
      for (int64_t n : {4096, 8192, 14336}) {
        const GemmConfig c = choose_gemm_config(m, n, 8192, DType::bf16, layout);
        EXPECT_EQ(c.bm, 128) << m << "x" << n;
        EXPECT_EQ(c.bn, 256) << m << "x" << n;
      }
  const GemmConfig c = choose_gemm_config(8192, 8192, 8192, DType::fp16, BLayout::nk);
  EXPECT_GT(c.group_m, 1) << "a wave of 132 tiles should share A panels";
}

// K clusters where they measured faster (r146-r149, H200): one wave of tiles (every tile's cluster
// resident at once), not 64 tiles of <= 8 n-blocks on 128 SMs; never for agmm's callers (KCuts).
TEST(GemmHeuristic, KClustersOnlyWhereTheyMeasuredFaster) {
  struct Expect {
    int64_t m, n, k;
    int cluster_k;
  };
  const Expect cases[] = {
      {128, 3584, 8192, 4},  // 28 tiles on 112 SMs: 23.1 us against split-K 4's 26.0
      {256, 3584, 8192, 2},  // 56 tiles: 29.7 against 33.5
      {128, 8192, 8192, 2},  // 64 tiles of 64 n-blocks: 40.3 against 44.3
      {768, 512, 8192, 4},   // 24 tiles: 17.2 against 19.2
      {1024, 3072, 8192, 1}, // 192 tiles for 66 clusters: ck2 98.5 against 79.1
      {384, 8192, 8192, 1},  // 192 tiles: 112.4 against 93.9
      {1024, 1024, 8192, 1}, // 64 tiles of 8 n-blocks: 33.5-35.4 against 30.4-33.4
      {2048, 512, 8192, 1},  // 64 tiles of 4 n-blocks: 33.5 against 30.6
      {8192, 8192, 8192, 1},
      {1, 3584, 8192, 4},    // swap-AB, 28 tiles: 19.9-20.0 us against split-K 3's 21.2-21.5 (r194)
      {16, 7168, 8192, 2},   // swap-AB, 56 tiles: 33.9-34.5 against split-K 2's 34.0-34.6
      {1, 14336, 8192, 1},   // swap-AB, 112 whole tiles
  };
  for (const Expect& e : cases)
    for (BLayout layout : {BLayout::nk, BLayout::kn}) {
      const GemmConfig c = choose_gemm_config(e.m, e.n, e.k, DType::bf16, layout, 132);
      EXPECT_EQ(c.cluster_k, e.cluster_k) << "M=" << e.m << " N=" << e.n << ": " << c.name();
      if (c.cluster_k > 1) EXPECT_FALSE(c.splits_k()) << c.name();
      for (KCuts cuts : {KCuts::split, KCuts::none})
        EXPECT_EQ(choose_gemm_config(e.m, e.n, e.k, DType::bf16, layout, 132, cuts).cluster_k, 1) << e.m << "x" << e.n;
    }
}

// 224-column tiles where they measured faster (r158-r159, H200, nk): N = 3584 k fills 128 or 256
// tiles per wave group; never for B [K, N] (not compiled) and not where 256 columns tile N as well.
TEST(GemmHeuristic, Tiles224WhereTheyFillWholeWaves) {
  struct Expect {
    int64_t m, n;
    int bn;
  };
  const Expect cases[] = {
      {1024, 3584, 224},  // 128 tiles: 80.7 us against 128 x 256's 84.3 (112 tiles)
      {2048, 3584, 224},  // 256 tiles: 151.6 against 166.8
      {512, 7168, 224},   // 79.2 against 85.0
      {1024, 7168, 224},  // 154.5 against 172.7
      {256, 14336, 224},  // 84.2 against 90.0
      {512, 14336, 224},  // 156.3 against 167.7
      {512, 3584, 128},   // 64 tiles of 224 on 132 SMs: 72 against 47.5
      {256, 7168, 128},   // 64 tiles of 224: 71.9 against 50.7
      {4096, 4096, 256},
      {8192, 8192, 256},
  };
  for (const Expect& e : cases) {
    EXPECT_EQ(choose_gemm_config(e.m, e.n, 8192, DType::bf16, BLayout::nk, 132).bn, e.bn) << "M=" << e.m << " N=" << e.n;
    EXPECT_NE(choose_gemm_config(e.m, e.n, 8192, DType::bf16, BLayout::kn, 132).bn, 224) << "M=" << e.m << " N=" << e.n;
  }
}

// 168-column tiles (r298, H200, nk, against the previous choice): whole tiles where M is a
// multiple of 128 from 256 (M = 768 N = 3584: 132 tiles, 62.0 against 71.8 us), or, since the
// overlapped last m-block, over a partial last m-block of at most 12 m-blocks (r342, 1x H100: M = 704
// N = 3072 61-63 against 72-80 us for 128 x 128 tail split 4; r343: 9-12 m-blocks 0.957x the choice
// before); never split, never for B [K, N] or an fp32 epilogue (not compiled).
TEST(GemmHeuristic, Tiles168WholeOverFullMBlocksOrAFewOverlapped) {
  for (const auto [m, n] :
       {std::pair<int64_t, int64_t>{768, 3584}, {1536, 3584}, {384, 7168}, {640, 4096}, {704, 3072}})
    EXPECT_EQ(choose_gemm_config(m, n, 8192, DType::bf16, BLayout::nk, 132).bn, 168) << "M=" << m << " N=" << n;
  int chosen = 0;
  for (int64_t m = 64; m <= 4096; m += 64)
    for (int64_t n = 512; n <= 16384; n += 512)
      for (BLayout layout : {BLayout::nk, BLayout::kn}) {
        const GemmConfig c = choose_gemm_config(m, n, 8192, DType::bf16, layout, 132);
        if (c.bn == 168) {
          ++chosen;
          EXPECT_EQ(layout, BLayout::nk) << "M=" << m << " N=" << n;
          EXPECT_TRUE(m % 128 == 0 || (m + 127) / 128 <= 12) << "M=" << m << " N=" << n;
          EXPECT_GE(m, 256) << "N=" << n;
          EXPECT_EQ(c.splits, 1) << "M=" << m << " N=" << n << " " << c.name();
        }
        EXPECT_EQ(choose_gemm_config(m, n, 8192, DType::bf16, layout, 132, KCuts::split, SwapAB::never,
                                     EpilogueOutput::fp32).bn % 32, 0) << "M=" << m << " N=" << n;
      }
  EXPECT_GT(chosen, 20);  // the rule above is not vacuous
}

// Tail splits of 4 parts only where their ranges fit one round of the persistent grid: over two
// rounds 128 x 256 sk4t ran 1.09x the same tile whole (r345, 1x H100; M = 896 N = 8192 K = 16384 kn
// 1.48x), kept to one round 0.927x on the 27 grid choices it moved (r347). At any SM count (a rank's
// share of the GPU has fewer).
TEST(GemmHeuristic, FourPartTailSplitsFitOneRound) {
  int four_part_tails = 0;
  for (int sms : {132, 114, 66})
    for (int64_t m = 256; m <= 4096; m += 160)
      for (int64_t n : {1024, 2048, 4096, 5120, 8192, 14336})
        for (BLayout layout : {BLayout::nk, BLayout::kn}) {
          const GemmConfig c = choose_gemm_config(m, n, 16384, DType::bf16, layout, sms);
          if (c.split_scope != SplitScope::tail || c.splits < 4) continue;
          ++four_part_tails;
          GemmArgs shape;
          shape.m = m, shape.n = n, shape.k = 16384;
          const int64_t clusters = sms / c.cluster_m;
          EXPECT_LE(detail::make_work_plan(shape, c, clusters).sk_units, clusters)
              << "M=" << m << " N=" << n << " on " << sms << " SMs: " << c.name();
        }
  EXPECT_GT(four_part_tails, 10);  // the rule above is not vacuous
}

// rank_gemm_configs is choose_gemm_config's ranking: its chosen candidate is the config
// choose_gemm_config returns (kept answers included), and no candidate weighed after it beats it by
// the switch margin (0.97); every estimate is positive and finite.
TEST(GemmHeuristic, RankingChoosesWhatChooseGemmConfigReturns) {
  for (int sms : {132, 66})
    for (int64_t m : {1, 17, 160, 384, 1000, 4096})
      for (int64_t n : {1000, 3584, 8192})
        for (int64_t k : {512, 8191, 16384})
          for (BLayout layout : {BLayout::nk, BLayout::kn})
            for (EpilogueOutput out : {EpilogueOutput::bits16, EpilogueOutput::fp32}) {
              const KCuts cuts = out == EpilogueOutput::fp32 ? KCuts::split : KCuts::split_or_cluster;
              const GemmRanking r = rank_gemm_configs(m, n, k, DType::bf16, layout, sms, cuts, SwapAB::choose, out);
              const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
                                       " on " + std::to_string(sms) + " SMs";
              ASSERT_LT(r.chosen, r.candidates.size()) << what;
              EXPECT_EQ(r.candidates[r.chosen].config.name(),
                        choose_gemm_config(m, n, k, DType::bf16, layout, sms, cuts, SwapAB::choose, out).name())
                  << what;
              for (size_t i = 0; i < r.candidates.size(); ++i) {
                EXPECT_TRUE(std::isfinite(r.candidates[i].estimate_s) && r.candidates[i].estimate_s > 0) << what;
                if (i > r.chosen) EXPECT_GE(r.candidates[i].estimate_s, 0.97 * r.candidates[r.chosen].estimate_s) << what;
              }
            }
}

TEST(GemmHeuristic, DecodeSizesUseSwapABOverManyCtas) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {1, 7, 16})
      for (int64_t n : kSweepN) {
        const GemmConfig c = choose_gemm_config(m, n, 8192, DType::bf16, layout);
        const std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) + ": " + c.name();
        EXPECT_TRUE(c.swap_ab) << what;
        EXPECT_GE(c.bm, m) << what << ": M fits one m-block";
        EXPECT_EQ(c.bm, 16) << what << ": the narrowest swap-AB tile";
        // CTAs (tiles, K ranges of split tiles, or K clusters of tiles) for enough SMs to saturate
        // HBM (~60% of them).
        GemmArgs shape;
        shape.m = m, shape.n = n, shape.k = 8192;
        EXPECT_GE(detail::make_work_plan(shape, c, 132).units() * c.cluster_k, 80) << what << " leaves SMs idle";
        EXPECT_GE(int64_t(c.stages) * c.bn * 128, 128 * 1024) << "too few B bytes in flight per SM for " << what;
      }
}

TEST(GemmHeuristic, SwapABOnlyForSmallM) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {512, 1024, 4096, 16384})
      for (int64_t n : kSweepN)
        EXPECT_FALSE(choose_gemm_config(m, n, 8192, DType::bf16, layout).swap_ab) << "M=" << m << " N=" << n;
}

TEST(GemmHeuristic, SwapChoiceCanBeForced) {
  for (BLayout layout : {BLayout::nk, BLayout::kn})
    for (int64_t m : {1, 16, 33, 128, 1000, 8192})
      for (KCuts cuts : {KCuts::split_or_cluster, KCuts::split, KCuts::none}) {
        const GemmConfig on = choose_gemm_config(m, 3592, 8200, DType::fp16, layout, 132, cuts, SwapAB::always);
        const GemmConfig off = choose_gemm_config(m, 3592, 8200, DType::fp16, layout, 132, cuts, SwapAB::never);
        EXPECT_TRUE(on.swap_ab && is_compiled(on, layout)) << "M=" << m << " " << on.name();
        EXPECT_FALSE(off.swap_ab) << "M=" << m << " " << off.name();
        EXPECT_TRUE(is_compiled(off, layout)) << off.name();
        EXPECT_EQ(on.cluster_m, 1);
        EXPECT_EQ(on.bm, m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : 192)
            << "the narrowest swap-AB tile that covers M, else the widest";
        if (cuts == KCuts::none) EXPECT_FALSE(on.splits_k() || off.splits_k()) << on.name() << " / " << off.name();
        if (cuts != KCuts::split_or_cluster) EXPECT_EQ(off.cluster_k, 1) << off.name();
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
  test::expect_error([&] { launch(a, cfg, nullptr); }, status, needle);
}

TEST(GemmValidation, AcceptsOddButAlignedShapes) {
  for (const GemmConfig& cfg : compiled_configs()) {
    GemmArgs a = valid_args();
    if (cfg.bn % 64 == 0) {
      a.b_layout = BLayout::kn;
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
  a.b_layout = BLayout::kn;  // ldb = K = 8200 < N? no: N = 3592, so make it too small
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
  // Strides whose byte products overflow int64 (2^62 * 2 wraps to a multiple of 16 below 2^40).
  a = valid_args();
  a.lda = int64_t(1) << 62;
  expect_error(a, cfg, Status::InvalidArgument, "lda=4611686018427387904 elements exceeds the TMA limit");
  a = valid_args();
  a.m = (int64_t(1) << 31) - 1, a.lda = int64_t(1) << 38;  // under the TMA limit, but 2^70 bytes in all
  expect_error(a, cfg, Status::InvalidArgument, "span more than 2^56 bytes");
  for (int64_t ldc : {int64_t(1) << 50, int64_t(1) << 61}) {
    a = valid_args();
    a.ldc = ldc;
    expect_error(a, cfg, Status::InvalidArgument, "ldc=" + std::to_string(ldc) + " elements span more than 2^56");
  }
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

TEST(GemmValidation, SwapABConfigs) {
  GemmConfig cfg;
  cfg.bm = 16, cfg.bn = 128, cfg.stages = 12, cfg.swap_ab = true;
  EXPECT_EQ(cfg.name(), "16x128x64 s12 g8 swap");
  EXPECT_EQ(cfg.consumers(), 2);
  GemmArgs a = valid_args();
  for (int64_t m : {1, 7, 127, 1000}) {
    a.m = m;
    EXPECT_NO_THROW(validate(a, cfg)) << m;
  }
  a.b_layout = BLayout::kn;
  a.ldb = a.n;
  EXPECT_NO_THROW(validate(a, cfg));
  // Well-formed but not built: NotSupported, naming the swap-AB tiles that exist.
  GemmConfig c = cfg;
  c.cluster_m = 2;
  expect_error(valid_args(), c, Status::NotSupported, "swap-AB runs without clusters");
  c = cfg;
  c.swap_ab = false;
  expect_error(valid_args(), c, Status::NotSupported, "16x128 s12 cluster_m=1 is not compiled");
  c = cfg;
  c.bm = 8;
  expect_error(valid_args(), c, Status::NotSupported, "8x128 s12 cluster_m=1 swap-AB is not compiled");
  expect_error(valid_args(), c, Status::NotSupported, "16x128 s12 c1 swap");
  c = cfg;
  c.bm = 64, c.bn = 64, c.stages = 13;  // a plain tile's shape
  expect_error(valid_args(), c, Status::NotSupported, "64x64 s13 cluster_m=1 swap-AB is not compiled");
  // Values that never make sense: InvalidArgument.
  c = cfg;
  c.bm = 0;
  expect_error(valid_args(), c, Status::InvalidArgument, "must be >= 1");
  c = cfg;
  c.splits = 65;
  expect_error(valid_args(), c, Status::InvalidArgument, "splits=65");
}

TEST(GemmValidation, KClusterConfigs) {
  GemmConfig cfg;
  cfg.bn = 128, cfg.stages = 6, cfg.cluster_k = 4;
  EXPECT_EQ(cfg.name(), "128x128x64 s6 g8 ck4");
  EXPECT_NO_THROW(validate(valid_args(), cfg));
  GemmArgs a = valid_args();
  a.b_layout = BLayout::kn;
  a.ldb = a.n;
  EXPECT_NO_THROW(validate(a, cfg));
  // A K cluster cuts K itself: no split-K of any scope on top, and a k-block for each of its CTAs.
  GemmConfig c = cfg;
  c.splits = 2;
  expect_error(valid_args(), c, Status::NotSupported, "split-K on top is not supported");
  c = cfg;
  c.split_scope = SplitScope::stream;
  expect_error(valid_args(), c, Status::NotSupported, "split-K on top is not supported");
  a = valid_args();
  a.k = 192;  // 3 k-blocks for 4 CTAs
  expect_error(a, cfg, Status::InvalidArgument, "K=192 has 3 k-blocks of 64, fewer than the cluster_k=4");
  a.k = 193;  // 4 k-blocks, the last one partial
  EXPECT_NO_THROW(validate(a, cfg));
  // Sizes not built, and values that never make sense.
  c = cfg;
  c.cluster_k = 3;
  expect_error(valid_args(), c, Status::NotSupported, "128x128 s6 cluster_m=1 cluster_k=3 is not compiled");
  c = cfg;
  c.bm = 64, c.bn = 64, c.stages = 13, c.cluster_k = 2;
  expect_error(valid_args(), c, Status::NotSupported, "64x64 s13 cluster_m=1 cluster_k=2 is not compiled");
  expect_error(valid_args(), c, Status::NotSupported, "128x128 s6 c1 ck2");  // the list names the K clusters built
  c = cfg;
  c.cluster_k = 0;
  expect_error(valid_args(), c, Status::InvalidArgument, "must be >= 1");
  // A CTA cap below one cluster cannot be honoured (the launch is in whole clusters).
  c = cfg;
  c.max_ctas = 3;
  expect_error(valid_args(), c, Status::InvalidArgument, "max_ctas=3 is fewer than one cluster of 4 CTAs");
  c.max_ctas = 4;
  EXPECT_NO_THROW(validate(valid_args(), c));
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


// Clusters::small keeps the cuBLASLt algorithms whose cluster shape has at most 2 CTAs; AUTO (the
// library's pick, of any size) and every larger shape are refused.
TEST(CublasLtClusters, SmallMeansAtMostTwoCtas) {
  for (int id : {CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1, CUBLASLT_CLUSTER_SHAPE_1x2x1})
    EXPECT_TRUE(cublaslt_small_cluster(id)) << "cluster shape " << id;
  for (int id : {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_4x1x1, CUBLASLT_CLUSTER_SHAPE_2x2x1,
                 CUBLASLT_CLUSTER_SHAPE_4x2x1, CUBLASLT_CLUSTER_SHAPE_2x4x1, CUBLASLT_CLUSTER_SHAPE_3x1x1,
                 CUBLASLT_CLUSTER_SHAPE_1x3x1, CUBLASLT_CLUSTER_SHAPE_16x1x1, CUBLASLT_CLUSTER_SHAPE_1x15x1})
    EXPECT_FALSE(cublaslt_small_cluster(id)) << "cluster shape " << id;
}

}  // namespace
}  // namespace taxfree::gemm
