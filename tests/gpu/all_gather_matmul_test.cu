// all_gather_matmul on real GPUs: every variant against a float64 host reference on fresh random
// inputs (odd M, K and N not multiples of any tile, M divisible by the ranks), the gathered A bit
// for bit against the expected shards and identical on every rank, both gather dims, both B
// layouts, bf16 and fp16, in place, tiny pieces, rank skew, 1000 launches without a host-side
// reset, CUDA-graph capture and replay, and validation before launch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <utility>

#include "agmm_test_util.h"
#include "gpu_env.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using namespace agmm_test;

class AgmmEveryVariant : public ::testing::TestWithParam<std::tuple<int, DType, BLayout>> {};

TEST_P(AgmmEveryVariant, MatchesReferenceAndGathersIdentically) {
  TF_REQUIRE_GPUS(1);
  const auto [gd, dtype, layout] = GetParam();
  Ops ops;
  Problem p(odd_shape(gd, dtype, layout), 11 + gd * 4 + int(dtype) * 2 + int(layout));
  for (const VariantRun& run : kRuns) launch_checked(ops, p, run, p.args(), label(p.shape()) + " " + run.name);
  // In place: this rank's shard already sits in the op's gathered A (bsp-sym, decomposed, push,
  // fused-ce, sm-specialized).
  for (const VariantRun& run : {kRuns[1], kRuns[4], kRuns[5], kRuns[6], kRuns[8]})
    launch_checked(ops, p, run, p.args(), label(p.shape()) + " " + run.name + " in place", true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AgmmEveryVariant,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(BLayout::nk, BLayout::kn)),
                         [](const auto& info) {
                           return "gd" + std::to_string(std::get<0>(info.param)) + "_" +
                                  gemm::dtype_name(std::get<1>(info.param)) + "_" +
                                  gemm::layout_name(std::get<2>(info.param));
                         });

// Many pieces (64-column chunks) moved by a single push CTA (sm-specialized: one cluster of
// movers), and the paper's decode shapes (M = 1 and 2, gather_dim 1).
TEST(Agmm, PushWithTinyPiecesOneCtaAndDecodeShapes) {
  TF_REQUIRE_GPUS(1);
  const int64_t w = team().world();
  AgmmConfig cfg;
  cfg.col_chunk = 64;
  cfg.push_ctas = 1;
  Ops ops(cfg);
  const VariantRun push{"push", false, AgmmVariant::push};
  for (const Shape& s : {Shape{w * 200, 520, 1000, 0, DType::bf16, BLayout::nk},
                         Shape{333, 520, w * 264, 1, DType::bf16, BLayout::kn}}) {
    Problem p(s, 77);
    launch_checked(ops, p, push, p.args(), label(s) + " push, 64-column pieces, 1 CTA");
    launch_checked(ops, p, kRuns[8], p.args(), label(s) + " sm-specialized, 64-column pieces, 1 mover cluster");
  }
  Ops defaults;
  for (int64_t m : {1, 2, 7}) {
    const Shape s{m, 3584, w * 1024, 1, DType::bf16, BLayout::kn};
    Problem p(s, 78 + uint64_t(m));
    for (const VariantRun& run : kRuns) launch_checked(defaults, p, run, p.args(), label(s) + " " + run.name);
  }
}

// fused-ce at gather_dim 1 with shards a whole number of k-blocks wide: each rank's GEMM starts
// its k-loop at its own columns and wraps around (first_k_block), M and N not multiples of a tile.
TEST(Agmm, FusedCeGatherDim1RotatedKLoop) {
  TF_REQUIRE_GPUS(1);
  const int64_t w = team().world();
  Ops ops;
  const VariantRun fused{"fused-ce", false, AgmmVariant::fused_ce};
  for (DType t : {DType::bf16, DType::fp16})
    for (BLayout l : {BLayout::nk, BLayout::kn})
      for (const Shape& s : {Shape{333, 1000, w * 320, 1, t, l}, Shape{520, 3584, w * 1024, 1, t, l}}) {
        Problem p(s, 90 + uint64_t(s.m) + uint64_t(t) * 2 + uint64_t(l));
        launch_checked(ops, p, fused, p.args(), label(s) + " fused-ce rotated");
        launch_checked(ops, p, fused, p.args(), label(s) + " fused-ce rotated, in place", true);
      }
}

// pull: the GEMM's producer loads each A tile over NVLink from the rank holding it. Shards of whole
// tiles (gather_dim 0: M / world a multiple of the tile's rows, N and K not; gather_dim 1: K / world
// a multiple of 64, M and N odd; the paper's M = 7), both dtypes and layouts, in place; then one
// rank late in turn while pull alternates with decomposed (they share the epoch and the begin
// barrier). Shards that are not whole tiles: NotSupported, before anything is enqueued.
TEST(Agmm, PullReadsEachTileFromTheRankHoldingIt) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  const int64_t w = t.world();
  Ops ops;
  const VariantRun pull{"pull", false, AgmmVariant::pull};
  uint64_t seed = 700;
  for (DType dt : {DType::bf16, DType::fp16})
    for (BLayout l : {BLayout::nk, BLayout::kn})
      for (const Shape& s : {Shape{w * 256, 1000, 520, 0, dt, l}, Shape{333, 1000, w * 320, 1, dt, l},
                             Shape{7, 3584, w * 1024, 1, dt, l}}) {
        Problem p(s, seed++);
        launch_checked(ops, p, pull, p.args(), label(s) + " pull");
        launch_checked(ops, p, pull, p.args(), label(s) + " pull, in place", true);
      }
  for (int gd : {0, 1}) {
    Problem p(gd == 0 ? Shape{w * 128, 1000, 520, 0, DType::bf16, BLayout::nk}
                      : Shape{200, 1000, w * 256, 1, DType::bf16, BLayout::kn},
              seed++);
    for (int i = 0; i < 2 * int(w); ++i) {
      auto s = t.stream();
      ops.poison(p);
      t.sync(s);
      t.host_barrier("agmm.pull.poisoned");
      if (t.rank() == i % w) usleep(50 * 1000);
      const GatheredA g = ops.plain->launch(i % 2 ? AgmmVariant::decomposed : AgmmVariant::pull, p.args(), s);
      t.sync(s);
      p.expect_result(g, label(p.shape()) + (i % 2 ? " decomposed" : " pull") + " after a late rank " +
                             std::to_string(i % w));
      t.host_barrier("agmm.pull.checked");
    }
  }
  for (int gd : {0, 1}) {
    Problem odd(odd_shape(gd, DType::bf16, BLayout::nk), seed++);
    try {
      ops.plain->launch(AgmmVariant::pull, odd.args(), t.stream());
      ADD_FAILURE() << label(odd.shape()) << ": pull ran on shards that are not whole tiles";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::NotSupported) << e.what();
    }
  }
  t.sync(t.stream());
}

TEST(Agmm, RankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  for (int gd : {0, 1}) {
    Problem p(odd_shape(gd, DType::bf16, BLayout::nk), 300 + uint64_t(gd));
    int round = 0;
    for (const VariantRun& run : {kRuns[0], kRuns[4], kRuns[5], kRuns[6], kRuns[8]}) {
      auto s = t.stream();
      p.poison_c(s);
      ops.plain->fill_buffers(0xFF, s);
      t.sync(s);
      t.host_barrier("agmm.skew.poisoned");
      // One rank (a different one each round) starts 100 ms late.
      if (t.rank() == round++ % t.world()) usleep(100 * 1000);
      const GatheredA g = ops.plain->launch(run.variant, p.args(), s);
      t.sync(s);
      p.expect_result(g, label(p.shape()) + " " + run.name + " with rank skew");
      t.host_barrier("agmm.skew.checked");
    }
  }
}

// decomposed at gather_dim 0 on both sides of kDecEarlyGemmMaxRows: shards of that many rows start
// their GEMM before the begin barrier, one row more keeps the barrier first. Each with one rank
// late (a peer must not copy into a gathered A its owner still reads), then 200 launches back to
// back, every result checked.
TEST(Agmm, DecomposedEarlyAndLateGemmUnderSkewAndRepeats) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops({}, 0, t.world() * (agmm::kDecEarlyGemmMaxRows + 1));
  const VariantRun& run = kRuns[4];
  for (int64_t rows : {agmm::kDecEarlyGemmMaxRows, agmm::kDecEarlyGemmMaxRows + 1}) {
    Problem p(Shape{t.world() * rows, 264, 520, 0, DType::bf16, BLayout::nk}, 600 + uint64_t(rows));
    const Problem decoy = p.decoy();
    const std::string what = label(p.shape()) + " decomposed";
    for (int late = 0; late < t.world(); ++late) {
      auto s = t.stream();
      p.poison_c(s);
      ops.plain->fill_buffers(0xFF, s);
      t.sync(s);
      t.host_barrier("agmm.dec.poisoned");
      if (t.rank() == late) usleep(50 * 1000);
      GatheredA g{};
      for (int i = 0; i < 200; ++i) {
        if (i == 199) p.poison_c(s);  // the earlier launches on p's inputs wrote the same C
        g = ops.plain->launch(run.variant, (199 - i) % 2 ? decoy.args() : p.args(), s);
      }
      t.sync(s);
      p.expect_result(g, what + ", rank " + std::to_string(late) + " late, 200 launches");
      t.host_barrier("agmm.dec.checked");
    }
  }
}

// Epochs, not resets: 1000 launches of each fused variant back to back with no host work between,
// alternating two sets of inputs (the last launch checked), then new inputs and one more launch
// each, checked.
TEST(Agmm, ThousandLaunchesWithoutReset) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops;
  const int64_t w = t.world();
  Problem rows(Shape{w * 96, 264, 520, 0, DType::bf16, BLayout::nk}, 900);
  Problem cols(Shape{96, 264, w * 264, 1, DType::bf16, BLayout::kn}, 900);  // decomposed at gather_dim 1
  const std::pair<Problem*, VariantRun> cases[] = {{&rows, kRuns[5]}, {&rows, kRuns[4]}, {&rows, kRuns[6]},
                                                   {&rows, kRuns[8]}, {&cols, kRuns[4]}, {&cols, kRuns[8]}};
  const Problem rows_decoy = rows.decoy(), cols_decoy = cols.decoy();
  for (const auto& [pp, run] : cases) {
    Problem& p = *pp;
    const Problem& decoy = pp == &rows ? rows_decoy : cols_decoy;
    auto s = t.stream();
    p.poison_c(s);
    ops.plain->fill_buffers(0xFF, s);
    t.sync(s);
    t.host_barrier("agmm.many.poisoned");
    GatheredA g{};
    for (int i = 0; i < 1000; ++i) {
      if (i == 999) p.poison_c(s);  // the earlier launches on p's inputs wrote the same C
      g = ops.plain->launch(run.variant, (999 - i) % 2 ? decoy.args() : p.args(), s);
    }
    t.sync(s);
    p.expect_result(g, label(p.shape()) + " " + run.name + " after 1000 launches");
    t.host_barrier("agmm.many.checked");
    p.refresh(901);
    launch_checked(ops, p, run, p.args(), label(p.shape()) + " " + run.name + " on new inputs after 1000 launches");
    p.refresh(900);
  }
}

// push and sm-specialized share their pieces' flags, the "free" flags and both launch sequences:
// alternating them launch by launch (both gather dims, one rank late) must keep every epoch in step.
TEST(Agmm, PushAndSmSpecializedInterleaved) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Ops ops;
  for (int gd : {0, 1}) {
    Problem p(odd_shape(gd, DType::bf16, BLayout::nk), 950 + uint64_t(gd));
    const Problem decoy = p.decoy();  // push's inputs; sm-specialized's last launch then reads its own
    auto s = t.stream();
    p.poison_c(s);
    ops.plain->fill_buffers(0xFF, s);
    t.sync(s);
    t.host_barrier("agmm.interleave.poisoned");
    if (t.rank() == gd % t.world()) usleep(50 * 1000);
    GatheredA g{};
    for (int i = 0; i < 101; ++i) {
      if (i == 100) p.poison_c(s);  // the earlier launches on p's inputs wrote the same C
      g = ops.plain->launch(i % 2 ? AgmmVariant::push : AgmmVariant::sm_specialized, i % 2 ? decoy.args() : p.args(), s);
    }
    t.sync(s);
    p.expect_result(g, label(p.shape()) + " push / sm-specialized alternating, 101 launches");
    t.host_barrier("agmm.interleave.checked");
  }
}

TEST(Agmm, CudaGraphCaptureAndReplay) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops;
  for (int gd : {0, 1}) {
    Problem p(odd_shape(gd, DType::bf16, BLayout::kn), 700 + uint64_t(gd));
    const Problem decoy = p.decoy();  // the graph's first launch: the second must not read its data
    for (const VariantRun& run : {kRuns[1], kRuns[4], kRuns[5], kRuns[6], kRuns[8]}) {
      AllGatherMatmul& op = run.sym ? *ops.sym : *ops.plain;
      auto s = t.stream();
      op.launch(run.variant, p.args(), s);  // first launch outside the graph: plans, attributes
      t.sync(s);
      t.host_barrier("agmm.graph.warm");
      GatheredA g{};
      const CapturedGraph graph(s, [&] {
        for (int i = 0; i < 2; ++i) g = op.launch(run.variant, i ? p.args() : decoy.args(), s);
      });
      for (int rep = 0; rep < 3; ++rep) {
        p.refresh(710 + uint64_t(rep) + 10 * uint64_t(gd));
        p.poison_c(s);
        ops.plain->fill_buffers(0xFF, s);
        ops.sym->fill_buffers(0xFF, s);
        t.sync(s);
        t.host_barrier("agmm.graph.poisoned");
        graph.launch(s);
        t.sync(s);
        p.expect_result(g, label(p.shape()) + " " + run.name + " graph replay " + std::to_string(rep));
        t.host_barrier("agmm.graph.checked");
      }
    }
  }
}

TEST(Agmm, RejectsBadArgumentsBeforeLaunch) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  Ops ops;
  Problem p(odd_shape(0, DType::bf16, BLayout::nk), 5);
  auto expect_invalid = [&](const std::string& what, AgmmArgs a, const char* needle, AllGatherMatmul* op = nullptr) {
    try {
      (op ? op : ops.plain.get())->launch(AgmmVariant::push, a, t.stream());
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  AgmmArgs a = p.args();
  if (t.world() > 1) {  // on one rank every M is divisible
    a.m += 1;
    expect_invalid("M not divisible", a, "divisible");
    a = p.args();
  }
  a.gather_dim = 1;
  a.k = t.world() * 500 + 1;
  expect_invalid("K not divisible", a, "divisible");
  a = p.args();
  a.m = (ops.plain->config().max_m / t.world() + 1) * t.world();  // the least M over capacity, divisible
  expect_invalid("over capacity", a, "capacity");
  a = p.args();
  a.a_shard = ops.plain->local_slot(a.m, a.k, 0).ptr;  // in the op's buffer but not with its stride
  expect_invalid("A_shard inside the op's buffer", a, "overlaps");
  a = p.args();
  a.c = static_cast<char*>(const_cast<void*>(a.a_shard));
  expect_invalid("C over A_shard", a, "overlaps");
  // Into the flags of the op built last (ops.sym): its heap part ends where the heap does.
  char* const sym_flags = t.heap().view().local_base + t.heap().mark() - 128;
  a = p.args();
  a.c = sym_flags;
  expect_invalid("C over the op's flags", a, "C overlaps the op's flags in the symmetric heap", ops.sym.get());
  a = p.args();
  a.a_shard = sym_flags;
  expect_invalid("A_shard over the op's flags", a, "A_shard overlaps the op's flags", ops.sym.get());
  a = p.args();
  a.b = sym_flags;
  expect_invalid("B over the op's flags", a, "B overlaps the op's flags in the symmetric heap", ops.sym.get());
  a = p.args();
  a.b = ops.plain->local_slot(a.m, a.k, 0).ptr;  // the gathered buffer a launch writes
  expect_invalid("B inside the op's buffer", a, "B overlaps the op's gathered / staging / partial buffers");
  AgmmConfig bad;  // every rank the same: the constructor throws before its first collective step
  bad.side_gather_ctas = agmm::kKsplitMaxCtas + 1;
  try {
    AllGatherMatmul op(t, bad);
    ADD_FAILURE() << "side_gather_ctas over the flags: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("side_gather_ctas=" + std::to_string(bad.side_gather_ctas)),
              std::string::npos)
        << e.what();
  }
  t.host_barrier("agmm.invalid.done");
}

// An op under the launch check mode (RankShare::check_launch through the coordinator, as
// TeamOptions::check_launches sets it up), a problem and `run`: a push launch into poisoned C and
// buffers, checked. Calls body(op, p, run) and returns the heap.
void with_launch_checked_op(
    const std::function<void(AllGatherMatmul&, Problem&, const std::function<void(const std::string&)>&)>& body) {
  auto& t = team();
  static int invocation = 0;  // keys unique across tests and --gtest_repeat (the same count on every rank)
  const std::string key = "agmm-launch-check-" + std::to_string(invocation++);
  const uint64_t mark = t.heap().mark();
  {
    RankShare share = t.share();
    uint64_t launches = 0;
    share.check_launch = [&](const std::string& what) {
      require_same_call(t.coordinator(), key, "op launch", launches++, what, 30);
    };
    AgmmConfig cfg;
    cfg.max_m = 512 * t.world(), cfg.max_k = 1024 * t.world(), cfg.ksplit_max_m = 0;
    AllGatherMatmul op(share, cfg);
    Problem p(odd_shape(0, DType::bf16, BLayout::nk), 901);
    auto s = t.stream();
    const auto run = [&](const std::string& what) {
      p.poison_c(s);
      op.fill_buffers(0xFF, s);
      t.sync(s);
      t.host_barrier("agmm.check.poisoned");
      const GatheredA g = op.launch(AgmmVariant::push, p.args(), s);
      t.sync(s);
      p.expect_result(g, what);
    };
    body(op, p, run);
    t.host_barrier("agmm.check.done");
  }
  t.heap().release(mark);
}

// Launches every rank makes alike pass the launch check and are right.
TEST(Agmm, LaunchCheckPassesLaunchesAlike) {
  TF_REQUIRE_GPUS(1);
  with_launch_checked_op([](AllGatherMatmul&, Problem&, const auto& run) {
    run("push, launch checked");
    run("push again, launch checked");
  });
}

// Rank 1 asking for fewer rows is named on every rank (InvalidUsage, both descriptions) before
// anything is enqueued, and the next launch, alike again, is right.
TEST(Agmm, LaunchCheckNamesTheRankWhoseLaunchDiffers) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  with_launch_checked_op([&](AllGatherMatmul& op, Problem& p, const auto& run) {
    run("push, launch checked");
    const int64_t m1 = p.args().m - t.world();  // still divisible: only the other ranks can tell
    AgmmArgs a = p.args();
    if (t.rank() == 1) a.m = m1;
    try {
      op.launch(AgmmVariant::push, a, t.stream());
      ADD_FAILURE() << "rank " << t.rank() << ": a launch with another M on rank 1 was not refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find("op launch #1 differs across ranks: rank 0 did all_gather_matmul push M=" +
                                           std::to_string(p.args().m)),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 1 did all_gather_matmul push M=" + std::to_string(m1)),
                std::string::npos)
          << e.what();
    }
    run("push after the refused launch, launch checked");
  });
}

}  // namespace
}  // namespace taxfree
