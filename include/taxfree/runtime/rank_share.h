// RankShare: what an op object takes from the rank it is built on.
//
// Team::share() gives a GPU's whole share; AllGather and AllGatherMatmul are built on one. Tests
// build one per rank simulated on one GPU (tests/gpu/simulated_ranks.h: a span of one allocation
// as each rank's heap, about 1/W of the SMs, no NCCL), so an op's cross-rank protocols run where
// only one GPU is at hand. An op reads the share once, at construction; the heap, the fault state,
// the coordinator and the functions must outlive it.
#pragma once

#include <nccl.h>

#include <functional>
#include <string>

#include "taxfree/device/fault.cuh"
#include "taxfree/runtime/symmetric_heap.h"

namespace taxfree {

class CoordinatorClient;

struct RankShare {
  int rank = 0;
  int world = 1;
  // SMs this rank's kernels may fill at once. Plans size the grids that wait for peers to it, so
  // the W ranks of one GPU can be resident together. Fewer than the GPU has also means the GPU is
  // shared with grids that wait: cuBLASLt then keeps to clusters of at most 2 CTAs
  // (gemm::Clusters::small): a larger cluster needs that many free SMs in one GPC at once.
  int sm_count = 0;
  // The op's symmetric buffers and launch sequences (allocate_sequence). Allocation is
  // collective: the same calls in the same order on every rank give every buffer the same offset.
  SymmetricHeap* heap = nullptr;
  dev::FaultContext fault{};     // deadline, abort flag and record of every device wait
  ncclComm_t comm = nullptr;     // nullptr: no NCCL; the variants that call it throw NotSupported
  // Every NCCL call of an op runs under a CallDeadline(coordinator, call, nccl_call_limit_s): a
  // collective's first use of an algorithm sets up its connections and blocks the host until the
  // peers make the same call, with no deadline of its own. Null: not bounded (no NCCL); otherwise
  // the limit must be in (0, 1e9] s (check_rank_share).
  CoordinatorClient* coordinator = nullptr;
  double nccl_call_limit_s = 0;
  // A host barrier of every rank; empty: none (one thread builds every simulated rank in turn).
  std::function<void(const std::string&)> host_barrier;
  // The launch check mode (TeamOptions::check_launches): every collective launch passes its
  // description (op, variant, the arguments every rank must agree on; no pointers) before it
  // enqueues anything, and this throws InvalidUsage when another rank's launch of the same number
  // differs (require_same_call). Blocks until every rank has made that launch (deadline: Timeout).
  // Empty: off.
  std::function<void(const std::string&)> check_launch;
};

// Throws InvalidArgument naming `op` unless the share has a heap of the same rank and world, a rank
// in [0, world), at least one SM, fault state of that rank (abort flag, wait record, a timeout > 0),
// and with a coordinator an NCCL call limit in (0, 1e9] s.
void check_rank_share(const RankShare& share, const char* op);

}  // namespace taxfree
