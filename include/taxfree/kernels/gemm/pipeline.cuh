// mbarrier, TMA and fence helpers for the Hopper GEMM pipeline (sm_90a, device only).
//
// Addresses of shared memory are 32-bit shared-window addresses (cvta to shared), as TMA and
// mbarrier instructions take them; an own-CTA shared address is also valid in the shared::cluster
// window. Every helper is a thin wrapper over one PTX instruction; the memory-order reasoning lives
// at the call sites in gemm_kernel.cuh and epilogue.cuh.
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

// The same load delivered to the same shared-memory offset of every CTA in `cta_mask` (bit r: CTA
// rank r of this cluster); each destination's mbarrier at offset `bar` gets the bytes.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int32_t c0, int32_t c1,
                                                      uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}

// --- clusters -------------------------------------------------------------------------------------

// Address of the same shared-memory location in CTA `rank` of this cluster (shared::cluster window).
__device__ __forceinline__ uint32_t map_to_cta(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// Arrive on an mbarrier of any CTA of the cluster (address from map_to_cta), with the default
// .release.cta semantics: enough to say "my wgmma reads of the stage are complete" (wgmma_wait
// already guarantees that; no generic writes need ordering). `.release.cluster` would cost a
// MEMBAR.GPU per arrival.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}

// Every thread of every CTA of the cluster; orders each thread's earlier accesses (and mbarrier
// initialisation, after fence_mbar_init) before everyone's later ones. Not `.aligned`: the
// producer warp reaches it after one lane ran the TMA loop.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}

// 8 bytes into the shared memory of any CTA of the cluster (address from map_to_cta). Weak: the
// cluster barrier after the stores (release / acquire) makes them visible to that CTA.
__device__ __forceinline__ void st_cluster_f32x2(uint32_t cluster_addr, float x, float y) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(cluster_addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// --- split-K workspace (global memory, gpu scope) --------------------------------------------------

// Partial sums go through L2 only: another SM reads them, and L1 is not coherent.
__device__ __forceinline__ void store_partial(float2* p, float2 v) { __stcg(p, v); }
__device__ __forceinline__ float2 load_partial(const float2* p) { return __ldcg(p); }

// Arrival on a split tile's counter: release (this warpgroup's partial stores, ordered before by a
// named barrier) and acquire (the other splits' stores, for the last arrival). Returns the old value.
__device__ __forceinline__ uint32_t arrive_counter(uint32_t* counter) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}
__device__ __forceinline__ void reset_counter(uint32_t* counter) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(counter) : "memory");
}

// --- barriers and registers ---------------------------------------------------------------------

// Barrier over `threads` threads (a multiple of 32) with hardware barrier `id` (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Barrier 0 over every thread of the CTA, not `.aligned`: the producer warp reaches it from two
// places (one lane streams, the others wait).
__device__ __forceinline__ void cta_sync_unaligned() { asm volatile("barrier.sync 0;" ::: "memory"); }

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace taxfree::gemm::device
