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
  float w[kMaxRows][kMaxParts + 1];  // + 1: the two rows a D = 64 warp reads at once use two banks
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

// Row statistics (lse_stats' m and S) and weights (lse_weight) of one row's n partial LSEs, spread
// over a segment of kLanes lanes (aligned within the warp): lane `col` holds partials col,
// col + kLanes, ... in l[k] (-inf past n). Owner lanes write weight p to w[p] for p < n; returns
// the merged lse. m and S are segment reductions (shuffles, no serial per-row loop); every lane
// of the warp must call it. Ends with __syncwarp, so the weights are then readable by the warp.
template <int kLanes, int kLse>
__device__ inline float segment_lse_weights(const float (&l)[kLse], int n, int col, bool owner, float* w) {
  constexpr float kNegInf = -INFINITY;
  float m = kNegInf;
#pragma unroll
  for (int k = 0; k < kLse; ++k) m = fmaxf(m, l[k]);
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float s = 0.f;
  if (m != kNegInf)
#pragma unroll
    for (int k = 0; k < kLse; ++k) s += l[k] == kNegInf ? 0.f : expf(l[k] - m);
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  const LseStats st{m, s};
  if (owner)
#pragma unroll
    for (int k = 0; k < kLse; ++k)
      if (col + k * kLanes < n) w[col + k * kLanes] = lse_weight(l[k], st);
  __syncwarp();
  return lse_total(st);
}

// acc += w * x, where the select, not a multiply, drops weight-0 partials, so garbage/NaN in an
// empty partial's o never reaches acc. Every combine accumulates through this, in partial order,
// so all paths give the same bits from the same partials.
__device__ inline void accumulate_weighted(float4& acc, float w, float4 x) {
  const float4 t = w != 0.f ? x : make_float4(0.f, 0.f, 0.f, 0.f);
  acc.x += w * t.x;
  acc.y += w * t.y;
  acc.z += w * t.z;
  acc.w += w * t.w;
}

// Merge n partials of `rows` rows into `out` (shared memory), with lse_combine.h's formula.
//   partial i, row r:  o at o[i*o_part_stride + r*D + d]   (fp32, normalised, 16-byte aligned)
//                      lse at lse[i*lse_part_stride + r]
// Preconditions: 1 <= n <= kMaxParts, 1 <= rows <= kMaxRows, blockDim.x a multiple of 32; every
// thread of the CTA calls it.
// Global reads are plain (weak) loads: the partials were written by other CTAs, other GPUs or an
// earlier kernel, and every calling thread must already be ordered after those writes by an
// acquire pattern (cta_arrive_last's acquire plus CTA barrier, a flag acquire plus CTA barrier, or
// a kernel boundary); the PTX memory model then guarantees the weak loads see them (no stale L1
// line). Every partial's o must be readable memory, but the o of a partial whose weight is 0
// (lse = -inf) is discarded by a select: garbage or NaN there cannot leak into the result.
// Synchronises the CTA on entry and exit (`out` and `scratch` are safe to read/reuse after).
//
// It runs in the launch's tail, so it is built for latency: a warp merges whole rows (a half-warp
// per row when D = 64), lane j owning float4 column j. The row's LSEs (lane j: partials j, j+L, ..)
// and the o values of the first kBatch partials are loaded together, the LSE statistics are warp
// reductions (no serial per-row loop, no CTA barrier between stats and sums), and the weights
// reach the lanes through the row's scratch line. The sum S is a tree (lse_stats sums in order):
// the result differs from the host formula by float rounding only.
template <int D>
__device__ inline void cta_combine_partials(const float* o, int64_t o_part_stride, const float* lse,
                                            int64_t lse_part_stride, int n, int rows,
                                            CombineScratch& scratch, PartialTile<D>& out) {
  constexpr int kLanes = D / 4;              // lanes per row: one float4 column each
  constexpr int kRowsPerWarp = 32 / kLanes;  // 1 (D = 128) or 2 (D = 64)
  constexpr int kLse = kMaxParts / kLanes;   // LSEs per lane
  constexpr int kBatch = 16;                 // o loads in flight per lane
  static_assert(32 % kLanes == 0 && kMaxParts % kLanes == 0, "head_dim 64 or 128");
  constexpr float kNegInf = -INFINITY;
  __syncthreads();  // scratch/out may still be read by the caller's previous step
  const int lane = threadIdx.x & 31, col = lane % kLanes;
  const int warps = int(blockDim.x) >> 5;
  for (int r0 = (int(threadIdx.x) >> 5) * kRowsPerWarp; r0 < rows; r0 += warps * kRowsPerWarp) {
    // Warp-uniform trip count; a half-warp past the last row redoes that row and stores nothing.
    const int r = r0 + lane / kLanes < rows ? r0 + lane / kLanes : rows - 1;
    const bool owner = r0 + lane / kLanes < rows;
    const float* src = o + int64_t(r) * D + 4 * col;
    float* const w = scratch.w[r];
    // Weak, unconditional loads with the index clamped into [0, n): ptxas keeps them back to back
    // (predicated or branched loads were serialised behind the math, seen in SASS).
    const auto load_batch = [&](int p0, float4 (&x)[kBatch]) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int p = p0 + u < n ? p0 + u : n - 1;
        x[u] = *reinterpret_cast<const float4*>(src + p * o_part_stride);
      }
    };
    float l[kLse];
#pragma unroll
    for (int k = 0; k < kLse; ++k) {
      const int p = col + k * kLanes;
      l[k] = lse[(p < n ? p : n - 1) * lse_part_stride + r];
      if (p >= n) l[k] = kNegInf;
    }
    float4 x[kBatch];
    load_batch(0, x);

    const float row_lse = segment_lse_weights<kLanes>(l, n, col, owner, w);
    if (owner && col == 0) out.lse[r] = row_lse;

    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p0 = 0;;) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) accumulate_weighted(acc, p0 + u < n ? w[p0 + u] : 0.f, x[u]);
      p0 += kBatch;
      if (p0 >= n) break;
      load_batch(p0, x);
    }
    if (owner) reinterpret_cast<float4*>(out.o[r])[col] = acc;
  }
  __syncthreads();
}

// Arrival of one CTA at a counter shared by `expected` CTAs; returns true (uniformly across the
// CTA) in exactly one of them, the last to arrive, which then may read everything the others
// stored before arriving. The last arriver resets the counter to 0, so the counter is 0 again
// after every launch (no host reset between launches; CUDA-graph replay works). The counter must
// be 0 before the first launch and not shared by two launches in flight at once.
//
// Memory order (signal.cuh's pattern P2 at gpu scope, as CUTLASS's barriers do it): the CTA
// barrier orders every thread's stores before thread 0's acq_rel fetch_add, whose release is
// cumulative over them; the last arriver's fetch_add reads the release sequence of all earlier
// arrivals (acquire), and the second barrier extends that to the whole CTA, whose weak loads then
// see the other CTAs' stores. No per-thread __threadfence: each would wait for its own stores to
// drain, a second serial L2 round trip in the launch's tail besides the fetch_add's own release.
// Device scope only: for partials arriving from other GPUs use the team's .sys-scope signals.
__device__ inline bool cta_arrive_last(int* counter, int expected) {
  __shared__ int s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> c(*counter);
    const int old = c.fetch_add(1, cuda::memory_order_acq_rel);
    const bool last = old == expected - 1;
    if (last) c.store(0, cuda::memory_order_relaxed);
    s_last = last;
  }
  __syncthreads();
  return s_last != 0;
}

}  // namespace taxfree::attention
