// CTA-level pieces around a partial attention result: the per-CTA tile it lives in, stores of
// the tile (fp32 or the input dtype), the LSE combine of n partials from global memory, and the
// "last arriver combines" election.
//
// These are the pieces a fused multi-rank decode reuses: a CTA attends its chunk
// (attend_chunk.h) into a PartialTile, stores it (locally or into a peer's buffer), and whoever
// arrives last merges all partials with cta_combine_partials (or, in a thread-block cluster, each
// CTA merges its rows from the partials the cluster's CTAs stored into its shared memory:
// cluster_merge.h).
#pragma once

#include <cuda/atomic>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

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
// dst[r*D + d] (16-byte aligned, 16-byte stores). kAsMerged: each value as a merge of this one
// partial would give it (accumulate_weighted from +0 with weight exactly 1, or 0 for an empty row,
// lse -inf): +0 + o, so -0 becomes +0, and +0 for an empty row whatever its o holds.
template <class T, int D, bool kAsMerged = false>
__device__ inline void cta_store_tile_as(const PartialTile<D>& t, int rows, T* dst) {
  constexpr int kVec = D / 8;
  for (int i = threadIdx.x; i < rows * kVec; i += blockDim.x) {
    const int r = i / kVec, c = i % kVec;
    float4 a = reinterpret_cast<const float4*>(t.o[r])[2 * c];
    float4 b = reinterpret_cast<const float4*>(t.o[r])[2 * c + 1];
    if constexpr (kAsMerged) {
      const bool empty = t.lse[r] == -INFINITY;
      const auto merged = [empty](float4 v) {
        return empty ? make_float4(0.f, 0.f, 0.f, 0.f)
                     : make_float4(__fadd_rn(0.f, v.x), __fadd_rn(0.f, v.y), __fadd_rn(0.f, v.z), __fadd_rn(0.f, v.w));
      };
      a = merged(a), b = merged(b);
    }
    uint4 u;
    u.x = ptx::pack2<T>(a.x, a.y);
    u.y = ptx::pack2<T>(a.z, a.w);
    u.z = ptx::pack2<T>(b.x, b.y);
    u.w = ptx::pack2<T>(b.z, b.w);
    reinterpret_cast<uint4*>(dst + int64_t(r) * D)[c] = u;
  }
}

// Where a merge's rows sit in a CTA of kWarps warps (cta_combine_partials, cta_combine_ll): a warp
// merges kRowsPerWarp rows side by side, one per segment of kLanes lanes (lane `col` of a segment
// owns 4 of the row's D values), and its rows repeat every kRowStep rows: warp w merges rows
// w*kRowsPerWarp + lane/kLanes + i*kRowStep, i < kRowIters at most.
template <int D>
struct MergeLayout {
  static constexpr int kLanes = D / 4;                      // lanes per row
  static constexpr int kRowsPerWarp = 32 / kLanes;          // 1 (D = 128) or 2 (D = 64)
  static constexpr int kRowStep = kWarps * kRowsPerWarp;    // 4 or 8
  static constexpr int kRowIters = kMaxRows / kRowStep;     // 4 or 2
  static constexpr int kLse = kMaxParts / kLanes;           // LSEs per lane and row: partials col + k*kLanes
  static_assert(32 % kLanes == 0 && kMaxParts % kLanes == 0 && kMaxRows % kRowStep == 0, "head_dim 64 or 128");
};

// The rows this lane merges when the CTA merges rows [0, rows): calls f(std::integral_constant<int,
// kR>, r, owner) once with kR = this warp's row count (warp-uniform, 1..kRowIters; no call when the
// warp has none), r[i] its i-th row and owner[i] whether it stores it. A segment past the last row
// (D = 64: the second half of a warp) gets row rows - 1 to redo, owner false, so every lane of the
// warp runs the same code (the merge's shuffles need the whole warp).
template <int D, class F>
__device__ inline void for_warp_rows(int rows, F&& f) {
  using L = MergeLayout<D>;
  const int lane = threadIdx.x & 31, first = int(threadIdx.x >> 5) * L::kRowsPerWarp;
  const int count = rows > first ? (rows - first + L::kRowStep - 1) / L::kRowStep : 0;
  const auto call = [&]<int kR>(std::integral_constant<int, kR> kr) {
    int r[kR];
    bool owner[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      const int row = first + lane / L::kLanes + i * L::kRowStep;
      owner[i] = row < rows;
      r[i] = owner[i] ? row : rows - 1;
    }
    f(kr, r, owner);
  };
  [&]<int... k>(std::integer_sequence<int, k...>) {
    ((count == k + 1 ? call(std::integral_constant<int, k + 1>{}) : void()), ...);
  }(std::make_integer_sequence<int, L::kRowIters>{});
}

// Butterfly reduction of v[i] (i < kR, interleaved) over the first 2^levels lanes of each segment:
// steps of distance 2^(levels-1), ..., 1, as a loop (a branch per step taken, none per step
// skipped). Every lane of the warp calls it with the same `levels`.
template <int kR, class Op>
__device__ __forceinline__ void segment_butterfly(float (&v)[kR], int levels, Op op) {
#pragma unroll 1
  for (int off = (1 << levels) >> 1; off > 0; off >>= 1)
#pragma unroll
    for (int i = 0; i < kR; ++i) v[i] = op(v[i], __shfl_xor_sync(0xffffffffu, v[i], off));
}

// Row statistics (lse_stats' m and S) and weights (lse_weight) of kR rows' n partial LSEs, each
// row spread over a segment of kLanes lanes (aligned within the warp): lane `col` holds partials
// col, col + kLanes, ... of row i in l[i][k] (-inf past n). Owner lanes write weight p of row i to
// w[i][p] for p < n; lse[i] is row i's merged lse on lanes col < n (the only ones that own a
// weight; lane col = 0 always). m and S are segment reductions (shuffles); the kR rows' reductions
// are interleaved, so they cost one reduction's latency, and each spans only the lanes that hold
// partials (the first 2^ceil(log2 n)): a wider step would only bring those lanes a -inf (max) or
// a +0 (sum), so they get the full butterfly's bits in fewer steps: each step is a shuffle round
// trip on the serial chain of the launch's tail (docs/notes/decode-latency.md, r229). Each weight
// divides the sum's own term (lse_weight_of_term), not a second expf. Every lane of the warp must
// call it. Ends with __syncwarp, so the weights are then readable by the warp.
template <int kLanes, int kR, int kLse>
__device__ inline void segment_lse_weights(const float (&l)[kR][kLse], int n, int col, const bool (&owner)[kR],
                                           float* const (&w)[kR], float (&lse)[kR]) {
  constexpr float kNegInf = -INFINITY;
  const int levels = 32 - __clz((n < kLanes ? n : kLanes) - 1);  // ceil(log2(min(n, kLanes))), n >= 1
  float m[kR], s[kR], e[kR][kLse];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    m[i] = kNegInf;
#pragma unroll
    for (int k = 0; k < kLse; ++k) m[i] = fmaxf(m[i], l[i][k]);
  }
  segment_butterfly(m, levels, [](float a, float b) { return fmaxf(a, b); });
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    s[i] = 0.f;  // m = -inf: every l is -inf, every term 0
#pragma unroll
    for (int k = 0; k < kLse; ++k) s[i] += e[i][k] = lse_term(l[i][k], m[i]);
  }
  segment_butterfly(s, levels, [](float a, float b) { return a + b; });
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const LseStats st{m[i], s[i]};
    if (owner[i])
#pragma unroll
      for (int k = 0; k < kLse; ++k)
        if (col + k * kLanes < n) w[i][col + k * kLanes] = lse_weight_of_term(l[i][k], e[i][k], st);
    lse[i] = lse_total(st);
  }
  __syncwarp();
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

// The unrolled loops over a fetch's partials run in steps of kTermStep partials and stop at the
// first step past n (warp-uniform), instead of always covering Source::kParts: the merge runs in
// the launch's tail on one warp's serial chain, where r116 counted ~1150 instructions on the
// merging warp of the clustered fused kernel, about a fifth of them terms past n that only added
// zeros. Skipping them changes no bits: acc starts at +0 and a sum that starts at +0 is never -0
// (round to nearest), so acc + (+0) == acc. A Source opts in with kStepped (its kParts then a
// multiple of kTermStep): not where ptxas would hold all of a fetch's values at once across the
// early exits (the persistent kernel's merges of 24 values per lane then spilled 140-372 bytes).
inline constexpr int kTermStep = 2;
inline constexpr int kMaxSteppedValues = 16;  // float4 per lane in one fetch
template <bool kStepped>
__device__ __forceinline__ bool terms_end(int p0, int u, int n) {
  return kStepped && u % kTermStep == 0 && p0 + u >= n;
}

// One warp's merge of n partials of its kR rows (r, owner: for_warp_rows), the arithmetic every
// combine shares: segment_lse_weights on each row's LSEs, then acc[i] = sum over p = 0, 1, .., n-1
// (in that order) of accumulate_weighted(w_p, o_p), lane `col` holding 4 values of each row.
// Where the values come from is `src`'s business (workspace loads, LL lines):
//   src.fetch(p0)  issues the reads of partials [p0, p0 + Source::kParts) of the kR rows (at least
//                  up to the kTermStep step that holds partial n - 1), and with p0 == 0 also the
//                  rows' LSEs, then returns once they are usable (false: gave up; the values are
//                  then arbitrary, the caller must not publish them);
//   src.lse_of(i, k)  the LSE of partial col + k*kLanes of row i (only asked for p < n);
//   src.o_of(i, u)  the 4 values of partial p0 + u of row i of the last fetch (only asked for u
//                  before terms_end; p0 + u >= n: any finite-or-not value, dropped by the weight-0
//                  select).
// So a merge of n <= kParts partials is one memory round trip for all the warp's rows: every read
// goes out before the first is used. Weights go through scratch.w[r[i]] (owner lanes write them);
// lse[i] is row i's merged LSE. Returns false when a fetch gave up.
template <int D, int kR, class Source>
__device__ inline bool warp_merge_rows(Source& src, int n, const int (&r)[kR], const bool (&owner)[kR],
                                       CombineScratch& scratch, float4 (&acc)[kR], float (&lse)[kR]) {
  using L = MergeLayout<D>;
  constexpr int kParts = Source::kParts;
  static_assert(!Source::kStepped || kParts % kTermStep == 0, "a stepped fetch covers whole steps");
  const int col = (threadIdx.x & 31) % L::kLanes;
  bool ok = src.fetch(0);
  float l[kR][L::kLse];
  float* w[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    w[i] = scratch.w[r[i]];
#pragma unroll
    for (int k = 0; k < L::kLse; ++k) l[i][k] = col + k * L::kLanes < n ? src.lse_of(i, k) : -INFINITY;
    acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  segment_lse_weights<L::kLanes>(l, n, col, owner, w, lse);
  for (int p0 = 0;;) {
    float wv[kR][kParts];  // every weight read before the first is used: one shared-memory round trip
#pragma unroll
    for (int u = 0; u < kParts; ++u) {
      if (terms_end<Source::kStepped>(p0, u, n)) break;
#pragma unroll
      for (int i = 0; i < kR; ++i) wv[i][u] = w[i][p0 + u < n ? p0 + u : n - 1];
    }
#pragma unroll
    for (int u = 0; u < kParts; ++u) {  // each row's terms in partial order, as before
      if (terms_end<Source::kStepped>(p0, u, n)) break;
#pragma unroll
      for (int i = 0; i < kR; ++i) accumulate_weighted(acc[i], p0 + u < n ? wv[i][u] : 0.f, src.o_of(i, u));
    }
    p0 += kParts;
    if (p0 >= n) return ok;
    ok = ok && src.fetch(p0);  // after a fetch gave up, no more waiting
  }
}

// Where a merge finds its partials: partial p's row r has o at o_of(p) + r*D (D fp32, 16-byte
// aligned) and lse at lse_of(p)[r]. StridedPartials: one stride between partials (the split
// workspace and gathered rank blocks in global memory; a cluster CTA's inbox in shared memory, as
// ClusterPartials, cluster_merge.h).
struct StridedPartials {
  static constexpr int kMaxPartials = kMaxParts;  // most partials a merge through it reads
  const float* o;
  int64_t o_stride;
  const float* lse;
  int64_t lse_stride;
  __device__ const float* o_of(int p) const { return o + p * o_stride; }
  __device__ const float* lse_of(int p) const { return lse + p * lse_stride; }
};

// Partials read with plain loads for warp_merge_rows, located by `where` (see above), kP of each
// row per fetch. Weak loads, unconditional within a kTermStep step, with the partial index clamped
// into [0, n): ptxas keeps them back to back (per-load predicates or branches were serialised
// behind the math, seen in SASS).
template <int D, int kR, class Where, int kP>
struct LoadedPartials {
  static constexpr int kParts = kP;
  static constexpr bool kStepped = kR * kParts <= kMaxSteppedValues;
  using L = MergeLayout<D>;
  const Where& where;
  int n, col;
  const int (&r)[kR];
  float l[kR][L::kLse];
  float4 x[kR][kParts];

  __device__ bool fetch(int p0) {
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      if (p0 == 0)
#pragma unroll
        for (int k = 0; k < L::kLse; ++k) {
          const int p = col + k * L::kLanes;
          l[i][k] = where.lse_of(p < n ? p : n - 1)[r[i]];
        }
#pragma unroll
      for (int u = 0; u < kParts; ++u) {
        if (terms_end<kStepped>(p0, u, n)) break;
        const int p = p0 + u < n ? p0 + u : n - 1;
        x[i][u] = *reinterpret_cast<const float4*>(where.o_of(p) + int64_t(r[i]) * D + 4 * col);
      }
    }
    return true;
  }
  __device__ float lse_of(int i, int k) const { return l[i][k]; }
  __device__ float4 o_of(int i, int u) const { return x[i][u]; }
};

// The merge of n partials of rows [0, rows) located by `where`, read with LoadedPartials: each
// merged row goes to emit(r, col, acc, lse) on the lanes that own it (lane `col` of the row's
// segment: 4 values). No synchronisation inside.
//
// Partials per fetch: as many as kMergeLoads float4 per lane allow (128 registers at D = 128: all
// 16 splits of two rows per warp, group 8, in one L2 round trip; at 24 loads splits 13-16 took a
// second one, +0.5 us of the merge, r251; D = 64 stays at 24, where 32 spilled in the combine
// kernel), or kFewParts when n is that small: a fetch runs all its loads and terms whatever n, and
// that straight-line code runs once per launch, in the tail, likely with its instructions not yet
// in the SM's caches (r251: with 32 loads and no small fetch, n = 1-2 merges read 1-4% slower).
template <int D, class Where, class Emit>
__device__ inline void merge_loaded_rows(const Where& where, int n, int rows, CombineScratch& scratch, Emit&& emit) {
  constexpr int kMergeLoads = D == 128 ? 32 : 24, kFewParts = 8;
  for_warp_rows<D>(rows, [&]<int kR>(std::integral_constant<int, kR>, const int (&r)[kR], const bool (&owner)[kR]) {
    const int col = (threadIdx.x & 31) % MergeLayout<D>::kLanes;
    const auto merge = [&]<int kP>(std::integral_constant<int, kP>) {
      LoadedPartials<D, kR, Where, kP> src{where, n, col, r};
      float4 acc[kR];
      float lse[kR];
      warp_merge_rows<D>(src, n, r, owner, scratch, acc, lse);
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (owner[i]) emit(r[i], col, acc[i], lse[i]);
    };
    constexpr int kAll = kMergeLoads / kR < Where::kMaxPartials ? kMergeLoads / kR : Where::kMaxPartials;
    if constexpr (kAll > kFewParts) {
      if (n <= kFewParts) return merge(std::integral_constant<int, kFewParts>{});
    }
    merge(std::integral_constant<int, kAll>{});
  });
}

// Merge n partials of `rows` rows, located by `where` (StridedPartials, ClusterPartials), into `out`
// (shared memory) rows [0, rows), with lse_combine.h's formula.
// Preconditions: 1 <= n <= kMaxParts, 1 <= rows <= kMaxRows, blockDim.x == kThreads; every thread
// of the CTA calls it.
// Reads are plain (weak) loads: the partials were written by other CTAs, other GPUs or an earlier
// kernel, and every calling thread must already be ordered after those writes by an acquire
// pattern (cta_arrive_last's acquire plus CTA barrier, a flag acquire plus CTA barrier, a cluster
// barrier, or a kernel boundary); the PTX memory model then guarantees the weak loads see them (no
// stale L1 line). Every partial's o must be readable memory, but the o of a partial whose weight is
// 0 (lse = -inf) is discarded by a select: garbage or NaN there cannot leak into the result.
// Synchronises the CTA on entry and exit (`out` and `scratch` are safe to read/reuse after).
//
// It runs in the launch's tail, so it is built for latency (warp_merge_rows): a warp merges its
// whole rows (a half-warp per row when D = 64), lane j owning float4 column j; the LSEs and the o
// values of all the warp's rows go out together, up to merge_loaded_rows' kMergeLoads per lane: one
// round trip for n <= 16 at two rows per warp (group 8, D = 128). The sum S is a tree: the result
// differs from the host formula by float rounding only, and is the same bits wherever the
// partials are read from.
template <int D, class Where>
__device__ inline void cta_merge_partials(const Where& where, int n, int rows, CombineScratch& scratch,
                                          PartialTile<D>& out) {
  __syncthreads();  // scratch/out may still be read by the caller's previous step
  merge_loaded_rows<D>(where, n, rows, scratch, [&](int r, int col, float4 acc, float lse) {
    reinterpret_cast<float4*>(out.o[r])[col] = acc;
    if (col == 0) out.lse[r] = lse;
  });
  __syncthreads();
}

// cta_merge_partials of partials in global memory:
//   partial i, row r:  o at o[i*o_part_stride + r*D + d],  lse at lse[i*lse_part_stride + r].
template <int D>
__device__ inline void cta_combine_partials(const float* o, int64_t o_part_stride, const float* lse,
                                            int64_t lse_part_stride, int n, int rows,
                                            CombineScratch& scratch, PartialTile<D>& out) {
  cta_merge_partials<D>(StridedPartials{o, o_part_stride, lse, lse_part_stride}, n, rows, scratch, out);
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
