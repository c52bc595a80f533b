// The fused flash_decode kernel with 2, 3, 4 and 8 ranks simulated on one GPU (simulated_ranks.h):
// the cross-rank protocol (epochs, inbox parities, LL lines, the split merges, the rank combine)
// runs for real, on the GPU one test process has, whatever the world of the job. Each rank is
// planned (plan_fused, the op's own planner) for 1/W of the SMs and of the clusters, so the W grids
// are resident together, the condition the fused schedules need (fused_schedule.h), now across W
// kernels. Checked as on real ranks: every rank's output against a double softmax over the whole
// sequences, bitwise equal across ranks, for the clustered, global and direct split merges, then
// hundreds of launches without a reset.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../../src/ops/flash_decode/kernels.h"
#include "flash_decode_dist_util.h"
#include "flash_decode_util.h"
#include "gpu_env.h"
#include "simulated_ranks.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode {
namespace {

using namespace test;
using SplitMerge = FlashDecodeConfig::SplitMerge;

const char* merge_name(SplitMerge m) {
  return m == SplitMerge::cluster ? "cluster" : m == SplitMerge::global ? "global" : "direct";
}

// W ranks of one fused flash_decode op on this GPU (see the top of the file).
class SimulatedRanks {
 public:
  SimulatedRanks(const Problem& p, int world, SplitMerge merge) : cfg_(config(p, merge)), sizes_(buffers(cfg_, world)),
                                                                  heaps_(world, sizes_.fused_inbox_bytes) {
    for (int r = 0; r < world; ++r) {
      workspaces_.emplace_back(std::max<size_t>(sizes_.workspace_bytes, 256));
      init_decode_workspace(workspaces_.back().p, workspaces_.back().n, nullptr);
    }
    TF_CUDA(cudaDeviceSynchronize());
  }

  cudaStream_t stream(int r) const { return heaps_.stream(r); }
  void sync(const std::string& what) { heaps_.sync(what); }

  // Rank r's plan of `a`, for its share of the GPU.
  FusedPlan plan(const DecodeArgs& a) const {
    validate_flash_decode_args(a, cfg_);
    DecodeConfig dc;
    dc.num_splits = cfg_.num_splits, dc.num_sms = heaps_.sms_per_rank();
    const bool paged = a.layout != KvLayout::Contiguous;
    FusedDevice d;
    d.world = heaps_.world(), d.num_sms = heaps_.sms_per_rank();
    d.ctas_per_sm = detail::dispatch(a.dtype, a.head_dim, [&]<class T, int D>() { return detail::fused_ctas_per_sm_t<T, D>(paged, false); });
    d.direct_ctas_per_sm = detail::dispatch(a.dtype, a.head_dim, [&]<class T, int D>() { return detail::fused_ctas_per_sm_t<T, D>(paged, true); });
    d.max_clusters = [&, w = heaps_.world()](int c) {
      return detail::dispatch(a.dtype, a.head_dim, [&]<class T, int D>() { return detail::fused_max_clusters_t<T, D>(paged, c); }) / w;
    };
    return plan_fused(a, plan_decode(a, dc), cfg_, sizes_, d);
  }

  // Enqueues rank r's fused launch of `a` on its stream (its inbox at the start of its heap); its
  // CTAs sleep `combine_delay_ns` between sending their partials and reading the peers'
  // (FusedDecodeParams: the peers run ahead).
  void launch(int r, const DecodeArgs& a, uint32_t combine_delay_ns = 0) {
    const FusedPlan fp = plan(a);
    attention::FusedDecodeParams params =
        detail::make_fused_params(a, fp, sizes_, workspaces_[size_t(r)].p, heaps_.view(r),
                                  reinterpret_cast<uint4*>(heaps_.base(r)), heaps_.sequence(r), heaps_.fault(r));
    params.combine_delay_ns = combine_delay_ns;
    detail::launch_fused(a, params, fp.grid, heaps_.stream(r));
  }

 private:
  static FlashDecodeConfig config(const Problem& p, SplitMerge merge) {
    FlashDecodeConfig c;
    c.max_batch = p.batch, c.max_q_heads = p.q_heads, c.max_kv_heads = p.kv_heads;
    c.max_head_dim = p.head_dim, c.num_splits = p.num_splits, c.split_merge = merge;
    return c;
  }
  static FlashDecodeBuffers buffers(const FlashDecodeConfig& c, int world) {
    validate_flash_decode_config(c, world);
    return flash_decode_buffers(c, world, ::taxfree::test::SimulatedHeaps::device_sms() / world);
  }

  FlashDecodeConfig cfg_;
  FlashDecodeBuffers sizes_;
  ::taxfree::test::SimulatedHeaps heaps_;
  std::vector<Dev<char>> workspaces_;
};

std::string schedule_name(const FusedPlan& fp) {
  return fp.direct ? "direct" : fp.cluster > 0 ? "clustered C=" + std::to_string(fp.cluster) : "persistent grid " + std::to_string(fp.grid);
}

// Poisons every rank's output, launches all ranks, checks each against the reference and rank 0.
void run_and_check(SimulatedRanks& sim, const Global& g, std::vector<Local>& ls, const std::string& what) {
  const int world = int(ls.size());
  for (int r = 0; r < world; ++r) TF_CUDA(cudaMemsetAsync(ls[size_t(r)].out_d.p, 0xFF, ls[size_t(r)].out_d.n * 2, sim.stream(r)));
  for (int r = 0; r < world; ++r) sim.launch(r, ls[size_t(r)].args(g.p));
  sim.sync(what);
  const std::vector<uint16_t> out0 = ls[0].out_d.download();
  for (int r = 0; r < world; ++r) {
    const std::string w = what + " rank " + std::to_string(r) + " (" + schedule_name(sim.plan(ls[size_t(r)].args(g.p))) + ")";
    const std::vector<uint16_t> out = r == 0 ? out0 : ls[size_t(r)].out_d.download();
    EXPECT_EQ(count_wrong(g, out, w), 0) << w;
    if (r > 0) EXPECT_TRUE(out == out0) << w << ": differs from rank 0";
  }
}

// Two problems: bf16, head_dim 128, GQA 8, four sequences (12345 tokens on rank 0 and 1 on rank 1,
// ragged, empty, growing with the rank: odd_lens); fp16, head_dim 64, GQA 16, three sequences.
Problem sim_problem(int which, int world) {
  Problem p;
  if (which == 0) {
    p.batch = 4, p.q_heads = 16, p.kv_heads = 2, p.lens = odd_lens(world);
  } else {
    p.dtype = DType::FP16, p.head_dim = 64, p.batch = 3, p.q_heads = 32, p.kv_heads = 2;
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
        for (int r = 0; r < world; ++r) {  // a merge the share cannot hold falls back (plan_fused)
          const FusedPlan fp = sim.plan(ls[size_t(r)].args(p));
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
    SimulatedRanks sim(p, kWorld, merge);
    std::vector<Local> ls(static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r) upload_local(g, ls[size_t(r)], r);
    for (int i = 0; i < kSteps; ++i)
      for (int r = 0; r < kWorld; ++r) sim.launch(r, ls[size_t(r)].args(p), r == 1 ? 20'000u : 0u);
    run_and_check(sim, g, ls, std::string("after ") + std::to_string(kSteps) + " steps, " + merge_name(merge));
  }
}

}  // namespace
}  // namespace taxfree::ops::flash_decode
