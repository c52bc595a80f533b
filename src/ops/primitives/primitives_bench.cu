// Benchmarks of the device primitives: put/get bandwidth, signal latency, barrier latency.
#include <nccl.h>

#include <algorithm>

#include "../../bench/bench_util.cuh"
#include "../../bench/rates.h"
#include "taxfree/bench/harness.h"
#include "taxfree/device/barrier.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {

namespace {

// Launches a sequence has seen end on this device (sequence_begin / sequence_end kernels), after
// the stream is synchronised: counted on the device, so runs replayed from a graph count too.
uint64_t launches_done(const dev::LaunchSequence& seq) {
  uint64_t n = 0;
  TF_CUDA(cudaMemcpy(&n, seq.counter, sizeof n, cudaMemcpyDeviceToHost));
  return n;
}

// ---- put / get -------------------------------------------------------------------------------

// mode oneway: rank 0 -> rank 1 only; ring: every rank r -> r+1 at once (both directions on 2 GPUs).
struct Route {
  int to = -1, from = -1;  // where this rank sends to / receives from (-1: none)
};
Route route_of(int rank, int world, bool ring) {
  if (ring) return {(rank + 1) % world, (rank + world - 1) % world};
  return {rank == 0 ? 1 : -1, rank == 1 ? 0 : -1};
}

// put: local src -> peer's dst; get: peer's src -> local dst. Chunks dealt round-robin to blocks.
__global__ void __launch_bounds__(512) put_kernel(dev::SymmetricView v, char* dst, const char* src, uint64_t bytes,
                                                  uint64_t chunk, int peer) {
  dev::block_copy_chunks(v.peer(dst, peer), src, bytes, chunk, blockIdx.x, gridDim.x);
}

__global__ void __launch_bounds__(512) get_kernel(dev::SymmetricView v, char* dst, const char* src, uint64_t bytes,
                                                  uint64_t chunk, int peer) {
  dev::block_copy_chunks(dst, v.peer(src, peer), bytes, chunk, blockIdx.x, gridDim.x);
}

constexpr uint32_t kBulkChunk = 32 << 10, kBulkStages = 4;

__global__ void bulk_put_kernel(dev::SymmetricView v, char* dst, const char* src, uint64_t bytes, uint64_t slice,
                                int peer) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bars[kBulkStages];
  const uint64_t b = uint64_t(blockIdx.x) * slice;
  if (b >= bytes) return;
  if (threadIdx.x == 0) {
    for (uint32_t i = 0; i < kBulkStages; ++i) dev::mbar_init(dev::smem_addr(&bars[i]), 1);
    dev::fence_mbar_init();
    uint32_t phase = 0;
    dev::bulk_copy(v.peer(dst + b, peer), src + b, std::min(slice, bytes - b), smem, kBulkChunk, kBulkStages, bars,
                   phase);
  }
}

class PutGetBench final : public OpBench {
 public:
  std::string name() const override { return "put_get"; }
  std::vector<std::string> variants() const override { return {"copy-engine", "put", "get", "put-bulk"}; }
  int min_ranks() const override { return 2; }
  void check_options(const Options& o) const override {
    check_shape_entries(o.shapes, {{"bytes", {}, kMaxBytes}, {"mode", {"oneway", "ring"}}});
  }

  std::vector<Case> cases(const Options& o, const Team& team) const override {
    std::vector<Case> out;
    for (const char* mode : {"oneway", "ring"})
      for (int64_t b : size_sweep(o, 1 << 10, 1 << 30, 16)) {
        Case c;
        c.size_bytes = b;
        c.count = b / 2;
        c.type = "bf16";
        c.params = {{"bytes", b}, {"mode", mode}};
        c.label = std::string(mode) + (std::string(mode) == "ring" ? " (all ranks send)" : " (rank 0 -> 1)");
        if (matches_shape_filters(c.params, o.shapes)) out.push_back(c);
      }
    (void)team;
    return out;
  }

  void setup(Team& team, const Case& c, const Options& o) override {
    team_ = &team;
    bytes_ = uint64_t(c.size_bytes);
    route_ = route_of(team.rank(), team.world(), c.params["mode"] == "ring");
    mark_ = team.heap().mark();
    src_ = static_cast<char*>(team.heap().allocate(bytes_, 4096, "bench.put.src"));
    dst_ = static_cast<char*>(team.heap().allocate(bytes_, 4096, "bench.put.dst"));
    seed_ = o.seed ^ bytes_;
    fill_random16(src_, bytes_, seed_, uint64_t(team.rank()), team.stream());
    // Same geometry as all_gather's direct protocol: 8-64 KiB chunks, up to 2 blocks per SM.
    chunk_ = std::clamp<uint64_t>((bytes_ / uint64_t(2 * team.sm_count()) + 15) / 16 * 16, 8 << 10, 64 << 10);
    blocks_ = int(std::clamp<uint64_t>((bytes_ + chunk_ - 1) / chunk_, 1, uint64_t(2 * team.sm_count())));
    slice_ = ((bytes_ + blocks_ - 1) / blocks_ + 15) / 16 * 16;
    TF_CUDA(cudaFuncSetAttribute(bulk_put_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kBulkChunk * kBulkStages)));
    team.sync(team.stream());
  }

  void poison(cudaStream_t s) override { poison16(dst_, bytes_, s); }

  void run(const std::string& v, cudaStream_t s) override {
    const auto& view = team_->view();
    if (v == "get") {  // the receiver pulls
      if (route_.from >= 0) get_kernel<<<blocks_, 512, 0, s>>>(view, dst_, src_, bytes_, chunk_, route_.from);
    } else if (route_.to >= 0) {
      if (v == "copy-engine")
        TF_CUDA(cudaMemcpyAsync(view.peer(dst_, route_.to), src_, bytes_, cudaMemcpyDeviceToDevice, s));
      else if (v == "put")
        put_kernel<<<blocks_, 512, 0, s>>>(view, dst_, src_, bytes_, chunk_, route_.to);
      else
        bulk_put_kernel<<<blocks_, 32, kBulkChunk * kBulkStages, s>>>(view, dst_, src_, bytes_, slice_, route_.to);
    }
    TF_CUDA(cudaGetLastError());
  }

  int64_t check(const std::string&, cudaStream_t s) override {
    team_->device_barrier(s);  // the sender's stores are complete on every rank after this
    team_->sync(s);
    return route_.from >= 0 ? count_mismatch16(dst_, bytes_, seed_, uint64_t(route_.from), s) : 0;
  }

  Figures figures(const Case& c, double seconds) const override {
    Figures f;
    f.algbw_gbs = double(c.size_bytes) / seconds * 1e-9;
    f.busbw_gbs = f.algbw_gbs;
    return f;
  }
  Floor floor(const Case& c, const MachineRates& r) const override {
    return {r.nvlink_bytes_per_s > 0 ? double(c.size_bytes) / r.nvlink_bytes_per_s : 0, "nvlink"};
  }
  void teardown() override { team_->heap().release(mark_); }

 private:
  Team* team_ = nullptr;
  Route route_;
  uint64_t bytes_ = 0, seed_ = 0, mark_ = 0, slice_ = 0, chunk_ = 0;
  int blocks_ = 1;
  char *src_ = nullptr, *dst_ = nullptr;
};

// ---- signal latency --------------------------------------------------------------------------

class SignalBench final : public OpBench {
 public:
  static constexpr int kRounds = 2000;
  std::string name() const override { return "signal"; }
  // Both rows time the same kernel: a round trip, and half of one (one-way latency).
  std::vector<std::string> variants() const override { return {"ping-pong", "one-way"}; }
  int min_ranks() const override { return 2; }
  double ops_per_run(const Case&, const std::string& v) const override {
    return v == "one-way" ? 2.0 * kRounds : double(kRounds);
  }
  void check_options(const Options& o) const override { check_shape_entries(o.shapes, {{"rounds", {}}}); }
  std::vector<Case> cases(const Options&, const Team&) const override {
    Case c;
    c.size_bytes = 8;
    c.count = 1;
    c.type = "u64";
    c.label = "rank 0 <-> rank 1, " + std::to_string(kRounds) + " round trips per launch";
    c.params = {{"rounds", kRounds}};
    return {c};
  }
  void setup(Team& team, const Case&, const Options&) override {
    team_ = &team;
    if (!flag_) {
      flag_ = team.heap().allocate_array<uint64_t>(1, "bench.signal.flag");
      TF_CUDA(cudaMemset(flag_, 0, sizeof(uint64_t)));
      TF_CUDA(cudaDeviceSynchronize());
      seq_ = team.heap().allocate_sequence("bench.signal.sequence");
      team.host_barrier("signal.init");
    }
  }
  void poison(cudaStream_t) override {}
  void run(const std::string&, cudaStream_t s) override {
    launch_ping_pong(team_->view(), flag_, seq_, kRounds, team_->fault(), s);
  }
  int64_t check(const std::string&, cudaStream_t s) override {
    team_->sync(s);
    uint64_t got = 0;
    TF_CUDA(cudaMemcpy(&got, flag_, sizeof got, cudaMemcpyDeviceToHost));
    // Ranks 0 and 1 must hold the last value of the last launch; others never touch the flag. The
    // launches are counted on the device (the sequence), so graph replays count too (--graph).
    const uint64_t want = team_->rank() <= 1 ? launches_done(seq_) * kRounds : 0;
    return got == want ? 0 : 1;
  }
  Figures figures(const Case&, double) const override { return {}; }
  Floor floor(const Case&, const MachineRates&) const override { return {}; }
  void teardown() override {}

 private:
  Team* team_ = nullptr;
  uint64_t* flag_ = nullptr;
  dev::LaunchSequence seq_{};
};

// ---- barrier latency -------------------------------------------------------------------------

__global__ void barrier_loop_kernel(dev::SymmetricView v, uint64_t* slots, dev::LaunchSequence seq, int n,
                                    dev::FaultContext fc) {
  const uint64_t launch = dev::sequence_begin(seq);
  for (int i = 1; i <= n; ++i)
    if (!dev::block_barrier(v, slots, (launch - 1) * uint64_t(n) + i, fc)) break;
  dev::sequence_end(seq, launch);
}

class BarrierBench final : public OpBench {
 public:
  static constexpr int kReps = 200;
  std::string name() const override { return "barrier"; }
  std::vector<std::string> variants() const override { return {"nccl-allreduce", "device", "in-kernel"}; }
  int min_ranks() const override { return 2; }
  double ops_per_run(const Case&, const std::string&) const override { return kReps; }
  void check_options(const Options& o) const override { check_shape_entries(o.shapes, {{"reps", {}}}); }
  std::vector<Case> cases(const Options&, const Team& team) const override {
    Case c;
    c.size_bytes = 4;
    c.count = 1;
    c.type = "i32";
    c.label = std::to_string(team.world()) + " ranks, " + std::to_string(kReps) + " barriers per run";
    c.params = {{"reps", kReps}};
    return {c};
  }
  void setup(Team& team, const Case&, const Options&) override {
    team_ = &team;
    if (!slots_) {
      slots_ = team.heap().allocate_array<uint64_t>(uint64_t(team.world()), "bench.barrier.slots");
      TF_CUDA(cudaMemset(slots_, 0, sizeof(uint64_t) * team.world()));
      TF_CUDA(cudaMalloc(&value_, 2 * sizeof(int)));
      const int one = team.rank() + 1;  // value_[1]: what each run starts the all-reduce from
      TF_CUDA(cudaMemcpy(value_ + 1, &one, sizeof one, cudaMemcpyHostToDevice));
      TF_CUDA(cudaDeviceSynchronize());
      seq_ = team.heap().allocate_sequence("bench.barrier.sequence");
      team.host_barrier("barrier.init");
    }
  }
  void poison(cudaStream_t s) override { TF_CUDA(cudaMemsetAsync(value_, 0xFF, sizeof(int), s)); }
  void run(const std::string& v, cudaStream_t s) override {
    last_ = v;
    if (v == "nccl-allreduce") {  // device to device: a captured graph replays it (--graph)
      TF_CUDA(cudaMemcpyAsync(value_, value_ + 1, sizeof(int), cudaMemcpyDeviceToDevice, s));
      const CallDeadline deadline(team_->coordinator(), "ncclAllReduce (barrier bench)", team_->nccl_call_timeout_s());
      for (int i = 0; i < kReps; ++i) TF_NCCL(ncclAllReduce(value_, value_, 1, ncclInt32, ncclMax, team_->comm(), s));
    } else if (v == "device") {
      for (int i = 0; i < kReps; ++i) team_->device_barrier(s);
    } else {
      barrier_loop_kernel<<<1, 32, 0, s>>>(team_->view(), slots_, seq_, kReps, team_->fault());
      TF_CUDA(cudaGetLastError());
    }
  }
  int64_t check(const std::string& v, cudaStream_t s) override {
    team_->sync(s);
    if (v == "nccl-allreduce") {
      int got = 0;
      TF_CUDA(cudaMemcpy(&got, value_, sizeof got, cudaMemcpyDeviceToHost));
      return got == team_->world() ? 0 : 1;  // max over ranks of rank+1
    }
    if (v == "in-kernel") {
      std::vector<uint64_t> h(size_t(team_->world()));
      TF_CUDA(cudaMemcpy(h.data(), slots_, sizeof(uint64_t) * h.size(), cudaMemcpyDeviceToHost));
      int64_t bad = 0;  // every peer has reached this launch's last epoch (launches counted on the device)
      const uint64_t last = launches_done(seq_) * kReps;
      for (int p = 0; p < team_->world(); ++p)
        if (p != team_->rank()) bad += h[size_t(p)] < last;
      return bad;
    }
    return 0;  // Team::sync already reported any barrier that gave up
  }
  Figures figures(const Case&, double) const override { return {}; }
  Floor floor(const Case&, const MachineRates&) const override { return {}; }
  int launches(const std::string& v) const override { return v == "in-kernel" ? 1 : kReps; }
  void teardown() override {}

 private:
  Team* team_ = nullptr;
  uint64_t* slots_ = nullptr;
  int* value_ = nullptr;
  dev::LaunchSequence seq_{};
  std::string last_;
};

}  // namespace

std::unique_ptr<OpBench> make_put_get_bench() { return std::make_unique<PutGetBench>(); }
std::unique_ptr<OpBench> make_signal_bench() { return std::make_unique<SignalBench>(); }
std::unique_ptr<OpBench> make_barrier_bench() { return std::make_unique<BarrierBench>(); }

}  // namespace taxfree::bench
