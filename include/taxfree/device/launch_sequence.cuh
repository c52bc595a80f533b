// Per-op launch sequence numbers kept on the device, so epochs advance without the host (CUDA
// graph replay, back-to-back launches). Two ways to use one; a sequence keeps to one way (the
// counter's meaning differs), and launches on it are stream-ordered (no programmatic overlap of
// two launches of one sequence).
//
// begin / end: every block reads the same `seq = *counter + 1` at start; the last block to finish
// stores `seq` into the counter. The counter changes only after every block of the launch has read
// it, and the next launch on the stream starts after this one ends, so all blocks agree. The
// finishing block's fenced read-modify-write sits in the launch's tail.
//
// enter / entered: the counter holds (launches << 32) | blocks entered in the current launch
// (`finished` unused). One thread per block takes a ticket at its start (a relaxed fetch_add, whose
// round trip can overlap the block's work) and later turns it into the epoch (launches + 1, the
// same numbering as begin / end); the block whose ticket completes the count advances the counter
// to (launches + 1) << 32 for the next launch. Nothing in the launch's tail. At most 2^32 - 1
// blocks per launch.
//
// work_take: the counter holds (launches << 32) | tickets taken in the current launch, and hands
// out work items [0, items) to whichever block asks first (a dynamic persistent schedule). Each
// block takes tickets until it gets one >= items, then stops: `blocks` such tickets, items +
// blocks in all, and the block taking the last one advances the counter to the next launch. A
// block's tickets increase. Every block must take tickets until one is >= items (a block that
// stops early, e.g. after a device wait gave up, leaves the count wrong for later launches: fine
// only where the failure ends the job, as a Team's does). items + blocks < 2^32.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include "taxfree/device/scoped_memory.cuh"
#endif

namespace taxfree::dev {

struct LaunchSequence {
  uint64_t* counter = nullptr;   // device memory of this rank, starts at 0
  uint32_t* finished = nullptr;  // blocks finished in the current launch, returns to 0
};

#if defined(__CUDACC__)
__device__ __forceinline__ uint64_t sequence_begin(const LaunchSequence& s) {
  return load<Sem::relaxed, Scope::gpu>(s.counter) + 1;
}

// One thread per block, after every use of `seq` by its block (ordered by a block barrier before
// the call). `blocks`: how many blocks of the launch take part (the whole grid, or the blocks of
// one role in a grid of several).
__device__ __forceinline__ void sequence_arrive(const LaunchSequence& s, uint64_t seq, uint32_t blocks) {
  if (blocks == 1) {  // no other block to wait for: skip the fenced read-modify-write
    store<Sem::relaxed, Scope::gpu>(s.counter, seq);
  } else if (fetch_add<Sem::acq_rel, Scope::gpu>(s.finished, 1u) == blocks - 1) {
    store<Sem::relaxed, Scope::gpu>(s.finished, 0u);
    store<Sem::relaxed, Scope::gpu>(s.counter, seq);
  }
}

// Call once per block, by all its threads, after the block's last use of `seq`.
__device__ __forceinline__ void sequence_end(const LaunchSequence& s, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0)
    sequence_arrive(s, seq, gridDim.x * gridDim.y * gridDim.z);
}

// One thread per block, at its start. The returned ticket goes to sequence_entered.
__device__ __forceinline__ uint64_t sequence_enter(const LaunchSequence& s) {
  return fetch_add<Sem::relaxed, Scope::gpu>(s.counter, uint64_t(1));
}

// The same thread, once per block, any time after sequence_enter (before the block needs the
// epoch, or at its end if it never does). `blocks`: every block of the launch enters.
__device__ __forceinline__ uint64_t sequence_entered(const LaunchSequence& s, uint64_t ticket, uint32_t blocks) {
  // The last block in: every block of the launch has taken its ticket; no later launch has started.
  if (uint32_t(ticket) == blocks - 1) fetch_add<Sem::relaxed, Scope::gpu>(s.counter, (uint64_t(1) << 32) - blocks);
  return (ticket >> 32) + 1;
}

// One thread of a block: the next work item (see work_take above); >= items: none left, and this
// block must take no more in this launch. Relaxed: a ticket orders nothing, the items' data has
// its own synchronisation.
__device__ __forceinline__ uint32_t work_take(const LaunchSequence& s, uint32_t items, uint32_t blocks) {
  const uint32_t t = uint32_t(fetch_add<Sem::relaxed, Scope::gpu>(s.counter, uint64_t(1)));
  if (t == items + blocks - 1) fetch_add<Sem::relaxed, Scope::gpu>(s.counter, (uint64_t(1) << 32) - (items + blocks));
  return t;
}

#endif  // __CUDACC__

}  // namespace taxfree::dev
