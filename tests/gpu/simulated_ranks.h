// Ranks simulated in one test process on one GPU, for the kernels of ops that talk across ranks.
//
// Each rank's symmetric heap is a span of one allocation, so SymmetricView's peer translation (one
// add) points into another rank's span exactly as it points into a peer GPU's heap; each rank has a
// launch sequence and a non-blocking stream; all ranks share one abort flag and one wait record
// (host-mapped, as a Team's), so a wait that gives up stops them all and names site, rank and peer.
// What it cannot show: NVLink's ordering and latency (every peer is in the same GPU's memory).
// Co-residency is the caller's part: kernels whose CTAs wait for peers must fit on the GPU together,
// so plan each rank for sms_per_rank().
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::test {

class SimulatedHeaps {
 public:
  // `span_bytes` of zeroed heap per rank (rounded up to 256).
  SimulatedHeaps(int world, uint64_t span_bytes)
      : world_(world), span_((span_bytes + 255) / 256 * 256), sms_per_rank_(device_sms() / world) {
    TF_CUDA(cudaMalloc(&heaps_, span_ * world));
    TF_CUDA(cudaMemset(heaps_, 0, span_ * world));
    TF_CUDA(cudaMalloc(&counters_, sizeof(uint64_t) * world));
    TF_CUDA(cudaMalloc(&finished_, sizeof(uint32_t) * world));
    TF_CUDA(cudaMemset(counters_, 0, sizeof(uint64_t) * world));
    TF_CUDA(cudaMemset(finished_, 0, sizeof(uint32_t) * world));
    TF_CUDA(cudaHostAlloc(&abort_, kFaultBytes, cudaHostAllocMapped));
    std::memset(static_cast<void*>(abort_), 0, kFaultBytes);
    record_ = reinterpret_cast<dev::WaitRecord*>(abort_ + 2);  // 8-byte aligned after the flag
    for (int r = 0; r < world; ++r) {
      cudaStream_t s;
      TF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams_.push_back(s);
    }
    TF_CUDA(cudaDeviceSynchronize());
  }
  ~SimulatedHeaps() {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    cudaFreeHost(abort_);
    cudaFree(finished_);
    cudaFree(counters_);
    cudaFree(heaps_);
  }
  SimulatedHeaps(const SimulatedHeaps&) = delete;
  SimulatedHeaps& operator=(const SimulatedHeaps&) = delete;

  // SMs of the current device (a rank plans for device_sms() / world).
  static int device_sms() {
    int dev = 0, sms = 0;
    TF_CUDA(cudaGetDevice(&dev));
    TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }

  int world() const { return world_; }
  int sms_per_rank() const { return sms_per_rank_; }
  uint64_t span() const { return span_; }
  char* base(int r) const { return heaps_ + uint64_t(r) * span_; }
  cudaStream_t stream(int r) const { return streams_[size_t(r)]; }

  dev::SymmetricView view(int r) const {
    dev::SymmetricView v;
    v.local_base = base(r), v.stride = int64_t(span_), v.size = span_, v.rank = r, v.world = world_;
    return v;
  }
  dev::LaunchSequence sequence(int r) const { return {counters_ + r, finished_ + r}; }
  dev::FaultContext fault(int r, uint64_t timeout_ns = 5'000'000'000ull) const {
    dev::FaultContext f;
    f.abort = device_ptr(abort_), f.record = device_ptr(record_), f.heap_base = base(r);
    f.timeout_ns = timeout_ns, f.rank = r;
    return f;
  }

  // Waits for every rank's stream; a device wait that gave up fails the test with its diagnostic
  // (then the record and the flag are cleared for the next case).
  void sync(const std::string& what) {
    for (cudaStream_t s : streams_) TF_CUDA(cudaStreamSynchronize(s));
    if (record_->complete == 1u) {
      ADD_FAILURE() << what << ": " << describe_wait_record(*record_);
      std::memset(static_cast<void*>(abort_), 0, kFaultBytes);
    }
  }

 private:
  static constexpr size_t kFaultBytes = 8 + sizeof(dev::WaitRecord);  // the flag, padding, the record

  template <class T>
  static T* device_ptr(T* host) {
    T* d = nullptr;
    TF_CUDA(cudaHostGetDevicePointer(&d, host, 0));
    return d;
  }

  int world_;
  uint64_t span_;
  int sms_per_rank_;
  char* heaps_ = nullptr;
  uint64_t* counters_ = nullptr;
  uint32_t* finished_ = nullptr;
  uint32_t* abort_ = nullptr;  // host-mapped: the abort flag, then (8-byte aligned) the wait record
  dev::WaitRecord* record_ = nullptr;
  std::vector<cudaStream_t> streams_;
};

}  // namespace taxfree::test
