// all_gather: every rank contributes `bytes` and receives every rank's contribution, rank r's at
// recv + r * bytes.
//
// Variants (one interface, AllGather::launch):
//  - nccl:      ncclAllGather (BSP baseline). With buffers from the symmetric heap NCCL takes its
//               symmetric-memory kernels; with plain buffers its regular ones.
//  - push:      one kernel per rank, no host work between launches, graph-capturable. Two
//               protocols, chosen by size:
//               * low-latency (bytes <= config.ll_max_bytes): the shard goes to every peer as LL
//                 lines (data and epoch in one 16-byte store, ll_line.cuh) into a staging buffer
//                 that alternates by epoch parity; each receiver copies its lines into `recv`. One
//                 NVLink trip, no handshake, twice the bytes.
//               * direct: each block waits until the peer's `recv` is free for this launch (the
//                 peer has started it), stores its chunks of the local shard straight into the
//                 peer's `recv` and raises a per-(sender, block) epoch flag; the kernel ends when
//                 every incoming chunk has arrived.
//               Both kernels' block b waits for block b of every peer, so a grid never has more
//               blocks than are resident at once (all_gather_push_resident_blocks: one per SM at
//               512 threads); larger shards loop over their chunks or lines. A grid of several
//               waves would rely on every GPU dispatching blocks in index order.
//
// Contract: `recv` lies in the team's symmetric heap (push: required; nccl: either). `send` is
// device memory of this rank; `send == recv + rank * bytes` (in place) is allowed, other overlaps
// are not. Both 16-byte aligned, `bytes` a multiple of 16 and > 0. Every rank calls with the same
// `bytes` and variant, in the same order (collective; checked across ranks only under
// TeamOptions::check_launches, otherwise a mismatch is undefined). On return, work is enqueued on `stream`;
// when it completes, `recv` holds all shards on this rank. A peer that never arrives ends the
// kernel at the team's deadline with a diagnostic (Team::sync reports it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/runtime/rank_share.h"

namespace taxfree {

class Team;

enum class AllGatherVariant { nccl, push };
AllGatherVariant parse_all_gather_variant(const std::string& name);  // throws InvalidArgument
const char* variant_name(AllGatherVariant v);

struct AllGatherConfig {
  int threads = 512;                  // per block
  int max_blocks = 0;                 // 0: the blocks resident at once; never more (< 0: InvalidArgument)
  // push: low-latency protocol up to this many bytes per rank (0: never). Up to 1 MiB its one
  // NVLink trip beats the direct protocol's handshake despite twice the bytes (measured, r3).
  uint64_t ll_max_bytes = 1 << 20;
};

// Kernel arguments of the push variant (plain data, passed by value).
struct AllGatherPushArgs {
  dev::SymmetricView view;
  const char* send;
  char* recv;               // heap
  uint64_t bytes;           // per rank
  uint64_t chunk;           // direct: bytes per chunk (multiple of 16), dealt round-robin to blocks
  uint64_t* ready;          // heap, [world]: slot p = epoch at which rank p's recv is free
  uint64_t* arrived;        // heap, [world][kMaxBlocks]: slot [p][b] = epoch of p's block b data
  uint4* ll;                // heap, [2 parities][world senders][ll_max_bytes / 8 lines]
  uint64_t ll_lines;        // lines per (parity, sender) region
  dev::LaunchSequence seq;
  dev::FaultContext fault;
  int skip_signal;          // fault injection: never signal / send lines (tests the timeout path)
};

// The push variant's launch shape for `bytes` per rank (the same on every rank): the low-latency
// protocol up to config.ll_max_bytes, its blocks (at most config.max_blocks, which must be resolved:
// in [1, AllGather::kMaxBlocks]) and the direct protocol's chunk. InvalidArgument for a max_blocks
// or threads outside the limits.
struct AllGatherPushGrid {
  bool low_latency = false;
  int blocks = 1;
  uint64_t chunk = 0;
};
AllGatherPushGrid all_gather_push_grid(const AllGatherConfig& config, uint64_t bytes);

// What the launch check mode (RankShare::check_launch) compares across ranks for a launch: the
// variant, the bytes per rank and, for push, its grid (the protocol, blocks and chunk every rank
// must share). Pure.
std::string describe_all_gather_launch(AllGatherVariant variant, uint64_t bytes, const AllGatherConfig& config);

// Blocks of `threads` threads of both push kernels that `sm_count` SMs hold at once (occupancy):
// the default and the limit of config.max_blocks.
int all_gather_push_resident_blocks(int threads, int sm_count);

// Enqueues the push kernel of grid `g` (config.threads threads per block) with arguments `a`: for
// AllGather::launch, and for callers that own the flags and buffers (tests that simulate ranks on
// one GPU). Every rank's flags start at 0; `a` as AllGatherPushArgs describes. InvalidArgument for
// g.blocks outside [1, AllGather::kMaxBlocks] (a sender's row of `arrived`) or threads not a
// multiple of 32 in [32, 512].
void launch_all_gather_push(const AllGatherPushArgs& a, const AllGatherPushGrid& g, int threads, cudaStream_t stream);

class AllGather {
 public:
  static constexpr int kMaxBlocks = 1024;
  static constexpr uint64_t kMaxShardBytes = 1ull << 40;  // per rank, and ll_max_bytes: no product overflows

  // Collective: allocates this op's flags, launch sequence and low-latency staging lines (4 x world
  // x ll_max_bytes: 8 MiB at two ranks by default) in the symmetric heap (returned by the heap's
  // release(mark) after the op is gone). Throws InvalidArgument for threads outside [32, 512] or
  // not a multiple of 32, ll_max_bytes not a multiple of 16 or over 2^40, or a max_blocks above the resident
  // blocks; NotSupported where no push block fits an SM. Blocks: synchronizes the device (the
  // zeroed flags are in memory before the host barrier lets a peer write them) and the barrier.
  explicit AllGather(Team& team, AllGatherConfig config = {});
  // The same on a rank share (rank_share.h; tests simulate ranks on one GPU this way): the grids
  // fit its SMs; the nccl variant throws NotSupported on a share without a communicator.
  AllGather(RankShare share, AllGatherConfig config);

  // Validates, then enqueues. Throws InvalidArgument (naming the bad value: bytes outside [1, 2^40]
  // or not a multiple of 16, buffers, send and recv overlapping each other or the op's flags and
  // staging lines in the heap) before any launch.
  void launch(AllGatherVariant variant, const void* send, void* recv, uint64_t bytes, cudaStream_t stream);

  // Whether push uses the low-latency protocol for `bytes` per rank.
  bool push_uses_ll(uint64_t bytes) const { return all_gather_push_grid(config_, bytes).low_latency; }
  // Fault injection for tests: this rank's push kernels never signal arrival.
  void set_skip_signal(bool skip) { skip_signal_ = skip; }

 private:
  void validate(AllGatherVariant variant, const void* send, const void* recv, uint64_t bytes) const;

  RankShare share_;
  AllGatherConfig config_;
  uint64_t* ready_ = nullptr;
  uint64_t* arrived_ = nullptr;
  uint4* ll_ = nullptr;
  dev::LaunchSequence seq_{};
  bool skip_signal_ = false;
};

}  // namespace taxfree
