// Reading a buffer through the memory system for its side effects only: every 16-byte word once,
// in a grid-stride loop over the whole grid (any grid size), through the default cache path, so
// the lines land in the L2 clean. Callers: the bench's --cold flush (a buffer of four times the L2
// evicts what a timed op touched, leaving clean lines) and tools/timer_probe (an HBM-bound load).
//
// Contract: `words` 16-byte aligned, `count` words readable; the XOR of all a thread read goes to
// *sink only when it equals one fixed value (so the loads are not dead code), which a caller cannot
// foresee: `sink` must be writable and its value is meaningless. No wait, no synchronisation.
#pragma once

#include <cstdint>

namespace taxfree::dev {

__device__ __forceinline__ void stream_read(const uint4* words, int64_t count, uint32_t* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = words[i];
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

}  // namespace taxfree::dev
