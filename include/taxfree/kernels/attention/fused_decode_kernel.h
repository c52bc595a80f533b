// fused_decode_kernel — flash_decode across ranks in one kernel per rank: split-KV decode of this
// rank's slices, the partial of every (sequence, KV head) group sent to every peer as low-latency
// lines (partial_exchange.h: data and epoch in each 16-byte store, no fence, no flag), and the
// cross-rank LSE combine of that group done by the CTA that sent it, straight from the lines once
// they arrive (one thread per peer waits for them, so a waiting CTA leaves its SM to the CTA beside
// it that still decodes). Every rank ends with the full output; the combine sums the ranks'
// partials in rank order from identical bits, so the output is bitwise identical on every rank. A
// team of one writes its partial as the output (cta_store_one_rank: the same bits as the combine).
//
// kSchedule persistent: grid fused_grid(items, resident slots) persistent CTAs taking items by
// ticket (FusedDecodeParams::work), kThreads threads,
// decode_smem_bytes<D>() dynamic shared memory. clustered: `items` CTAs in clusters of num_splits
// (FusedDecodeParams::cluster), at least fused_cluster_smem_bytes<D>(). direct: `items` CTAs, all
// resident, decode_smem_bytes<D>(); raw split partials to every rank, splits and ranks merged in one
// step (direct_merge.h). fused_schedule.h: the schedules and why none can deadlock. Launched as a
// programmatic dependent launch (dev::wait_prior_grid first: its CTAs may be placed during the tail
// of the grid ahead, which every CTA of that grid reached already, so the residency the schedules
// need is not at stake).
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * epoch e from the op's sequence, entered way (launch_sequence.cuh), +1 per launch of the op;
//    lines carry dev::ll_flag(e). Thread 0 takes the ticket at the CTA's start and turns it into the
//    epoch only when the first partial is ready (shared with the CTA through post.word), so the
//    atomic's round trip hides behind the attention, and the launch's tail holds no fenced atomic
//    waiting for the output stores.
//  * Launch e uses inbox parity e & 1, at a line fixed by the op's maxima whatever the launch's
//    shape (fused_inbox_span): a sender may write its lines of e + 1 while a receiver still reads
//    those of e, so the two parities must not overlap. A receiver reads parity e & 1 only during its launch e,
//    and accepts a line only when it carries exactly e's flag (a stale line of this parity carries
//    an older epoch's, or 0 from the initial zeroing, which no flag is).
//  * A sender at launch e + 2 overwrites the lines a receiver R reads at e. It got there only
//    after finishing e + 1, which needed R's partials of e + 1 for every group (every rank
//    combines every group), which R sends only during its launch e + 1, after its launch e ended
//    (launches of one op are stream-ordered on each rank). So the lines are free without a
//    "buffer free" handshake: the ll_line.cuh argument, since every rank receives from every rank
//    at every step.
//  * The entered way's epochs run 1..2^32 and wrap (launch_sequence.cuh), so flags repeat every
//    2^32 launches: a line left unwritten for exactly a multiple of that (a larger shape used that
//    long ago) would be taken as current.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/kernels/attention/attend_chunk.h"
#include "taxfree/kernels/attention/cluster_merge.h"
#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/decode_kernel.h"
#include "taxfree/kernels/attention/direct_merge.h"
#include "taxfree/kernels/attention/fused_schedule.h"
#include "taxfree/kernels/attention/params.h"
#include "taxfree/kernels/attention/partial_exchange.h"

namespace taxfree::attention {

// Shared memory of the clustered kernel: the attending CTA's, then the cluster inbox.
template <int D>
constexpr int fused_cluster_smem_bytes() {
  return decode_smem_bytes<D>() + int(sizeof(ClusterInbox<D>));
}

template <class T, int D, bool kPaged, FusedSchedule kSchedule>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) fused_decode_kernel(const __grid_constant__ FusedDecodeParams p) {
  constexpr int kStages = stages_for(D);
  constexpr int kRow = ll_lines_per_row(D);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<AttendSmem<D, kStages>*>(smem_raw);
  const DecodeParams& d = p.d;
  const dev::SymmetricView& v = p.view;
  // Launched as a dependent launch: nothing (the sequence, the inbox, the inputs) is touched before
  // the grid ahead on the stream, maybe this op's previous launch, has finished. No
  // allow_dependent_grid: the next launch's CTAs placed early on the SMs this grid leaves idle
  // slowed its attention (r137: 96/12 b=4 8K +6.6 to +10%, triggered at the start or after
  // attending; without the trigger -1.3%).
  dev::wait_prior_grid();
  const uint64_t ticket = threadIdx.x == 0 ? dev::sequence_enter(p.seq) : 0;
  uint64_t epoch = 0;  // 0: not known yet (epochs start at 1)
  const int64_t sender_lines = p.rows * kRow;
  uint64_t* const trace = p.trace != nullptr && threadIdx.x == 0 ? p.trace + blockIdx.x * kFusedTraceEvents : nullptr;
  const auto mark = [&](int event) {
    if (trace != nullptr) trace[event] = dev::global_timer_ns();
  };
  if (trace != nullptr)
    for (int e = 0; e < kFusedTraceEvents; ++e)
      trace[e] = e == kTraceStart ? dev::global_timer_ns() : e == kTraceSm ? dev::sm_id() : 0;

  // Every thread, once the CTA's partial is ready: the epoch, through post.word (the ring it aliases
  // is idle until the next attend, which every thread reaches after a barrier); ends with a barrier.
  const auto share_epoch = [&] {
    if (threadIdx.x == 0) {
      if (epoch == 0) epoch = dev::sequence_entered(p.seq, ticket, gridDim.x);
      smem.post.word = epoch;
    }
    __syncthreads();
    epoch = smem.post.word;
  };
  // This rank's partial of `rows` rows from query row `row` on, in `part`: send it, then combine
  // as the peers' lines arrive (no barrier between: the push only reads `part`). After
  // share_epoch. False: a wait gave up (the fault record names it); the CTA must stop.
  const auto exchange = [&](const PartialTile<D>& part, int rows, int64_t row) {
    mark(kTraceMerged);
    if (v.world == 1) {  // nothing to exchange; the combine of one partial is a copy
      cta_store_one_rank<T, D>(part, rows, static_cast<T*>(d.out) + row * D);
      mark(kTraceCombined);
      return true;
    }
    uint4* const inbox = p.ll + fused_inbox_span(epoch, p.parity_lines, v.world, p.rows, D).begin;  // this parity
    const uint32_t flag = dev::ll_flag(epoch);
    if (!p.skip_signal) cta_push_partial_ll<D>(part, rows, inbox + v.rank * sender_lines + row * kRow, v, flag);
    mark(kTracePushed);
    if (p.combine_delay_ns != 0) dev::sleep_for_ns(p.combine_delay_ns);
    if (!cta_wait_ll<D>(inbox + row * kRow, sender_lines, rows, v.rank, v.world, flag, p.fault)) return false;
    mark(kTraceArrived);
    if (!cta_combine_ll<T, D>(part, rows, inbox + row * kRow, sender_lines, v.rank, v.world, flag, p.fault,
                              smem.post.scratch, static_cast<T*>(d.out) + row * D))
      return false;
    mark(kTraceCombined);
    return true;
  };
  // Item i of the launch: split `split` of group (b, kvh). Only the persistent schedule, which runs
  // items in waves, starts them in the batch order (params.h); the others run every item at once.
  // b and kvh travel with the item: deriving them again from the group costs a division on every
  // CTA's way to its first load.
  struct Item {
    int group, split, b, kvh;
  };
  const auto item_at = [&](int i) {
    const FusedItem f = fused_item(i, d.num_splits);
    const int pos = f.group / d.kv_heads, kvh = f.group - pos * d.kv_heads;
    const int b = kSchedule == FusedSchedule::persistent ? batch_at(d, pos) : pos;
    return Item{b * d.kv_heads + kvh, f.split, b, kvh};
  };
  const auto attend = [&](const Item& it, const TokenRange& slice, const SplitRange& sr) {
    const int64_t row0 = int64_t(it.group) * d.group;  // = b*q_heads + kvh*group
    cta_attend_chunk<T, D, kStages, kPaged>(d.kv, static_cast<const T*>(d.q) + row0 * D, d.group, it.b, it.kvh,
                                            sr.tile_begin, sr.tile_end, slice, d.scale_log2, smem);
    mark(kTraceAttended);
  };

  if constexpr (kSchedule == FusedSchedule::direct) {  // one item per CTA, every CTA resident
    using Post = typename AttendSmem<D, kStages>::Post;
    static_assert(sizeof(float) * direct_stage_rows(D) * (D + 1) <= offsetof(Post, scratch),
                  "the direct merge's stage must not reach the scratch its merges use");
    __shared__ int counts[kDirectMaxWorld];
    const Item it = item_at(blockIdx.x);
    const TokenRange slice = slice_of(d.kv, it.b);
    const SplitRange sr = split_range(slice, d.num_splits, it.split);
    const int64_t row0 = int64_t(it.group) * d.group;
    const bool attends = it.split < sr.splits;
    if (attends) attend(it, slice, sr);  // into smem.post.tile
    share_epoch();
    const uint32_t flag = dev::ll_flag(epoch);
    const auto line = [&](int sender, int split, int64_t row) {
      return p.ll + direct_line(epoch, p.parity_lines, p.direct_begin, p.direct_sender_lines, p.rows, D, sender, split, row);
    };
    if (attends)  // to every rank, this one last (only to itself under skip_signal)
      cta_push_partial_ll<D>(smem.post.tile, d.group, line(v.rank, it.split, row0), v, flag, true,
                             uint32_t(sr.splits), !p.skip_signal);
    mark(kTracePushed);
    const RowBlock rb = cluster_rows(d.group, d.num_splits, it.split);
    if (rb.begin < rb.end) {
      if (p.combine_delay_ns != 0) dev::sleep_for_ns(p.combine_delay_ns);
      const int rows = rb.end - rb.begin;
      const uint4* const base = line(0, 0, row0 + rb.begin);
      const int64_t split_lines = p.rows * kRow;
      if (cta_wait_direct<D>(base, p.direct_sender_lines, split_lines, rows, v.world, flag, p.fault, counts)) {
        mark(kTraceArrived);  // the wait's barriers also end the push's reads of the tile the stage overwrites
        cta_merge_direct<T, D>(base, p.direct_sender_lines, split_lines, rows, v.world, counts, flag, p.fault,
                               smem.post.scratch, DirectStage<D>(smem_raw, v.world * rows),
                               static_cast<T*>(d.out) + (row0 + rb.begin) * D);
        mark(kTraceCombined);
      }
    }
  } else if constexpr (kSchedule == FusedSchedule::clustered) {  // one item per CTA; the cluster holds the group's splits
    auto& cluster_inbox = *reinterpret_cast<ClusterInbox<D>*>(smem_raw + sizeof(AttendSmem<D, kStages>));
    const Item it = item_at(blockIdx.x);
    const TokenRange slice = slice_of(d.kv, it.b);
    const SplitRange sr = split_range(slice, d.num_splits, it.split);
    const RowBlock rb = cluster_rows(d.group, d.num_splits, it.split);
    const int per = cluster_rows_per_cta(d.group, d.num_splits);
    const int own_rows = rb.end - rb.begin;
    if (threadIdx.x == 0) cluster_inbox_expect(cluster_inbox, own_rows, sr.splits);  // cluster_merge.h's protocol
    cluster_arrive_relaxed();
    const bool attends = it.split < sr.splits;
    if (attends) attend(it, slice, sr);  // into smem.post.tile
    cluster_wait();  // every CTA of the cluster runs, its inbox barrier initialised
    if (attends) cta_scatter_rows<D>(smem.post.tile, d.group, per, it.split, cluster_inbox);
    // This CTA's rows from every split are in (or the wait gave up: reported, nothing merged).
    const bool in = own_rows == 0 || cluster_inbox_wait(cluster_inbox, p.fault);
    cluster_arrive_relaxed();  // phase 2: waited for before this CTA exits
    mark(kTraceSynced);
    share_epoch();
    if (own_rows > 0 && in) {
      cta_merge_inbox_rows<D>(cluster_inbox, sr.splits, per, own_rows, smem.post.scratch, smem.post.tile);
      exchange(smem.post.tile, own_rows, int64_t(it.group) * d.group + rb.begin);
    }
    cluster_wait();  // every CTA's rows are in: no store into an inbox is still in flight
  } else {  // CTA c: item c, then items grid.. by ticket (dev::work_take; fused_schedule.h)
    PartialTile<D>& tile = smem.post.tile;
    __shared__ uint32_t next_item;
    const uint32_t grid = gridDim.x, later = uint32_t(p.items) - grid;  // items past the first wave
    uint32_t held = blockIdx.x;  // thread 0's: the item after the current one
    for (;;) {
      __syncthreads();  // the previous item's reads of smem.post and next_item end
      if (threadIdx.x == 0) next_item = held;
      __syncthreads();
      const uint32_t item = next_item;
      if (item >= grid + later) break;
      // The next ticket, its round trip behind this item (the first item needs none).
      if (threadIdx.x == 0) held = grid + dev::work_take(p.work, later, grid);
      const Item it = item_at(int(item));
      const TokenRange slice = slice_of(d.kv, it.b);
      const SplitRange sr = split_range(slice, d.num_splits, it.split);
      if (it.split >= sr.splits) continue;  // beyond this sequence's splits: no work, not counted

      const int group = d.group;
      attend(it, slice, sr);
      if (sr.splits > 1) {  // the last split of the group to finish merges them (decode_kernel.h)
        const int64_t part0 = int64_t(it.group) * d.num_splits;
        cta_store_tile<D>(tile, group, d.ws_o + (part0 + it.split) * group * D, d.ws_lse + (part0 + it.split) * group);
        if (!cta_arrive_last(d.ws_count + it.group, sr.splits)) continue;
        mark(kTraceSynced);  // every split's partial is in
        cta_combine_partials<D>(d.ws_o + part0 * group * D, int64_t(group) * D, d.ws_lse + part0 * group, group,
                                sr.splits, group, smem.post.scratch, tile);
      }
      // The group's partial is in `tile` (both paths end with a CTA barrier).
      share_epoch();
      // A wait gave up: the team's failure contract ends the job (team.h), so the CTA stops here,
      // leaving the tickets and the split counters as they are.
      if (!exchange(tile, group, int64_t(it.group) * group)) break;
    }
  }
  // A CTA that sent nothing still counts as entered (it may be the last one in).
  if (threadIdx.x == 0 && epoch == 0) dev::sequence_entered(p.seq, ticket, gridDim.x);
  mark(kTraceEnd);
}

}  // namespace taxfree::attention
