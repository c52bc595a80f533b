// Device-side cross-rank barrier (one block per rank takes part).
//
// Each rank owns `world` 64-bit slots in the symmetric heap; rank p writes the epoch into slot p
// of every peer (release, system scope) and then waits until each of its own slots holds at least
// the epoch (acquire). Because the epochs only grow, slots are never reset. All of the calling
// block's memory accesses before the barrier happen before all accesses after it on every rank
// (pattern P2 of signal.cuh on both sides).
#pragma once

#include <cstdint>

#include "taxfree/device/signal.cuh"
#include "taxfree/device/symmetric_view.cuh"

namespace taxfree::dev {

// Called by every thread of one block on each rank, with the same epoch. `slots` is this rank's
// array of `view.world` slots. Returns false (on every thread) if a peer did not arrive before the
// deadline or the team is aborting.
__device__ __forceinline__ bool block_barrier(const SymmetricView& view, uint64_t* slots, uint64_t epoch,
                                              const FaultContext& fc) {
  __syncthreads();
  for (int p = threadIdx.x; p < view.world; p += blockDim.x)
    if (p != view.rank) signal_set(view.peer(slots, p) + view.rank, epoch);
  bool ok = true;
  for (int p = threadIdx.x; p < view.world; p += blockDim.x)
    if (p != view.rank) ok = wait_geq(slots + p, epoch, fc, WaitSite::barrier, p) && ok;
  return __syncthreads_and(ok) != 0;
}

}  // namespace taxfree::dev
