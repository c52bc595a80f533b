// Work schedule of the fused multi-rank decode kernel, and why its cross-rank waits cannot
// deadlock. Header-only, includable from plain C++ (the CPU tests simulate the schedule).
//
// Work items: item i = g * num_splits + s is split s of group g = z * kv_heads + kvh (the query
// heads of KV head kvh of the sequence at position z of the batch order, params.h; below "group g"
// means this position, which maps to the same group on every rank only if every rank has the same
// order: the host orders the batch only for a team of one, where nothing waits). The grid has
// G = min(items, resident CTA slots) CTAs: CTA c starts with item c, and takes items G, G + 1, ...
// by ticket from a per-launch counter (dev::work_take: tickets in increasing order, each CTA taking
// its next one while it works on the current item; the first needs no ticket, whose round trip
// would delay every CTA's start, r207: +0.8 us at 96/12 b=1 8K with one item per CTA), so a CTA
// that spent longer on an item (a longer sequence's split, a merge, a wait) does not hold back the
// items after it: a static order (CTA c: items c, c + G, ...) made the CTA that merged a group the
// last to finish its next item, so it merged again (r206: 1.09-1.23x the decode alone at world 1
// on ragged batches with 4 items per CTA). For each item a CTA attends its split; with several effective splits the
// last split to arrive (cta_arrive_last, no waiting) merges them. The CTA holding the group's
// merged partial then
//   1. sends it to every peer (LL lines, partial_exchange.h), and only then
//   2. waits (deadline) for every peer's lines of the same group, and combines.
//
// No deadlock, for any grid sizes, split counts and slice lengths that differ between ranks:
//  (a) every CTA of a rank's grid is resident at once (G <= resident slots, checked on the host
//      with the occupancy API), so a CTA that is not waiting is running and finishes its item;
//  (b) along each CTA's item sequence the group index never decreases (i / num_splits), and a
//      rank's items are taken in index order;
//  (c) a CTA waits on group g only after its rank's partial of g is sent (step 1 before 2).
//  Take, over all ranks, a waiting CTA whose group g is the smallest any CTA waits on. It needs
//  rank p's partial of g. A split of g on p is done, or held by a CTA that is at it (running, by
//  (a)) or before it at an item of a group <= g (b), or not taken yet, in which case every CTA of p
//  works on or waits after an item below it (b), of a group <= g. A CTA of p waiting on a group < g
//  contradicts minimality, and one waiting on g means p's partial of g is already sent (c). So the
//  CTAs ahead of p's splits of g are running: they finish, take those splits and finish them, and
//  p's partial of g arrives.
// Nothing waits for a CTA of its own GPU, so no kernel of the same GPU has to be resident either.
//
// Clustered schedule (FusedDecodeParams::cluster = C = num_splits, 2..kMaxClusterCtas): used when
// every item fits one wave of clusters. The grid is the `items` CTAs, in clusters of C: cluster g
// holds group g's splits, CTA s of it split s (cluster block rank = s). Each CTA attends its split;
// a cluster barrier phase (arrived at on entry: every CTA runs); each CTA stores each row of its
// partial into the CTA that merges the row (cluster_merge.h); CTA k, once its rows are in (an
// mbarrier counting their bytes), merges the rows cluster_rows(group, C, k), sends them, waits for
// the peers' lines of those rows, and combines; a second phase before exit. No deadlock: a cluster
// is launched as a whole, and the host takes this schedule only when every cluster is resident at
// once (cudaOccupancyMaxActiveClusters); the barrier phases and the inbox wait need only the
// cluster's own CTAs, which attend and send without waiting; every rank sends each row's partial
// before it waits on anything remote, so every remote wait is answered whatever schedule the peers
// run, this one or the persistent one.
//
// Direct schedule (FusedDecodeParams::direct, direct_merge.h): the grid is the `items` CTAs, all
// resident at once (items <= resident slots, checked on the host), no clusters. CTA i attends item
// i (split s of group g), sends its raw partial of all the group's rows to every rank, this one
// included, and then merges the rows cluster_rows(group, num_splits, s) over every rank's splits.
// No deadlock: every CTA sends before it waits on anything, and every CTA of every rank runs (all
// resident), so every line a CTA waits for is sent. Every rank in the direct schedule or none: the
// layout differs (FlashDecodeConfig::split_merge).
#pragma once

#include <cstdint>

#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

struct FusedItem {
  int group;  // z * kv_heads + kvh, z the batch position (fused_decode_kernel maps it to the sequence)
  int split;  // 0 .. num_splits-1 (splits past a sequence's effective count have no work)
};

TF_HD inline FusedItem fused_item(int item, int num_splits) {
  return {item / num_splits, item % num_splits};
}

// Rows [begin, end) of a group of `group` query heads that CTA k of a cluster of `ctas` CTAs
// merges, sends and combines: contiguous blocks of ceil(group / ctas) rows, so a CTA's rows are
// one run of a peer's lines (the ones its matching CTA sends); CTAs past the last row get none.
struct RowBlock {
  int begin, end;
};
TF_HD inline int cluster_rows_per_cta(int group, int ctas) { return (group + ctas - 1) / ctas; }
TF_HD inline RowBlock cluster_rows(int group, int ctas, int k) {
  const int per = cluster_rows_per_cta(group, ctas);
  const int begin = k * per < group ? k * per : group;
  return {begin, begin + per < group ? begin + per : group};
}

// The lines of one rank's inbox (partial_exchange.h layout) that launch `epoch` of `rows` query rows
// and head_dim `head_dim` uses, [begin, end), for a `world`-rank team whose op fixed
// `parity_lines` = world x its largest rows x ll_lines_per_row(its largest head_dim), plus the
// direct merge's region when the op is configured for it (FlashDecodeBuffers::fused_parity_lines). Parity epoch & 1 starts at a fixed line whatever the
// shape, because a sender may start launch e + 1 while a receiver still reads its lines of e (the
// sender needed the receiver's lines of e, not that the receiver had read the sender's): the
// parities must never overlap. A base computed from the launch's own shape put a smaller launch's
// parity 1 inside a larger one's parity 0 (4 ranks, r73: a receiver's wait timed out).
struct LineSpan {
  int64_t begin, end;
};
TF_HD inline LineSpan fused_inbox_span(uint64_t epoch, int64_t parity_lines, int world, int64_t rows, int head_dim) {
  const int64_t begin = int64_t(epoch & 1) * parity_lines;
  return {begin, begin + int64_t(world) * rows * ll_lines_per_row(head_dim)};
}

// Which schedule a fused launch runs (fused_decode_kernel's template argument).
enum class FusedSchedule { persistent, clustered, direct };

// Line of (sender, split, row) in the direct schedule's layout: the region starts `direct_begin`
// lines into parity epoch & 1 (fused_inbox_span's parity), senders `sender_lines` apart (fixed by
// the op's maxima: kMaxDirectSplits x its largest direct rows x ll_lines_per_row of its largest
// head_dim), splits `rows` rows apart (the launch's rows, the same on every rank).
TF_HD inline int64_t direct_line(uint64_t epoch, int64_t parity_lines, int64_t direct_begin, int64_t sender_lines,
                                 int64_t rows, int head_dim, int sender, int split, int64_t row) {
  return int64_t(epoch & 1) * parity_lines + direct_begin + sender * sender_lines +
         (split * rows + row) * ll_lines_per_row(head_dim);
}

// CTAs of the fused kernel: one per item, at most one per resident slot (the co-residency that
// the argument above needs). resident >= 1.
TF_HD inline int fused_grid(int64_t items, int resident) {
  return items < resident ? int(items) : resident;
}

}  // namespace taxfree::attention
