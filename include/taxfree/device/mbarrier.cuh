// Shared-memory mbarriers (sm_90): the completion mechanism of TMA / bulk copies and the
// producer-consumer handshake of pipelined kernels. Device only.
//
// Addresses are 32-bit shared-window addresses (smem_addr), as the PTX instructions take them.
// Waits are bounded: a local barrier whose phase never completes means a lost transaction or a
// protocol bug, and after kMbarTimeoutNs the waiting thread prints what it waited for and traps,
// so the host sees a launch failure instead of a hang. The bound is far above any legitimate wait;
// a kernel whose producer may be held by another rank's flag adds that wait's deadline to it (the
// GEMM: GemmParams::stall_ns), so the flag wait gives up and reports first.
#pragma once

#include <cstdint>
#include <cstdio>

#include "taxfree/device/scoped_memory.cuh"

namespace taxfree::dev {

constexpr uint64_t kMbarTimeoutNs = 60'000'000'000ull;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Makes initialised barriers visible to the async proxy (TMA complete_tx) before first use.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrive once and add `bytes` to the transaction count the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

// Release-arrive: the caller's prior accesses of the guarded buffer happen before the phase completes.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One bounded hardware wait (try_wait) for the phase with parity `parity`; true once it completed
// (acquire).
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Blocks until the phase with parity `parity` has completed (acquire). A fresh barrier is in phase
// 0, so waiting for parity 1 returns at once.
//
// The clock starts at the first miss (i == 0), so it restarts if i wraps: after 2^32 tries, over
// a minute even at 20 ns a try. Only a bound raised past that (a stall_ns from a flag deadline of
// minutes) can be outrun; the host's sync deadline then fails the job. Starting the clock on
// start == 0, as the LL polls do, changed ptxas's instruction choices in every GEMM kernel and
// read 1.5-2.4% slower at M = 16 (r361, 1x H100, two rounds each): not done.
//
// kReport = false traps without printing. The print is a function call (vprintf), and a call
// anywhere in a kernel that issues wgmma makes ptxas serialise every wgmma of that kernel (C7510:
// each HGMMA then waits for the previous one; measured by ptxas, not only where a group is in
// flight), so wgmma kernels use the quiet form: the host sees a trap (launch failure), unnamed.
template <bool kReport = true>
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, uint64_t timeout_ns = kMbarTimeoutNs) {
  uint64_t start = 0;
  for (uint32_t i = 0;; ++i) {
    if (mbar_try_wait(bar, parity)) return;
    if ((i & 1023u) == 0u) {
      const uint64_t now = global_timer_ns();
      if (i == 0) start = now;
      else if (now - start > timeout_ns) {
        if constexpr (kReport)
          printf("[taxfree device] block %d thread %d: mbarrier at smem 0x%x never completed phase parity %u\n",
                 int(blockIdx.x), int(threadIdx.x), bar, parity);
        __trap();
      }
    }
  }
}

}  // namespace taxfree::dev
