// Split merge inside a thread-block cluster: the CTAs of one cluster attend the splits of one
// (sequence, KV head) group; each then stores every row of its partial straight into the shared
// memory of the CTA that merges that row (distributed shared memory), and each CTA merges its
// block of rows from its own shared memory as soon as its rows have arrived. Used by the fused
// multi-rank decode when a launch fits one wave of clusters (fused_schedule.h).
//
// Why: the global-memory merge (cta_store_tile, cta_arrive_last, cta_combine_partials) is a chain
// of a store, a gpu-scope release/acquire atomic and an L2 round trip in the launch's tail, taken by
// one CTA for all the group's rows (3 us at 96/12 heads, batch 1, 11 splits on an H200). Here the
// partials never leave the GPC, and the rows' merges, sends and cross-rank combines run on as many
// CTAs as the group has rows. Stores, not loads: the merging CTA reading the other CTAs' tiles took
// as long as the global merge (r54: 2.9 us from the barrier to the merged rows for 8 partials of
// one row), while remote stores are fire-and-forget.
//
// Protocol (one launch; `inbox.full` is an mbarrier in each CTA's inbox):
//  1. start: thread 0 initialises `full` (one arrival) and arrives expecting the bytes its rows
//     will receive (cluster_inbox_expect: rows x sending splits x (D + 1) floats), fences the init
//     for the cluster, and every thread arrives (relaxed) at cluster barrier phase 1;
//  2. after attending, phase 1's wait: every CTA of the cluster runs and its `full` is initialised
//     (CUDA's rule: a CTA's shared memory may be written by others only once it runs; racecheck,
//     r87, flagged the row stores otherwise);
//  3. cta_scatter_rows: st.async of each row's values into the merging CTA's inbox, each completing
//     its bytes on that CTA's `full`;
//  4. a CTA with rows waits for `full` (cluster_inbox_wait; acquire: the rows are then visible to
//     its plain loads) and merges; no cluster barrier in between, so it starts as soon as its own
//     rows are in, not when every CTA has sent (from the slowest split's attention to the merge:
//     0.77 us with the barrier phase this replaced, 0.52-0.55 with this; r129, r132 traces);
//  5. every CTA arrives at phase 2 once its rows are in (or at once, with none), and waits for
//     phase 2 before it exits: no CTA leaves while another's inbox may still receive its stores.
#pragma once

#include "taxfree/device/ll_line.cuh"
#include "taxfree/device/mbarrier.cuh"
#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

// Halves of a cluster barrier phase. Every thread of every CTA of the cluster calls
// cluster_arrive_relaxed then cluster_wait once per phase (.aligned: warp-uniform, no thread of a
// warp skips it). The arrival orders nothing: the phases say "this CTA runs" and "this CTA's
// rows are in"; the data's order comes from the mbarrier.
__device__ inline void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ inline void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// One merging CTA's rows: slot p*per + r (kClusterSlots, config.h) holds row r of its block of
// `per` rows of the partial of the cluster's CTA p; `full` completes when they are all in.
template <int D>
struct ClusterInbox {
  alignas(16) float o[kClusterSlots][D];
  float lse[kClusterSlots];
  alignas(8) uint64_t full;
};

// Remote shared-memory address (shared::cluster window) of `local` in the cluster's CTA `cta`.
__device__ __forceinline__ uint32_t cluster_map(const void* local, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(dev::smem_addr(local)), "r"(cta));
  return remote;
}

// Step 1 of the protocol, by thread 0 before the kernel's first cluster barrier arrival: this CTA
// merges `rows` rows, each sent by `senders` CTAs.
template <int D>
__device__ inline void cluster_inbox_expect(ClusterInbox<D>& inbox, int rows, int senders) {
  const uint32_t full = dev::smem_addr(&inbox.full);
  dev::mbar_init(full, 1);
  dev::fence_mbar_init();
  dev::mbar_arrive_expect_tx(full, uint32_t(rows * senders) * uint32_t(sizeof(float) * (D + 1)));
}

// Store the `group` rows of this CTA's partial `t` into the inboxes of the cluster's CTAs that
// merge them: row r goes to CTA r / per, slot k*per + r % per, k = this CTA's block rank. `inbox`
// is this CTA's inbox (every CTA of the kernel has it at the same offset). st.async: each store
// completes its bytes on the receiving CTA's `full` (step 3 of the protocol above).
template <int D>
__device__ inline void cta_scatter_rows(const PartialTile<D>& t, int group, int per, int k, ClusterInbox<D>& inbox) {
  constexpr int kVec = D / 4;
  for (int i = threadIdx.x; i < group * (kVec + 1); i += blockDim.x) {
    const int r = i < group * kVec ? i / kVec : i - group * kVec;
    const uint32_t cta = uint32_t(r / per);
    const int slot = k * per + r % per;
    const uint32_t full = cluster_map(&inbox.full, cta);
    if (i < group * kVec) {
      const int c = i % kVec;
      const float4 v = reinterpret_cast<const float4*>(t.o[r])[c];
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                   ::"r"(cluster_map(&inbox.o[slot][4 * c], cta)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(full)
                   : "memory");
    } else {
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
                   ::"r"(cluster_map(&inbox.lse[slot], cta)), "f"(t.lse[r]), "r"(full)
                   : "memory");
    }
  }
}

// Step 4, by every thread of a CTA with rows. Bounded like the cross-rank waits (deadline, abort
// flag): false (uniformly across the CTA) when it gave up, after a WaitRecord naming
// WaitSite::decode_cluster_rows (peer -1, no heap flag: a CTA of this rank's cluster never sent, a
// protocol bug, as every CTA of the cluster sends before it waits on anything). Ends with a CTA
// barrier, which also ends the scatter's reads of the tile the merge then overwrites.
template <int D>
__device__ inline bool cluster_inbox_wait(ClusterInbox<D>& inbox, const dev::FaultContext& fc) {
  const uint32_t full = dev::smem_addr(&inbox.full);
  bool done = false;
  uint64_t start = 0, waited = 0;
  for (uint32_t i = 0; !(done = dev::mbar_try_wait(full, 0)); ++i)
    if (dev::ll_poll_expired(i, start, fc, waited)) {
      // Whichever thread's deadline passes reports (the record keeps the first): the others may
      // still see the phase complete, and the CTA's vote then fails on this thread alone.
      if (waited != 0) dev::report_wait_timeout(fc, dev::WaitSite::decode_cluster_rows, -1, nullptr, 1, 0, waited);
      break;
    }
  return __syncthreads_and(done) != 0;
}

// The inbox's partials for cta_merge_partials: at most a cluster's, so a warp merging one row loads
// 16 partials per round trip, not merge_loaded_rows' 24-32 (a smaller unrolled loop in the launch's tail).
struct ClusterPartials : StridedPartials {
  static constexpr int kMaxPartials = kMaxClusterCtas;
};

// Merge the n partials of this CTA's `rows` rows (of `per` slots each) from its inbox into out
// rows [0, rows): the same weights and order as cta_combine_partials, so the same bits as the
// global-memory merge of the same partials. Preconditions: cluster_inbox_wait; 1 <= n <= cluster
// size; `out` and `scratch` free.
template <int D>
__device__ inline void cta_merge_inbox_rows(const ClusterInbox<D>& inbox, int n, int per, int rows,
                                            CombineScratch& scratch, PartialTile<D>& out) {
  cta_merge_partials<D>(ClusterPartials{{&inbox.o[0][0], int64_t(per) * D, inbox.lse, per}}, n, rows, scratch, out);
}

}  // namespace taxfree::attention
