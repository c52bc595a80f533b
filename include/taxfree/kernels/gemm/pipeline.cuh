// mbarrier, TMA and fence helpers for the Hopper GEMM pipeline (sm_90a, device only).
//
// Addresses of shared memory are 32-bit shared-window addresses (cvta to shared), as TMA and
// mbarrier instructions take them. Every helper is a thin wrapper over one PTX instruction; the
// memory-order reasoning lives at the call sites in gemm_kernel.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "taxfree/device/mbarrier.cuh"

namespace taxfree::gemm::device {

// mbarrier helpers live with the other device primitives.
using dev::fence_mbar_init;
using dev::mbar_arrive;
using dev::mbar_arrive_expect_tx;
using dev::mbar_init;
using dev::mbar_wait;
using dev::smem_addr;

// --- TMA -----------------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 2-D tiled load of the box at (c0 = inner, c1 = outer) element coordinates into `dst`; completes
// its bytes on `bar`. Out-of-bounds elements (any part of the box past the tensor) arrive as zeros
// and still count towards the transaction bytes.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// --- barriers and registers ---------------------------------------------------------------------

// Barrier over `threads` threads (a multiple of 32) with hardware barrier `id` (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace taxfree::gemm::device
