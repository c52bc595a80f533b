// The device's view of the symmetric heap: rank, world, and peer translation in one add.
//
// Every rank's heap is mapped into this process at `local_base + (peer - rank) * stride` (NCCL's
// flat LSA layout for symmetric windows). Allocation is collective and ordered, so an object at
// offset X in this rank's heap is at offset X in every peer's heap; `peer(p, r)` returns the
// address of rank r's copy of the object p points to. Loads and stores through that address go
// over NVLink. The view is a POD: pass it to kernels by value.
#pragma once

#include <cstdint>

#include "taxfree/device/config.cuh"

namespace taxfree::dev {

struct SymmetricView {
  char* local_base = nullptr;  // this rank's heap
  int64_t stride = 0;          // bytes from one rank's heap to the next in this address space
  uint64_t size = 0;           // usable heap bytes per rank
  int rank = 0;
  int world = 1;

  // `local` must point into this rank's heap; the result points into `peer`'s heap.
  template <class T>
  TF_HOST_DEVICE T* peer(T* local, int peer_rank) const {
    return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(local) +
                                static_cast<int64_t>(peer_rank - rank) * stride);
  }
  TF_HOST_DEVICE bool contains(const void* p, uint64_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(local_base);
    return a >= b && bytes <= size && a - b <= size - bytes;
  }
  TF_HOST_DEVICE uint64_t offset_of(const void* p) const {
    return reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(local_base);
  }
};

}  // namespace taxfree::dev
