// flash_decode across ranks (FlashDecode, bsp and fused) on real GPUs, every rank running every
// test: against a double-precision softmax over the whole sequences, with odd per-rank slices
// (12345 tokens on rank 0, 1 on rank 1, 0 on the others), ragged and empty sequences, GQA 1..16,
// head_dim 64/128, bf16 and fp16, paged vs contiguous (bitwise), forced split counts and the
// persistent grid, large batch (192-256 groups), 1000 fused steps without a reset, ops built and
// dropped thousands of times, rank skew, CUDA-graph replay, inputs written by an early-triggering
// kernel ahead (dependent launch), and outputs identical on every rank.
//
// Every rank draws the same global data from the same seed (no communication) and uploads only its
// slice, placed at a rank-dependent offset inside its local cache (slice_start != 0) with NaN
// around it, so a read outside the slice shows up. Outputs are poisoned (NaN) before checked runs.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../../src/ops/flash_decode/reference.h"
#include "flash_decode_dist_util.h"
#include "flash_decode_util.h"
#include "gpu_env.h"
#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/device/scoped_memory.cuh"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::ops::flash_decode {
namespace {

using namespace test;
using ::taxfree::test::team;

void upload_local(const Global& g, Local& l) { upload_local(g, l, team().rank()); }

// The op and the heap space it took (released when this goes out of scope).
struct Op {
  uint64_t mark;
  std::unique_ptr<FlashDecode> op;
  using SplitMerge = FlashDecodeConfig::SplitMerge;
  Op(const Problem& p, BspBuffers bsp = BspBuffers::symmetric, SplitMerge merge = SplitMerge::cluster)
      : mark(team().heap().mark()) {
    FlashDecodeConfig c;
    c.max_batch = p.batch, c.max_q_heads = p.q_heads, c.max_kv_heads = p.kv_heads, c.max_head_dim = p.head_dim;
    c.num_splits = p.num_splits, c.bsp_buffers = bsp, c.split_merge = merge;
    op = std::make_unique<FlashDecode>(team(), c);
  }
  ~Op() {
    op.reset();
    team().heap().release(mark);
  }
  FlashDecode* operator->() { return op.get(); }
};

std::vector<uint16_t> download_out(const Local& l) {
  TF_CUDA(cudaStreamSynchronize(team().stream()));
  return l.out_d.download();
}

// Poison, align the ranks (peers write into this rank's buffers only after it is ready), launch,
// wait, download.
std::vector<uint16_t> run_checked(Op& op, Variant v, const Problem& p, Local& l) {
  auto& t = team();
  TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
  t.sync(t.stream());
  t.host_barrier("fdd.run");
  op->launch(v, l.args(p), t.stream());
  t.sync(t.stream());
  return download_out(l);
}

// Collective: every rank's output must equal rank 0's bit for bit (compared by hash).
void expect_same_on_all_ranks(const std::vector<uint16_t>& out, const std::string& what) {
  static int calls = 0;
  uint64_t h = 1469598103934665603ull;
  for (uint16_t x : out) h = (h ^ x) * 1099511628211ull;
  const auto all = team().coordinator().all_gather("fdd.hash." + std::to_string(calls++), std::to_string(h), 120);
  for (size_t r = 1; r < all.size(); ++r) EXPECT_EQ(all[r], all[0]) << what << ": rank " << r << " differs from rank 0";
}

void check(const Global& g, const std::vector<uint16_t>& out, const std::string& what) {
  EXPECT_EQ(count_wrong(g, out, what), 0) << what;
  expect_same_on_all_ranks(out, what);
}

std::string name(const Problem& p) {
  return std::string(p.dtype == DType::BF16 ? "bf16" : "fp16") + " D=" + std::to_string(p.head_dim) +
         " heads=" + std::to_string(p.q_heads) + "/" + std::to_string(p.kv_heads) +
         " splits=" + std::to_string(p.num_splits);
}

constexpr Variant kVariants[] = {Variant::bsp, Variant::fused};

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
    for (int gqa : {1, 4, 8, 16}) cfgs.push_back({DType::BF16, d, gqa});
  cfgs.push_back({DType::FP16, 128, 8});  // fp16: a sample
  cfgs.push_back({DType::FP16, 64, 1});
  uint64_t seed = 100;
  for (const Cfg& c : cfgs) {
    Problem p;
    p.dtype = c.dt, p.head_dim = c.d, p.kv_heads = 2, p.q_heads = 2 * c.gqa, p.batch = 4, p.lens = odd_lens(world);
    const Global g = make_global(p, ++seed);
    Local l;
    upload_local(g, l);
    Op op(p);
    for (Variant v : kVariants) check(g, run_checked(op, v, p, l), name(p) + " " + variant_name(v));
  }
}

TEST(FlashDecodeDist, PlainBspBuffersAndBothVariantsOnOneOp) {
  TF_REQUIRE_GPUS(1);
  Problem p;
  p.q_heads = 64, p.kv_heads = 8, p.batch = 3, p.lens = same_lens(team().world(), {4000, 17, 0});
  const Global g = make_global(p, 7);
  Local l;
  upload_local(g, l);
  Op plain(p, BspBuffers::plain);
  // Alternating variants on one op: bsp keeps its own buffers, so fused's parities stay valid.
  for (int i = 0; i < 3; ++i)
    for (Variant v : kVariants) check(g, run_checked(plain, v, p, l), std::string("plain ") + variant_name(v));
}

TEST(FlashDecodeDist, PagedMatchesContiguousBitwise) {
  TF_REQUIRE_GPUS(1);
  Problem p;
  p.q_heads = 32, p.kv_heads = 4, p.batch = 4, p.lens = odd_lens(team().world()), p.num_splits = 5;
  const Global g = make_global(p, 21);
  Local l;
  upload_local(g, l);
  Op op(p);
  for (Variant v : kVariants) {
    l.paged.reset();
    const auto contiguous = run_checked(op, v, p, l);
    check(g, contiguous, std::string("contiguous ") + variant_name(v));
    for (auto [layout, page] : {std::pair{KvLayout::PagedHND, 16}, std::pair{KvLayout::PagedNHD, 64}}) {
      l.paged = std::make_unique<Paged>(make_paged(l.k, l.v, p.batch, p.kv_heads, l.cap, p.head_dim, layout, page,
                                                   uint64_t(page) + team().rank()));
      const std::string what = std::string(variant_name(v)) + (layout == KvLayout::PagedHND ? " HND" : " NHD");
      const auto paged = run_checked(op, v, p, l);
      // Same tiles (absolute positions), same splits, same math: same bits.
      EXPECT_TRUE(paged == contiguous) << what << " differs from the contiguous cache";
      expect_same_on_all_ranks(paged, what);
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
    for (Variant v : kVariants) check(g, run_checked(op, v, p, l), name(p) + " " + variant_name(v));
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
  for (Variant v : kVariants) check(g, run_checked(op, v, p, l), std::string("320 groups ") + variant_name(v));
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
    const auto bsp = run_checked(forced, Variant::bsp, same, l);
    const auto fused = run_checked(op, Variant::fused, p, l);
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
    for (int round = 0; round < 3; ++round) {
      const std::string what = name(p) + " round " + std::to_string(round);
      const auto a = run_checked(clustered, Variant::fused, p, l);
      const auto b = run_checked(global, Variant::fused, same, l);
      check(g, a, what + " clustered");
      check(g, b, what + " global");
      EXPECT_TRUE(a == b) << what << ": the clustered merge differs from the global one";
      if (round == 0) EXPECT_TRUE(a == run_checked(global, Variant::bsp, same, l)) << what << ": differs from bsp";
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
    for (int round = 0; round < 3; ++round) {
      const std::string what = name(p) + " direct round " + std::to_string(round);
      const auto a = run_checked(direct, Variant::fused, p, l);
      check(g, a, what);
      if (round != 1) EXPECT_TRUE(a == run_checked(forced, Variant::bsp, same, l)) << what << ": differs from bsp";
    }
  }
}

// Large batch, as in the bench rows where polling every line slowed the kernel: 192 and 256 groups
// of one split each, every CTA waiting (one thread per peer, then every line read) while others
// still decode. Slices differ by rank and some are empty, and a rank starts late now and then, so
// the waits are real; 24 steps on one op, each against the float64 reference, across ranks every
// 6th, and the first bitwise equal to bsp.
TEST(FlashDecodeDist, LargeBatchManyGroupsRepeatedSkewedSteps) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  const int world = t.world();
  for (auto [batch, q, kv] : {std::tuple{16, 96, 12}, std::tuple{32, 64, 8}}) {
    Problem p;
    p.q_heads = q, p.kv_heads = kv, p.batch = batch;
    p.lens.assign(size_t(world), std::vector<int32_t>(size_t(batch)));
    for (int r = 0; r < world; ++r)  // < 800 tokens per sequence in all (the host reference's memory)
      for (int b = 0; b < batch; ++b)
        p.lens[size_t(r)][size_t(b)] = b % 5 == 4 && r == 0 ? 0 : (b * 37 + r * 211) % 400 * 2 / world;
    const Global g = make_global(p, 1300 + batch);
    Local l;
    upload_local(g, l);
    Op op(p);
    const FusedPlan fp = op->fused_plan(l.args(p));
    if (batch * kv >= t.sm_count())  // no cluster of a group's splits fits: the split plan's count
      EXPECT_EQ(fp.num_splits, choose_splits(batch, kv, l.args(p).max_len, t.sm_count())) << "groups >= SMs";
    const std::string what = name(p) + " b=" + std::to_string(batch);
    const auto bsp = run_checked(op, Variant::bsp, p, l);
    check(g, bsp, what + " bsp");
    Rng delay{uint64_t(t.rank()) + 31};
    t.host_barrier("fdd.large");
    for (int step = 0; step < 24; ++step) {
      TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
      if (step % world == t.rank() && step % 3 == 1) usleep(500 + delay.below(3000));  // this rank starts late
      op->launch(Variant::fused, l.args(p), t.stream());
      const auto out = download_out(l);
      const std::string at = what + " fused step " + std::to_string(step);
      EXPECT_EQ(count_wrong(g, out, at), 0) << at;  // no early exit: the peers would wait for this rank
      if (step == 0) EXPECT_TRUE(out == bsp) << at << ": fused differs from bsp";
      if (step % 6 == 5) expect_same_on_all_ranks(out, at);
    }
  }
}

// The LL exchange under stress: 1000 consecutive fused steps on one op without a reset, each step
// one of three problems (different rows, head_dim 64 and 128, so the lines of one step sit where
// another step's lines of other rows were) with one of two q, in a pattern that changes the
// inputs at every step; odd slices with empty ones on some ranks; no barrier between steps and a
// random rank delayed now and then. Every step is checked against its float64 reference, and
// every 50th across ranks. With the clustered, the direct and the global split merge.
TEST(FlashDecodeDist, LlThousandStepsChangingShapesAndInputs) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const int world = t.world();
  Problem ps[3];
  ps[0].q_heads = 16, ps[0].kv_heads = 2, ps[0].batch = 4, ps[0].lens = odd_lens(world);
  ps[1].q_heads = 96, ps[1].kv_heads = 12, ps[1].batch = 1, ps[1].lens = same_lens(world, {3001});
  ps[1].lens[0][0] = 0;  // rank 0 holds none of it
  ps[2].q_heads = 8, ps[2].kv_heads = 4, ps[2].head_dim = 64, ps[2].batch = 3;
  ps[2].lens = same_lens(world, {0, 17, 900});
  Problem big;  // maxima of the three
  big.q_heads = 96, big.kv_heads = 12, big.batch = 4, big.lens = ps[0].lens;
  std::vector<Global> gs[3];
  Local ls[3];
  for (int i = 0; i < 3; ++i) {
    gs[i].push_back(make_global(ps[i], 2000 + 10 * i));
    Global other = gs[i][0];
    draw_q(other, 2005 + 10 * i);
    compute_reference(other);
    gs[i].push_back(std::move(other));
    upload_local(gs[i][0], ls[i]);
  }
  // global at 64 forced splits: the persistent schedule with several items per CTA (512-768 items,
  // many past their sequence's splits), its tickets over item counts that change every step.
  for (auto merge : {Op::SplitMerge::cluster, Op::SplitMerge::direct, Op::SplitMerge::global}) {
    big.num_splits = merge == Op::SplitMerge::global ? 64 : 0;
    Op op(big, BspBuffers::symmetric, merge);
    if (merge == Op::SplitMerge::global)
      for (int i = 0; i < 3; ++i) {
        const FusedPlan fp = op->fused_plan(ls[i].args(ps[i]));
        EXPECT_LT(fp.grid, fp.items) << "problem " << i << ": expected several items per CTA";
      }
    if (merge == Op::SplitMerge::direct)
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(op->fused_plan(ls[i].args(ps[i])).direct) << "problem " << i;
    Rng rng{4242};  // the same on every rank: the same problem sequence everywhere
    Rng delay{uint64_t(t.rank()) + 17};
    int version[3] = {0, 0, 0};
    t.host_barrier("fdd.ll1000");
    for (int step = 0; step < 1000; ++step) {
      const int i = int(rng.below(3));
      Local& l = ls[i];
      version[i] ^= 1;  // the other q than this problem's last step
      const Global& g = gs[i][size_t(version[i])];
      TF_CUDA(cudaMemcpyAsync(l.q_d.p, g.q.data(), g.q.size() * 2, cudaMemcpyHostToDevice, t.stream()));
      TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
      if (step % 97 == int(delay.below(97))) usleep(2000 + delay.below(20'000));  // skew
      op->launch(Variant::fused, l.args(ps[i]), t.stream());
      const auto out = download_out(l);
      const std::string what = std::string(merge == Op::SplitMerge::direct   ? "direct"
                                           : merge == Op::SplitMerge::global ? "global"
                                                                             : "cluster") +
                               " step " +
                               std::to_string(step) + " problem " + std::to_string(i);
      EXPECT_EQ(count_wrong(g, out, what), 0) << what;  // no early exit: the peers would wait for this rank
      if (step % 50 == 49) expect_same_on_all_ranks(out, what);
    }
  }
}

// One rank reads its peers' lines late (set_combine_delay_ns, after sending its own) while the
// peers run a launch ahead into another shape, on both inbox parities: the parities must never
// overlap, whatever the two shapes (r73 found them overlapping on 4 ranks; this provokes it on any
// world). The host collective comes after the loop, so nothing else holds the peers back.
TEST(FlashDecodeDist, LateReaderWhilePeersRunAheadIntoAnotherShape) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  const int world = t.world();
  Problem ps[2];
  ps[0].q_heads = 96, ps[0].kv_heads = 12, ps[0].batch = 4, ps[0].lens = same_lens(world, {300, 77, 1, 512});
  ps[1].q_heads = 8, ps[1].kv_heads = 4, ps[1].head_dim = 64, ps[1].batch = 3;
  ps[1].lens = same_lens(world, {17, 900, 5});
  const Global gs[2] = {make_global(ps[0], 3100), make_global(ps[1], 3200)};
  Local ls[2];
  for (int i = 0; i < 2; ++i) upload_local(gs[i], ls[i]);
  // Direct: ps[0] (384 rows) is past its limits and runs clustered, ps[1] direct: the peers also
  // switch between the two layouts.
  for (auto merge : {Op::SplitMerge::cluster, Op::SplitMerge::direct}) {
    Op op(ps[0], BspBuffers::symmetric, merge);  // maxima: ps[0]'s, head_dim 128
    if (t.rank() == world - 1) op->set_combine_delay_ns(2'000'000);  // >> a peer's host time between steps
    t.host_barrier("fdd.late_reader");
    std::vector<uint16_t> out;
    std::string what;
    for (int step = 0; step < 16; ++step) {
      const int i = (step / 2) % 2;  // big, big, small, small, ...: each change on both parities
      TF_CUDA(cudaMemsetAsync(ls[i].out_d.p, 0xFF, ls[i].out_d.n * 2, t.stream()));
      op->launch(Variant::fused, ls[i].args(ps[i]), t.stream());
      out = download_out(ls[i]);
      what = "step " + std::to_string(step) + " " + name(ps[i]) + (merge == Op::SplitMerge::direct ? " direct" : "");
      EXPECT_EQ(count_wrong(gs[i], out, what), 0) << what;
    }
    op->set_combine_delay_ns(0);
    expect_same_on_all_ranks(out, what);
  }
}

// Two sequences of odd_lens' first two slices, 2 KV heads: the long-running tests' small problem.
Problem two_odd_sequences(int q_heads) {
  Problem p;
  p.q_heads = q_heads, p.kv_heads = 2, p.batch = 2, p.lens = odd_lens(team().world());
  for (auto& r : p.lens) r.resize(2);
  return p;
}

TEST(FlashDecodeDist, ThousandFusedStepsWithoutResetFreshInputs) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const Problem p = two_odd_sequences(16);
  Global g = make_global(p, 500);
  Local l;
  upload_local(g, l);
  Op op(p);
  const DecodeArgs a = l.args(p);
  t.host_barrier("fdd.1000");
  for (int i = 0; i < 1000; ++i) {
    if (i % 100 == 0 && i > 0) {  // fresh q, stream-ordered between steps
      draw_q(g, 1000 + i);
      compute_reference(g);
      TF_CUDA(cudaMemcpyAsync(l.q_d.p, g.q.data(), g.q.size() * 2, cudaMemcpyHostToDevice, t.stream()));
    }
    const bool checked = i == 0 || i == 99 || i == 100 || i == 500 || i == 999;
    if (checked) TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
    // A bsp step now and then: it must not disturb the fused epochs.
    op->launch(i % 97 == 50 ? Variant::bsp : Variant::fused, a, t.stream());
    if (checked) {
      t.sync(t.stream());
      check(g, download_out(l), "step " + std::to_string(i));
    }
  }
  t.sync(t.stream());
}

// Ops built, launched and dropped 2500 times in one Team (5000 launch sequences: more than the fixed
// pool of 4096 a Team once had), each on the heap its predecessor left dirty: every op's epochs
// start again from a zero counter and its results stay right; the heap ends where it began.
TEST(FlashDecodeDist, OpsBuiltAndDroppedThousandsOfTimes) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const Problem p = two_odd_sequences(8);
  const Global g = make_global(p, 77);
  Local l;
  upload_local(g, l);
  const uint64_t start = t.heap().used();
  for (int i = 0; i < 2500; ++i) {
    Op op(p);
    const Variant v = i % 2 ? Variant::fused : Variant::bsp;
    if (i % 250 == 0 || i == 2499) {
      check(g, run_checked(op, v, p, l), "op " + std::to_string(i) + " " + variant_name(v));
      check(g, run_checked(op, Variant::fused, p, l), "op " + std::to_string(i) + " second launch");
    } else {
      op->launch(v, l.args(p), t.stream());
      t.sync(t.stream());  // the op's work is done before its heap goes back
    }
  }
  EXPECT_EQ(t.heap().used(), start);
}

TEST(FlashDecodeDist, RankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  Problem p;
  p.q_heads = 64, p.kv_heads = 8, p.batch = 2, p.lens = same_lens(t.world(), {3000, 5});
  const Global g = make_global(p, 600);
  Local l;
  upload_local(g, l);
  Op op(p), direct(p, BspBuffers::symmetric, Op::SplitMerge::direct);
  Rng rng{uint64_t(t.rank()) + 9};
  for (int round = 0; round < 2 * t.world(); ++round)
    for (int v = 0; v < 3; ++v) {  // bsp, fused, fused with the direct split merge
      TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
      t.sync(t.stream());
      t.host_barrier("fdd.skew");
      if (t.rank() == round % t.world()) usleep(50'000 + rng.below(100'000));  // this rank starts late
      for (int k = 0; k < 3; ++k) (v == 2 ? direct : op)->launch(kVariants[v % 2], l.args(p), t.stream());
      t.sync(t.stream());
      check(g, download_out(l), "skew round " + std::to_string(round) + " " + std::to_string(v));
    }
}

// 64/8 heads, batch 2, 2500 + 1 tokens on every rank (128 rows: the direct merge applies too), this
// rank's slice uploaded, and one op of each split merge.
struct BothMerges {
  Problem p = problem();
  Global g;
  Local l;
  Op cluster{p}, direct{p, BspBuffers::symmetric, Op::SplitMerge::direct};
  explicit BothMerges(uint64_t seed) : g(make_global(p, seed)) {
    upload_local(g, l);
    EXPECT_TRUE(direct->fused_plan(l.args(p)).direct);
  }
  static Problem problem() {
    Problem p;
    p.q_heads = 64, p.kv_heads = 8, p.batch = 2, p.lens = same_lens(team().world(), {2500, 1});
    return p;
  }
};

// Fused steps of the clustered and of the direct split merge, alternating, captured into one graph
// and replayed with fresh inputs, eager steps between replays: all share the op's epochs.
TEST(FlashDecodeDist, CudaGraphReplayOfFusedSteps) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  BothMerges m(700);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TF_CUDA(cudaStreamBeginCapture(t.stream(), cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 4; ++i) (i % 2 ? m.direct : m.cluster)->launch(Variant::fused, m.l.args(m.p), t.stream());
  TF_CUDA(cudaStreamEndCapture(t.stream(), &graph));
  TF_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 4; ++rep) {
    Op& op = rep % 2 ? m.cluster : m.direct;
    draw_q(m.g, 800 + rep);  // fresh inputs in the buffers the graph captured
    draw_kv(m.g, 900 + rep);
    compute_reference(m.g);
    upload_local(m.g, m.l);
    EXPECT_EQ(m.l.args(m.p).q, m.l.q_d.p);  // the captured pointers
    TF_CUDA(cudaMemsetAsync(m.l.out_d.p, 0xFF, m.l.out_d.n * 2, t.stream()));
    t.sync(t.stream());
    t.host_barrier("fdd.graph");
    TF_CUDA(cudaGraphLaunch(exec, t.stream()));
    if (rep % 2) op->launch(Variant::fused, m.l.args(m.p), t.stream());  // eager steps share the epochs
    t.sync(t.stream());
    check(m.g, download_out(m.l), "graph replay " + std::to_string(rep));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The kernel ahead lets its dependents start at once (griddepcontrol.launch_dependents), then
// writes the next step's q only after `delay_ns`: a decode or fused kernel that read q before that
// grid completed (no dev::wait_prior_grid) would attend with the old q.
__global__ void late_copy_kernel(const uint16_t* src, uint16_t* dst, int64_t n, uint64_t delay_ns) {
  dev::allow_dependent_grid();
  if (threadIdx.x == 0) dev::sleep_for_ns(delay_ns);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

TEST(FlashDecodeDist, DependentLaunchWaitsForTheKernelAheadThatWritesQ) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  BothMerges m(1300);
  Dev<uint16_t> next(m.g.q.size());
  int round = 0;
  for (Variant v : {Variant::bsp, Variant::fused, Variant::fused})
    for (int rep = 0; rep < 2; ++rep, ++round) {
      Op& op = round < 4 ? m.cluster : m.direct;
      draw_q(m.g, 1400 + round);  // only the kernel ahead puts it in place
      compute_reference(m.g);
      next.upload(m.g.q);
      TF_CUDA(cudaMemsetAsync(m.l.out_d.p, 0xFF, m.l.out_d.n * 2, t.stream()));
      t.sync(t.stream());
      t.host_barrier("fdd.pdl");
      late_copy_kernel<<<1, 256, 0, t.stream()>>>(next.p, m.l.q_d.p, int64_t(m.g.q.size()), 50000);
      TF_CUDA(cudaGetLastError());
      op->launch(v, m.l.args(m.p), t.stream());
      t.sync(t.stream());
      check(m.g, download_out(m.l), std::string(variant_name(v)) + (round >= 4 ? " direct" : "") + " round " +
                                    std::to_string(round));
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
  auto expect_invalid = [&](const char* what, DecodeArgs a, const char* needle) {
    try {
      op->launch(Variant::fused, a, team().stream());
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
  try {
    op->launch(Variant(9), l.args(p), team().stream());
    ADD_FAILURE() << "bad variant: no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
  }
  team().sync(team().stream());
}

}  // namespace
}  // namespace taxfree::ops::flash_decode
