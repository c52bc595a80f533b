// Ranks simulated in one test process on one GPU, for the kernels of ops that talk across ranks.
//
// Each rank's symmetric heap is a span of one allocation, so SymmetricView's peer translation (one
// add) points into another rank's span exactly as it points into a peer GPU's heap; each rank has a
// launch sequence and a non-blocking stream; all ranks share one abort flag and one wait record
// (host-mapped, as a Team's), so a wait that gives up stops them all and names site, rank and peer.
// share(r) gives rank r as an op object takes it (RankShare: the span as its heap, (SMs - 4) / W
// SMs, launch sequences from a pool, no NCCL), so an op built on it runs its cross-rank variants;
// kernels whose CTAs wait for peers must fit on the GPU together, which the ops' plans for that
// share see to. gated() (hold() / release()) starts every rank's work together, launch_graphs()
// every rank's CUDA graph (capture_each()); delay() makes a rank late. Ranks whose streams share a
// hardware queue (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default) can wait out their deadline: under
// compute-sanitizer, graph replays at W = 8 did with the default 8 and passed with 32 (r351, r352),
// which scripts/gpu_check.sh's sanitize step sets.
// What it cannot show: NVLink's ordering and latency (every peer is in the same GPU's memory).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/rank_share.h"
#include "taxfree/runtime/symmetric_heap.h"
#include "taxfree/runtime/team.h"

namespace taxfree::test {

namespace simulated_detail {
// One thread waits (bounded) until the host raises *gate to `open`.
static __global__ void gate_kernel(const uint64_t* gate, uint64_t open, dev::FaultContext fc) {
  dev::wait_geq(gate, open, fc, dev::WaitSite::test_signal, -1);
}
static __global__ void sleep_kernel(uint64_t ns) { dev::sleep_for_ns(ns); }
}  // namespace simulated_detail

class SimulatedHeaps {
 public:
  // `span_bytes` of zeroed heap per rank (rounded up to 256).
  SimulatedHeaps(int world, uint64_t span_bytes)
      : world_(world), span_((span_bytes + 255) / 256 * 256) {
    TF_CUDA(cudaMalloc(&heaps_, span_ * world));
    TF_CUDA(cudaMemset(heaps_, 0, span_ * world));
    TF_CUDA(cudaHostAlloc(&abort_, kFaultBytes, cudaHostAllocMapped));
    std::memset(static_cast<void*>(abort_), 0, kFaultBytes);
    record_ = reinterpret_cast<dev::WaitRecord*>(abort_ + 2);  // 8-byte aligned after the flag
    TF_CUDA(cudaHostAlloc(&gate_, sizeof(uint64_t), cudaHostAllocMapped));
    *gate_ = 0;
    for (int r = 0; r < world; ++r) {
      cudaStream_t s;
      TF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
    TF_CUDA(cudaDeviceSynchronize());
  }
  ~SimulatedHeaps() {
    for (cudaStream_t s : streams_) {
      gemm::release_stream_workspace(s);  // the ops' GEMMs ran on it
      cudaStreamDestroy(s);
    }
    cudaFreeHost(gate_);
    cudaFreeHost(abort_);
    cudaFree(heaps_);
  }
  SimulatedHeaps(const SimulatedHeaps&) = delete;
  SimulatedHeaps& operator=(const SimulatedHeaps&) = delete;

  // SMs of the current device.
  static int device_sms() {
    int dev = 0, sms = 0;
    TF_CUDA(cudaGetDevice(&dev));
    TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }

  // SMs of each rank's share at `world` ranks (share(r).sm_count).
  static int rank_sms(int world) { return (device_sms() - kCopySms) / world; }

  int world() const { return world_; }
  uint64_t span() const { return span_; }
  char* base(int r) const { return heaps_ + uint64_t(r) * span_; }
  cudaStream_t stream(int r) const { return streams_[size_t(r)]; }

  dev::SymmetricView view(int r) const {
    dev::SymmetricView v;
    v.local_base = base(r), v.stride = int64_t(span_), v.size = span_, v.rank = r, v.world = world_;
    return v;
  }

  // Rank r as an op takes it (rank_share.h). Its heap allocates from the span's start: an op built
  // on it and a test writing at base(r) directly do not mix.
  RankShare share(int r) {
    if (heaps_of_.empty())
      for (int q = 0; q < world_; ++q) heaps_of_.push_back(std::make_unique<SymmetricHeap>(view(q)));
    RankShare s;
    // kCopySms left over: copies between spans of one GPU may run as kernels (across GPUs the copy
    // engines move them), and a rank's GEMM waiting for a peer's copy must leave them room (r181:
    // fused-ce at W = 3, three 44-SM grids filling the GPU, waited out its deadline).
    s.rank = r, s.world = world_, s.sm_count = rank_sms(world_);
    s.heap = heaps_of_[size_t(r)].get();
    s.fault = fault(r);
    return s;
  }
  dev::FaultContext fault(int r, uint64_t timeout_ns = 5'000'000'000ull) const {
    dev::FaultContext f;
    f.abort = device_ptr(abort_), f.record = device_ptr(record_), f.heap_base = base(r);
    f.timeout_ns = timeout_ns, f.rank = r;
    return f;
  }

  // Holds every rank's stream behind a gate (a one-thread kernel waiting, with the deadline, for
  // release()) while the caller enqueues every rank's work, so the ranks start together as on W
  // GPUs, not in the order the host enqueued them. Needs eager module loading: the first launch
  // of a lazily loaded kernel waits for the device to go idle, which the gate keeps it from.
  void hold() {
    ++gate_open_;
    for (int r = 0; r < world_; ++r)
      simulated_detail::gate_kernel<<<1, 1, 0, streams_[size_t(r)]>>>(device_ptr(gate_), gate_open_, fault(r));
    TF_CUDA(cudaGetLastError());
  }
  void release() { __atomic_store_n(gate_, gate_open_, __ATOMIC_RELEASE); }

  // hold(), `enqueue()` (every rank's work on its stream), release(): the ranks start together. A
  // throw opens the gate first (the ranks enqueued so far then wait for peers that never come:
  // their deadline).
  template <class Enqueue>
  void gated(Enqueue&& enqueue) {
    try {
      hold();
      enqueue();
    } catch (...) {
      release();
      throw;
    }
    release();
  }

  // Rank r's CUDA graph of what `enqueue(r)` puts on stream(r), for every rank.
  template <class Enqueue>
  std::vector<CapturedGraph> capture_each(Enqueue&& enqueue) {
    std::vector<CapturedGraph> graphs;
    for (int r = 0; r < world_; ++r) graphs.emplace_back(stream(r), [&] { enqueue(r); });
    return graphs;
  }

  // One replay of every rank's graph (capture_each's) on its stream, started together.
  void launch_graphs(const std::vector<CapturedGraph>& graphs) {
    TF_REQUIRE(int(graphs.size()) == world_, Status::InvalidArgument,
               graphs.size() << " graphs for " << world_ << " simulated ranks");
    gated([&] {
      for (int r = 0; r < world_; ++r) graphs[size_t(r)].launch(streams_[size_t(r)]);
    });
  }

  // Rank r starts late: a one-thread kernel sleeping `ns` on its stream (inside a capture too).
  void delay(int r, uint64_t ns) {
    simulated_detail::sleep_kernel<<<1, 1, 0, streams_[size_t(r)]>>>(ns);
    TF_CUDA(cudaGetLastError());
  }

  // Waits for every rank's stream; a device wait that gave up fails the test with its diagnostic
  // (then the record and the flag are cleared for the next case).
  void sync(const std::string& what) {
    for (cudaStream_t s : streams_) TF_CUDA(cudaStreamSynchronize(s));
    if (record_->complete == 1u) {
      const int r = record_->rank;
      ADD_FAILURE() << what << ": "
                    << describe_wait_record(*record_, r >= 0 && r < world_ ? heaps_of_[size_t(r)].get() : nullptr);
      std::memset(static_cast<void*>(abort_), 0, kFaultBytes);
    }
  }

 private:
  static constexpr size_t kFaultBytes = 8 + sizeof(dev::WaitRecord);  // the flag, padding, the record
  static constexpr int kCopySms = 4;

  template <class T>
  static T* device_ptr(T* host) {
    T* d = nullptr;
    TF_CUDA(cudaHostGetDevicePointer(&d, host, 0));
    return d;
  }

  int world_;
  uint64_t span_;
  char* heaps_ = nullptr;
  uint32_t* abort_ = nullptr;  // host-mapped: the abort flag, then (8-byte aligned) the wait record
  dev::WaitRecord* record_ = nullptr;
  uint64_t* gate_ = nullptr;  // host-mapped: hold()'s kernels wait for it to reach gate_open_
  uint64_t gate_open_ = 0;
  std::vector<cudaStream_t> streams_;
  std::vector<std::unique_ptr<SymmetricHeap>> heaps_of_;  // share()'s, made at its first call
};

}  // namespace taxfree::test
