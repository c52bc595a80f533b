// Compile-time hooks of the GEMM engine, with the default policies and the epilogues fused ops use.
//
// A GEMM kernel is gemm_kernel<Shape, T, MajorB, Order, Ready, Epilogue>. Each policy is a type with
// a trivially copyable `Params` (passed by value in the kernel parameters) and static functions:
//
//   Order     TileCoord at(const Params&, const TileGrid&, int64_t t)       host + device
//             Bijection from order indices to cluster tiles (tile_scheduler.cuh: GroupedOrder,
//             RotatedOrder); with clusters of 2 a cluster tile is 2 m-blocks of BM rows.
//
//   Ready     void wait(const Params&, TileCoord tile, int k_block)           device
//             Called by the single producer thread of each CTA before it issues the TMA load of
//             A's k-block `k_block` (K columns [64 k_block, 64 k_block + 64)) of `tile` (this CTA's
//             m-block and n-block); B of that k-block is already in flight. It may block. Split-K
//             configs run a tile's K ranges on different CTAs, so launch_gemm accepts them only
//             with a policy that allows it (split_k_safe, below). On return, A data released by
//             the writer must be visible to TMA: acquire the flag (device/signal.cuh: dev::wait_geq, pattern P4), then
//             dev::fence_proxy_async_global(). Per-tile policies return at once for k_block > 0.
//             The tile's rows are its m-block's: an m-block reaching past M also loads rows of the
//             one before it (tile_scheduler.cuh: overlapped_row0), whose results it discards, so
//             the wait need not cover them (they may be read while being written).
//             A wait must have a deadline (the engine has none); when it gives up it returns
//             anyway: the GEMM then finishes on whatever A holds, in bounded time, and the host
//             reports the wait record.
//             Optional: uint64_t max_wait_ns(const Params&)                       host + device
//             That deadline (ns), for a policy whose wait can block: the engine's own pipeline
//             waits (mbarriers, which trap) allow that much more than kMbarTimeoutNs, so the
//             policy's wait gives up, and names what it waited for, first. Without it, 0.
//             Optional: int first_k_block(const Params&, TileCoord tile)                device
//             The k-block the producer loads first for `tile`; it then wraps around (k-blocks
//             r, r+1, ..., last, 0, ..., r-1) and wait() sees that order. Whole tiles only (a
//             policy that allows split-K returns 0 under a split config); without the function, 0.
//             Optional A in several tensors (all_gather_matmul pull: each shard read where it lies):
//             static constexpr int kATensors; Params members `const void* a_bases[kATensors]`
//             (host: tensors of A's shape and stride; null entries are skipped) and
//             `CUtensorMap a_maps[kATensors]` (launch_gemm builds them as it builds A's map), and
//             const CUtensorMap* a_map(const Params&, TileCoord tile, int k_block)        device
//             The map the producer loads A's k-block of `tile` from (a member of a_maps, or
//             nullptr for A's own); called right after wait() for the same k-block.
//             Optional movers (SM specialization: data movement and the GEMM in one kernel):
//             int movers(const Params&)                                          host + device
//             void move(const Params&, int block, int blocks, const dev::ThreadGroup&)  device
//             The launch adds movers(p) CTAs (a multiple of the cluster size, fewer than the GEMM
//             CTAs that fit at once) at block indices [0, movers(p)), which the block scheduler
//             dispatches first. Their consumer warpgroups run move(p, block, movers(p), group) (the
//             group: those warps, on a named barrier; the producer warpgroup idles), and the GEMM
//             runs on the CTAs after them. The GEMM's waits may depend on the movers (the movers
//             are resident before the GEMM CTAs that wait, so this cannot deadlock while the kernel
//             has the GPU to itself); the movers must not wait for the GEMM.
//
//   Epilogue  static void check(const Params&, int64_t m, int64_t n, int elem_bytes)   host
//             Throws taxfree::Error (InvalidArgument) if the destination is unusable.
//             template <class T> void put8(const Params&, int64_t row, int64_t col, uint4 v)
//             template <class T> void put1(const Params&, int64_t row, int64_t col, T v)   device
//             Write C[row, col .. col+7] (8 packed elements) or C[row, col]. Called by the consumer
//             threads for every element of C exactly once, rows < M, columns < N; put8 only where
//             all 8 columns are inside N. No ordering between calls is promised.
//
//   fp32 epilogue (static constexpr bool kFloatOut = true; tiles without swap-AB whose BN is a
//   multiple of 32: ops/gemm_tiles.h, fp32_epilogue_compiled): C leaves
//   as the fp32 accumulators, one 64-row band (a consumer warpgroup's rows x BN columns) at a time:
//             uint64_t band_begin(const Params&)                                      device
//             Called by every thread of the warpgroup before its puts of a band; the value is
//             passed to the calls below (e.g. a launch epoch read once per band).
//             void put4(const Params&, uint64_t ctx, int64_t row, int64_t col, float4 v, int count)
//             C[row, col + i] = v[i] for i < count (col a multiple of 4, count 4 unless the row
//             ends at N; rows < M). Every element of C exactly once, no order among calls.
//             void band_done(const Params&, uint64_t ctx, int64_t row0, int64_t col0)  device
//             Called by one thread after every put of the band at (row0, col0) of every thread of
//             the warpgroup (a named barrier orders them before it: a release by this thread
//             covers them). Bands wholly past M are never written and never done.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {

// Default A-ready policy: A is always ready (plain GEMM).
struct AlwaysReady {
  struct Params {};
#ifdef __CUDACC__
  __device__ static __forceinline__ void wait(const Params&, TileCoord, int) {}
#endif
};

// Whether launch_gemm may run split-K configs with a Ready policy (a tile's K ranges on different
// CTAs, in any order): AlwaysReady, or a policy declaring `static constexpr bool kSplitKSafe = true`
// (its wait and a_map depend on nothing but their arguments; first_k_block, if any, returns 0).
template <class Ready>
constexpr bool split_k_safe() {
  if constexpr (requires { Ready::kSplitKSafe; }) return Ready::kSplitKSafe;
  else return std::is_same_v<Ready, AlwaysReady>;
}

// Whether the producer's Ready policy fits the plain producer's 40 registers, so the consumers keep
// 232 (gemm_kernel.cuh): AlwaysReady, or a policy declaring `static constexpr bool kLightProducer =
// true` (no waits: a few integer operations per k-block).
template <class Ready>
constexpr bool light_producer() {
  if constexpr (requires { Ready::kLightProducer; }) return Ready::kLightProducer;
  else return std::is_same_v<Ready, AlwaysReady>;
}

// Whether an Epilogue writes fp32 accumulators (kFloatOut, above) rather than T.
template <class Epi>
constexpr bool float_out() {
  if constexpr (requires { Epi::kFloatOut; }) return Epi::kFloatOut;
  else return false;
}

// How long one Ready::wait may block: Ready::max_wait_ns when the policy declares it, else 0.
template <class Ready>
TF_HOST_DEVICE uint64_t ready_max_wait_ns(const typename Ready::Params& p) {
  if constexpr (requires { Ready::max_wait_ns(p); }) return Ready::max_wait_ns(p);
  else return 0;
}

// Mover CTAs of a launch: Ready::movers when the policy has movers, else 0.
template <class Ready>
TF_HOST_DEVICE int mover_ctas(const typename Ready::Params& p) {
  if constexpr (requires { Ready::movers(p); }) return Ready::movers(p);
  else return 0;
}

#ifdef __CUDACC__
// The k-block a tile's k-loop starts at: Ready::first_k_block when the policy has one, else 0.
template <class Ready>
__device__ __forceinline__ int first_k_block(const typename Ready::Params& p, TileCoord tile) {
  if constexpr (requires { Ready::first_k_block(p, tile); }) return Ready::first_k_block(p, tile);
  else return 0;
}

// The tensor map A's k-block `kb` of `tile` loads from: Ready::a_map's when the policy has one and
// gives one, else `own` (the GEMM's A).
template <class Ready>
__device__ __forceinline__ const CUtensorMap* a_map(const typename Ready::Params& p, const CUtensorMap* own,
                                                    TileCoord tile, int kb) {
  if constexpr (requires { Ready::a_map(p, tile, kb); }) {
    const CUtensorMap* m = Ready::a_map(p, tile, kb);
    return m != nullptr ? m : own;
  } else {
    return own;
  }
}
#endif

// Destination of C for the StoreTo/AddTo epilogues: element (r, c) at ptr[r * ld + c]. `ptr` is in
// this process's address space: for a peer's buffer the caller passes the already translated
// (symmetric-heap / P2P) address.
struct OutputParams {
  void* ptr = nullptr;
  int64_t ld = 0;  // row stride in elements
};

namespace detail {
// A matrix spans at most this many bytes: strides and offsets stay far from int64 overflow.
inline constexpr int64_t kMaxMatrixBytes = int64_t(1) << 56;

inline void check_output(const OutputParams& p, int64_t m, int64_t n, int elem_bytes) {
  TF_REQUIRE(p.ptr != nullptr, Status::InvalidArgument, "GEMM output pointer is null");
  TF_REQUIRE(reinterpret_cast<uintptr_t>(p.ptr) % 16 == 0, Status::InvalidArgument,
             "GEMM output pointer " << p.ptr << " must be 16-byte aligned");
  TF_REQUIRE(p.ld >= n, Status::InvalidArgument, "GEMM output row stride ldc=" << p.ld << " must be >= N=" << n);
  TF_REQUIRE(p.ld <= kMaxMatrixBytes / elem_bytes / std::max<int64_t>(m, 1), Status::InvalidArgument,
             "GEMM output: " << m << " rows of ldc=" << p.ld << " elements span more than 2^56 bytes");
  TF_REQUIRE(p.ld * elem_bytes % 16 == 0, Status::InvalidArgument,
             "GEMM output row stride ldc=" << p.ld << " elements (" << p.ld * elem_bytes
                                           << " bytes) must be a multiple of 16 bytes");
}
}  // namespace detail

// C = A * B stored (st.global) into local memory or, through a translated pointer, a peer's.
struct StoreTo {
  using Params = OutputParams;
  static void check(const Params& p, int64_t m, int64_t n, int elem_bytes) {
    detail::check_output(p, m, n, elem_bytes);
  }
#ifdef __CUDACC__
  template <class T>
  __device__ static __forceinline__ void put8(const Params& p, int64_t row, int64_t col, uint4 v) {
    T* dst = static_cast<T*>(p.ptr) + row * p.ld + col;
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
  template <class T>
  __device__ static __forceinline__ void put1(const Params& p, int64_t row, int64_t col, T v) {
    static_cast<T*>(p.ptr)[row * p.ld + col] = v;
  }
#endif
};

// C += A * B with atomic adds (red.relaxed.sys, element-wise atomic across GPUs and with other
// adders; no order among them): reduce-scatter style accumulation into a local or peer buffer.
// The sum is rounded to T once per add (the product is rounded to T first).
struct AddTo {
  using Params = OutputParams;
  static void check(const Params& p, int64_t m, int64_t n, int elem_bytes) {
    detail::check_output(p, m, n, elem_bytes);
  }
#ifdef __CUDACC__
  template <class T>
  __device__ static __forceinline__ void put8(const Params& p, int64_t row, int64_t col, uint4 v) {
    T* dst = static_cast<T*>(p.ptr) + row * p.ld + col;
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      asm volatile("red.relaxed.sys.global.add.noftz.v4.bf16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x),
                   "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    else
      asm volatile("red.relaxed.sys.global.add.noftz.v4.f16x2 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x),
                   "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
  }
  template <class T>
  __device__ static __forceinline__ void put1(const Params& p, int64_t row, int64_t col, T v) {
    T* dst = static_cast<T*>(p.ptr) + row * p.ld + col;
    if constexpr (std::is_same_v<T, __nv_bfloat16>)
      asm volatile("red.relaxed.sys.global.add.noftz.bf16 [%0], %1;" ::"l"(dst), "h"(__bfloat16_as_ushort(v))
                   : "memory");
    else
      asm volatile("red.relaxed.sys.global.add.noftz.f16 [%0], %1;" ::"l"(dst), "h"(__half_as_ushort(v))
                   : "memory");
  }
#endif
};

}  // namespace taxfree::gemm
