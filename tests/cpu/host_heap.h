// A symmetric heap over host memory, as rank `rank` of `world` sees it (the view's stride is its
// own span): for CPU tests of what ops check and place, which never touch the memory from a GPU.
#pragma once

#include <cstdint>
#include <vector>

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
  HostHeap(int rank, int world, size_t bytes = 1 << 12) : memory(bytes), heap(host_view(memory, rank, world)) {}
};

}  // namespace taxfree::test
