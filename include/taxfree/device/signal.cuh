// Signals: 64-bit flags in the symmetric heap that only grow (epochs, not resets).
//
// A launch carries an epoch e (see launch_sequence.cuh); a producer publishes with
// `signal_set(peer_flag, e)` or counts with `signal_add`; a consumer waits for `flag >= e`. No
// host-side zeroing or barrier is needed between launches, so CUDA-graph replay works.
//
// Synchronization patterns (write the pattern's name at the call site):
//  P1 thread publishes: the thread's data stores, then signal_set/add (st/red .release.sys). The
//     consumer's wait_geq (ld.acquire.sys) then makes those stores visible to it.
//  P2 block publishes: all threads store data; __syncthreads(); one thread signals. bar.sync
//     orders the other threads' stores before the release (release is cumulative).
//  P3 bulk copies publish: the issuing thread waits `cp.async.bulk.wait_group 0` (full
//     completion, not `.read`), fence_proxy_async_global(), then signals as in P1/P2.
//  P4 TMA consumes: after wait_geq succeeds, fence_proxy_async_global() before the TMA load.
//
// Waits never spin unbounded: each checks a %globaltimer deadline and the team's abort flag, and
// on expiry fills the WaitRecord (rank, peer, site, flag, expected, observed), raises the abort
// flag so every other wait of this rank stops too, and returns false. A caller that gets false
// must leave its kernel promptly (skip the remaining work); the host then reports the record and
// ends the job.
#pragma once

#include <cstdint>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/scoped_memory.cuh"

namespace taxfree::dev {

__device__ __forceinline__ void signal_set(uint64_t* flag, uint64_t value) {
  store<Sem::release, Scope::sys>(flag, value);
}
__device__ __forceinline__ void signal_add(uint64_t* flag, uint64_t value) {
  red_add<Sem::release, Scope::sys>(flag, value);
}

__device__ __forceinline__ bool abort_requested(const FaultContext& fc) {
  return load<Sem::relaxed, Scope::sys>(fc.abort) != 0u;
}

// Record why a wait gave up (first reporter only) and raise the abort flag.
inline __device__ __noinline__ void report_wait_timeout(const FaultContext& fc, WaitSite site, int peer,
                                                 const void* flag, uint64_t expected,
                                                 uint64_t observed, uint64_t waited_ns) {
  WaitRecord* r = fc.record;
  if (r != nullptr && atomicCAS(&r->claimed, 0u, 1u) == 0u) {
    r->site = static_cast<uint32_t>(site);
    r->rank = fc.rank;
    r->peer = peer;
    r->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const uintptr_t f = reinterpret_cast<uintptr_t>(flag), b = reinterpret_cast<uintptr_t>(fc.heap_base);
    r->flag_offset = (fc.heap_base != nullptr && f >= b) ? f - b : ~0ull;
    r->expected = expected;
    r->observed = observed;
    r->waited_ns = waited_ns;
    store<Sem::release, Scope::sys>(&r->complete, 1u);
  }
  store<Sem::release, Scope::sys>(fc.abort, 1u);
}

// Wait until *flag >= expected (acquire, system scope). Returns false if the deadline passed or
// the team is aborting; see the contract above. `peer` names who should have signalled.
// Every poll is an acquire load: polling relaxed and acquiring once with fence.acq_rel.sys after
// the value is seen measured slower (one-way latency 1.2 -> 2.0 us), because that fence also waits
// for this thread's outstanding remote stores. kSleepNs > 0: sleep that long between polls (many
// waiters on one GPU polling at full rate can slow the traffic they wait for).
template <uint32_t kSleepNs = 0>
__device__ __forceinline__ bool wait_geq(const uint64_t* flag, uint64_t expected, const FaultContext& fc,
                                         WaitSite site, int peer) {
  uint64_t v = load<Sem::acquire, Scope::sys>(flag);
  if (v >= expected) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t i = 1;; ++i) {
    v = load<Sem::acquire, Scope::sys>(flag);
    if (v >= expected) return true;
    if constexpr (kSleepNs > 0) __nanosleep(kSleepNs);
    if ((i & 127u) == 0u) {  // the abort flag is host memory: poll it sparingly
      if (abort_requested(fc)) return false;
      const uint64_t waited = global_timer_ns() - start;
      if (waited > fc.timeout_ns) {
        report_wait_timeout(fc, site, peer, flag, expected, v, waited);
        return false;
      }
    }
  }
}

}  // namespace taxfree::dev
