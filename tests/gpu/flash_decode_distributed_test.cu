// flash_decode across ranks (FlashDecode, bsp and fused) on real GPUs, every rank running every
// test, one launch or a few per op: against a double-precision softmax over the whole sequences,
// with odd per-rank slices (12345 tokens on rank 0, 1 on rank 1, 0 on the others), ragged and
// empty sequences, GQA 1..16, head_dim 64/128, bf16 and fp16, paged vs contiguous (bitwise), forced
// split counts and the persistent grid, the three split merges against each other and against bsp
// (bitwise), bad arguments; outputs identical on every rank. Repeated launches, skew, graphs and
// op lifetimes: flash_decode_repeated_test.cu.
//
// Every rank draws the same global data from the same seed (no communication) and uploads only its
// slice, placed at a rank-dependent offset inside its local cache (slice_start != 0) with NaN
// around it, so a read outside the slice shows up. Outputs are poisoned (NaN) before checked runs.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "flash_decode_team_util.h"

namespace taxfree::flash_decode {
namespace {

using namespace test;

// ---------------------------------------------------------------------------------------------

TEST(FlashDecodeDist, OddSlicesEveryGqaRatioBothHeadDimsBothDtypes) {
  TF_REQUIRE_GPUS(1);
  const int world = team().world();
  struct Cfg {
    DType dt;
    int d, gqa;
  };
  std::vector<Cfg> cfgs;
  for (int d : {64, 128})
    for (int gqa : {1, 4, 8, 16}) cfgs.push_back({DType::bf16, d, gqa});
  cfgs.push_back({DType::fp16, 128, 8});  // fp16: a sample
  cfgs.push_back({DType::fp16, 64, 1});
  uint64_t seed = 100;
  for (const Cfg& c : cfgs) {
    Problem p;
    p.dtype = c.dt, p.head_dim = c.d, p.kv_heads = 2, p.q_heads = 2 * c.gqa, p.batch = 4, p.lens = odd_lens(world);
    const Global g = make_global(p, ++seed);
    Local l;
    upload_local(g, l);
    Op op(p);
    for (FlashDecodeVariant v : kVariants) check(g, run_checked(op, v, p, l), name(p) + " " + variant_name(v));
  }
}

TEST(FlashDecodeDist, PlainBspBuffersAndBothVariantsOnOneOp) {
  TF_REQUIRE_GPUS(1);
  Problem p;
  p.q_heads = 64, p.kv_heads = 8, p.batch = 3, p.lens = same_lens(team().world(), {4000, 17, 0});
  const Global g = make_global(p, 7), g2 = with_other_q(g, 8);
  Local l;
  upload_local(g, l);
  Op plain(p, BspBuffers::plain);
  // Alternating variants on one op: bsp keeps its own buffers, so fused's parities stay valid. The
  // q alternates too, so a launch that read the last one's data would show.
  for (int i = 0; i < 3; ++i)
    for (FlashDecodeVariant v : kVariants) {
      const Global& gi = (i + int(v == FlashDecodeVariant::fused)) % 2 ? g2 : g;
      l.q_d.upload(gi.q);
      check(gi, run_checked(plain, v, p, l), std::string("plain ") + variant_name(v));
    }
}

TEST(FlashDecodeDist, PagedMatchesContiguousBitwise) {
  TF_REQUIRE_GPUS(1);
  Problem p;
  p.q_heads = 32, p.kv_heads = 4, p.batch = 4, p.lens = odd_lens(team().world()), p.num_splits = 5;
  const Global g = make_global(p, 21);
  Local l;
  upload_local(g, l);
  Op op(p);
  for (FlashDecodeVariant v : kVariants) {
    l.paged.reset();
    const auto contiguous = run_checked(op, v, p, l);
    check(g, contiguous, std::string("contiguous ") + variant_name(v));
    for (auto [layout, page] : {std::pair{KvLayout::paged_hnd, 16}, std::pair{KvLayout::paged_nhd, 64}}) {
      l.paged = std::make_unique<Paged>(make_paged(l.k, l.v, p.batch, p.kv_heads, l.cap, p.head_dim, layout, page,
                                                   uint64_t(page) + team().rank()));
      const std::string what = std::string(variant_name(v)) + (layout == KvLayout::paged_hnd ? " HND" : " NHD");
      const auto paged = run_checked(op, v, p, l);
      // Same tiles (absolute positions), same splits, same math: same bits.
      EXPECT_TRUE(paged == contiguous) << what << " differs from the contiguous cache";
      expect_same_on_every_rank(paged, what);
    }
  }
  l.paged.reset();
}

TEST(FlashDecodeDist, ForcedSplitCountsAndPersistentGrid) {
  TF_REQUIRE_GPUS(1);
  const int world = team().world();
  // Forced splits, including 64 x 64 groups = 4096 work items: a persistent grid (items > resident
  // CTAs), where CTAs wait on a group and then go on to later items.
  for (int splits : {1, 3, 64}) {
    Problem p;
    p.q_heads = 32, p.kv_heads = 8, p.batch = splits == 64 ? 8 : 3, p.num_splits = splits;
    p.lens = same_lens(world, std::vector<int32_t>(size_t(p.batch), 2000));
    p.lens[0][0] = 1;  // one short sequence slice
    const Global g = make_global(p, 300 + splits);
    Local l;
    upload_local(g, l);
    Op op(p);
    const FusedPlan fp = op->fused_plan(l.args(p));
    EXPECT_EQ(fp.num_splits, splits);
    if (splits == 64) EXPECT_LT(fp.grid, fp.items) << "expected a persistent grid";
    for (FlashDecodeVariant v : kVariants) check(g, run_checked(op, v, p, l), name(p) + " " + variant_name(v));
  }
  // More groups than resident CTAs with one split each: 40 x 8 = 320 groups.
  Problem p;
  p.q_heads = 8, p.kv_heads = 8, p.head_dim = 64, p.batch = 40, p.num_splits = 1;
  p.lens = same_lens(world, std::vector<int32_t>(40, 100));
  const Global g = make_global(p, 400);
  Local l;
  upload_local(g, l);
  Op op(p);
  const FusedPlan fp = op->fused_plan(l.args(p));
  EXPECT_EQ(fp.items, 320);
  EXPECT_LE(fp.grid, fp.resident);
  for (FlashDecodeVariant v : kVariants)
    check(g, run_checked(op, v, p, l), std::string("320 groups ") + variant_name(v));
}

// b=1, 96/12 heads, small odd slices: the heuristic's plan (11 splits on an H200), and the fused
// output (partials exchanged as LL lines, combined from the lines) bitwise equal to bsp's (the
// same partials through NCCL and the combine kernel: same weights, same order).
TEST(FlashDecodeDist, SmallBatchAutoPlanFusedMatchesBspBitwise) {
  TF_REQUIRE_GPUS(1);
  const int world = team().world();
  for (auto [q, kv, d] : {std::tuple{96, 12, 128}, std::tuple{64, 8, 128}, std::tuple{8, 1, 64}}) {
    Problem p;
    p.q_heads = q, p.kv_heads = kv, p.head_dim = d, p.batch = 1;
    p.lens.clear();
    for (int r = 0; r < world; ++r) p.lens.push_back({r == 0 ? 12345 : r == 1 ? 1 : 8192});
    const Global g = make_global(p, 77 + q);
    Local l;
    upload_local(g, l);
    Op op(p);
    const FusedPlan fp = op->fused_plan(l.args(p));
    if (team().rank() == 0) EXPECT_GT(fp.num_splits, 1) << "rank 0 holds 12345 tokens of one sequence";
    // bsp at the fused plan's split count (the clustered schedule may take fewer than the heuristic).
    Problem same = p;
    same.num_splits = fp.num_splits;
    Op forced(same);
    const auto bsp = run_checked(forced, FlashDecodeVariant::bsp, same, l);
    const auto fused = run_checked(op, FlashDecodeVariant::fused, p, l);
    check(g, bsp, name(p) + " bsp");
    check(g, fused, name(p) + " fused");
    EXPECT_TRUE(fused == bsp) << name(p) << ": fused differs from bsp";
  }
}

// c's q/kv heads, head_dim, batch and forced splits; rank 0 holds c.lens, rank 1 one token of each
// non-empty sequence, the others 3000: ranks get different split counts.
struct SkewCase {
  int q, kv, d, batch, splits;
  std::vector<int32_t> lens;  // rank 0's (rank1_short)
  bool direct = true;         // whether the direct split merge applies
};
Problem rank1_short(const SkewCase& c) {
  Problem p;
  p.q_heads = c.q, p.kv_heads = c.kv, p.head_dim = c.d, p.batch = c.batch, p.num_splits = c.splits;
  for (int r = 0; r < team().world(); ++r) {
    std::vector<int32_t> l = c.lens;
    if (r > 0)
      for (int32_t& x : l) x = x == 0 ? 0 : r == 1 ? 1 : 3000;
    p.lens.push_back(l);
  }
  return p;
}
// The heuristic's plan at 96/12 and 64/8 heads (one or two rows per CTA), GQA 16 over 3 splits,
// GQA 1 over 7 forced splits (one CTA with a row), head_dim 64, an empty sequence, a sequence too
// short for more than one split.
const std::vector<SkewCase>& skew_cases() {
  static const std::vector<SkewCase> cases = {
      {96, 12, 128, 1, 0, {12345}}, {64, 8, 128, 1, 0, {5000}}, {16, 1, 64, 3, 0, {700, 0, 600}}, {4, 4, 128, 2, 7, {3000, 17}}};
  return cases;
}

// The clustered schedule (splits merged through the cluster's shared memory, rows spread over the
// cluster's CTAs) against the persistent one (global-memory merge) at the same split count, on
// the same inputs: the same bits, both right, launch after launch on the same ops (epochs of both
// parities), with ranks on different schedules where their slices give them different split
// counts (rank 1 holds one token), and bitwise equal to bsp at that split count. Shapes: the
// heuristic's plan at 96/12 and 64/8 heads (one or two rows per CTA), GQA 16 over 3 splits (blocks
// of 6, 6, 4 rows), GQA 1 over 7 forced splits (one CTA with a row), head_dim 64, an empty
// sequence, a sequence too short for more than one split.
TEST(FlashDecodeDist, ClusterSplitMergeMatchesGlobalMergeBitwise) {
  TF_REQUIRE_GPUS(1);
  const int rank = team().rank();
  uint64_t seed = 3100;
  for (const SkewCase& c : skew_cases()) {
    const Problem p = rank1_short(c);
    const Global g = make_global(p, ++seed);
    Local l;
    upload_local(g, l);
    Op clustered(p);
    const FusedPlan cp = clustered->fused_plan(l.args(p));
    std::printf("[rank %d] %s: splits %d, cluster %d, grid %d\n", rank, name(p).c_str(), cp.num_splits, cp.cluster,
                cp.grid);
    if (rank == 0) {  // these groups fit an H200 at once
      EXPECT_EQ(cp.cluster, cp.num_splits) << name(p) << ": expected the clustered schedule";
      EXPECT_EQ(cp.grid, cp.items);
      if (c.splits != 0) EXPECT_EQ(cp.num_splits, c.splits) << "a forced split count is kept";
    }
    Problem same = p;  // the persistent schedule at the clustered plan's split count
    same.num_splits = cp.num_splits;
    Op global(same, BspBuffers::symmetric, Op::SplitMerge::global);
    EXPECT_EQ(global->fused_plan(l.args(same)).cluster, 0);
    const Global g2 = with_other_q(g, seed + 50);
    for (int round = 0; round < 3; ++round) {  // the q alternates: a partial read a launch early shows
      const std::string what = name(p) + " round " + std::to_string(round);
      const Global& gr = round % 2 ? g2 : g;
      l.q_d.upload(gr.q);
      const auto a = run_checked(clustered, FlashDecodeVariant::fused, p, l);
      const auto b = run_checked(global, FlashDecodeVariant::fused, same, l);
      check(gr, a, what + " clustered");
      check(gr, b, what + " global");
      EXPECT_TRUE(a == b) << what << ": the clustered merge differs from the global one";
      if (round == 0)
        EXPECT_TRUE(a == run_checked(global, FlashDecodeVariant::bsp, same, l)) << what << ": differs from bsp";
    }
  }
}

// The direct split merge (raw split partials to every rank, splits and ranks merged in one step by
// the rows' owners) against bsp at the direct plan's split count: the same bits, right, launch
// after launch on one op (both inbox parities), with ranks at different split counts (rank 1 holds
// one token of each sequence: one split, its lines say so), an empty sequence, GQA 16 (one CTA
// merging all 16 rows when a rank has one split), head_dim 64, forced splits (7, and 24 capped at
// 16). A shape past the direct limits (192 rows) falls back to the clustered schedule on every
// rank.
TEST(FlashDecodeDist, DirectSplitMergeMatchesBspBitwise) {
  TF_REQUIRE_GPUS(1);
  const int rank = team().rank();
  std::vector<SkewCase> cases = skew_cases();
  cases.push_back({32, 2, 128, 1, 24, {9000}});
  cases.push_back({64, 8, 128, 3, 0, {2000, 5, 0}, false});
  uint64_t seed = 5100;
  for (const SkewCase& c : cases) {
    const Problem p = rank1_short(c);
    const Global g = make_global(p, ++seed);
    Local l;
    upload_local(g, l);
    Op direct(p, BspBuffers::symmetric, Op::SplitMerge::direct);
    const FusedPlan dp = direct->fused_plan(l.args(p));
    std::printf("[rank %d] %s: splits %d, direct %d, cluster %d, grid %d\n", rank, name(p).c_str(), dp.num_splits,
                int(dp.direct), dp.cluster, dp.grid);
    EXPECT_EQ(dp.direct, c.direct) << name(p);
    if (dp.direct) {
      EXPECT_EQ(dp.cluster, 0);
      EXPECT_EQ(dp.grid, dp.items);
      EXPECT_LE(dp.grid, dp.resident);
      EXPECT_LE(dp.num_splits, 16);
      if (rank == 0 && c.splits == 7) EXPECT_EQ(dp.num_splits, 7) << "a forced split count is kept";
      if (rank == 0 && c.splits == 24) EXPECT_EQ(dp.num_splits, 16) << "capped at 16 splits";
    }
    Problem same = p;  // bsp at the direct plan's split count
    same.num_splits = dp.num_splits;
    Op forced(same);
    const Global g2 = with_other_q(g, seed + 50);
    for (int round = 0; round < 3; ++round) {  // the q alternates: a partial read a launch early shows
      const std::string what = name(p) + " direct round " + std::to_string(round);
      const Global& gr = round % 2 ? g2 : g;
      l.q_d.upload(gr.q);
      const auto a = run_checked(direct, FlashDecodeVariant::fused, p, l);
      check(gr, a, what);
      if (round != 1)
        EXPECT_TRUE(a == run_checked(forced, FlashDecodeVariant::bsp, same, l)) << what << ": differs from bsp";
    }
  }
}

TEST(FlashDecodeDist, RejectsBadArgumentsBeforeLaunch) {
  TF_REQUIRE_GPUS(1);
  Problem p;
  p.q_heads = 16, p.kv_heads = 2, p.batch = 2, p.lens = same_lens(team().world(), {100, 3});
  const Global g = make_global(p, 1);
  Local l;
  upload_local(g, l);
  Op op(p);
  auto expect_invalid = [&](const char* what, DecodeArgs a, const char* needle,
                            FlashDecodeVariant v = FlashDecodeVariant::fused) {
    try {
      op->launch(v, a, team().stream());
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::InvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  DecodeArgs a = l.args(p);
  a.batch = 3;
  a.host_slice_len = {}, a.host_slice_start = {};
  expect_invalid("batch above max", a, "batch=3 exceeds");
  a = l.args(p);
  a.o_part = reinterpret_cast<float*>(l.out_d.p);
  expect_invalid("o_part set", a, "o_part=");
  a = l.args(p);
  a.out = nullptr;
  expect_invalid("no out", a, "out is null");
  // Into the op's own memory: its heap part ends where the heap does (the op was built last), in
  // the line of its last sequence.
  char* const op_flags = team().heap().view().local_base + team().heap().mark() - 128;
  a = l.args(p);
  a.out = op_flags;
  expect_invalid("out over the op's flags", a, "out=");
  expect_invalid("out over the op's flags", a, "overlaps the op's flags and buffers in the symmetric heap");
  a = l.args(p);
  a.q = op_flags;
  expect_invalid("q over the op's flags", a, "overlaps the op's flags and buffers in the symmetric heap");
  // Every input, for both variants: bsp checks once, then its stages do not check again.
  for (FlashDecodeVariant v : {FlashDecodeVariant::fused, FlashDecodeVariant::bsp}) {
    a = l.args(p);
    a.k = op_flags;
    expect_invalid("k over the op's flags", a, "k=", v);
    expect_invalid("k over the op's flags", a, "overlaps the op's flags and buffers in the symmetric heap", v);
    a = l.args(p);
    a.slice_len = reinterpret_cast<int32_t*>(op_flags);
    expect_invalid("slice_len over the op's flags", a, "slice_len=", v);
  }
  try {
    op->launch(FlashDecodeVariant(9), l.args(p), team().stream());
    ADD_FAILURE() << "bad variant: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
  }
  team().sync(team().stream());
}

}  // namespace
}  // namespace taxfree::flash_decode
