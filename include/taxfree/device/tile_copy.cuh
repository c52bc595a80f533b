// Moving tiles between this GPU's memory and a peer's: vectorized loads/stores by a group of
// threads, and bulk (cp.async.bulk) copies staged through shared memory.
//
// put = store into a peer's heap (`view.peer(dst, p)`), get = load from it; both are the same
// copy with the peer address on one side. Alignment: dst and src 16-byte aligned. Aliasing: the
// ranges must not overlap. Completion: the stores are ordinary weak stores; publish them with a
// signal (signal.cuh patterns P1/P2 for copy_vec16, P3 for bulk copies).
#pragma once

#include <cstdint>

#include "taxfree/device/mbarrier.cuh"
#include "taxfree/device/scoped_memory.cuh"
#include "taxfree/device/symmetric_view.cuh"

namespace taxfree::dev {

// Copy `bytes` with threads tid = 0..nthreads-1 of a group (all must call). Each thread keeps
// kUnroll 16-byte loads in flight before it stores, which NVLink needs to reach full bandwidth.
// A tail that is not a multiple of 16 bytes is copied bytewise.
template <int kUnroll = 8>
__device__ __forceinline__ void copy_vec16(void* dst, const void* src, uint64_t bytes, uint32_t tid,
                                           uint32_t nthreads) {
  auto* d = static_cast<uint4*>(dst);
  const auto* s = static_cast<const uint4*>(src);
  const uint64_t n = bytes / 16;
  const uint64_t step = uint64_t(nthreads) * kUnroll;
  uint64_t i = tid;
  for (; i + (kUnroll - 1) * uint64_t(nthreads) < n; i += step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * uint64_t(nthreads)];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * uint64_t(nthreads)] = v[u];
  }
  for (; i < n; i += nthreads) d[i] = s[i];
  for (uint64_t b = n * 16 + tid; b < bytes; b += nthreads)
    static_cast<char*>(dst)[b] = static_cast<const char*>(src)[b];
}

// A grid-wide copy split into `chunk`-byte pieces (multiple of 16) dealt round-robin to blocks: this
// block copies pieces `first`, `first + stride`, ... with all its threads. Interleaving keeps the
// pieces in flight at any moment close together, which keeps NVLink stores at full rate on large
// copies (contiguous per-block slices of hundreds of MiB lose ~10% to address-translation misses
// on the peer). dst/src may be local or already translated for a peer.
template <int kUnroll = 8>
__device__ __forceinline__ void block_copy_chunks(void* dst, const void* src, uint64_t bytes, uint64_t chunk,
                                                  uint32_t first, uint32_t stride) {
  for (uint64_t c = first; c * chunk < bytes; c += stride) {
    const uint64_t off = c * chunk;
    copy_vec16<kUnroll>(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                        bytes - off < chunk ? bytes - off : chunk, threadIdx.x, blockDim.x);
  }
}

// Store `bytes` from local `src` into peer `p`'s copy of the heap object at `dst_local`.
template <int kUnroll = 8>
__device__ __forceinline__ void put(const SymmetricView& view, void* dst_local, const void* src, uint64_t bytes,
                                    int p, uint32_t tid, uint32_t nthreads) {
  copy_vec16<kUnroll>(view.peer(dst_local, p), src, bytes, tid, nthreads);
}

// Load `bytes` from peer `p`'s copy of the heap object at `src_local` into local `dst`.
template <int kUnroll = 8>
__device__ __forceinline__ void get(const SymmetricView& view, void* dst, const void* src_local, uint64_t bytes,
                                    int p, uint32_t tid, uint32_t nthreads) {
  copy_vec16<kUnroll>(dst, view.peer(src_local, p), bytes, tid, nthreads);
}

// ---- bulk copies (cp.async.bulk), one issuing thread per block -------------------------------

// One 1-D bulk load (cp.async.bulk, no tensor map) of `bytes` (multiple of 16, both addresses
// 16-byte aligned) from global `src` into shared `dst`, completing its bytes on mbarrier `bar`
// (armed by the caller with mbar_arrive_expect_tx). The bytes land in order, unswizzled.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Copy `bytes` (multiple of 16, both addresses 16-byte aligned) from global `src` to global `dst`
// (local or a peer's) through `stages` shared-memory buffers of `chunk` bytes each, with
// cp.async.bulk in both directions. Called by one thread; `bars` are `stages` mbarriers
// initialised with count 1 and fenced (mbar_init, fence_mbar_init) by the caller;
// `phase` holds their next parity bits and is updated so consecutive calls can reuse them.
// Returns after the copy has fully completed (wait_group 0) and been fenced for publication (P3).
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint64_t bytes, char* smem, uint32_t chunk,
                                          uint32_t stages, uint64_t* bars, uint32_t& phase) {
  const uint64_t nchunks = (bytes + chunk - 1) / chunk;
  auto chunk_bytes = [&](uint64_t i) { return uint32_t(i + 1 < nchunks ? chunk : bytes - i * chunk); };
  auto load_chunk = [&](uint64_t i) {
    const uint32_t s = uint32_t(i % stages);
    mbar_arrive_expect_tx(smem_addr(&bars[s]), chunk_bytes(i));
    bulk_load(smem_addr(smem + size_t(s) * chunk), static_cast<const char*>(src) + i * chunk, chunk_bytes(i),
              smem_addr(&bars[s]));
  };
  for (uint64_t i = 0; i < nchunks && i < stages; ++i) load_chunk(i);
  for (uint64_t i = 0; i < nchunks; ++i) {
    const uint32_t s = uint32_t(i % stages);
    mbar_wait(smem_addr(&bars[s]), (phase >> s) & 1u);
    phase ^= 1u << s;
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                     static_cast<char*>(dst) + i * chunk),
                 "r"(smem_addr(smem + size_t(s) * chunk)), "r"(chunk_bytes(i))
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (i + stages < nchunks) {
      // The stage is refilled only after the store issued from it has read it.
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      load_chunk(i + stages);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  fence_proxy_async_global();
}

}  // namespace taxfree::dev
