// all_gather_matmul's cross-rank variants with 2, 3, 4 and 8 ranks simulated on one GPU
// (simulated_ranks.h): each rank's op is built on its RankShare (a span of one allocation as its
// heap, SMs / W for its plans, no NCCL) and each rank has its own Problem (its shard, its B, or the
// replicated B of ksplit). Every variant but bsp (NCCL) -- push, sm-specialized, fused-ce, pull,
// decomposed, nsplit, ksplit's three paths -- runs on every rank, and each rank's C is checked against
// the float64 reference, its gathered A bit for bit against the shards and the same on every rank
// (C too after ksplit and nsplit). Outputs and op buffers are poisoned before each launch, and every rank's
// launch is enqueued behind a gate so the ranks start together. Then hundreds of launches without
// a reset with one rank late, every variant captured into CUDA graphs and replayed, and bsp's
// NotSupported on a share without NCCL.
//
// decomposed, nsplit and ksplit's two-kernel path call cuBLASLt, which loads a kernel at its first
// use and may wait for the device to go idle first, which the simulated ranks' waiting kernels
// never let it (r180): every rank's op warms them first (AllGatherMatmul::warm_up, the same GEMM
// arguments, no peer touched). What this cannot show: simulated_ranks.h.
//
// Needs CUDA_MODULE_LOADING=EAGER (our kernels loaded at start, for the same reason) and
// CUDA_DEVICE_MAX_CONNECTIONS >= 16 (two streams per rank, each its own hardware queue: sharing one,
// a waiting kernel holds back a peer's work queued behind it; r180 at W = 8); skipped otherwise.
// scripts/gpu_check.sh runs it so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "agmm_test_util.h"
#include "gpu_env.h"
#include "random_draws.h"
#include "simulated_ranks.h"
#include "taxfree/device/scoped_memory.cuh"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

using namespace agmm_test;
using test::Draws;
using test::SimulatedHeaps;

// The driver reads both variables when it starts.
#define REQUIRE_SIMULATION_ENV()                                                                      \
  do {                                                                                                \
    TF_REQUIRE_GPUS(1);                                                                               \
    const char* tf_mode_ = std::getenv("CUDA_MODULE_LOADING");                                        \
    const char* tf_conn_ = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");                                \
    if (tf_mode_ == nullptr || std::string(tf_mode_) != "EAGER" || tf_conn_ == nullptr ||             \
        std::atoi(tf_conn_) < 16)                                                                     \
      GTEST_SKIP() << "needs CUDA_MODULE_LOADING=EAGER and CUDA_DEVICE_MAX_CONNECTIONS >= 16 (see the " \
                      "file's top)";                                                                  \
  } while (0)

// K / W = 1032: a multiple of 8 (the shard rule), not of 64 (the GEMM's k-block).
constexpr int64_t kSplitShardK = 1032;

// W simulated ranks, an all_gather_matmul op on each rank's share.
class SimulatedAgmm {
 public:
  SimulatedAgmm(int world, int64_t max_m, int64_t max_k) : heaps_(world, span(world, config(max_m, max_k))) {
    for (int r = 0; r < world; ++r) ops_.push_back(std::make_unique<AllGatherMatmul>(heaps_.share(r), config(max_m, max_k)));
  }

  int world() const { return heaps_.world(); }
  AllGatherMatmul& op(int r) { return *ops_[size_t(r)]; }
  cudaStream_t stream(int r) const { return heaps_.stream(r); }

  // One Problem per rank (the same shards on each; rank r's B, or with same_b the replicated one).
  std::vector<Problem> problems(const Shape& s, uint64_t seed, bool same_b) const {
    std::vector<Problem> ps;
    for (int r = 0; r < world(); ++r) ps.emplace_back(s, seed, same_b, r, world());
    return ps;
  }

  // Poisons every rank's C and op buffers and waits (the peers write into them).
  void poison(std::vector<Problem>& ps) {
    for (int r = 0; r < world(); ++r) ps[size_t(r)].poison_c(stream(r)), op(r).fill_buffers(0xFF, stream(r));
    TF_CUDA(cudaDeviceSynchronize());
  }

  // Enqueues `v` on every rank behind the gate (rank `late` first sleeps late_ns on its stream); in
  // place: each rank's shard copied into its op's slot first. Returns every rank's gathered A.
  std::vector<GatheredA> launch(std::vector<Problem>& ps, AgmmVariant v, bool in_place = false, int late = -1,
                                uint64_t late_ns = 0) {
    std::vector<GatheredA> gs;
    heaps_.gated([&] {
      for (int r = 0; r < world(); ++r) {
        const AgmmArgs a = args(ps, r, v, in_place);
        if (r == late) heaps_.delay(r, late_ns);
        gs.push_back(op(r).launch(v, a, stream(r)));
      }
    });
    return gs;
  }

  // Waits for every rank (a device wait that gave up fails with its diagnostic), then checks every
  // rank's C against the reference and its gathered A against the shards; the gathered A, and C
  // after ksplit and nsplit (the same sums in the same order everywhere), the same on every rank.
  void check(std::vector<Problem>& ps, const std::vector<GatheredA>& gs, AgmmVariant v, const std::string& what) {
    heaps_.sync(what);
    uint64_t hash0 = 0;
    std::vector<uint16_t> c0;
    for (int r = 0; r < world(); ++r) {
      const std::string at = what + " rank " + std::to_string(r) + " of " + std::to_string(world());
      Problem& p = ps[size_t(r)];
      p.expect_c(at);
      const uint64_t hash = p.expect_gathered_values(gs[size_t(r)], at);
      if (r == 0) hash0 = hash;
      EXPECT_EQ(hash, hash0) << at << ": gathered A differs from rank 0's";
      if (v != AgmmVariant::ksplit && v != AgmmVariant::nsplit) continue;
      if (r == 0) c0 = p.c_bits();
      else EXPECT_TRUE(p.c_bits() == c0) << at << ": C differs from rank 0's bit for bit";
    }
  }

  // Every rank's cuBLASLt kernels of `v` loaded (AllGatherMatmul::warm_up) and waited for: a gated
  // launch must not load one.
  void warm_up(std::vector<Problem>& ps, AgmmVariant v, bool in_place = false) {
    for (int r = 0; r < world(); ++r) op(r).warm_up(v, args(ps, r, v, in_place), stream(r));
    heaps_.sync("warm-up");
  }

  // warm_up, then as launch() and check() above.
  void run(std::vector<Problem>& ps, AgmmVariant v, const std::string& what, bool in_place = false) {
    warm_up(ps, v, in_place);
    poison(ps);
    check(ps, launch(ps, v, in_place), v, what);
  }

  // As a serving engine replays its step: run() once outside a capture (plans, attributes,
  // cuBLASLt's kernels), then two launches of `v` captured on every rank into its own CUDA graph
  // (on the decoys' inputs, then on ps's),
  // rank `late` sleeping 20 us before each inside its graph, and three replays of every rank's graph
  // started together, with fresh inputs (seeds seed, seed + 1, ...) and poisoned outputs before each;
  // every replay checked. The epochs advance inside a graph and across replays with no host work.
  void replay(std::vector<Problem>& ps, AgmmVariant v, bool in_place, int late, uint64_t seed,
              const std::string& what) {
    const auto t0 = std::chrono::steady_clock::now();
    run(ps, v, what + " outside a graph", in_place);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<GatheredA> gs(static_cast<size_t>(world()));
    std::vector<Problem> decoys;  // the first launch's inputs: the second must not read its data
    for (const Problem& p : ps) decoys.push_back(p.decoy());
    const auto graphs = heaps_.capture_each([&](int r) {
      for (int i = 0; i < 2; ++i) {
        if (r == late) heaps_.delay(r, 20'000);
        gs[size_t(r)] = op(r).launch(v, args(i ? ps : decoys, r, v, in_place), stream(r));
      }
    });
    for (int rep = 0; rep < 3; ++rep) {
      for (Problem& p : ps) p.refresh(seed + uint64_t(rep));
      poison(ps);
      heaps_.launch_graphs(graphs);
      check(ps, gs, v, what + " graph replay " + std::to_string(rep));
    }
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("%s: %.2f s outside a graph, %.2f s captured and replayed\n", what.c_str(),
                std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
  }

  // Every variant of `seq` warmed up, then `seq` launched back to back without a reset, rank `late`
  // sleeping late_ns before each of its launches, on ps's inputs and their decoys' in turn (ending
  // on ps's); the last launch checked, into a C poisoned just before it (the earlier launches on
  // ps's inputs wrote the same values).
  void burst(std::vector<Problem>& ps, const std::vector<AgmmVariant>& seq, int late, uint64_t late_ns,
             const std::string& what) {
    std::vector<AgmmVariant> warm;
    for (AgmmVariant v : seq)
      if (std::find(warm.begin(), warm.end(), v) == warm.end()) warm_up(ps, v), warm.push_back(v);
    std::vector<Problem> decoys;
    for (const Problem& p : ps) decoys.push_back(p.decoy());
    poison(ps);
    std::vector<GatheredA> gs;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (i + 1 == seq.size())
        for (int r = 0; r < world(); ++r) ps[size_t(r)].poison_c(stream(r));
      gs = launch((seq.size() - 1 - i) % 2 ? decoys : ps, seq[i], false, late, late_ns);
    }
    check(ps, gs, seq.back(), what + ", the last " + variant_name(seq.back()));
  }

 private:
  // Rank r's arguments for `v` (in place: its shard copied into the op's slot on its stream).
  AgmmArgs args(std::vector<Problem>& ps, int r, AgmmVariant v, bool in_place) {
    Problem& p = ps[size_t(r)];
    AgmmArgs a = in_place ? p.in_place_args(op(r), stream(r)) : p.args();
    a.b_replicated = p.shape().gather_dim == 1 && (v == AgmmVariant::ksplit || v == AgmmVariant::nsplit);
    return a;
  }

  static AgmmConfig config(int64_t max_m, int64_t max_k) {
    AgmmConfig c;
    c.max_m = max_m, c.max_k = max_k;
    c.ksplit_max_n = 1024;  // the widest ksplit shape here
    return c;
  }
  // Each rank's heap: the gathered A, ksplit's partials (its own and 2 (W - 1) received), flags.
  static uint64_t span(int world, const AgmmConfig& c) {
    const uint64_t gathered = uint64_t(c.max_m) * uint64_t((c.max_k + 7) / 8 * 8) * 2;
    const uint64_t partials = uint64_t(c.ksplit_max_m) * uint64_t(c.ksplit_max_n) * 4 * uint64_t(2 * world - 1);
    return gathered + 2 * partials + (64ull << 20);
  }

  SimulatedHeaps heaps_;
  std::vector<std::unique_ptr<AllGatherMatmul>> ops_;
};

struct SimVariant {
  const char* name;
  AgmmVariant v;
};
// pull needs whole tiles per shard (gather_dim 0: M / W a multiple of 128): it runs on its own shapes.
constexpr SimVariant kGatherVariants[] = {{"push", AgmmVariant::push},
                                          {"sm-specialized", AgmmVariant::sm_specialized},
                                          {"fused-ce", AgmmVariant::fused_ce}};

std::string world_label(int w) { return "W=" + std::to_string(w) + " "; }

// The odd shapes of the two-GPU tests (M not a multiple of any tile, K = 1001 or K / W a multiple
// of 8 but not of 64, N = 1000) through every gathering variant, both gather dims, bf16 NK and
// fp16 KN, and in place; pull on whole-tile shards (M = 256 W, K = 520; M = 333, K = 320 W).
TEST(AgmmSim, GatheringVariantsAtTwoToEightRanks) {
  REQUIRE_SIMULATION_ENV();
  for (int w : {2, 3, 4, 8}) {
    SimulatedAgmm sim(w, 500 * w, 504 * w);
    for (int gd : {0, 1}) {
      const bool bf16 = gd == 0;
      const DType t = bf16 ? DType::bf16 : DType::fp16;
      const BLayout l = bf16 ? BLayout::nk : BLayout::kn;
      auto ps = sim.problems(odd_shape(gd, t, l, w), 300 + uint64_t(w) * 2 + uint64_t(gd), false);
      const std::string shape = world_label(w) + label(ps[0].shape()) + " ";
      for (const SimVariant& sv : kGatherVariants) sim.run(ps, sv.v, shape + sv.name);
      for (const SimVariant& sv : kGatherVariants) sim.run(ps, sv.v, shape + sv.name + " in place", true);
      auto whole = sim.problems(gd == 0 ? Shape{256 * w, 1000, 520, 0, t, l} : Shape{333, 1000, 320 * w, 1, t, l},
                                320 + uint64_t(w) * 2 + uint64_t(gd), false);
      const std::string whole_shape = world_label(w) + label(whole[0].shape()) + " ";
      sim.run(whole, AgmmVariant::pull, whole_shape + "pull");
      sim.run(whole, AgmmVariant::pull, whole_shape + "pull in place", true);
    }
  }
}

// push and sm-specialized on 2-CTA pair tiles whose last pair ends in its first CTA (an odd count
// of bm-row m-blocks): the waiting GEMM counts every CTA's tile toward publishing the launch's
// epoch, the one past M too. r267 (AgmmSim.RandomShapesAtRandomWorlds, W = 4 M = 584): the count
// fell one short per n-block, the epoch was published while tiles still waited for it, and they
// waited out their deadline. The shape is found from the plans, so a retuned heuristic still
// lands on one.
TEST(AgmmSim, PairTilesWithAnOddLastPair) {
  REQUIRE_SIMULATION_ENV();
  for (int w : {2, 3, 4}) {
    const int sms = SimulatedHeaps::rank_sms(w);
    Shape s{0, 815, 175, 0, DType::bf16, BLayout::kn};
    for (int64_t rows = 1; rows <= 1000 && s.m == 0; ++rows) {
      AgmmArgs a;
      a.m = rows * w, a.n = s.n, a.k = s.k, a.gather_dim = 0, a.dtype = s.dtype, a.b_layout = s.layout;
      const gemm::GemmConfig c = make_sm_specialized_plan(a, w, AgmmConfig{}, sms).gemm;
      if (c.cluster_m == 2 && (a.m + c.bm - 1) / c.bm % 2 == 1) s.m = a.m;
    }
    ASSERT_GT(s.m, 0) << "no shape with an odd last pair at W=" << w << " (" << sms << " SMs a rank)";
    SimulatedAgmm sim(w, s.m, s.k);
    auto ps = sim.problems(s, 340 + uint64_t(w), false);
    const std::string shape = world_label(w) + label(s) + " ";
    for (AgmmVariant v : {AgmmVariant::push, AgmmVariant::sm_specialized}) {
      sim.run(ps, v, shape + variant_name(v));
      sim.run(ps, v, shape + variant_name(v) + " in place", true);
    }
  }
}

// pull on 2-CTA pair tiles whose last pair ends in its first CTA, at odd worlds (M / W whole
// m-blocks, W of them: an odd count when W is odd). The second CTA's m-block, W, belongs to no rank,
// and its A tensor map was never built: r283 (AgmmSim.RandomShapesAtRandomWorlds, seed
// 12684032186503707283, W = 5 M = 640 N = 843 K = 45) ended in an illegal instruction. On real GPUs
// this is any odd world, not only the simulation. The shape is found from the plan.
TEST(AgmmSim, PullPairTilesPastTheLastShard) {
  REQUIRE_SIMULATION_ENV();
  for (int w : {3, 5, 7}) {
    const int sms = SimulatedHeaps::rank_sms(w);
    Shape s{0, 843, 45, 0, DType::fp16, BLayout::nk};
    for (int64_t tiles = 1; tiles <= 9 && s.m == 0; tiles += 2) {
      AgmmArgs a;
      a.m = w * tiles * 128, a.n = s.n, a.k = s.k, a.gather_dim = 0, a.dtype = s.dtype, a.b_layout = s.layout;
      const gemm::GemmConfig c = make_pull_plan(a, w, sms).gemm;
      if (c.cluster_m == 2 && c.bm == 128) s.m = a.m;
    }
    ASSERT_GT(s.m, 0) << "no pull shape on pair tiles at W=" << w << " (" << sms << " SMs a rank)";
    SimulatedAgmm sim(w, s.m, s.k);
    auto ps = sim.problems(s, 350 + uint64_t(w), false);
    const std::string shape = world_label(w) + label(s) + " ";
    sim.run(ps, AgmmVariant::pull, shape + "pull");
    sim.run(ps, AgmmVariant::pull, shape + "pull in place", true);
  }
}

// ksplit's skinny path (M <= 32) and band path (M >= 512, and M = 127 forced), B replicated,
// gather_dim 1, in place too, then three launches back to back with the last rank late.
TEST(AgmmSim, KsplitSkinnyAndBandsAtTwoToEightRanks) {
  REQUIRE_SIMULATION_ENV();
  for (int w : {2, 3, 4, 8}) {
    SimulatedAgmm sim(w, 1024, kSplitShardK * w);
    for (int64_t m : {3, 32, 520, 127}) {
      auto ps = sim.problems({m, 1003, kSplitShardK * w, 1, m == 32 ? DType::fp16 : DType::bf16,
                              m == 32 ? BLayout::kn : BLayout::nk},
                             400 + uint64_t(m), true);
      const std::string shape = world_label(w) + label(ps[0].shape()) + " ksplit" + (m == 127 ? " bands" : "");
      if (m == 127) setenv("TAXFREE_AGMM_KSPLIT_PATH", "bands", 1);
      sim.run(ps, AgmmVariant::ksplit, shape);
      sim.run(ps, AgmmVariant::ksplit, shape + " in place", true);
      // Back to back, the last rank late (as GraphReplayAtTwoThreeAndEightRanks replays them).
      sim.burst(ps, std::vector<AgmmVariant>(3, AgmmVariant::ksplit), w - 1, 20'000, shape + " x3, the last rank late");
      unsetenv("TAXFREE_AGMM_KSPLIT_PATH");
    }
  }
}

// The variants that call cuBLASLt, each rank's kernels loaded first (warm_up): decomposed (the
// copy engine's shards and arrival flags, a GEMM per arriving shard: the odd shapes, both gather
// dims, in place), nsplit (a column block of C per rank, fp32 sums per arriving shard, then the
// block all-gather) and ksplit's two-kernel path (M between the skinny and band paths), B
// replicated, with the exchange the size picks at this world (agmm::ksplit_owner_sums) and then the
// other one forced.
TEST(AgmmSim, CublasLtVariantsAtTwoToEightRanks) {
  REQUIRE_SIMULATION_ENV();
  for (int w : {2, 3, 4, 8}) {
    SimulatedAgmm sim(w, std::max<int64_t>(1024, 500 * w), kSplitShardK * w);
    for (int gd : {0, 1}) {
      const bool bf16 = gd == 0;
      auto ps = sim.problems(odd_shape(gd, bf16 ? DType::bf16 : DType::fp16, bf16 ? BLayout::nk : BLayout::kn, w),
                             700 + uint64_t(w) * 2 + uint64_t(gd), false);
      const std::string shape = world_label(w) + label(ps[0].shape()) + " ";
      sim.run(ps, AgmmVariant::decomposed, shape + "decomposed");
      sim.run(ps, AgmmVariant::decomposed, shape + "decomposed in place", true);
    }
    for (int64_t m : {40, 200}) {
      auto ps = sim.problems({m, 1003, kSplitShardK * w, 1, m == 40 ? DType::fp16 : DType::bf16,
                              m == 40 ? BLayout::kn : BLayout::nk},
                             720 + uint64_t(m), true);
      const std::string shape = world_label(w) + label(ps[0].shape()) + " ";
      for (AgmmVariant v : {AgmmVariant::nsplit, AgmmVariant::ksplit}) {
        sim.run(ps, v, shape + variant_name(v));
        sim.run(ps, v, shape + variant_name(v) + " in place", true);
      }
      const bool by_size = agmm::ksplit_owner_sums(m * 1008 * 4, w);
      const char* other = by_size ? "all-to-all" : "owner-sums";
      setenv("TAXFREE_AGMM_KSPLIT_EXCHANGE", other, 1);
      sim.run(ps, AgmmVariant::ksplit, shape + "ksplit, exchange " + other);
      unsetenv("TAXFREE_AGMM_KSPLIT_EXCHANGE");
    }
  }
}

// Epochs, not resets: at three ranks, 210 launches back to back per rank cycling through the
// gathering variants and decomposed (and ksplit, nsplit at gather_dim 1), rank 1 sleeping 20 us before each of
// its launches, the last launch checked; then one more with rank 1 200 us late.
TEST(AgmmSim, HundredsOfMixedLaunchesWithoutResetAtThreeRanks) {
  REQUIRE_SIMULATION_ENV();
  constexpr int kWorld = 3;
  SimulatedAgmm sim(kWorld, 1024, kSplitShardK * kWorld);
  auto rows = sim.problems({kWorld * 128, 264, 520, 0, DType::bf16, BLayout::nk}, 500, false);  // whole tiles: pull
  // Whole k-tiles (pull), M <= 32 (ksplit's skinny path).
  auto cols = sim.problems({32, 264, 1024 * kWorld, 1, DType::bf16, BLayout::kn}, 501, true);
  std::vector<AgmmVariant> gathering = {AgmmVariant::pull, AgmmVariant::decomposed};
  for (const SimVariant& sv : kGatherVariants) gathering.push_back(sv.v);
  std::vector<AgmmVariant> splitting = gathering;
  splitting.push_back(AgmmVariant::ksplit);
  splitting.push_back(AgmmVariant::nsplit);
  for (auto* ps : {&rows, &cols}) {
    const std::vector<AgmmVariant>& cycle = ps == &rows ? gathering : splitting;
    const std::string shape = label((*ps)[0].shape());
    std::vector<AgmmVariant> seq;
    for (int i = 0; i < 210; ++i) seq.push_back(cycle[size_t(i) % cycle.size()]);
    sim.burst(*ps, seq, 1, 20'000, shape + " after 210 mixed launches, rank 1 late");
    for (AgmmVariant last : cycle) {
      sim.poison(*ps);
      sim.check(*ps, sim.launch(*ps, last, false, 1, 200'000), last, shape + " " + variant_name(last) + ", rank 1 late");
    }
  }
}

// ksplit's two-kernel path among other variants, back to back at eight ranks with one late: the
// launches AgmmSim.RandomShapesAtRandomWorlds drew in r269 (seed 10707698007169557191, shape 5),
// where the side gather's 16 CTAs per rank, waiting for their peers' "free" flags, filled the GPU
// the eight 16-SM shares have and starved a rank's gather of the SMs it needed to raise its own
// (r270: 4 of 4 runs timed out; 0 of 4 with 2 CTAs). The gather now takes an eighth of the share
// (side_gather_ctas(): 16 on a whole GPU, 2 here).
TEST(AgmmSim, KsplitAmongOtherVariantsAtEightRanksWithOneLate) {
  REQUIRE_SIMULATION_ENV();
  constexpr int kWorld = 8;
  SimulatedAgmm sim(kWorld, 443, 2176);
  auto ps = sim.problems({443, 5, 2176, 1, DType::fp16, BLayout::kn}, 810, true);
  using V = AgmmVariant;
  sim.burst(ps,
            {V::fused_ce, V::ksplit, V::fused_ce, V::fused_ce, V::decomposed, V::push, V::nsplit, V::decomposed,
             V::nsplit, V::sm_specialized, V::fused_ce, V::ksplit},
            4, 20'000, label(ps[0].shape()) + " after 12 mixed launches, rank 4 late");
}

// cuBLASLt's GEMMs of a rank that lags while the other ranks' grids wait for it: nsplit back to
// back at five ranks with one late, the launches AgmmSim.RandomShapesAtRandomWorlds drew in r275
// (seed 17658819865327697873, shape 3). The other four ranks' block all-gathers, 25 CTAs of a whole
// SM each, waited for the fifth, whose cuBLASLt GEMM had 2x4 clusters: a cluster needs 8 free SMs
// in one GPC, the 32 SMs left were spread over all of them, and a cluster grid waiting to be placed
// holds back every later grid (r276-r279: 9 of 9 runs of 12 nsplits timed out within 5 rounds).
// A share smaller than the GPU now keeps cuBLASLt to clusters of 2 (Clusters::small). Then
// nsplit, decomposed and ksplit (each calls cuBLASLt) mixed.
TEST(AgmmSim, CublasLtBehindWaitingRanksAtFiveRanks) {
  REQUIRE_SIMULATION_ENV();
  constexpr int kWorld = 5;
  SimulatedAgmm sim(kWorld, 38, 160);
  auto ps = sim.problems({38, 360, 160, 1, DType::bf16, BLayout::kn}, 830, true);
  using V = AgmmVariant;
  const std::string shape = label(ps[0].shape());
  for (int round = 0; round < 3; ++round)
    sim.burst(ps, std::vector<V>(12, V::nsplit), 4, 20'000, shape + " round " + std::to_string(round) + " of 12 nsplits");
  sim.burst(ps, {V::nsplit, V::decomposed, V::nsplit, V::ksplit, V::decomposed, V::decomposed, V::nsplit, V::ksplit,
                 V::nsplit, V::ksplit, V::decomposed, V::nsplit},
            2, 20'000, shape + " after 12 mixed cuBLASLt launches, rank 2 late");
}

// Every variant a share runs, captured into a CUDA graph on every rank and replayed
// (SimulatedAgmm::replay: two launches a graph, the last rank late inside its graph, three replays
// on fresh inputs, each checked), at 2, 3 and 8 ranks: gather_dim 0 on the odd rows (bf16, B
// [N, K]; push in place too) and pull on whole-tile shards (B [K, N]); gather_dim 1 with B
// replicated (fp16, B [K, N]) at M = 200 (ksplit's two-kernel path: cuBLASLt in the graph) and
// ksplit's skinny (M = 24) and band (M = 520) paths. r303 found the band path's second launch in a
// graph stuck at three ranks (every replay, both runs): its sum kernel's grid (4 CTAs a band, 288)
// waited for a peer's A shard, whose copies did not come; the same launches back to back eagerly
// passed on that kernel (r304), so the copies as graph nodes seem to need the SMs the waiting
// CTAs held. The sum now waits for no copy (the side stream waits for the shards) and its grid is
// capped at the share's SMs.
TEST(AgmmSim, GraphReplayAtTwoThreeAndEightRanks) {
  REQUIRE_SIMULATION_ENV();
  using V = AgmmVariant;
  for (int w : {2, 3, 8}) {
    // K / W = 264: a multiple of 8, not of 64, and small: every replay draws fresh inputs on the host.
    constexpr int64_t kShardK = 264;
    SimulatedAgmm sim(w, std::max<int64_t>(520, 203 * w), std::max<int64_t>(1001, kShardK * w));
    const int late = w - 1;
    const uint64_t seed = 900 + 10 * uint64_t(w);
    auto rows = sim.problems({203 * w, 264, 1001, 0, DType::bf16, BLayout::nk}, seed, false);
    const std::string rows_shape = world_label(w) + label(rows[0].shape()) + " ";
    for (V v : {V::push, V::sm_specialized, V::fused_ce, V::decomposed})
      sim.replay(rows, v, false, late, seed + 1, rows_shape + variant_name(v));
    sim.replay(rows, V::push, true, late, seed + 4, rows_shape + "push in place");
    auto whole = sim.problems({128 * w, 264, 520, 0, DType::bf16, BLayout::kn}, seed + 5, false);
    sim.replay(whole, V::pull, false, late, seed + 6, world_label(w) + label(whole[0].shape()) + " pull");
    for (int64_t m : {200, 24, 520}) {
      auto cols = sim.problems({m, 1003, kShardK * w, 1, DType::fp16, BLayout::kn}, seed + 7, true);
      const std::string cols_shape = world_label(w) + label(cols[0].shape()) + " B replicated ";
      std::vector<V> vs = {V::ksplit};
      if (m == 200) vs = {V::push, V::sm_specialized, V::fused_ce, V::decomposed, V::nsplit, V::ksplit};
      for (V v : vs) sim.replay(cols, v, false, late, seed + 8, cols_shape + variant_name(v));
    }
    if (HasFailure()) return;
  }
}

// bsp and bsp-own call NCCL: NotSupported on a share without a communicator, nothing enqueued
// (the next launch of another variant still matches).
TEST(AgmmSim, BspIsNotSupportedWithoutNccl) {
  REQUIRE_SIMULATION_ENV();
  SimulatedAgmm sim(2, 1000, 1008);
  auto ps = sim.problems(odd_shape(0, DType::bf16, BLayout::nk, 2), 600, false);
  for (AgmmVariant v : {AgmmVariant::bsp, AgmmVariant::bsp_own}) {
    try {
      sim.op(0).launch(v, ps[0].args(), sim.stream(0));
      ADD_FAILURE() << variant_name(v) << " launched without NCCL";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::NotSupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
    }
  }
  sim.run(ps, AgmmVariant::push, "push after the refused bsp");
}

// Shapes nobody listed at a random world, fresh every run (TAXFREE_TEST_SEED=N repeats one; its
// seed is in every failure): 2-8 simulated ranks (5-7 included, which no other test runs), either
// gather dim, dtype and B layout, M, N and K log-uniform within the shard rules (gather_dim 0: M a
// multiple of W; 1: K / W a multiple of 8; a quarter of them whole tiles per shard), through two
// variants drawn from those a share runs (the gathering ones and decomposed; pull where the shards
// are whole tiles; ksplit and nsplit where B is replicated), the second
// in place, then 12 launches back to back of variants drawn the same way, then one drawn variant
// captured into CUDA graphs and replayed (SimulatedAgmm::replay).
TEST(AgmmSim, RandomShapesAtRandomWorlds) {
  REQUIRE_SIMULATION_ENV();
  Draws rnd;
  for (int i = 0; i < 6; ++i) {
    const int w = rnd.uni(2, 8), gd = rnd.uni(0, 1);
    const DType t = rnd.uni(0, 1) ? DType::bf16 : DType::fp16;
    const BLayout l = rnd.uni(0, 1) ? BLayout::nk : BLayout::kn;
    const int64_t n = rnd.log_uni(1, 1024);
    const bool whole = rnd.uni(0, 3) == 0;  // shards of whole 128-row tiles or 64-column k-blocks: pull runs
    const int64_t m = gd == 0 ? w * (whole ? 128 * rnd.log_uni(1, 3) : rnd.log_uni(1, 400)) : rnd.log_uni(1, 1000);
    const int64_t k = gd == 0 ? rnd.log_uni(1, 2000) : w * (whole ? 64 * rnd.log_uni(1, 31) : 8 * rnd.log_uni(1, 250));
    const bool same_b = gd == 1 && rnd.uni(0, 1);
    std::vector<AgmmVariant> pool = {AgmmVariant::push, AgmmVariant::sm_specialized, AgmmVariant::fused_ce,
                                     AgmmVariant::decomposed};
    if (same_b) pool.push_back(AgmmVariant::ksplit), pool.push_back(AgmmVariant::nsplit);
    try {  // pull where its plan takes the shape (whole tiles per shard for the GEMM it picks)
      AgmmArgs a;
      a.m = m, a.n = n, a.k = k, a.gather_dim = gd, a.dtype = t, a.b_layout = l;
      make_pull_plan(a, w, SimulatedHeaps::rank_sms(w));
      pool.push_back(AgmmVariant::pull);
    } catch (const Error& e) {
      if (e.status() != Status::NotSupported) throw;
    }
    SimulatedAgmm sim(w, m, k);
    auto ps = sim.problems({m, n, k, gd, t, l}, rnd.bits(), same_b);
    const std::string shape = world_label(w) + label(ps[0].shape()) + (same_b ? " B replicated " : " ") + rnd.where(i) + " ";
    const auto draw = [&] { return pool[size_t(rnd.uni(0, int(pool.size()) - 1))]; };
    for (int in_place = 0; in_place < 2; ++in_place) {
      const AgmmVariant v = draw();
      const std::string what = shape + variant_name(v) + (in_place ? " in place" : "");
      std::printf("%s\n", what.c_str());
      sim.run(ps, v, what, in_place == 1);
    }
    // Then launches back to back without a reset, each variant drawn, one rank 20 us late before
    // each: every op's epochs across variants; the last launch checked.
    const int late = rnd.uni(0, w - 1);
    std::vector<AgmmVariant> seq;
    for (int j = 0; j < 12; ++j) seq.push_back(draw());
    sim.burst(ps, seq, late, 20'000, shape + "12 drawn launches, rank " + std::to_string(late) + " late");
    const AgmmVariant v = draw();
    sim.replay(ps, v, false, late, rnd.bits(), shape + variant_name(v) + ", rank " + std::to_string(late) + " late");
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace taxfree
