// Split merge inside a thread-block cluster: the CTAs of one cluster attend the splits of one
// (sequence, KV head) group, each into its own shared-memory PartialTile, and after one cluster
// barrier each CTA merges a block of the group's rows straight from all the cluster's tiles
// (distributed shared memory). Used by the fused multi-rank decode when a launch fits one wave of
// clusters (fused_schedule.h).
//
// Why: the global-memory merge (cta_store_tile, cta_arrive_last, cta_combine_partials) is a chain
// of a store, a gpu-scope release/acquire atomic and an L2 round trip in the launch's tail, taken by
// one CTA for all the group's rows (3 us at 96/12 heads, batch 1, 11 splits on an H200). Here the
// tiles never leave the SMs, and the rows' merges, sends and cross-rank combines run on as many
// CTAs as the group has rows (up to the cluster size).
//
// Memory order: cluster_arrive (barrier.cluster.arrive.release) after a CTA's tile is written and
// cluster_wait (barrier.cluster.wait.acquire) before another CTA reads it over distributed shared
// memory: the release/acquire pair at cluster scope makes the tile's shared-memory stores visible
// to the remote weak loads. A CTA's shared memory must stay alive while other CTAs may read it, so
// every CTA arrives once more after its last remote read, and waits on that phase before it exits.
#pragma once

#include <cooperative_groups.h>

#include "taxfree/kernels/attention/combine.h"

namespace taxfree::attention {

// Halves of a cluster barrier phase. Every thread of every CTA of the cluster calls cluster_arrive
// then cluster_wait once per phase (.aligned: warp-uniform, no thread of a warp skips it).
__device__ inline void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ inline void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Partials for cta_merge_partials: partial p is the PartialTile of the cluster's CTA p (block
// rank p), at the offset of `tile` in this CTA's shared memory (every CTA of a kernel has the same
// layout), rows from `first` on.
template <int D>
struct ClusterTiles {
  const PartialTile<D>* tile;
  int first;
  __device__ const float* o_of(int p) const {
    return cooperative_groups::this_cluster().map_shared_rank(&tile->o[first][0], unsigned(p));
  }
  __device__ const float* lse_of(int p) const {
    return cooperative_groups::this_cluster().map_shared_rank(&tile->lse[first], unsigned(p));
  }
};

// Merge rows [first, first + rows) of the tiles of the cluster's CTAs 0 .. n-1 (at `tile`'s offset
// in each) into out rows [0, rows). Preconditions: a cluster barrier phase (arrive after the
// tiles were written, wait) separates the tiles' stores from this call; 1 <= n <= cluster size;
// first + rows <= kMaxRows; `out` and `scratch` are this CTA's and not `tile`. Same weights and
// order as cta_combine_partials: the same bits as the global-memory merge of the same partials.
template <int D>
__device__ inline void cta_merge_cluster_rows(const PartialTile<D>& tile, int n, int first, int rows,
                                              CombineScratch& scratch, PartialTile<D>& out) {
  cta_merge_partials<D>(ClusterTiles<D>{&tile, first}, n, rows, scratch, out);
}

}  // namespace taxfree::attention
