// The symmetric heap: one NCCL symmetric window per rank, carved by a bump allocator.
//
// Backend: ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC). NCCL maps every rank's
// window into one flat address range (rank r at base + r * stride), which is exactly the
// SymmetricView the device uses. Pointers handed out by allocate() are in that flat range.
//
// Contract:
//  - allocate()/release() are collective and ordered: every rank makes the same calls with the same
//    sizes in the same order (like NCCL's own collectives). With check mode on (TAXFREE_CHECK_HEAP=1
//    or TeamOptions::check_heap) each call is compared across ranks and a mismatch is an
//    InvalidUsage error naming the call, rank and sizes. Without it, a mismatch is undefined.
//  - Exhaustion is an OutOfMemory error naming the requested and free bytes; nothing is allocated.
//  - Memory is not initialised (allocate_sequence excepted).
//  - release() hands the memory to the next allocate(): work still in flight on it (an op's
//    kernels, flags a peer may still write) must have finished on every rank first.
//  - Blocks: window registration (construction) waits for all ranks; with check mode on, each
//    allocate()/release() waits up to 60 s for every rank's same call (then Timeout; a differing
//    call: InvalidUsage).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/runtime/byte_range.h"

namespace taxfree {

class CoordinatorClient;

class SymmetricHeap {
 public:
  SymmetricHeap(ncclComm_t comm, CoordinatorClient& coord, int rank, int world, uint64_t bytes, bool check);
  // A heap over memory the caller owns and keeps alive: `view` (its rank's span, the peers'
  // view.stride apart). Ranks simulated in one process on one GPU (tests/gpu/simulated_ranks.h):
  // no NCCL window (nccl_address throws NotSupported), no cross-rank check of the calls.
  explicit SymmetricHeap(const dev::SymmetricView& view);
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  // `bytes` > 0; `align` a power of two >= 16. Returns this rank's copy (flat address).
  void* allocate(uint64_t bytes, uint64_t align = 256, const std::string& tag = "");
  template <class T>
  T* allocate_array(uint64_t n, const std::string& tag = "", uint64_t align = 256) {
    return static_cast<T*>(allocate(array_bytes(n, sizeof(T), tag), align, tag));
  }
  // A fresh launch counter (launch_sequence.cuh) of this rank: an allocation of its own 128-byte
  // line (no other data shares the line its atomics hit), both words zero. Returns after the zeroes
  // are in memory, so any later launch on any stream sees them. Collective like allocate(); goes
  // back with release() like any allocation, so ops built and dropped any number of times leave no
  // counters behind.
  dev::LaunchSequence allocate_sequence(const std::string& tag);
  static constexpr uint64_t kSequenceBytes = 128;  // allocate_sequence's allocation: one line
  // From `first` to the end of sequence `last`'s line: an op's part of the heap where its
  // constructor allocates `first` first and `last` last (what its launches check arguments against).
  static ByteRange span_through(const void* first, const dev::LaunchSequence& last) {
    const auto* begin = static_cast<const char*>(first);
    return byte_range(begin, reinterpret_cast<const char*>(last.counter) + kSequenceBytes - begin);
  }
  // Stack discipline: release(mark()) frees everything allocated after mark() was taken. A mark
  // above used() or inside a live allocation (not one mark() returned since) is InvalidArgument,
  // naming the allocation: memory handed out again while still in use would alias it.
  uint64_t mark() const { return used_; }
  void release(uint64_t mark);

  uint64_t capacity() const { return view_.size; }
  uint64_t used() const { return used_; }
  uint64_t available() const { return view_.size - used_; }
  const dev::SymmetricView& view() const { return view_; }
  bool contains(const void* p, uint64_t bytes) const { return view_.contains(p, bytes); }

  // The live allocation holding byte `offset` of the heap, for diagnostics (a wait that gave up
  // names its flag by offset): "'tag' + N B of a B-byte allocation"; empty outside every one.
  std::string describe_offset(uint64_t offset) const;

  // The same memory at the address NCCL registered as a window, for passing heap buffers to NCCL
  // collectives so they take their symmetric-memory path.
  void* nccl_address(const void* flat) const;

 private:
  // n * elem bytes; InvalidArgument naming `tag` where the product does not fit 64 bits.
  static uint64_t array_bytes(uint64_t n, uint64_t elem, const std::string& tag);
  void check_collective(const std::string& what);

  ncclComm_t comm_ = nullptr;
  CoordinatorClient* coord_ = nullptr;  // nullptr: over caller-owned memory (no check)
  bool check_;
  void* registered_ = nullptr;  // ncclMemAlloc'd pointer, registered as the window
  ncclWindow_t window_ = nullptr;
  dev::SymmetricView view_{};
  uint64_t used_ = 0;
  uint64_t calls_ = 0;
  std::string check_key_;  // this heap's coordinator keys (heaps are built collectively: next_key)
  struct Allocation {
    uint64_t offset, bytes;
    std::string tag;
  };
  std::vector<Allocation> allocations_;  // live ones, in offset order (the heap is a stack)
};

// Bump-allocator arithmetic, separate so it can be tested without a GPU: the aligned offset for a
// request at `used`, or throws OutOfMemory naming the request, the free bytes and `tag`.
uint64_t heap_place(uint64_t used, uint64_t capacity, uint64_t bytes, uint64_t align, const std::string& tag);

}  // namespace taxfree
