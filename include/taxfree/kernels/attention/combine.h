// CTA-level pieces around a partial attention result: the per-CTA tile it lives in, stores of
// the tile (fp32 or the input dtype), the LSE combine of n partials from global memory, and the
// "last arriver combines" election.
//
// These are the pieces a fused multi-rank decode reuses: a CTA attends its chunk
// (attend_chunk.h) into a PartialTile, stores it (locally or into a peer's buffer), and whoever
// arrives last merges all partials with cta_combine_partials.
#pragma once

#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "taxfree/kernels/attention/config.h"
#include "taxfree/kernels/attention/impl/ptx.h"
#include "taxfree/kernels/attention/lse_combine.h"

namespace taxfree::attention {

// One CTA's partial for up to kMaxRows query heads (the heads of one GQA group, or a block of
// rows in the cross-rank combine): o normalised fp32, lse natural log (see lse_combine.h).
template <int D>
struct PartialTile {
  alignas(16) float o[kMaxRows][D];
  float lse[kMaxRows];
};

// Weights of up to kMaxParts partials for up to kMaxRows rows.
struct CombineScratch {
  float w[kMaxParts][kMaxRows];
};

// Store rows [0, rows) of `t`: o_dst[r*D + d] (16-byte aligned, float4 stores) and, when
// lse_dst is not null, lse_dst[r]. Works for any blockDim; no synchronisation inside.
template <int D>
__device__ inline void cta_store_tile(const PartialTile<D>& t, int rows, float* o_dst,
                                      float* lse_dst) {
  constexpr int kVec = D / 4;
  for (int i = threadIdx.x; i < rows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = i % kVec;
    reinterpret_cast<float4*>(o_dst + int64_t(r) * D)[c] = reinterpret_cast<const float4*>(t.o[r])[c];
  }
  if (lse_dst != nullptr)
    for (int r = threadIdx.x; r < rows; r += blockDim.x) lse_dst[r] = t.lse[r];
}

// Store rows [0, rows) of `t.o` converted to T (bf16/fp16, round to nearest even) at
// dst[r*D + d] (16-byte aligned, 16-byte stores).
template <class T, int D>
__device__ inline void cta_store_tile_as(const PartialTile<D>& t, int rows, T* dst) {
  constexpr int kVec = D / 8;
  for (int i = threadIdx.x; i < rows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = i % kVec;
    const float4 a = reinterpret_cast<const float4*>(t.o[r])[2 * c];
    const float4 b = reinterpret_cast<const float4*>(t.o[r])[2 * c + 1];
    uint4 u;
    u.x = ptx::pack2<T>(a.x, a.y);
    u.y = ptx::pack2<T>(a.z, a.w);
    u.z = ptx::pack2<T>(b.x, b.y);
    u.w = ptx::pack2<T>(b.z, b.w);
    reinterpret_cast<uint4*>(dst + int64_t(r) * D)[c] = u;
  }
}

// Merge n partials of `rows` rows into `out` (shared memory), with lse_combine.h's formula.
//   partial i, row r:  o at o[i*o_part_stride + r*D + d]   (fp32, normalised, 16-byte aligned)
//                      lse at lse[i*lse_part_stride + r]
// Preconditions: 1 <= n <= kMaxParts, 1 <= rows <= kMaxRows; every thread of the CTA calls it.
// Global reads are plain (weak) loads: the partials were written by other CTAs, other GPUs or an
// earlier kernel, and every calling thread must already be ordered after those writes by an
// acquire pattern (cta_arrive_last's fence, a flag acquire plus CTA barrier and fence, or a kernel
// boundary); the PTX memory model then guarantees the weak loads see them (no stale L1 line).
// Every partial's o must be readable memory, but the o of a partial whose weight is 0
// (lse = -inf) is discarded by a select: garbage or NaN there cannot leak into the result.
// Synchronises the CTA on entry and exit (`out` and `scratch` are safe to read/reuse after).
template <int D>
__device__ inline void cta_combine_partials(const float* o, int64_t o_part_stride, const float* lse,
                                            int64_t lse_part_stride, int n, int rows,
                                            CombineScratch& scratch, PartialTile<D>& out) {
  __syncthreads();  // scratch/out may still be read by the caller's previous step
  for (int i = threadIdx.x; i < n * rows; i += blockDim.x) {
    const int p = i / rows, r = i % rows;
    scratch.w[p][r] = lse[p * lse_part_stride + r];
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    const LseStats st = lse_stats(&scratch.w[0][r], n, kMaxRows);
    for (int p = 0; p < n; ++p) scratch.w[p][r] = lse_weight(scratch.w[p][r], st);
    out.lse[r] = lse_total(st);
  }
  __syncthreads();
  constexpr int kVec = D / 4;
  constexpr int kBatch = 8;  // L2 loads in flight per thread: this runs in the launch's tail
  for (int i = threadIdx.x; i < rows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = i % kVec;
    const float* src = o + int64_t(r) * D + 4 * c;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p0 = 0; p0 < n; p0 += kBatch) {
      // Weights first, then kBatch unconditional weak loads (index clamped into [0, n)), then the
      // math: ptxas then keeps the loads back to back. Predicated, branched or ld.global.cg
      // (STRONG.GPU) loads were serialised behind the FMAs (seen in SASS). The select, not a
      // multiply, drops weight-0 partials, so garbage/NaN there never reaches acc.
      float w[kBatch];
      float4 x[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) w[u] = p0 + u < n ? scratch.w[p0 + u][r] : 0.f;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u < n ? p0 + u : n - 1;
        x[u] = *reinterpret_cast<const float4*>(src + p * o_part_stride);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float4 t = w[u] != 0.f ? x[u] : make_float4(0.f, 0.f, 0.f, 0.f);
        acc.x += w[u] * t.x;
        acc.y += w[u] * t.y;
        acc.z += w[u] * t.z;
        acc.w += w[u] * t.w;
      }
    }
    reinterpret_cast<float4*>(out.o[r])[c] = acc;
  }
  __syncthreads();
}

// Arrival of one CTA at a counter shared by `expected` CTAs; returns true (uniformly across the
// CTA) in exactly one of them, the last to arrive, which then may read everything the others
// stored before arriving. The last arriver resets the counter to 0, so the counter is 0 again
// after every launch (no host reset between launches; CUDA-graph replay works). The counter must
// be 0 before the first launch and not shared by two launches in flight at once.
//
// Memory order (the threadfence-reduction pattern of the CUDA guide): every thread fences its own
// stores at gpu scope, the CTA barrier orders them before thread 0's acq_rel fetch_add; the last
// arriver's fetch_add reads the release sequence of all earlier arrivals, and its barrier plus
// fence order the following reads after it. Device scope only: for partials arriving from other
// GPUs use the team's .sys-scope signals instead.
__device__ inline bool cta_arrive_last(int* counter, int expected) {
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> c(*counter);
    const int old = c.fetch_add(1, cuda::memory_order_acq_rel);
    const bool last = old == expected - 1;
    if (last) c.store(0, cuda::memory_order_relaxed);
    s_last = last;
  }
  __syncthreads();
  const bool last = s_last != 0;
  if (last) __threadfence();
  return last;
}

}  // namespace taxfree::attention
