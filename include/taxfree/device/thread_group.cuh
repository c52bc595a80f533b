// A group of threads of one block that synchronizes on one hardware barrier: the whole block
// (barrier 0, as __syncthreads) or some warps of it (a named barrier, e.g. the consumer warpgroups
// of a GEMM CTA running another role). Device only.
//
// Memory order: sync() and any() order the group's shared and global accesses as bar.sync does
// (CTA scope); a release to other blocks or GPUs still needs a fence or a release operation.
#pragma once

#include <cstdint>

namespace taxfree::dev {

struct ThreadGroup {
  uint32_t tid;    // this thread's index in the group, 0 .. count - 1
  uint32_t count;  // threads in the group, a multiple of 32
  uint32_t bar;    // hardware barrier id (0: the whole block)

#ifdef __CUDACC__
  __device__ static ThreadGroup block() { return {threadIdx.x, blockDim.x, 0}; }

  __device__ __forceinline__ void sync() const {
    asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(count) : "memory");
  }
  // sync(), and whether `pred` held for any thread of the group.
  __device__ __forceinline__ bool any(bool pred) const {
    uint32_t r;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}"
        : "=r"(r)
        : "r"(uint32_t(pred)), "r"(bar), "r"(count)
        : "memory");
    return r != 0;
  }
#endif
};

}  // namespace taxfree::dev
