// flash_decode across ranks on real GPUs, many launches per op: 1000 fused steps without a flag
// reset (fresh inputs, changing shapes, the LL exchange under stress), large batches with skewed
// ranks, a late reader while peers run ahead into another shape, rank skew, CUDA-graph replay,
// inputs written by an early-triggering kernel ahead (dependent launch), and ops built and dropped
// thousands of times; each checked against a double-precision softmax, outputs identical on every
// rank (helpers and conventions: flash_decode_team_util.h, flash_decode_distributed_test.cu).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flash_decode_team_util.h"
#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/device/scoped_memory.cuh"
#include "taxfree/runtime/captured_graph.h"

namespace taxfree::flash_decode {
namespace {

using namespace test;

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
    const Global g = make_global(p, 1300 + batch), g2 = with_other_q(g, 1350 + batch);
    Local l;
    upload_local(g, l);
    const DeviceQ q2(g2);
    Op op(p);
    const FusedPlan fp = op->fused_plan(l.args(p));
    if (batch * kv >= t.sm_count())  // no cluster of a group's splits fits: the split plan's count
      EXPECT_EQ(fp.num_splits, choose_splits(batch, kv, l.args(p).max_len, t.sm_count())) << "groups >= SMs";
    const std::string what = name(p) + " b=" + std::to_string(batch);
    const auto bsp = run_checked(op, FlashDecodeVariant::bsp, p, l);
    check(g, bsp, what + " bsp");
    Rng delay{uint64_t(t.rank()) + 31};
    t.host_barrier("fdd.large");
    for (int step = 0; step < 24; ++step) {  // the q switches every step: a stale partial shows
      TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
      if (step % world == t.rank() && step % 3 == 1) usleep(500 + delay.below(3000));  // this rank starts late
      DecodeArgs a = l.args(p);
      if (step % 2) a.q = q2.d.p;
      op->launch(FlashDecodeVariant::fused, a, t.stream());
      const auto out = download_out(l);
      const std::string at = what + " fused step " + std::to_string(step);
      EXPECT_EQ(count_wrong(step % 2 ? g2 : g, out, at), 0) << at;  // no early exit: the peers would wait for this rank
      if (step == 0) EXPECT_TRUE(out == bsp) << at << ": fused differs from bsp";
      if (step % 6 == 5) expect_same_on_every_rank(out, at);
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
    gs[i].push_back(with_other_q(gs[i][0], 2005 + 10 * i));
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
      op->launch(FlashDecodeVariant::fused, l.args(ps[i]), t.stream());
      const auto out = download_out(l);
      const std::string what = std::string(merge == Op::SplitMerge::direct   ? "direct"
                                           : merge == Op::SplitMerge::global ? "global"
                                                                             : "cluster") +
                               " step " +
                               std::to_string(step) + " problem " + std::to_string(i);
      EXPECT_EQ(count_wrong(g, out, what), 0) << what;  // no early exit: the peers would wait for this rank
      if (step % 50 == 49) expect_same_on_every_rank(out, what);
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
      op->launch(FlashDecodeVariant::fused, ls[i].args(ps[i]), t.stream());
      out = download_out(ls[i]);
      what = "step " + std::to_string(step) + " " + name(ps[i]) + (merge == Op::SplitMerge::direct ? " direct" : "");
      EXPECT_EQ(count_wrong(gs[i], out, what), 0) << what;
    }
    op->set_combine_delay_ns(0);
    expect_same_on_every_rank(out, what);
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
    op->launch(i % 97 == 50 ? FlashDecodeVariant::bsp : FlashDecodeVariant::fused, a, t.stream());
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
  const Global gs[2] = {g, with_other_q(g, 78)};
  Local l;
  upload_local(gs[0], l);
  const DeviceQ qs[2] = {DeviceQ(gs[0]), DeviceQ(gs[1])};
  const uint64_t start = t.heap().used();
  for (int i = 0; i < 2500; ++i) {  // every op gets the q its predecessor did not: stale lines show
    Op op(p);
    const FlashDecodeVariant v = i % 2 ? FlashDecodeVariant::fused : FlashDecodeVariant::bsp;
    TF_CUDA(cudaMemcpyAsync(l.q_d.p, qs[i % 2].d.p, l.q_d.n * 2, cudaMemcpyDeviceToDevice, t.stream()));
    if (i % 250 == 0 || i == 2499) {
      check(gs[i % 2], run_checked(op, v, p, l), "op " + std::to_string(i) + " " + variant_name(v));
      check(gs[i % 2], run_checked(op, FlashDecodeVariant::fused, p, l), "op " + std::to_string(i) + " second launch");
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
  const DeviceQ other(with_other_q(g, 601));  // the middle launch's: a partial read a launch early shows
  Op op(p), direct(p, BspBuffers::symmetric, Op::SplitMerge::direct);
  Rng rng{uint64_t(t.rank()) + 9};
  for (int round = 0; round < 2 * t.world(); ++round)
    for (int v = 0; v < 3; ++v) {  // bsp, fused, fused with the direct split merge
      TF_CUDA(cudaMemsetAsync(l.out_d.p, 0xFF, l.out_d.n * 2, t.stream()));
      t.sync(t.stream());
      t.host_barrier("fdd.skew");
      if (t.rank() == round % t.world()) usleep(50'000 + rng.below(100'000));  // this rank starts late
      for (int k = 0; k < 3; ++k) {
        DecodeArgs a = l.args(p);
        if (k == 1) a.q = other.d.p;
        (v == 2 ? direct : op)->launch(kVariants[v % 2], a, t.stream());
      }
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
  // Steps 1 and 2 read another q: each op's checked step (direct's step 3; cluster's eager step
  // after step 2) follows its own step on the other q, so a partial read a step late is wrong.
  const DeviceQ other_q(with_other_q(m.g, 750));
  const CapturedGraph graph(t.stream(), [&] {
    for (int i = 0; i < 4; ++i) {
      DecodeArgs a = m.l.args(m.p);
      if (i == 1 || i == 2) a.q = other_q.d.p;
      (i % 2 ? m.direct : m.cluster)->launch(FlashDecodeVariant::fused, a, t.stream());
    }
  });
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
    graph.launch(t.stream());
    if (rep % 2) op->launch(FlashDecodeVariant::fused, m.l.args(m.p), t.stream());  // eager steps share the epochs
    t.sync(t.stream());
    check(m.g, download_out(m.l), "graph replay " + std::to_string(rep));
  }
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
  for (FlashDecodeVariant v : {FlashDecodeVariant::bsp, FlashDecodeVariant::fused, FlashDecodeVariant::fused})
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

}  // namespace
}  // namespace taxfree::flash_decode
