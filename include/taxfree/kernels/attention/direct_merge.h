// Direct split merge of the fused multi-rank decode: every split's raw partial goes straight to
// every rank (this one included) as LL lines, and the CTA that owns a block of a group's rows merges
// splits and ranks in one step, from the lines. Used by fused_decode_kernel's direct schedule
// (fused_schedule.h).
//
// Why: the clustered schedule's tail after the last split attends is a chain (r110, 96/12 heads,
// batch 1, 8K: cluster barrier +0.8 us, split merge +1.3, send +0.35, then the peers' lines and the
// rank combine); here the lines leave as soon as each split attends, and one merge at the
// receiver replaces the barrier, the split merge and the combine. The price: a split count times
// the lines (only small batches: kDirectMaxRows), sent while the slower splits still attend, and a
// longer merge in the tail (at world 1, 2.9 us after the lines arrive at 96/12 b=1 8K, r134; it
// beats the clustered path there, r135), so it is opt-in (FlashDecodeConfig::SplitMerge::direct)
// until two GPUs measure what its split-count-times-larger NVLink traffic costs.
//
// Inbox layout of the direct region (fused_schedule.h: direct_line): [sender][split][row][line],
// the sender stride fixed by the op's maxima, the split stride the launch's rows. The LSE line of a
// row carries the sender's split count for it (cta_push_partial_ll's `count`); splits past the
// count send nothing.
//
// Same bits as bsp: the merge is two-level, as bsp's is: each rank's splits first (over that
// rank's `count` partials, with warp_merge_rows' weights and summation order: the arithmetic of
// cta_combine_partials), staged in shared memory, then the ranks in rank order (the arithmetic of
// the combine kernel). Every rank merges the same bits in the same order, so the output is bitwise
// identical across ranks.
#pragma once

#include <cstdint>

#include "taxfree/kernels/attention/partial_exchange.h"

namespace taxfree::attention {

// Shared memory of the merge: the ranks' merged rows, [rank][row] (o: D fp32, lse), in the
// attention's idle accumulators and tile (below AttendSmem::Post::scratch, which the merges use).
template <int D>
struct DirectStage {
  float* o;    // [ranks * rows][D]
  float* lse;  // [ranks * rows]
  __device__ DirectStage(void* base, int ranks_x_rows)
      : o(static_cast<float*>(base)), lse(static_cast<float*>(base) + int64_t(ranks_x_rows) * D) {}
};

// The stage's per-rank rows for level 2: at most kDirectMaxWorld partials, so a warp's loads of them
// stay a short unrolled loop (the merge runs in the launch's tail, where its code is fetched cold).
struct StagedRanks : StridedPartials {
  static constexpr int kMaxPartials = kDirectMaxWorld;
};

// Wait until every rank's lines for this CTA's rows [0, rows) carry `flag`, as far as each split's
// LSE line of the last row: thread p*kMaxDirectSplits (p < world) reads rank p's split count from
// split 0's (into counts[p]), then thread p*kMaxDirectSplits + s polls split s < counts[p] (backoff: the CTA beside
// it may still attend). `rows_base` is the line of (sender 0, split 0, the CTA's row 0). Returns
// false (uniformly) when a wait gave up (WaitSite::decode_partial naming the rank) or a count is
// out of [1, kMaxDirectSplits] (not a direct sender's line: reported as a wait on that line, the
// count as the value observed). Every thread calls it; ends with a CTA barrier.
template <int D>
__device__ inline bool cta_wait_direct(const uint4* rows_base, int64_t sender_lines, int64_t split_lines, int rows,
                                       int world, uint32_t flag, const dev::FaultContext& fc, int* counts) {
  constexpr uint32_t kBackoffNs = 32;
  static_assert(kThreads >= kDirectMaxWorld * kMaxDirectSplits, "one thread per (rank, split)");
  const int p = threadIdx.x / kMaxDirectSplits, s = threadIdx.x % kMaxDirectSplits;
  const uint4* const lse_line = rows_base + int64_t(rows - 1) * ll_lines_per_row(D) + D / 2;
  bool ok = true;
  if (s == 0 && p < world) {
    uint2 got;
    const uint4* const at = lse_line + p * sender_lines;
    ok = dev::ll_load(at, flag, got, fc, dev::WaitSite::decode_partial, p, kBackoffNs);
    if (ok && (got.y < 1u || got.y > uint32_t(kMaxDirectSplits))) {
      dev::report_wait_timeout(fc, dev::WaitSite::decode_partial, p, at, kMaxDirectSplits, got.y, 0);
      ok = false;
    }
    counts[p] = ok ? int(got.y) : 1;
  }
  if (__syncthreads_and(ok) == 0) return false;
  if (p < world && s >= 1 && s < counts[p]) {
    uint2 got;
    ok = dev::ll_load(lse_line + p * sender_lines + s * split_lines, flag, got, fc, dev::WaitSite::decode_partial, p,
                      kBackoffNs);
  }
  return __syncthreads_and(ok) != 0;
}

// How level 1 spreads a unit (rank p, row r) over warps: kWarpsPerUnit warps per unit, lane L of
// them owning LL line L of the row.
template <int D>
struct DirectColumns {
  using L = MergeLayout<D>;
  static constexpr int kLines = D / 2;                 // o lines per row
  static constexpr int kWarpsPerUnit = kLines / 32;    // 2 (D = 128) or 1 (D = 64)
  static constexpr int kUnitsPerPass = kWarps / kWarpsPerUnit;
  static_assert(kLines % 32 == 0 && kWarps % kWarpsPerUnit == 0, "head_dim 64 or 128");
};

// Level 1 of one unit by its kWarpsPerUnit warps side by side: lane L owns LL line L of the row (o
// values 2L, 2L+1), so every partial of the unit is one line per lane and all of them go out in one
// round trip (before: one warp per row through LlPartials, 8 partials per fetch: two round trips
// for 11 splits while three warps waited). The weights are segment_lse_weights' on the MergeLayout
// segment (lane col = L % kLanes holds partials col + k*kLanes), each term is accumulate_weighted's,
// in partial order: the same bits as warp_merge_rows. The merged values go to the stage in
// MergeLayout order (float4 col = values 2col, 2col+1, 2col+D/2, 2col+D/2+1), which level 2 reads.
// Returns false when a line was still stale at the deadline (reported, WaitSite::decode_partial
// naming rank `peer`).
template <int D>
__device__ inline bool warp_merge_direct_unit(const uint4* unit, int64_t split_lines, int n, int peer, uint32_t flag,
                                              const dev::FaultContext& fc, float* w, float2* stage_o, float* stage_lse,
                                              bool writes_lse) {
  using L = MergeLayout<D>;
  const int lane = threadIdx.x & 31;
  const int line = (int(threadIdx.x >> 5) % DirectColumns<D>::kWarpsPerUnit) * 32 + lane;  // o line, < D/2
  const int col = lane % L::kLanes;
  uint4 x[kMaxDirectSplits];
  uint2 l[L::kLse];
  const uint4 stale4 = make_uint4(0u, ~flag, 0u, ~flag);
#pragma unroll
  for (int s = 0; s < kMaxDirectSplits; ++s) x[s] = stale4;
#pragma unroll
  for (int k = 0; k < L::kLse; ++k) l[k] = make_uint2(0u, ~flag);
  uint64_t start = 0, waited = 0;
  for (uint32_t it = 0;; ++it) {  // every line read before any is checked; later passes only the stale
#pragma unroll
    for (int s = 0; s < kMaxDirectSplits; ++s)
      if (s < n && !dev::ll_current(x[s], flag)) x[s] = dev::ll_peek(unit + s * split_lines + line);
#pragma unroll
    for (int k = 0; k < L::kLse; ++k) {
      const int s = col + k * L::kLanes;
      if (s < n && !dev::ll_half_current(l[k], flag)) l[k] = dev::ll_peek_half(unit + s * split_lines + D / 2);
    }
    const uint4* stale = nullptr;
    uint32_t seen = 0;
#pragma unroll
    for (int s = 0; s < kMaxDirectSplits; ++s)
      if (s < n && !dev::ll_current(x[s], flag) && stale == nullptr)
        stale = unit + s * split_lines + line, seen = x[s].y != flag ? x[s].y : x[s].w;
#pragma unroll
    for (int k = 0; k < L::kLse; ++k) {
      const int s = col + k * L::kLanes;
      if (s < n && !dev::ll_half_current(l[k], flag) && stale == nullptr)
        stale = unit + s * split_lines + D / 2, seen = l[k].y;
    }
    if (__all_sync(0xffffffffu, stale == nullptr)) break;
    const bool expired = dev::ll_poll_expired(it, start, fc, waited);  // every lane, every pass
    if (__any_sync(0xffffffffu, expired)) {  // the warp gives up together (its shuffles follow)
      if (expired && waited != 0 && stale != nullptr)
        dev::report_wait_timeout(fc, dev::WaitSite::decode_partial, peer, stale, flag, seen, waited);
      return false;
    }
  }
  float lf[1][L::kLse];
  float* const wr[1] = {w};
  const bool owner[1] = {lane < L::kLanes};  // one segment writes the weights
  float lse[1];
#pragma unroll
  for (int k = 0; k < L::kLse; ++k) lf[0][k] = col + k * L::kLanes < n ? __uint_as_float(l[k].x) : -INFINITY;
  segment_lse_weights<L::kLanes>(lf, n, col, owner, wr, lse);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);  // .x, .y: this lane's two values
#pragma unroll
  for (int s = 0; s < kMaxDirectSplits; ++s) {
    if (s >= n) break;
    accumulate_weighted(acc, w[s], make_float4(__uint_as_float(x[s].x), __uint_as_float(x[s].z), 0.f, 0.f));
  }
  // Line `line` holds values 2*line, 2*line+1: MergeLayout's float4 (line % kLanes), half line / kLanes.
  stage_o[(line % L::kLanes) * 2 + line / L::kLanes] = make_float2(acc.x, acc.y);
  if (writes_lse && lane == 0) *stage_lse = lse[0];
  return true;
}

// Merge rows [0, rows) over every rank's splits into out[r*D + d] (T), after cta_wait_direct with
// the same arguments. `stage` holds world*rows rows (world*rows <= direct_stage_rows(D): the
// caller checks). Level 1: unit u = p*rows + r (rank p, row r) merged over rank p's counts[p]
// splits by warp_merge_direct_unit, kUnitsPerPass units at a time; level 2: each row over the ranks
// (world <= kMaxParts). Returns false (uniformly) when a line did not arrive in time (the rows are
// then not stored). Every thread calls it; ends with a CTA barrier.
template <class T, int D>
__device__ inline bool cta_merge_direct(const uint4* rows_base, int64_t sender_lines, int64_t split_lines, int rows,
                                        int world, const int* counts, uint32_t flag, const dev::FaultContext& fc,
                                        CombineScratch& scratch, DirectStage<D> stage,
                                        T* out) {
  using C = DirectColumns<D>;
  constexpr int kRow = ll_lines_per_row(D);
  const int units = world * rows, warp = int(threadIdx.x >> 5);
  bool ok = true;
  for (int u0 = 0; u0 < units; u0 += C::kUnitsPerPass) {
    const int u = u0 + warp / C::kWarpsPerUnit;
    if (u < units && ok) {
      const int p = u / rows;
      ok = warp_merge_direct_unit<D>(rows_base + p * sender_lines + int64_t(u % rows) * kRow, split_lines, counts[p], p,
                                     flag, fc, scratch.w[warp], reinterpret_cast<float2*>(stage.o + int64_t(u) * D),
                                     stage.lse + u, warp % C::kWarpsPerUnit == 0);
    }
    __syncwarp();  // the next unit's weights reuse this warp's scratch row
  }
  if (__syncthreads_and(ok) == 0) return false;  // the stage is complete
  merge_loaded_rows<D>(StagedRanks{{stage.o, int64_t(rows) * D, stage.lse, rows}}, world, rows, scratch,
                       [&](int r, int col, float4 acc, float) { store_row_as<T, D>(out + int64_t(r) * D, col, acc); });
  __syncthreads();
  return true;
}

}  // namespace taxfree::attention
