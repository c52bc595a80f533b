// Machine rates the harness measures once per run (floors, tax breakdown), and the flag
// ping-pong shared with the signal benchmark.
#pragma once

#include <cuda_runtime_api.h>

#include "taxfree/bench/op_bench.h"
#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"

namespace taxfree::bench {

// A CUDA event owned by scope, and the seconds between two recorded ones.
struct Event {
  cudaEvent_t e = nullptr;
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e(o.e) { o.e = nullptr; }
};
double elapsed_s(const Event& from, const Event& to);

// HBM copy rate, NVLink copy-engine rate, launch costs and the one-way flag latency (ranks >= 2).
MachineRates measure_rates(Team& team);

// Ranks 0 and 1 bounce `flag` (a heap word, zero before the first launch) `rounds` times; the
// values grow across launches, so no reset is needed. Other ranks do nothing.
void launch_ping_pong(const dev::SymmetricView& view, uint64_t* flag, const dev::LaunchSequence& seq, int rounds,
                      const dev::FaultContext& fault, cudaStream_t stream);

}  // namespace taxfree::bench
