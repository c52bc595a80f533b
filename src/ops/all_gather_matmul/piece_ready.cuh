// The GEMM's A-ready policy of all_gather_matmul `push` and `fused-ce` (kernels/gemm/policies.cuh,
// "Ready"): before
// the producer's TMA load of A's k-block kb of a tile, wait until every piece of the gathered A
// under the tile's rows and that k-block's columns has landed (its flag >= this launch's epoch),
// each piece once per tile, at the first k-block that reads it.
//
// Epoch without the host (CUDA-graph replay): the policy keeps its own launch sequence. Every
// wait reads e = counter + 1; the producer that finishes the last k-block wait of a tile counts
// the tile, and whoever counts the launch's last tile stores e (and resets the count). Each
// producer's reads precede its own counts, so every read of a launch happens before the store;
// the next launch starts after this GEMM has ended. The push kernel of the same launch counts its
// own sequence, so both arrive at the same e. With seq.finished == nullptr the launch's epoch is
// *seq.counter itself, advanced by an earlier kernel of the same stream (fused-ce's begin kernel),
// and the policy counts nothing.
//
// Relies on the engine calling wait() for every k-block of every tile, in k order rotated by
// first_k_block, from one producer thread per CTA (policies.cuh). If that changes, the count never completes and the
// next launch waits for a stale epoch: a timeout with a diagnostic, never a silent wrong result.
#pragma once

#include <cstdint>

#include "push_pieces.cuh"
#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"  // TileCoord
#include "taxfree/ops/all_gather_matmul_plan.h"

namespace taxfree::agmm {

struct PieceReady {
  struct Params {
    const uint64_t* flags = nullptr;  // this rank's, PieceGrid::flag_index order
    PieceGrid pieces;
    int bm = 128;                     // the GEMM's tile rows
    int k_blocks = 1;                 // ceil(k / 64)
    uint32_t tiles = 0;               // CTA tiles of the GEMM: an M cluster's every CTA counts one
    int present_source = -1;          // a source whose pieces are in place before the launch, or -1
    int start_mask = 0;               // piece_start_mask(pieces): k-blocks that start no piece
    int k_first = 0;                  // first_k_block(pieces, rank), or 0: the k-loop's rotation
    dev::LaunchSequence seq;          // own launch counter (`finished` counts tiles), or finished == nullptr:
                                      // counter holds this launch's epoch (see above)
    dev::FaultContext fault;
    // sm-specialized: the GEMM kernel's first mover_ctas CTAs push this rank's pieces (movers.grid
    // and movers.flags are the grid and flags above); 0: the pieces come from another kernel or the
    // copy engine.
    PushWork movers;
    int mover_ctas = 0;
  };

  // The engine's mover hook (policies.cuh).
  TF_HOST_DEVICE static int movers(const Params& p) { return p.mover_ctas; }
  // A wait's deadline (policies.cuh); after the first gives up, the abort flag it raises ends the rest.
  TF_HOST_DEVICE static uint64_t max_wait_ns(const Params& p) { return p.fault.timeout_ns; }
#ifdef __CUDACC__
  __device__ __forceinline__ static void move(const Params& p, int block, int blocks, const dev::ThreadGroup& t) {
    // 256 threads (a GEMM CTA's consumer warpgroups) x 6 x 16 B = 24 KiB of loads in flight; 8 made
    // ptxas spill the consumers' registers of the 128 x 128 GEMM that shares the kernel.
    push_pieces<6>(p.movers, block, blocks, t);
  }

  __device__ static int first_k_block(const Params& p, gemm::TileCoord) { return p.k_first; }

  __device__ static void wait(const Params& p, gemm::TileCoord tile, int kb) {
    // The epoch is read only where it is needed: most k-blocks start no new piece, and a global
    // load per k-block would slow the producer of small tiles.
    uint64_t epoch = 0;
    auto current = [&] {
      if (epoch == 0) epoch = dev::load<dev::Sem::relaxed, dev::Scope::gpu>(p.seq.counter) + (p.seq.finished ? 1 : 0);
      return epoch;
    };
    // The piece walk costs a few integer divisions in the one producer thread, more than a small
    // tile's k-block takes to compute (measured: the 64 x 64 GEMM ran 4x slower with it on every
    // k-block); most k-blocks start no piece and skip it.
    if ((kb & p.start_mask) == 0) {
      const int64_t r_lo = int64_t(tile.m) * p.bm, c_lo = int64_t(kb) * 64;
      const int64_t r_hi = r_lo + p.bm < p.pieces.m ? r_lo + p.bm : p.pieces.m;
      const int64_t c_hi = c_lo + 64 < p.pieces.k ? c_lo + 64 : p.pieces.k;
      bool waited = false;
      for_each_piece(p.pieces, r_lo, r_hi, c_lo, c_hi, [&](int source, int64_t flag) {
        if (source == p.present_source) return;  // written before the launch (stream order)
        // P4: acquire the piece's flag; a false return (deadline, abort) is recorded for the host,
        // and the GEMM finishes on whatever A holds. 200 ns between polls: up to one producer per
        // SM polling at full rate slowed the movers they wait for 2-7x (PERFORMANCE.md, r71).
        dev::wait_geq<200>(p.flags + flag, current(), p.fault, dev::WaitSite::gemm_a_ready, source);
        waited = true;
      });
      if (waited) dev::fence_proxy_async_global();  // P4: generic-proxy writes -> TMA reads
    }
    // The tile's last k-block in the rotated order.
    if (p.seq.finished && kb == (p.k_first == 0 ? p.k_blocks : p.k_first) - 1 &&
        dev::fetch_add<dev::Sem::acq_rel, dev::Scope::gpu>(p.seq.finished, 1u) == p.tiles - 1) {
      dev::store<dev::Sem::relaxed, dev::Scope::gpu>(p.seq.finished, 0u);
      dev::store<dev::Sem::relaxed, dev::Scope::gpu>(p.seq.counter, current());
    }
  }
#endif
};

}  // namespace taxfree::agmm
