// The push protocol's data movement, shared by all_gather_matmul `push` (its own kernel beside the
// GEMM) and `sm-specialized` (mover CTAs of the GEMM kernel itself): copy every piece of this rank's
// shard into every target's gathered A (this rank's own too unless in place), raising the target's
// flag for (this rank, piece) after each.
//
// Memory order: a block's stores of a piece, a block barrier, then one thread's signal_set
// (st.release.sys) of the piece's flag: pattern P2 of device/signal.cuh; the GEMM's producer
// acquires the flag before its TMA load (P4, piece_ready.cuh). Before its first piece for a peer, a
// block waits (bounded: the team's deadline) until that peer has started this launch, i.e. until the
// peer's use of its previous gathered A is over.
#pragma once

#include <cstdint>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/device/thread_group.cuh"
#include "taxfree/ops/all_gather_matmul_plan.h"

#ifdef __CUDACC__
#include "taxfree/device/copy_rows.cuh"
#include "taxfree/device/signal.cuh"
#endif

namespace taxfree::agmm {

struct PushWork {
  dev::SymmetricView view;
  const char* src = nullptr;   // A_shard
  int64_t src_ld = 0;          // bytes
  char* gathered = nullptr;    // this rank's gathered A (heap; the same offset on every rank)
  int64_t ld = 0;              // bytes
  uint64_t* ready = nullptr;   // heap, [world]: slot p = epoch at which rank p's gathered A is free
  uint64_t* flags = nullptr;   // heap, [PieceGrid::flags()]
  PieceGrid grid;
  bool copy_local = true;      // false: A_shard already is this rank's slot (in place)
  bool skip_signal = false;    // fault injection: raise no piece flag on any peer
  dev::LaunchSequence seq;     // the push side's own launch counter (advances with the GEMM's)
  dev::FaultContext fault;
};

#ifdef __CUDACC__
// Run by every thread of group `t` in each of `blocks` blocks; `block` in [0, blocks) picks work
// items block, block + blocks, ... of push_item(). Ends the push sequence for this block.
template <int kUnroll>
__device__ __forceinline__ void push_pieces(const PushWork& a, int block, int blocks, const dev::ThreadGroup& t) {
  const auto& v = a.view;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  // P1 (the flag publishes nothing else): this rank's gathered A is free from now on.
  if (block == 0)
    for (int p = int(t.tid); p < v.world; p += int(t.count))
      if (p != v.rank) dev::signal_set(v.peer(a.ready, p) + v.rank, epoch);

  const PieceGrid& g = a.grid;
  const int64_t items = push_items(g, a.copy_local);
  uint64_t confirmed = 0;  // bit p: peer p was seen ready (ranks >= 64 are checked every time)
  for (int64_t x = block; x < items; x += blocks) {
    const PushItem item = push_item(g, v.rank, a.copy_local, x);
    const uint64_t bit = item.target < 64 ? 1ull << item.target : 0;
    if (item.target != v.rank && !(confirmed & bit)) {
      bool gave_up = false;
      if (t.tid == 0)
        gave_up = !dev::wait_geq(a.ready + item.target, epoch, a.fault, dev::WaitSite::all_gather_ready, item.target);
      if (t.any(gave_up)) break;  // the waits of the peer's GEMM give up at their deadline too
      confirmed |= bit;
    }
    const Piece pc = g.piece_in_order(item.t);
    char* dst = a.gathered + (g.row0(v.rank) + pc.r0) * a.ld + (g.col0(v.rank) + pc.c0) * 2;
    if (item.target != v.rank) dst = v.peer(dst, item.target);
    dev::copy_rows_vec16<kUnroll>(dst, a.ld, a.src + pc.r0 * a.src_ld + pc.c0 * 2, a.src_ld, pc.rows, pc.cols * 2,
                                  t.tid, t.count);
    t.sync();  // P2: the group's stores, then one release
    if (t.tid == 0 && !(a.skip_signal && item.target != v.rank)) {
      uint64_t* flag = a.flags + g.flag_index(v.rank, pc.i, pc.j);
      dev::signal_set(item.target == v.rank ? flag : v.peer(flag, item.target), epoch);
    }
  }
  t.sync();
  if (t.tid == 0) dev::sequence_arrive(a.seq, epoch, uint32_t(blocks));
}
#endif

}  // namespace taxfree::agmm
