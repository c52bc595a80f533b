// The fused flash_decode op with 2, 3, 4 and 8 ranks simulated on one GPU (simulated_ranks.h):
// one FlashDecode per rank, built on the rank's share (its span as the symmetric heap, about 1/W of
// the SMs, no NCCL), so the op's own planner, buffers and launch path and the kernel's cross-rank
// protocol (epochs, inbox parities, LL lines, the split merges, the rank combine) run for real on
// the GPU one test process has, whatever the world of the job. Each rank's plan fills its share
// (its part of the GPU's clusters too), so the W grids are resident together, the condition the
// fused schedules need (fused_schedule.h), now across W kernels. Checked as on real ranks: every
// rank's output against a double softmax over the whole sequences, bitwise equal across ranks, for
// the clustered, global and direct split merges, then hundreds of launches without a reset and
// steps captured into CUDA graphs and replayed; bsp is refused (NotSupported) without NCCL.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "flash_decode_dist_util.h"
#include "flash_decode_util.h"
#include "gpu_env.h"
#include "random_draws.h"
#include "simulated_ranks.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

using namespace test;
using ::taxfree::test::Draws;
using SplitMerge = FlashDecodeConfig::SplitMerge;

const char* merge_name(SplitMerge m) {
  return m == SplitMerge::cluster ? "cluster" : m == SplitMerge::global ? "global" : "direct";
}

// W ranks of one fused flash_decode op on this GPU (see the top of the file): one FlashDecode per
// rank, built on the rank's share (simulated_ranks.h), as on W GPUs.
class SimulatedRanks {
 public:
  SimulatedRanks(const Problem& p, int world, SplitMerge merge)
      : heaps_(world, span_bytes(config(p, merge), world)) {
    for (int r = 0; r < world; ++r) ops_.push_back(std::make_unique<FlashDecode>(heaps_.share(r), config(p, merge)));
  }

  cudaStream_t stream(int r) const { return heaps_.stream(r); }
  void sync(const std::string& what) { heaps_.sync(what); }
  template <class Enqueue>
  std::vector<CapturedGraph> capture_each(Enqueue&& enqueue) { return heaps_.capture_each(enqueue); }
  void launch_graphs(const std::vector<CapturedGraph>& graphs) { heaps_.launch_graphs(graphs); }

  // Rank r's plan of `a`, for its share of the GPU.
  FusedPlan plan(int r, const DecodeArgs& a) const { return ops_[size_t(r)]->fused_plan(a); }

  // Enqueues rank r's fused launch of `a` on its stream; its CTAs sleep `combine_delay_ns` between
  // sending their partials and reading the peers' (FlashDecode::set_combine_delay_ns: the peers
  // run ahead).
  void launch(int r, const DecodeArgs& a, uint32_t combine_delay_ns = 0) {
    FlashDecode& op = *ops_[size_t(r)];
    op.set_combine_delay_ns(combine_delay_ns);
    op.launch(FlashDecodeVariant::fused, a, heaps_.stream(r));
  }

  // bsp needs NCCL, which simulated ranks do not have: refused before anything is enqueued.
  void expect_bsp_refused(int r, const DecodeArgs& a) {
    try {
      ops_[size_t(r)]->launch(FlashDecodeVariant::bsp, a, heaps_.stream(r));
      ADD_FAILURE() << "bsp ran without NCCL on simulated rank " << r;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::NotSupported) << e.what();
    }
  }

 private:
  static FlashDecodeConfig config(const Problem& p, SplitMerge merge) {
    FlashDecodeConfig c;
    c.max_batch = p.batch, c.max_q_heads = p.q_heads, c.max_kv_heads = p.kv_heads;
    c.max_head_dim = p.head_dim, c.num_splits = p.num_splits, c.split_merge = merge;
    return c;
  }
  // The op's heap buffers (fused inbox, bsp's gather buffer) with their 256-byte alignment.
  static uint64_t span_bytes(const FlashDecodeConfig& c, int world) {
    const int sms = ::taxfree::test::SimulatedHeaps::device_sms();
    const FlashDecodeBuffers b = flash_decode_buffers(c, world, sms);
    return b.fused_inbox_bytes + b.bsp_gather_bytes + 512;
  }

  ::taxfree::test::SimulatedHeaps heaps_;
  std::vector<std::unique_ptr<FlashDecode>> ops_;
};

std::string schedule_name(const FusedPlan& fp) {
  return fp.direct ? "direct" : fp.cluster > 0 ? "clustered C=" + std::to_string(fp.cluster) : "persistent grid " + std::to_string(fp.grid);
}

// Poisons every rank's output on its stream.
void poison_outputs(SimulatedRanks& sim, std::vector<Local>& ls) {
  for (size_t r = 0; r < ls.size(); ++r)
    TF_CUDA(cudaMemsetAsync(ls[r].out_d.p, 0xFF, ls[r].out_d.n * 2, sim.stream(int(r))));
}

// Waits for every rank, checks each rank's output against the reference and rank 0's.
void check_outputs(SimulatedRanks& sim, const Global& g, std::vector<Local>& ls, const std::string& what) {
  const int world = int(ls.size());
  sim.sync(what);
  const std::vector<uint16_t> out0 = ls[0].out_d.download();
  for (int r = 0; r < world; ++r) {
    const std::string w = what + " rank " + std::to_string(r) + " (" + schedule_name(sim.plan(r, ls[size_t(r)].args(g.p))) + ")";
    const std::vector<uint16_t> out = r == 0 ? out0 : ls[size_t(r)].out_d.download();
    EXPECT_EQ(count_wrong(g, out, w), 0) << w;
    if (r > 0) EXPECT_TRUE(out == out0) << w << ": differs from rank 0";
  }
}

// Poisons every rank's output, launches all ranks, checks each against the reference and rank 0.
void run_and_check(SimulatedRanks& sim, const Global& g, std::vector<Local>& ls, const std::string& what) {
  poison_outputs(sim, ls);
  for (int r = 0; r < int(ls.size()); ++r) sim.launch(r, ls[size_t(r)].args(g.p));
  check_outputs(sim, g, ls, what);
}

// As a serving engine replays its decode step: one checked launch outside a capture (plans,
// attributes), then four fused steps captured into a CUDA graph on every rank, rank `late` sleeping
// 20 us between sending and reading in each, and three replays with fresh q (seeds seed, seed + 1,
// ...; the graph reads q where it was captured) and poisoned outputs before each, every replay
// checked. The epochs advance inside the graph and across replays with no host work.
void replay_and_check(SimulatedRanks& sim, Global& g, std::vector<Local>& ls, int late, uint64_t seed,
                      const std::string& what) {
  run_and_check(sim, g, ls, what + " outside a graph");
  Global unchecked = g;  // steps 0 and 2 read another q: a partial read a step late is wrong
  draw_q(unchecked, seed + 1000);
  const DeviceQ other_q(unchecked);
  const auto graphs = sim.capture_each([&](int r) {
    for (int step = 0; step < 4; ++step) {
      DecodeArgs a = ls[size_t(r)].args(g.p);
      if (step % 2 == 0) a.q = other_q.d.p;
      sim.launch(r, a, r == late ? 20'000u : 0u);
    }
  });
  for (int rep = 0; rep < 3; ++rep) {
    draw_q(g, seed + uint64_t(rep));
    compute_reference(g);
    for (Local& l : ls) l.q_d.upload(g.q);
    poison_outputs(sim, ls);
    sim.launch_graphs(graphs);
    check_outputs(sim, g, ls, what + " graph replay " + std::to_string(rep));
  }
}

// Two problems: bf16, head_dim 128, GQA 8, four sequences (12345 tokens on rank 0 and 1 on rank 1,
// ragged, empty, growing with the rank: odd_lens); fp16, head_dim 64, GQA 16, three sequences.
Problem sim_problem(int which, int world) {
  Problem p;
  if (which == 0) {
    p.batch = 4, p.q_heads = 16, p.kv_heads = 2, p.lens = odd_lens(world);
  } else {
    p.dtype = DType::fp16, p.head_dim = 64, p.batch = 3, p.q_heads = 32, p.kv_heads = 2;
    for (int r = 0; r < world; ++r) p.lens.push_back({r % 2 == 0 ? 3000 + 11 * r : 0, 1 + r, r == world - 1 ? 40 : 0});
  }
  return p;
}

TEST(FlashDecodeSim, FusedAtTwoToEightRanksEverySplitMerge) {
  TF_REQUIRE_GPUS(1);
  std::map<int, std::set<std::string>> ran;  // world -> schedules some rank ran
  for (int world : {2, 3, 4, 8})
    for (SplitMerge merge : {SplitMerge::cluster, SplitMerge::global, SplitMerge::direct})
      for (int which : {0, 1}) {
        const Problem p = sim_problem(which, world);
        Global g = make_global(p, 900 + uint64_t(world) + 10 * uint64_t(which));
        SimulatedRanks sim(p, world, merge);
        std::vector<Local> ls(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) upload_local(g, ls[size_t(r)], r);
        if (merge == SplitMerge::cluster && which == 0) sim.expect_bsp_refused(world - 1, ls.back().args(p));
        for (int r = 0; r < world; ++r) {  // a merge the share cannot hold falls back (plan_fused)
          const FusedPlan fp = sim.plan(r, ls[size_t(r)].args(p));
          ran[world].insert(fp.direct ? "direct" : fp.cluster > 0 ? "clustered" : "persistent");
        }
        const std::string what = "W=" + std::to_string(world) + " " + merge_name(merge) + " problem " + std::to_string(which);
        for (int step = 0; step < 3; ++step) {  // fresh q every step, the same op: epochs 1..3
          draw_q(g, 7000 + uint64_t(step));
          compute_reference(g);
          for (Local& l : ls) l.q_d.upload(g.q);
          run_and_check(sim, g, ls, what + " step " + std::to_string(step));
        }
      }
  for (const auto& [world, schedules] : ran) {
    std::string list;
    for (const std::string& x : schedules) list += " " + x;
    std::printf("W=%d ran:%s\n", world, list.c_str());
    // Every schedule fits a quarter of the GPU for these shapes (r175, H200: an eighth too).
    if (world <= 4) EXPECT_EQ(schedules.size(), 3u) << "W=" << world << " ran only" << list;
  }
}

// More groups (batch x KV heads = 40) than a rank's share has SMs (four ranks of 32): the split
// plan fills waves of two CTAs per SM with 3 splits per group (slices of 3072 tokens or more), so
// the persistent fused grid runs several items per CTA, splits merged through global memory.
// Ragged slices, a sequence empty on rank 0, one of a single token on the last rank.
TEST(FlashDecodeSim, MoreGroupsThanSmsAtFourRanks) {
  TF_REQUIRE_GPUS(1);
  constexpr int kWorld = 4;
  for (SplitMerge merge : {SplitMerge::cluster, SplitMerge::global}) {
    Problem p;
    p.batch = 5, p.q_heads = 16, p.kv_heads = 8;
    for (int r = 0; r < kWorld; ++r) {
      std::vector<int32_t> l;
      for (int b = 0; b < p.batch; ++b)
        l.push_back(b == 2 ? (r == kWorld - 1 ? 1 : 0) : b == 3 && r == 0 ? 0 : 3100 + 53 * b + 37 * r);
      p.lens.push_back(l);
    }
    Global g = make_global(p, 5100);
    SimulatedRanks sim(p, kWorld, merge);
    std::vector<Local> ls(static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r) upload_local(g, ls[size_t(r)], r);
    const std::string what = std::string("W=4 ") + merge_name(merge) + " b=5 16/8";
    for (int r = 0; r < kWorld; ++r) {
      const FusedPlan fp = sim.plan(r, ls[size_t(r)].args(p));
      EXPECT_GT(fp.num_splits, 1) << what << " rank " << r << ": " << schedule_name(fp);
      EXPECT_GT(fp.items, fp.grid) << what << " rank " << r << ": " << schedule_name(fp);
    }
    for (int step = 0; step < 3; ++step) {
      draw_q(g, 7100 + uint64_t(step));
      compute_reference(g);
      for (Local& l : ls) l.q_d.upload(g.q);
      run_and_check(sim, g, ls, what + " step " + std::to_string(step));
    }
  }
}

// Hundreds of launches back to back on every rank's stream, no host reset, rank 1 sleeping 20 us
// in every launch between sending and reading so the others run up to a launch ahead: the inbox
// parities are reused only as fused_decode_kernel.h argues.
TEST(FlashDecodeSim, ManyFusedStepsWithoutResetAtThreeRanks) {
  TF_REQUIRE_GPUS(1);
  constexpr int kWorld = 3, kSteps = 400;
  for (SplitMerge merge : {SplitMerge::cluster, SplitMerge::global, SplitMerge::direct}) {
    Problem p;
    p.batch = 2, p.q_heads = 64, p.kv_heads = 8, p.lens = {{2500, 1}, {0, 300}, {777, 0}};
    const Global g = make_global(p, 4242);
    const DeviceQ other(with_other_q(g, 4243));  // every other step's, ending on g's: stale partials show
    SimulatedRanks sim(p, kWorld, merge);
    std::vector<Local> ls(static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r) upload_local(g, ls[size_t(r)], r);
    for (int i = 0; i < kSteps; ++i)
      for (int r = 0; r < kWorld; ++r) {
        DecodeArgs a = ls[size_t(r)].args(p);
        if ((kSteps - i) % 2) a.q = other.d.p;
        sim.launch(r, a, r == 1 ? 20'000u : 0u);
      }
    run_and_check(sim, g, ls, std::string("after ") + std::to_string(kSteps) + " steps, " + merge_name(merge));
  }
}

// Four fused steps captured into a CUDA graph on every rank and replayed, as a serving engine
// replays its decode step: fresh q (read where the graph captured it) and poisoned outputs before
// each of three replays, rank 1 sleeping 20 us between sending and reading in every step, every
// replay checked; each split merge at 2, 3 and 8 ranks. The epochs advance inside the graph and
// across replays with no host work.
TEST(FlashDecodeSim, GraphReplayAtTwoThreeAndEightRanks) {
  TF_REQUIRE_GPUS(1);
  for (int world : {2, 3, 8})
    for (SplitMerge merge : {SplitMerge::cluster, SplitMerge::global, SplitMerge::direct}) {
      const Problem p = sim_problem(0, world);
      Global g = make_global(p, 950 + uint64_t(world));
      SimulatedRanks sim(p, world, merge);
      std::vector<Local> ls(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) upload_local(g, ls[size_t(r)], r);
      replay_and_check(sim, g, ls, 1, 9600, "W=" + std::to_string(world) + " " + merge_name(merge));
      if (HasFailure()) return;
    }
}

// Shapes nobody listed at a random world, fresh every run (TAXFREE_TEST_SEED=N repeats one; its
// seed is in every failure): 2-8 simulated ranks (5-7 included, which no other test runs), each
// split merge, either dtype and head_dim, 1-8 KV heads at any GQA ratio, batch 1-12, a third of
// the time a split count of 1-64 instead of the heuristic's, every rank's slice of every sequence
// drawn on its own (a quarter of them empty or one token), a contiguous or paged cache (either
// layout, any page size). Two steps per problem with fresh q, then 20 with one rank late in each
// and one more, then replay_and_check with that rank late, every rank against the double reference
// and bitwise equal to rank 0.
TEST(FlashDecodeSim, RandomShapesAtRandomWorlds) {
  TF_REQUIRE_GPUS(1);
  Draws rnd;
  for (int i = 0; i < 8; ++i) {
    const int world = rnd.uni(2, 8);
    const SplitMerge merge = SplitMerge(rnd.uni(0, 2));
    Problem p;
    p.dtype = rnd.uni(0, 1) ? DType::bf16 : DType::fp16;
    p.head_dim = rnd.uni(0, 1) ? 128 : 64;
    p.kv_heads = rnd.log_uni(1, 8), p.q_heads = p.kv_heads * rnd.uni(1, kMaxGqaRatio), p.batch = rnd.log_uni(1, 12);
    if (rnd.uni(0, 2) == 0) p.num_splits = rnd.uni(1, kMaxSplits);  // else the heuristic's
    // Slices that keep the reference near 5e7 multiply-adds and the host cache near 1e7 values.
    const double cap = std::min(5e7 / (2.0 * p.q_heads * p.head_dim), 1e7 / (double(p.kv_heads) * p.head_dim)) /
                       (double(p.batch) * world);
    // The longest slice log-uniform over problems, the others within 4x of it.
    const int top = rnd.log_uni(1, std::max(1, std::min(int(cap), 20000)));
    p.lens.assign(size_t(world), {});
    for (auto& rank_lens : p.lens)
      for (int b = 0; b < p.batch; ++b) {
        const int kind = rnd.uni(0, 7);
        rank_lens.push_back(kind == 0 ? 0 : kind == 1 ? 1 : rnd.uni(std::max(1, top / 4), top));
      }
    Global g = make_global(p, rnd.bits());
    SimulatedRanks sim(p, world, merge);
    std::vector<Local> ls(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) upload_local(g, ls[size_t(r)], r);
    std::string cache = "contiguous";
    if (rnd.uni(0, 2) == 0) {  // every rank's slice in a paged cache of one layout and page size
      const KvLayout layout = rnd.uni(0, 1) ? KvLayout::paged_hnd : KvLayout::paged_nhd;
      const int page = 16 << rnd.uni(0, 4);
      for (Local& l : ls)
        l.paged = std::make_unique<Paged>(make_paged(l.k, l.v, p.batch, p.kv_heads, l.cap, p.head_dim, layout, page, rnd.bits()));
      cache = std::string(layout == KvLayout::paged_hnd ? "HND" : "NHD") + " page " + std::to_string(page);
    }
    const std::string what = "W=" + std::to_string(world) + " " + merge_name(merge) + " " + cache + " " +
                             dtype_name(p.dtype) + " D=" + std::to_string(p.head_dim) +
                             " q/kv=" + std::to_string(p.q_heads) + "/" + std::to_string(p.kv_heads) +
                             " batch=" + std::to_string(p.batch) + " splits=" +
                             (p.num_splits ? std::to_string(p.num_splits) : std::string("auto")) + " longest=" +
                             std::to_string(*std::max_element(g.total.begin(), g.total.end())) + " " + rnd.where(i);
    std::printf("%s: %s\n", what.c_str(), schedule_name(sim.plan(0, ls[0].args(p))).c_str());
    for (int step = 0; step < 2; ++step) {
      draw_q(g, rnd.bits());
      compute_reference(g);
      for (Local& l : ls) l.q_d.upload(g.q);
      run_and_check(sim, g, ls, what + " step " + std::to_string(step));
    }
    // 20 steps back to back, one rank sleeping 20 us between sending and reading in each, then one
    // more checked: the inbox parities under a rank that falls behind. Every other step (the last
    // of the 20 among them) reads another q, so a partial read a step late would be wrong.
    const int late = rnd.uni(0, world - 1);
    Global unchecked = g;  // another q, never checked: no reference
    draw_q(unchecked, rnd.bits());
    const DeviceQ other_q(unchecked);
    for (int j = 0; j < 20; ++j)
      for (int r = 0; r < world; ++r) {
        DecodeArgs a = ls[size_t(r)].args(p);
        if (j % 2) a.q = other_q.d.p;
        sim.launch(r, a, r == late ? 20'000u : 0u);
      }
    run_and_check(sim, g, ls, what + " after 20 steps with rank " + std::to_string(late) + " late");
    replay_and_check(sim, g, ls, late, rnd.bits(), what + " rank " + std::to_string(late) + " late");
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace taxfree::flash_decode
