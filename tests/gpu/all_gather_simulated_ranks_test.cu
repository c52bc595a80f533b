// all_gather's push kernels, both protocols, with 2, 3, 4 and 8 ranks simulated on one GPU
// (simulated_ranks.h): the ready / arrived epoch flags, the low-latency lines and their parities
// run for real whatever the world of the job. Each rank's AllGather op is built on its RankShare,
// so its grids never exceed the blocks resident on its share of the SMs and the W grids are
// resident together, as their waits for each other need (r177: with 2 blocks per SM per rank, four
// ranks' 3 MiB grids did not fit and waited out their deadline). Every rank's recv is checked word
// for word after every launch, in place and not, then after hundreds of launches without a reset,
// and after CUDA-graph replays.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu_env.h"
#include "random_draws.h"
#include "simulated_ranks.h"
#include "taxfree/ops/all_gather.h"
#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {

using test::SimulatedHeaps;

// The value of word i of rank r's shard at step s: distinct per (step, rank, word).
__host__ __device__ inline uint32_t shard_word(uint32_t step, uint32_t rank, uint64_t i) {
  return (step << 20 | rank << 16) ^ uint32_t(i * 2654435761ull);
}

__global__ void fill_shard(uint32_t* p, uint64_t words, uint32_t step, uint32_t rank) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < words; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = shard_word(step, rank, i);
}

// W simulated ranks, an AllGather op on each rank's share (low-latency lines up to 64 KiB: both
// protocols at moderate sizes), recv [W][max_bytes] in its heap after the op's flags, a send buffer.
class SimulatedAllGather {
 public:
  SimulatedAllGather(int world, uint64_t max_bytes)
      : heaps_(world, (uint64_t(world) + 2) * (uint64_t(1) << 20) + uint64_t(world) * max_bytes) {
    AllGatherConfig c;
    c.ll_max_bytes = 64 << 10;
    for (int r = 0; r < world; ++r) {
      const RankShare s = heaps_.share(r);
      ops_.push_back(std::make_unique<AllGather>(s, c));
      recvs_.push_back(static_cast<char*>(s.heap->allocate(uint64_t(world) * max_bytes, 256, "recv")));
      sends_.push_back(nullptr);
      TF_CUDA(cudaMalloc(&sends_.back(), max_bytes));
    }
  }
  ~SimulatedAllGather() {
    for (char* s : sends_) cudaFree(s);
  }
  SimulatedAllGather(const SimulatedAllGather&) = delete;
  SimulatedAllGather& operator=(const SimulatedAllGather&) = delete;

  int world() const { return heaps_.world(); }
  char* recv(int r) const { return recvs_[size_t(r)]; }

  // Rank r's step: fills its shard (in its recv slot when in_place, else its send buffer), then its
  // push launch, both on its stream.
  void launch(int r, uint64_t bytes, uint32_t step, bool in_place) {
    char* from = in_place ? recv(r) + uint64_t(r) * bytes : send(r);
    fill_shard<<<64, 256, 0, heaps_.stream(r)>>>(reinterpret_cast<uint32_t*>(from), bytes / 4, step, uint32_t(r));
    TF_CUDA(cudaGetLastError());
    op(r).launch(AllGatherVariant::push, from, recv(r), bytes, heaps_.stream(r));
  }

  AllGather& op(int r) { return *ops_[size_t(r)]; }
  char* send(int r) const { return sends_[size_t(r)]; }
  cudaStream_t stream(int r) const { return heaps_.stream(r); }
  SimulatedHeaps& heaps() { return heaps_; }

  // Every rank's recv poisoned, and waited for (the peers write into it).
  void poison_recv(uint64_t bytes) {
    for (int r = 0; r < world(); ++r) TF_CUDA(cudaMemsetAsync(recv(r), 0xFF, uint64_t(world()) * bytes, stream(r)));
    TF_CUDA(cudaDeviceSynchronize());
  }

  // Waits for every rank; each rank's recv must hold every rank's shard of `step`.
  void check(uint64_t bytes, uint32_t step, const std::string& what) {
    heaps_.sync(what);
    std::vector<uint32_t> got(uint64_t(world()) * bytes / 4);
    for (int r = 0; r < world(); ++r) {
      TF_CUDA(cudaMemcpy(got.data(), recv(r), got.size() * 4, cudaMemcpyDeviceToHost));
      int64_t bad = 0;
      for (int p = 0; p < world(); ++p)
        for (uint64_t i = 0; i < bytes / 4; ++i) {
          const uint32_t want = shard_word(step, uint32_t(p), i), x = got[uint64_t(p) * bytes / 4 + i];
          if (x != want && ++bad <= 3)
            ADD_FAILURE() << what << ": rank " << r << " holds word " << i << " of rank " << p << "'s shard as " << x
                          << ", want " << want;
        }
      EXPECT_EQ(bad, 0) << what << ": rank " << r;
    }
  }

 private:
  SimulatedHeaps heaps_;
  std::vector<std::unique_ptr<AllGather>> ops_;
  std::vector<char*> recvs_, sends_;
};

TEST(AllGatherSim, PushBothProtocolsAtTwoToEightRanks) {
  TF_REQUIRE_GPUS(1);
  // 16 B and 4 KiB + 48 (low-latency), 64 KiB (its limit), 64 KiB + 16 (direct, a partial chunk),
  // 3 MiB + 16 (direct, every block several chunks).
  const uint64_t sizes[] = {16, 4096 + 48, 64 << 10, (64 << 10) + 16, (3 << 20) + 16};
  for (int world : {2, 3, 4, 8}) {
    SimulatedAllGather ag(world, sizes[4]);
    uint32_t step = 0;
    for (uint64_t bytes : sizes)
      for (bool in_place : {false, true}) {
        ++step;
        for (int r = 0; r < world; ++r) ag.launch(r, bytes, step, in_place);
        ag.check(bytes, step,
                 "W=" + std::to_string(world) + " " + std::to_string(bytes) + " B" + (in_place ? " in place" : ""));
      }
  }
}

// Hundreds of launches per rank back to back on its own stream, new data each time, no host
// reset: every flag and line is reused across epochs only as the protocols allow.
TEST(AllGatherSim, HundredsOfLaunchesWithoutResetAtThreeRanks) {
  TF_REQUIRE_GPUS(1);
  constexpr int kWorld = 3, kSteps = 300;
  for (uint64_t bytes : {uint64_t(4096), uint64_t(1) << 20}) {
    SimulatedAllGather ag(kWorld, bytes);
    for (uint32_t step = 1; step <= kSteps; ++step)
      for (int r = 0; r < kWorld; ++r) ag.launch(r, bytes, step, false);
    ag.check(bytes, kSteps, std::to_string(bytes) + " B after " + std::to_string(kSteps) + " launches");
  }
}

// Ten launches a rank captured into a CUDA graph (every other one in place, each step's own shard
// values, the last rank 20 us late before each) and replayed three times, every recv poisoned
// before each replay (the graph writes the same values every replay: poison is what shows it ran),
// at 2, 3 and 8 ranks, both protocols: the epochs advance inside the graph and across replays with
// no host work.
TEST(AllGatherSim, GraphReplayAtTwoThreeAndEightRanks) {
  TF_REQUIRE_GPUS(1);
  for (int world : {2, 3, 8})
    for (uint64_t bytes : {uint64_t(4096 + 48), (uint64_t(1) << 20) + 16}) {
      SimulatedAllGather ag(world, bytes);
      const std::string what = "W=" + std::to_string(world) + " " + std::to_string(bytes) + " B";
      for (int r = 0; r < world; ++r) ag.launch(r, bytes, 1, false);  // outside a graph: plans
      ag.check(bytes, 1, what + " outside a graph");
      const auto graphs = ag.heaps().capture_each([&](int r) {
        for (uint32_t step = 2; step <= 11; ++step) {
          if (r == world - 1) ag.heaps().delay(r, 20'000);
          ag.launch(r, bytes, step, step % 2 == 0);
        }
      });
      for (int rep = 0; rep < 3; ++rep) {
        ag.poison_recv(bytes);
        ag.heaps().launch_graphs(graphs);
        ag.check(bytes, 11, what + " graph replay " + std::to_string(rep));
      }
      if (HasFailure()) return;
    }
}

// Sizes and worlds nobody listed, fresh every run (TAXFREE_TEST_SEED=N repeats one; its seed is in
// every failure): 2-8 simulated ranks, 10 launches back to back without a check between, each of a
// size drawn log-uniform from 16 B to 2 MiB (multiples of 16: both protocols, switching between
// them from one epoch to the next), in place or not, then the last checked; 6 such bursts a run.
TEST(AllGatherSim, RandomSizesBackToBackAtRandomWorlds) {
  TF_REQUIRE_GPUS(1);
  test::Draws rnd;
  constexpr uint64_t kMaxBytes = 2 << 20;
  for (int burst = 0; burst < 6; ++burst) {
    const int world = rnd.uni(2, 8);
    SimulatedAllGather ag(world, kMaxBytes);
    uint64_t bytes = 0;
    bool in_place = false;
    std::string sizes;
    for (uint32_t step = 1; step <= 10; ++step) {
      bytes = std::min<uint64_t>(kMaxBytes, uint64_t(rnd.log_uni(16, double(kMaxBytes))) / 16 * 16);
      in_place = rnd.coin();
      sizes += " " + std::to_string(bytes) + (in_place ? "i" : "");
      for (int r = 0; r < world; ++r) ag.launch(r, bytes, step, in_place);
    }
    const std::string what = "W=" + std::to_string(world) + " sizes" + sizes + " (i: in place) " + rnd.where(burst);
    std::printf("%s\n", what.c_str());
    ag.check(bytes, 10, what);
    if (HasFailure()) return;
  }
}

// The nccl variant needs a communicator: NotSupported on a share without one, nothing enqueued
// (a push launch after it still gathers).
TEST(AllGatherSim, NcclIsNotSupportedWithoutNccl) {
  TF_REQUIRE_GPUS(1);
  SimulatedAllGather ag(2, 4096);
  try {
    ag.op(0).launch(AllGatherVariant::nccl, ag.send(0), ag.recv(0), 4096, nullptr);
    ADD_FAILURE() << "nccl launched without a communicator";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NotSupported) << e.what();
  }
  for (int r = 0; r < 2; ++r) ag.launch(r, 4096, 1, false);
  ag.check(4096, 1, "push after the refused nccl");
}

}  // namespace
}  // namespace taxfree
