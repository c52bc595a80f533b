#include "rates.h"

#include <algorithm>
#include <vector>

#include "taxfree/bench/harness.h"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {

namespace {

__global__ void empty_kernel() {}

// Ranks 0 and 1 bounce a flag `rounds` times; values grow across launches (epoch = base + i).
__global__ void ping_pong_kernel(dev::SymmetricView v, uint64_t* flag, dev::LaunchSequence seq, int rounds,
                                 dev::FaultContext fc) {
  const uint64_t launch = dev::sequence_begin(seq);
  const uint64_t base = (launch - 1) * uint64_t(rounds);
  if (v.rank <= 1) {
    const int peer = 1 - v.rank;
    uint64_t* remote = v.peer(flag, peer);
    for (int i = 1; i <= rounds; ++i) {
      if (v.rank == 0) {
        dev::signal_set(remote, base + i);
        if (!dev::wait_geq(flag, base + i, fc, dev::WaitSite::ping_pong, peer)) break;
      } else {
        if (!dev::wait_geq(flag, base + i, fc, dev::WaitSite::ping_pong, peer)) break;
        dev::signal_set(remote, base + i);
      }
    }
  }
  dev::sequence_end(seq, launch);
}

}  // namespace

Event::Event() { TF_CUDA(cudaEventCreate(&e)); }
Event::~Event() {
  if (e) cudaEventDestroy(e);
}

double elapsed_s(const Event& a, const Event& b) {
  float ms = 0;
  TF_CUDA(cudaEventElapsedTime(&ms, a.e, b.e));
  return double(ms) * 1e-3;
}

void launch_ping_pong(const dev::SymmetricView& view, uint64_t* flag, const dev::LaunchSequence& seq, int rounds,
                      const dev::FaultContext& fault, cudaStream_t stream) {
  ping_pong_kernel<<<1, 1, 0, stream>>>(view, flag, seq, rounds, fault);
  TF_CUDA(cudaGetLastError());
}

// Rates for floors and the tax breakdown, measured once per run on this machine.
MachineRates measure_rates(Team& team) {
  MachineRates r;
  cudaStream_t s = team.stream();
  Event a, b;
  // HBM: a 1 GiB device-to-device copy moves 2 GiB.
  const size_t bytes = 1ull << 30;
  void *x = nullptr, *y = nullptr;
  TF_CUDA(cudaMalloc(&x, bytes));
  TF_CUDA(cudaMalloc(&y, bytes));
  TF_CUDA(cudaMemsetAsync(x, 1, bytes, s));
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    TF_CUDA(cudaEventRecord(a.e, s));
    TF_CUDA(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s));
    TF_CUDA(cudaEventRecord(b.e, s));
    team.sync(s);
    if (i > 0) t.push_back(elapsed_s(a, b));
  }
  r.hbm_bytes_per_s = 2.0 * double(bytes) / summarize(t).median;
  TF_CUDA(cudaFree(y));
  // NVLink: copy engine from this rank's heap into the next rank's, 256 MiB.
  if (team.world() > 1) {
    const uint64_t mark = team.heap().mark();
    const size_t nb = std::min<size_t>(256ull << 20, team.heap().available() / 2);
    char* buf = static_cast<char*>(team.heap().allocate(nb, 4096, "bench.rates"));
    char* peer = team.view().peer(buf, (team.rank() + 1) % team.world());
    t.clear();
    for (int i = 0; i < 6; ++i) {
      team.device_barrier(s);
      TF_CUDA(cudaEventRecord(a.e, s));
      TF_CUDA(cudaMemcpyAsync(peer, x, nb, cudaMemcpyDeviceToDevice, s));
      TF_CUDA(cudaEventRecord(b.e, s));
      team.sync(s);
      if (i > 0) t.push_back(elapsed_s(a, b));
    }
    team.device_barrier(s);
    team.sync(s);
    team.heap().release(mark);
    r.nvlink_bytes_per_s = double(nb) / summarize(t).median;
  }
  TF_CUDA(cudaFree(x));
  // One-way flag latency: half a ping-pong round trip between ranks 0 and 1.
  if (team.world() > 1) {
    const uint64_t mark = team.heap().mark();
    auto* flag = team.heap().allocate_array<uint64_t>(1, "bench.rates.flag");
    TF_CUDA(cudaMemsetAsync(flag, 0, sizeof(uint64_t), s));
    team.sync(s);
    team.host_barrier("rates.flag");
    const auto seq = team.heap().allocate_sequence("bench.rates.sequence");
    constexpr int kRounds = 1000;
    for (int i = 0; i < 2; ++i) {
      team.device_barrier(s);
      TF_CUDA(cudaEventRecord(a.e, s));
      launch_ping_pong(team.view(), flag, seq, kRounds, team.fault(), s);
      TF_CUDA(cudaEventRecord(b.e, s));
      team.sync(s);
    }
    // Ranks 0 and 1 time the loop; the others only pass through the barriers.
    const double mine = team.rank() <= 1 ? elapsed_s(a, b) / (2.0 * kRounds) : 0.0;
    r.flag_latency_s = all_gather_doubles(team.coordinator(), team.coordinator().next_key("rates.flag"), mine)[0];
    team.host_barrier("rates.flag.done");
    team.heap().release(mark);
  }
  // Launch cost: 2000 empty kernels back to back, then the same inside a CUDA graph.
  const int n = 2000;
  TF_CUDA(cudaEventRecord(a.e, s));
  for (int i = 0; i < n; ++i) empty_kernel<<<1, 1, 0, s>>>();
  TF_CUDA(cudaEventRecord(b.e, s));
  team.sync(s);
  r.launch_s = elapsed_s(a, b) / n;
  const CapturedGraph graph(s, [&] {
    for (int i = 0; i < n; ++i) empty_kernel<<<1, 1, 0, s>>>();
  });
  graph.launch(s);
  TF_CUDA(cudaEventRecord(a.e, s));
  graph.launch(s);
  TF_CUDA(cudaEventRecord(b.e, s));
  team.sync(s);
  r.graph_launch_s = elapsed_s(a, b) / n;
  return r;
}

}  // namespace taxfree::bench
