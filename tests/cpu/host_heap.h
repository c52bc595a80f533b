// A symmetric heap over host memory, as rank `rank` of `world` sees it (the view's stride is its
// own span): for CPU tests of what ops check and place, which never touch the memory from a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "taxfree/runtime/rank_share.h"
#include "taxfree/runtime/symmetric_heap.h"

namespace taxfree::test {

inline dev::SymmetricView host_view(std::vector<char>& memory, int rank, int world) {
  dev::SymmetricView v;
  v.local_base = memory.data(), v.stride = int64_t(memory.size()), v.size = memory.size(), v.rank = rank,
  v.world = world;
  return v;
}

struct HostHeap {
  std::vector<char> memory;
  SymmetricHeap heap;
  uint32_t abort_flag = 0;  // the fault state an op's share must have; never read on the host
  dev::WaitRecord record{};
  HostHeap(int rank, int world, size_t bytes = 1 << 12) : memory(bytes), heap(host_view(memory, rank, world)) {}

  // This rank's share as an op takes it (check_rank_share accepts it).
  RankShare share(int sm_count) {
    RankShare s;
    s.rank = heap.view().rank, s.world = heap.view().world, s.sm_count = sm_count, s.heap = &heap;
    s.fault.abort = &abort_flag, s.fault.record = &record, s.fault.rank = s.rank;
    return s;
  }
};

}  // namespace taxfree::test
