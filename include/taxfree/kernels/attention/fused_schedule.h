// Work schedule of the fused multi-rank decode kernel, and why its cross-rank waits cannot
// deadlock. Header-only, includable from plain C++ (the CPU tests simulate the schedule).
//
// Work items: item i = g * num_splits + s is split s of group g = b * kv_heads + kvh (the query
// heads of KV head kvh of sequence b). The grid has G = min(items, resident CTA slots) CTAs and
// CTA c takes items c, c + G, c + 2G, ... in that order (a persistent loop when items > G). For
// each item a CTA attends its split; with several effective splits the last split to arrive
// (cta_arrive_last, no waiting) merges them. The CTA holding the group's merged partial then
//   1. sends it to every peer (LL lines, partial_exchange.h), and only then
//   2. waits (deadline) for every peer's lines of the same group, and combines.
//
// No deadlock, for any grid sizes, split counts and slice lengths that differ between ranks:
//  (a) every CTA of a rank's grid is resident at once (G <= resident slots, checked on the host
//      with the occupancy API), so a CTA that is not waiting is running and finishes its item;
//  (b) along each CTA's item sequence the group index never decreases (i / num_splits);
//  (c) a CTA waits on group g only after its rank's partial of g is sent (step 1 before 2).
//  Take, over all ranks, a waiting CTA whose group g is the smallest any CTA waits on. It needs
//  rank p's partial of g; the splits of g on p belong to CTAs that are either past them (done),
//  at them (running, by (a)), or before them at an item of a group <= g (b) that they are either
//  computing (running) or waiting on; waiting on a group < g contradicts minimality, and waiting
//  on g itself means p's partial of g is already sent (c). So p's partial of g arrives.
// Nothing waits for a CTA of its own GPU, so no kernel of the same GPU has to be resident either.
#pragma once

#include <cstdint>

#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

struct FusedItem {
  int group;  // b * kv_heads + kvh
  int split;  // 0 .. num_splits-1 (splits past a sequence's effective count have no work)
};

TF_HD inline FusedItem fused_item(int item, int num_splits) {
  return {item / num_splits, item % num_splits};
}

// CTAs of the fused kernel: one per item, at most one per resident slot (the co-residency that
// the argument above needs). resident >= 1.
TF_HD inline int fused_grid(int64_t items, int resident) {
  return items < resident ? int(items) : resident;
}

}  // namespace taxfree::attention
