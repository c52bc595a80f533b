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
// longer merge in the tail: at world 1 it takes 4.2 us after the lines arrive, bound by cold code
// and one warp's dependence chain (r116-r119: a wash warm, 1-1.7 us slower with a cold L2), so it
// is opt-in (FlashDecodeConfig::SplitMerge::direct) until two GPUs measure the overlap it buys.
//
// Inbox layout of the direct region (fused_schedule.h: direct_line): [sender][split][row][line],
// the sender stride fixed by the op's maxima, the split stride the launch's rows. The LSE line of a
// row carries the sender's split count for it (cta_push_partial_ll's `count`); splits past the
// count send nothing.
//
// Same bits as bsp: the merge is two-level, as bsp's is: each rank's splits first (warp_merge_rows
// over the rank's `count` partials, the arithmetic of cta_combine_partials), staged in shared
// memory, then the ranks in rank order (the arithmetic of the combine kernel). The first level of a
// row merges as many partials as the largest count of the CTA's senders; the extra ones read as
// empty (LSE -inf), which adds exact zeros. Every rank merges the same bits in the same order, so
// the output is bitwise identical across ranks.
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
// LSE line of the last row: first thread p < world reads rank p's split count from split 0's (into
// counts[p]), then thread p*kMaxDirectSplits + s polls split s < counts[p] (backoff: the CTA beside
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

// Merge rows [0, rows) over every rank's splits into out[r*D + d] (T), after cta_wait_direct with
// the same arguments. `stage` holds world*rows rows (world*rows <= direct_stage_rows(D): the
// caller checks). Level 1: unit u = p*rows + r (rank p, row r) merged over rank p's counts[p]
// splits by one warp segment, units spread over the CTA's warps; level 2: each row over the ranks
// (world <= kMaxParts). Returns false (uniformly) when a line did not arrive in time (the rows are
// then not stored). Every thread calls it; ends with a CTA barrier.
template <class T, int D>
__device__ inline bool cta_merge_direct(const uint4* rows_base, int64_t sender_lines, int64_t split_lines, int rows,
                                        int world, const int* counts, uint32_t flag, const dev::FaultContext& fc,
                                        CombineScratch& scratch, DirectStage<D> stage,
                                        T* out) {
  constexpr int kRow = ll_lines_per_row(D);
  int most = 1;  // splits of the level-1 merges (CTA-uniform)
  for (int p = 0; p < world; ++p) most = counts[p] > most ? counts[p] : most;
  const int units = world * rows;
  bool ok = true;
  for (int u0 = 0; u0 < units; u0 += kMaxRows) {
    const int n_units = units - u0 < kMaxRows ? units - u0 : kMaxRows;
    for_warp_rows<D>(n_units, [&]<int kR>(std::integral_constant<int, kR>, const int (&r)[kR], const bool (&owner)[kR]) {
      if (__all_sync(0xffffffffu, ok) == 0) return;  // a wait gave up: no more waiting
      const int col = (threadIdx.x & 31) % MergeLayout<D>::kLanes;
      // `own` -1: no partial from shared memory (this rank's splits come through its inbox too).
      // Not stepped: n (the splits) is mostly past a fetch's kParts here (combine.h, terms_end).
      LlPartials<D, kR, false> src{nullptr, r, -1, {}, split_lines, {}, {}, flag, fc, col, most};
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const int u = u0 + r[i], p = u / rows;
        src.base[i] = rows_base + p * sender_lines + int64_t(u % rows) * kRow;
        src.n[i] = counts[p];
        src.peer[i] = p;
      }
      float4 acc[kR];
      float lse[kR];
      ok = warp_merge_rows<D>(src, most, r, owner, scratch, acc, lse) && ok;
#pragma unroll
      for (int i = 0; i < kR; ++i)
        if (owner[i]) {
          reinterpret_cast<float4*>(stage.o + int64_t(u0 + r[i]) * D)[col] = acc[i];
          if (col == 0) stage.lse[u0 + r[i]] = lse[i];
        }
      __syncwarp();  // the next merge's weights reuse scratch rows this one read
    });
  }
  if (__syncthreads_and(ok) == 0) return false;  // the stage is complete
  merge_loaded_rows<D>(StagedRanks{{stage.o, int64_t(rows) * D, stage.lse, rows}}, world, rows, scratch,
                       [&](int r, int col, float4 acc, float) { store_row_as<T, D>(out + int64_t(r) * D, col, acc); });
  __syncthreads();
  return true;
}

}  // namespace taxfree::attention
