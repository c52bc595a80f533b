// Split merge inside a thread-block cluster: the CTAs of one cluster attend the splits of one
// (sequence, KV head) group; each then stores every row of its partial straight into the shared
// memory of the CTA that merges that row (distributed shared memory), and after one cluster
// barrier each CTA merges its block of rows from its own shared memory. Used by the fused
// multi-rank decode when a launch fits one wave of clusters (fused_schedule.h).
//
// Why: the global-memory merge (cta_store_tile, cta_arrive_last, cta_combine_partials) is a chain
// of a store, a gpu-scope release/acquire atomic and an L2 round trip in the launch's tail, taken by
// one CTA for all the group's rows (3 us at 96/12 heads, batch 1, 11 splits on an H200). Here the
// partials never leave the GPC, and the rows' merges, sends and cross-rank combines run on as many
// CTAs as the group has rows. Stores, not loads: the merging CTA reading the other CTAs' tiles took
// as long as the global merge (r54: 2.9 us from the barrier to the merged rows for 8 partials of
// one row), while remote stores are fire-and-forget and their completion overlaps the barrier.
//
// Start: no CTA stores into another's shared memory before that one runs (the CUDA programming
// guide's rule for distributed shared memory): a barrier phase arrived at with
// cluster_arrive_relaxed at the kernel's start and waited for just before the first remote store.
//
// Memory order: cluster_arrive (barrier.cluster.arrive.release) after a CTA's remote stores and
// cluster_wait (barrier.cluster.wait.acquire) before the merge's local reads: the release/acquire
// pair at cluster scope makes the stores visible. The inbox is written only by the cluster's CTAs
// before that barrier phase and read only after it, and no CTA touches another's shared memory
// after it, so CTAs may leave the kernel at any time after it.
#pragma once

#include <cooperative_groups.h>

#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

// Halves of a cluster barrier phase. Every thread of every CTA of the cluster calls cluster_arrive
// then cluster_wait once per phase (.aligned: warp-uniform, no thread of a warp skips it).
__device__ inline void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
// An arrival that orders nothing (a phase that only says "this CTA runs").
__device__ inline void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ inline void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// One merging CTA's rows: slot p*per + r (kClusterSlots, config.h) holds row r of its block of
// `per` rows of the partial of the cluster's CTA p.
template <int D>
struct ClusterInbox {
  alignas(16) float o[kClusterSlots][D];
  float lse[kClusterSlots];
};

// Store the `group` rows of this CTA's partial `t` into the inboxes of the cluster's CTAs that
// merge them: row r goes to CTA r / per, slot k*per + r % per, k = this CTA's block rank. `inbox`
// is this CTA's inbox (every CTA of the kernel has it at the same offset). No synchronisation
// inside; the caller's cluster barrier phase publishes the stores.
template <int D>
__device__ inline void cta_scatter_rows(const PartialTile<D>& t, int group, int per, int k, ClusterInbox<D>& inbox) {
  constexpr int kVec = D / 4;
  const auto cluster = cooperative_groups::this_cluster();
  for (int i = threadIdx.x; i < group * (kVec + 1); i += blockDim.x) {
    const int r = i < group * kVec ? i / kVec : i - group * kVec;
    ClusterInbox<D>* const dst = cluster.map_shared_rank(&inbox, unsigned(r / per));
    const int slot = k * per + r % per;
    if (i < group * kVec)
      reinterpret_cast<float4*>(dst->o[slot])[i % kVec] = reinterpret_cast<const float4*>(t.o[r])[i % kVec];
    else
      dst->lse[slot] = t.lse[r];
  }
}

// The inbox's partials for cta_merge_partials: at most a cluster's, so a warp merging one row loads
// 16 partials per round trip, not LoadedPartials' 24 (a smaller unrolled loop in the launch's tail).
struct ClusterPartials : StridedPartials {
  static constexpr int kMaxPartials = kMaxClusterCtas;
};

// Merge the n partials of this CTA's `rows` rows (of `per` slots each) from its inbox into out
// rows [0, rows): the same weights and order as cta_combine_partials, so the same bits as the
// global-memory merge of the same partials. Preconditions: the cluster barrier phase after every
// CTA's cta_scatter_rows; 1 <= n <= cluster size; `out` and `scratch` free.
template <int D>
__device__ inline void cta_merge_inbox_rows(const ClusterInbox<D>& inbox, int n, int per, int rows,
                                            CombineScratch& scratch, PartialTile<D>& out) {
  cta_merge_partials<D>(ClusterPartials{{&inbox.o[0][0], int64_t(per) * D, inbox.lse, per}}, n, rows, scratch, out);
}

}  // namespace taxfree::attention
