// all_gather_matmul `ksplit` (cross-rank split-K, gather_dim 1, B replicated) on real GPUs: against
// a float64 host reference on fresh random inputs with poisoned outputs and partial buffers, M from
// 1 to 1000, K / world a multiple of 8 but not of 64, N not a multiple of 8, both B layouts, bf16
// and fp16, in place (M = 127); C bit for bit the same on every rank, the gathered A bit for bit the shards;
// 1000 back-to-back launches alternating two shapes with inputs changed on the way, rank skew,
// CUDA-graph capture and replay, auto's choice, and the errors before launch. M <= kSkinnyMaxM runs
// the one-kernel skinny path (AgmmKsplitSkinny* add its shapes: N not a multiple of its 32-column
// slices, M across its MMA row tiles, in place, both paths in one sequence, agreement with the
// two-kernel path); above it the band path (our GEMM's epilogue sends the partial band by band).
// TAXFREE_AGMM_KSPLIT_PATH (PathEnv) forces the two-kernel or the band path at any M,
// TAXFREE_AGMM_KSPLIT_EXCHANGE the two-kernel path's exchange.
// `nsplit` (each rank one column block of C over the whole K, blocks all-gathered) has the same
// contract and runs through the same tests (parameterized by variant), plus N = 5 (one rank's
// block empty).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>

#include "agmm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using namespace agmm_test;

VariantRun split_run(AgmmVariant v) { return {variant_name(v), false, v}; }

// K / world = 4104: a multiple of 8 (the shard rule), not of 64 (the GEMM's k-block).
Shape ksplit_shape(int64_t m, int64_t n, DType t, BLayout l) { return {m, n, team().world() * 4104, 1, t, l}; }

AgmmArgs replicated(AgmmArgs a) {
  a.b_replicated = true;
  return a;
}

// launch_checked plus C identical on every rank.
void check_ksplit(Ops& ops, Problem& p, const std::string& what, bool in_place = false,
                  AgmmVariant v = AgmmVariant::ksplit) {
  launch_checked(ops, p, split_run(v), replicated(p.args()), what, in_place);
  p.expect_c_same_on_every_rank(what);
}

// TAXFREE_AGMM_KSPLIT_PATH for a scope (every rank sets the same: the ranks must take one path).
// An environment variable the op reads at each launch, set for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};
struct PathEnv : ScopedEnv {
  explicit PathEnv(const char* path) : ScopedEnv("TAXFREE_AGMM_KSPLIT_PATH", path) {}
};

class AgmmKsplit : public ::testing::TestWithParam<std::tuple<DType, BLayout, AgmmVariant>> {};

TEST_P(AgmmKsplit, MatchesReferenceIdenticallyOnEveryRank) {
  TF_REQUIRE_GPUS(1);
  const auto [dtype, layout, v] = GetParam();
  const std::string name = std::string(" ") + variant_name(v);
  Ops ops({}, team().world() * 4104);
  for (int64_t m : {1, 3, 64, 127, 1000}) {
    Problem p(ksplit_shape(m, 1003, dtype, layout), 40 + uint64_t(m), true);
    check_ksplit(ops, p, label(p.shape()) + name, false, v);
    if (m == 127) check_ksplit(ops, p, label(p.shape()) + name + " in place", true, v);
  }
  Problem p(ksplit_shape(2, 3584, dtype, layout), 47, true);  // the paper's decode shape
  check_ksplit(ops, p, label(p.shape()) + name, false, v);
  if (v == AgmmVariant::nsplit) {  // 8-column blocks: rank 0 takes all 5 columns, the others none
    Problem narrow(ksplit_shape(33, 5, dtype, layout), 48, true);
    check_ksplit(ops, narrow, label(narrow.shape()) + name, false, v);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, AgmmKsplit,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::nk, BLayout::kn),
                                            ::testing::Values(AgmmVariant::ksplit, AgmmVariant::nsplit)),
                         [](const auto& info) {
                           return std::string(gemm::dtype_name(std::get<0>(info.param))) + "_" +
                                  gemm::layout_name(std::get<1>(info.param)) + "_" +
                                  variant_name(std::get<2>(info.param));
                         });

// The skinny path on its edges: M across the MMA row tiles (1, 3, 16, 17, 32), and the band path
// just above it and across a 64-row band and a 128-row tile (33, 130); N = 3592 and 1000 (not
// multiples of the 32-column slice or of a tile), K / world = 4104 (not a multiple of the 64-wide K
// chunk), in place at M = 17 and 130; then the two-kernel path on the same inputs agrees to rounding.
class AgmmKsplitPathsAgree : public ::testing::TestWithParam<std::tuple<DType, BLayout>> {};

TEST_P(AgmmKsplitPathsAgree, MatchesReferenceAndTheTwoKernelPath) {
  TF_REQUIRE_GPUS(1);
  const auto [dtype, layout] = GetParam();
  Ops ops({}, team().world() * 4104);
  for (int64_t n : {3592, 1000})
    for (int64_t m : {1, 3, 16, 17, 32, 33, 130}) {
      Problem p(ksplit_shape(m, n, dtype, layout), 100 + uint64_t(m) + uint64_t(n), true);
      const bool skinny_m = m <= agmm::kSkinnyMaxM;
      const std::string what = label(p.shape()) + (skinny_m ? " ksplit-skinny" : " ksplit-bands");
      {
        std::optional<PathEnv> bands;  // below kBandsMinM the band path runs only when forced
        if (!skinny_m) bands.emplace("bands");
        check_ksplit(ops, p, what);
        if (m == 17 || m == 130) check_ksplit(ops, p, what + " in place", true);
      }
      const std::vector<uint16_t> skinny = p.c_bits();
      {
        PathEnv two_kernel("two-kernel");
        check_ksplit(ops, p, label(p.shape()) + " ksplit two-kernel");
      }
      // Both sum the same products in fp32, in different orders (tensor-core K chunks vs cuBLASLt),
      // and round once: they differ by the fp32 order difference (about sqrt(K) * 2^-24 * |row
      // norm| ~ 1e-4 for these inputs; 1e-3 allowed) plus one spacing of T at the larger value.
      const std::vector<uint16_t> old = p.c_bits();
      const int mantissa = dtype == DType::bf16 ? 7 : 10;
      int64_t bad = 0;
      for (size_t i = 0; i < old.size(); ++i) {
        const double x = bits_to_float(dtype, skinny[i]), y = bits_to_float(dtype, old[i]);
        const double big = std::fmax(std::fabs(x), std::fabs(y));
        const double spacing = big > 0 ? std::ldexp(1.0, std::ilogb(big) - mantissa) : 0.0;
        if (skinny[i] == old[i] || std::fabs(x - y) <= spacing + 1e-3) continue;
        if (bad++ < 5) ADD_FAILURE() << what << ": element " << i << " skinny " << x << ", two-kernel " << y;
      }
      EXPECT_EQ(bad, 0) << what << ": elements where the paths differ by more than one rounding and fp32 order";
    }
}

INSTANTIATE_TEST_SUITE_P(Types, AgmmKsplitPathsAgree,
                         ::testing::Combine(::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::nk, BLayout::kn)),
                         [](const auto& info) {
                           return std::string(gemm::dtype_name(std::get<0>(info.param))) + "_" +
                                  gemm::layout_name(std::get<1>(info.param));
                         });

// 1000 launches with no host work between: M = 3 (skinny, one row tile, 113 slices) and M = 32
// (skinny, two row tiles, 32 slices) alternating with M = 33, which takes the two-kernel path and
// (forced) the band path by turns, so all three paths share the epochs; checked and refreshed every
// 250.
TEST(AgmmKsplitSkinnyMany, ThousandLaunchesAcrossBothPaths) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops({}, t.world() * 4104);
  Problem small(ksplit_shape(3, 3592, DType::bf16, BLayout::nk), 110, true);
  Problem mid(ksplit_shape(32, 1000, DType::bf16, BLayout::nk), 111, true);
  Problem tall(ksplit_shape(33, 1000, DType::bf16, BLayout::nk), 112, true);
  auto s = t.stream();
  small.poison_c(s);
  mid.poison_c(s);
  ops.poison(tall);
  align("agmm.skinny.many.poisoned");
  for (int i = 1; i <= 1000; ++i) {
    Problem& p = i % 3 == 0 ? tall : i % 3 == 1 ? small : mid;
    std::optional<PathEnv> bands;
    if (i % 6 == 0) bands.emplace("bands");
    if (i % 250 == 0) p.poison_c(s);  // the checked launch: earlier ones on these inputs wrote the same C
    const GatheredA g = ops.plain->launch(AgmmVariant::ksplit, replicated(p.args()), s);
    if (i % 250 == 0) {
      t.sync(s);
      const std::string what = "ksplit-skinny after " + std::to_string(i) + " launches";
      p.expect_result(g, what, true);
      for (Problem* q : {&small, &mid, &tall})
        if (q != &p) q->expect_c(what + " (another shape)");
      t.host_barrier("agmm.skinny.many.checked");
      small.refresh(113 + uint64_t(i));
      mid.refresh(114 + uint64_t(i));
      tall.refresh(115 + uint64_t(i));
    }
  }
  align("agmm.skinny.many.done");
}

// Epochs and parity buffers: 1000 launches with no host work between, two shapes alternating (the
// slices and CTA counts change from launch to launch), new inputs every 250 launches (each rank
// changes its own inputs once its stream is idle; peers may already be ahead), checked there.
TEST(AgmmKsplitMany, ThousandLaunchesAlternatingShapes) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops({}, t.world() * 4104);
  for (AgmmVariant v : {AgmmVariant::ksplit, AgmmVariant::nsplit}) {
    Problem small(ksplit_shape(5, 1003, DType::bf16, BLayout::nk), 60, true);
    Problem big(ksplit_shape(300, 1003, DType::bf16, BLayout::nk), 61, true);
    auto s = t.stream();
    small.poison_c(s);
    ops.poison(big);
    align("agmm.ksplit.many.poisoned");
    GatheredA g{};
    for (int i = 1; i <= 1000; ++i) {
      Problem& p = i % 3 == 0 ? small : big;
      if (i % 250 == 0) p.poison_c(s);  // the checked launch: earlier ones on these inputs wrote the same C
      g = ops.plain->launch(v, replicated(p.args()), s);
      if (i % 250 == 0) {
        t.sync(s);
        const std::string what = std::string(variant_name(v)) + " after " + std::to_string(i) + " launches";
        p.expect_result(g, what, true);
        (&p == &small ? big : small).expect_c(what + " (the other shape)");
        small.refresh(62 + uint64_t(i));
        big.refresh(63 + uint64_t(i));
      }
    }
    align("agmm.ksplit.many.done");
  }
}

// The two-kernel path's two exchange protocols (all-to-all, and reduce-scatter + all-gather; by
// size they switch at agmm::ksplit_owner_sums, which depends on the world, so here each is forced,
// TAXFREE_AGMM_KSPLIT_EXCHANGE) alternating launch by launch with no host work between, one rank
// 50 ms late at the start, new inputs and a check every 200 launches.
TEST(AgmmKsplitMany, BothExchangeProtocolsAlternating) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops({}, t.world() * 4104);
  Problem a2a(ksplit_shape(200, 1003, DType::bf16, BLayout::nk), 64, true);
  Problem rs(ksplit_shape(300, 3592, DType::bf16, BLayout::kn), 65, true);
  // The size rule picks them so at two ranks.
  ASSERT_FALSE(agmm::ksplit_owner_sums(200 * 1008 * 4, 2));
  ASSERT_TRUE(agmm::ksplit_owner_sums(300 * 3592 * 4, 2));
  auto s = t.stream();
  a2a.poison_c(s);
  ops.poison(rs);
  align("agmm.ksplit.protocols.poisoned");
  if (t.rank() == 0) usleep(50 * 1000);
  GatheredA g{};
  for (int i = 1; i <= 600; ++i) {
    Problem& p = i % 2 == 0 ? a2a : rs;
    if (i % 200 == 0) p.poison_c(s);  // the checked launch: earlier ones on these inputs wrote the same C
    {
      ScopedEnv exchange("TAXFREE_AGMM_KSPLIT_EXCHANGE", &p == &a2a ? "all-to-all" : "owner-sums");
      g = ops.plain->launch(AgmmVariant::ksplit, replicated(p.args()), s);
    }
    if (i % 200 == 0) {
      t.sync(s);
      const std::string what = "ksplit after " + std::to_string(i) + " launches of both protocols";
      p.expect_result(g, what, true);
      (&p == &a2a ? rs : a2a).expect_c(what + " (the other shape)");
      t.host_barrier("agmm.ksplit.protocols.checked");
      a2a.refresh(66 + uint64_t(i));
      rs.refresh(67 + uint64_t(i));
    }
  }
  align("agmm.ksplit.protocols.done");
}

// Each path: M = 17 (skinny), 200 (two-kernel), and 200 with the band path forced; nsplit at 200.
struct KsplitPath {
  int64_t m;
  const char* forced;  // TAXFREE_AGMM_KSPLIT_PATH, or nullptr: by size
  AgmmVariant variant = AgmmVariant::ksplit;
};
class AgmmKsplitPaths : public ::testing::TestWithParam<KsplitPath> {};

TEST_P(AgmmKsplitPaths, RankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops({}, t.world() * 4104);
  std::optional<PathEnv> path;
  if (GetParam().forced) path.emplace(GetParam().forced);
  Problem p(ksplit_shape(GetParam().m, 1003, DType::fp16, BLayout::kn), 70, true);
  const Problem decoy = p.decoy();
  for (int round = 0; round < 2 * t.world(); ++round) {
    ops.poison(p);
    align("agmm.ksplit.skew.poisoned");
    // One rank (a different one each round) starts 100 ms late; odd rounds launch three times
    // back to back (p, its decoy, p into C poisoned again), so the late rank's peers run ahead into
    // the next launches, and a launch reading a partial of the one before computes a wrong C.
    if (t.rank() == round % t.world()) usleep(100 * 1000);
    GatheredA g{};
    const int launches = round % 2 ? 3 : 1;
    for (int i = 0; i < launches; ++i) {
      if (i == launches - 1 && i > 0) p.poison_c(t.stream());
      g = ops.plain->launch(GetParam().variant, replicated(i % 2 ? decoy.args() : p.args()), t.stream());
    }
    t.sync(t.stream());
    p.expect_result(g, std::string(variant_name(GetParam().variant)) + " with rank skew, round " + std::to_string(round),
                    true);
    t.host_barrier("agmm.ksplit.skew.checked");
  }
}

TEST_P(AgmmKsplitPaths, CudaGraphCaptureAndReplay) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops({}, t.world() * 4104);
  std::optional<PathEnv> path;
  if (GetParam().forced) path.emplace(GetParam().forced);
  Problem p(ksplit_shape(GetParam().m, 1003, DType::bf16, BLayout::kn), 80, true);
  auto s = t.stream();
  const AgmmVariant v = GetParam().variant;
  ops.plain->launch(v, replicated(p.args()), s);  // outside the graph: cuBLASLt's plan
  align("agmm.ksplit.graph.warm");
  GatheredA g{};
  const Problem decoy = p.decoy();
  // Both parities: p, its decoy, then p into C poisoned again (a launch reading a partial of the
  // one before it computes a wrong C; the first launch wrote the right one).
  const CapturedGraph graph(s, [&] {
    for (int i = 0; i < 3; ++i) {
      if (i == 2) p.poison_c(s);
      g = ops.plain->launch(v, replicated(i % 2 ? decoy.args() : p.args()), s);
    }
  });
  for (int rep = 0; rep < 4; ++rep) {
    p.refresh(81 + uint64_t(rep));
    ops.poison(p);
    align("agmm.ksplit.graph.poisoned");
    graph.launch(s);
    t.sync(s);
    p.expect_result(g, std::string(variant_name(v)) + " graph replay " + std::to_string(rep), true);
    t.host_barrier("agmm.ksplit.graph.checked");
  }
}

INSTANTIATE_TEST_SUITE_P(M, AgmmKsplitPaths,
                         ::testing::Values(KsplitPath{17, nullptr}, KsplitPath{200, nullptr}, KsplitPath{200, "bands"},
                                           KsplitPath{200, nullptr, AgmmVariant::nsplit}),
                         [](const auto& info) {
                           return "M" + std::to_string(info.param.m) + (info.param.forced ? "_bands" : "") +
                                  (info.param.variant == AgmmVariant::nsplit ? "_nsplit" : "");
                         });

// auto takes ksplit (nsplit from kNsplitMinM) for a replicated B within capacity, something else
// otherwise; all right.
TEST(AgmmKsplitMany, AutoPicksKsplitOnlyWithReplicatedB) {
  TF_REQUIRE_GPUS(1);
  Ops ops({}, team().world() * 4104);
  Problem p(ksplit_shape(7, 1003, DType::bf16, BLayout::nk), 90, true);
  const VariantRun automatic{"auto", false, AgmmVariant::automatic};
  ASSERT_EQ(choose_agmm_variant(replicated(p.args()), team().world(), ops.plain->config()), AgmmVariant::ksplit);
  launch_checked(ops, p, automatic, replicated(p.args()), "auto (ksplit)");
  p.expect_c_same_on_every_rank("auto (ksplit)");
  ASSERT_NE(choose_agmm_variant(p.args(), team().world(), ops.plain->config()), AgmmVariant::ksplit);
  launch_checked(ops, p, automatic, p.args(), "auto without b_replicated");
  Problem tall(ksplit_shape(agmm::kNsplitMinM + 3, 1003, DType::bf16, BLayout::nk), 91, true);
  ASSERT_EQ(choose_agmm_variant(replicated(tall.args()), team().world(), ops.plain->config()), AgmmVariant::nsplit);
  launch_checked(ops, tall, automatic, replicated(tall.args()), "auto (nsplit)");
  tall.expect_c_same_on_every_rank("auto (nsplit)");
}

TEST(AgmmKsplitMany, RejectsBeforeLaunchNamingTheLimit) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  AgmmConfig small;
  small.ksplit_max_m = 64;
  small.ksplit_max_n = 1008;
  Ops ops(small, t.world() * 4104);
  AgmmVariant v = AgmmVariant::ksplit;
  auto expect_error = [&](const std::string& what, const AgmmArgs& a, Status status, const char* needle) {
    try {
      ops.plain->launch(v, a, t.stream());
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), status) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  Problem gd0(odd_shape(0, DType::bf16, BLayout::nk), 95);
  Problem tall(ksplit_shape(65, 1003, DType::bf16, BLayout::nk), 96, true);
  Problem wide(ksplit_shape(8, 1010, DType::bf16, BLayout::nk), 97, true);
  for (AgmmVariant variant : {AgmmVariant::ksplit, AgmmVariant::nsplit}) {
    v = variant;
    expect_error("gather_dim 0", replicated(gd0.args()), Status::NotSupported, variant_name(v));
    expect_error("M over capacity", replicated(tall.args()), Status::InvalidArgument, "ksplit_max_m=64");
    expect_error("B not replicated", tall.args(), Status::InvalidArgument, "b_replicated");
    expect_error("N over capacity", replicated(wide.args()), Status::InvalidArgument, "ksplit_max_n=1008");
    // The sym op has no ksplit buffers.
    try {
      ops.sym->launch(v, replicated(wide.args()), t.stream());
      ADD_FAILURE() << variant_name(v) << " on an op without partial buffers: no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ksplit_max_m=0"), std::string::npos) << e.what();
    }
  }
  // An unknown forced path or exchange names the value, and nothing is enqueued: the next launch
  // (M = 40: the two-kernel path, which reads both) still pairs with the peers' and matches.
  v = AgmmVariant::ksplit;
  Problem mid(ksplit_shape(40, 1003, DType::bf16, BLayout::nk), 98, true);
  {
    PathEnv path("ring");
    expect_error("TAXFREE_AGMM_KSPLIT_PATH=ring", replicated(mid.args()), Status::InvalidArgument, "'ring'");
  }
  {
    ScopedEnv exchange("TAXFREE_AGMM_KSPLIT_EXCHANGE", "tree");
    expect_error("TAXFREE_AGMM_KSPLIT_EXCHANGE=tree", replicated(mid.args()), Status::InvalidArgument, "'tree'");
  }
  check_ksplit(ops, mid, label(mid.shape()) + " ksplit after the refused launches");
  t.host_barrier("agmm.ksplit.invalid.done");
}

}  // namespace
}  // namespace taxfree
