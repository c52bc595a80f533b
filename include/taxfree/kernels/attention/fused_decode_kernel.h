// fused_decode_kernel — flash_decode across ranks in one kernel per rank: split-KV decode of this
// rank's slices, the partial of every (sequence, KV head) group pushed into every rank's gather
// buffer with a per-(group, sender) epoch flag, and the cross-rank LSE combine of that group done
// by the CTA that pushed it, as soon as the other ranks' flags arrive. Every rank ends with the
// full output; the combine sums the ranks' partials in rank order from identical bits, so the
// output is bitwise identical on every rank.
//
// Grid fused_grid(items, resident slots) (fused_schedule.h: schedule and the no-deadlock
// argument), kThreads threads, decode_smem_bytes<D, kCtasPerSm>() dynamic shared memory.
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * epoch e = dev::sequence_begin(seq), +1 per launch of the op; flags only grow.
//  * Launch e uses gather parity e & 1. A sender at epoch e+2 writes the parity that receivers
//    read at epoch e; it got there only after finishing e+1, which needed every rank's partials of
//    e+1, which each rank pushes only after it finished e (launches of one op are stream-ordered
//    on each rank). So the slot is free without a "buffer free" handshake (the ll_line.cuh
//    argument: every rank receives from every rank at every step).
//  * A receiver still in launch e may see a flag at e+1 (>= e passes): the sender's e+1 data goes
//    to the other parity, and its e data was complete before its launch e ended.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/kernels/attention/attend_chunk.h"
#include "taxfree/kernels/attention/combine.h"
#include "taxfree/kernels/attention/fused_schedule.h"
#include "taxfree/kernels/attention/params.h"

namespace taxfree::attention {

// This rank's partial of group g (rows row0 .. row0+group-1) is in smem.post.tile: push it to every
// rank, wait for every rank's partial of g, combine them and store the output rows. Returns false
// when a wait gave up (deadline or team abort); the caller must then leave the kernel.
template <class T, int D, int kStages>
__device__ bool exchange_and_combine(const FusedDecodeParams& p, float* gather, int g, int64_t row0,
                                     uint64_t epoch, AttendSmem<D, kStages>& smem) {
  const dev::SymmetricView& v = p.view;
  const int group = p.d.group;
  PartialTile<D>& tile = smem.post.tile;
  float* const o_mine = gather + int64_t(v.rank) * p.block + row0 * D;
  float* const lse_mine = gather + int64_t(v.rank) * p.block + p.lse_offset + row0;

  // Push into slot [me] of every rank's buffer: peers first (their wait is the critical path),
  // the own copy last (i == world gives r == rank; peer() of the own rank is the identity).
  for (int i = 1; i <= v.world; ++i) {
    const int r = (v.rank + i) % v.world;
    cta_store_tile<D>(tile, group, v.peer(o_mine, r), v.peer(lse_mine, r));
  }
  // Pattern P2 (signal.cuh): every thread's stores, bar.sync, then thread r's st.release.sys of
  // rank r's flag [g][me]; the release is cumulative over the stores the barrier ordered before it.
  __syncthreads();
  uint64_t* const group_flags = p.flags + int64_t(g) * v.world;  // [sender]
  const int t = threadIdx.x;
  const bool peer_thread = t < v.world && t != v.rank;
  if (peer_thread && !p.skip_signal) dev::signal_set(v.peer(group_flags, t) + v.rank, epoch);

  // Pattern P1/P2 consumer: thread r acquires rank r's flag [g][r] (wait_geq: ld.acquire.sys), and
  // bar.sync extends that to the whole CTA, whose weak loads in cta_combine_partials then see rank
  // r's stores. The own partial needs no flag: this CTA wrote
  // it, and the barrier at the combine's entry orders it.
  bool ok = true;
  if (peer_thread) ok = dev::wait_geq(group_flags + t, epoch, p.fault, dev::WaitSite::decode_partial, t);
  if (__syncthreads_and(ok) == 0) return false;

  cta_combine_partials<D>(gather + row0 * D, p.block, gather + p.lse_offset + row0, p.block, v.world,
                          group, smem.post.scratch, tile);
  cta_store_tile_as<T, D>(tile, group, static_cast<T*>(p.d.out) + row0 * D);
  return true;
}

template <class T, int D, bool kPaged, int kCtasPerSm>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) fused_decode_kernel(const __grid_constant__ FusedDecodeParams p) {
  constexpr int kStages = stages_for(D, kCtasPerSm);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  auto& smem = *reinterpret_cast<AttendSmem<D, kStages>*>(smem_raw);
  const DecodeParams& d = p.d;
  const uint64_t epoch = dev::sequence_begin(p.seq);
  float* const gather = p.gather + int64_t(epoch & 1) * p.view.world * p.block;
  PartialTile<D>& tile = smem.post.tile;

  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
    const FusedItem it = fused_item(item, d.num_splits);
    const int b = it.group / d.kv_heads, kvh = it.group % d.kv_heads;
    const TokenRange slice = slice_of(d.kv, b);
    const SplitRange sr = split_range(slice, d.num_splits, it.split);
    if (it.split >= sr.splits) continue;  // beyond this sequence's splits: no work, not counted

    const int group = d.group;
    const int64_t row0 = int64_t(it.group) * group;  // = b*q_heads + kvh*group
    __syncthreads();  // the previous item's reads of smem.post end before the ring reuses it
    cta_attend_chunk<T, D, kStages, kPaged>(d.kv, static_cast<const T*>(d.q) + row0 * D, group, b, kvh,
                                            sr.tile_begin, sr.tile_end, slice, d.scale_log2, smem);
    if (sr.splits > 1) {  // the last split of the group to finish merges them (decode_kernel.h)
      const int64_t part0 = int64_t(it.group) * d.num_splits;
      cta_store_tile<D>(tile, group, d.ws_o + (part0 + it.split) * group * D,
                        d.ws_lse + (part0 + it.split) * group);
      if (!cta_arrive_last(d.ws_count + it.group, sr.splits)) continue;
      cta_combine_partials<D>(d.ws_o + part0 * group * D, int64_t(group) * D, d.ws_lse + part0 * group,
                              group, sr.splits, group, smem.post.scratch, tile);
    }
    if (!exchange_and_combine<T, D, kStages>(p, gather, it.group, row0, epoch, smem)) break;
  }
  dev::sequence_end(p.seq, epoch);
}

}  // namespace taxfree::attention
