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
// on the peer). Used with dst/src already translated for a peer.
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

__device__ __forceinline__ void bulk_load(uint32_t smem, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, uint32_t smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem), "r"(bytes)
               : "memory");
}

// Shared-memory staging of the bulk copies below: `stages` buffers of `chunk` bytes at `smem`
// (16-byte aligned) and `stages` mbarriers, initialised with count 1 and fenced (mbar_init,
// fence_mbar_init) by the issuing thread or before a barrier; `phase` holds their next parity
// bits, so consecutive copies can reuse them.
struct BulkStaging {
  char* smem;
  uint32_t chunk, stages;
  uint64_t* bars;
  uint32_t phase;
};
// By the one issuing thread, before its first copy.
__device__ __forceinline__ BulkStaging make_bulk_staging(char* smem, uint32_t chunk, uint32_t stages, uint64_t* bars) {
  for (uint32_t i = 0; i < stages; ++i) mbar_init(smem_addr(&bars[i]), 1);
  fence_mbar_init();
  return {smem, chunk, stages, bars, 0};
}

// The pipeline behind bulk_copy and bulk_copy_rows: n chunks, chunk i of c.bytes(i) <= st.chunk
// bytes, loaded into a stage by c.load(i, smem address, mbarrier address) (cp.async.bulk loads
// that complete c.bytes(i) on the mbarrier) and stored from it by c.store(i, smem address)
// (cp.async.bulk stores, one bulk group per chunk). Returns after every store has fully completed
// (wait_group 0) and been fenced for publication (signal.cuh P3). kReport: mbar_wait's (a copy
// inlined into a wgmma kernel passes false: no printf call, mbarrier.cuh). Chunks are functors
// with __forceinline__ members rather than lambdas, so nothing is left as a call.
template <class Chunks>
__device__ __forceinline__ void bulk_load_chunk(const Chunks& c, uint64_t i, BulkStaging& st) {
  const uint32_t s = uint32_t(i % st.stages);
  mbar_arrive_expect_tx(smem_addr(&st.bars[s]), c.bytes(i));
  c.load(i, smem_addr(st.smem + size_t(s) * st.chunk), smem_addr(&st.bars[s]));
}
template <bool kReport, class Chunks>
__device__ __forceinline__ void bulk_pipeline(uint64_t n, const Chunks& c, BulkStaging& st) {
  for (uint64_t i = 0; i < n && i < st.stages; ++i) bulk_load_chunk(c, i, st);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t s = uint32_t(i % st.stages);
    mbar_wait<kReport>(smem_addr(&st.bars[s]), (st.phase >> s) & 1u);
    st.phase ^= 1u << s;
    c.store(i, smem_addr(st.smem + size_t(s) * st.chunk));
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (i + st.stages < n) {
      // The stage is refilled only after the store issued from it has read it.
      asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      bulk_load_chunk(c, i + st.stages, st);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  fence_proxy_async_global();
}

// Copy `bytes` (multiple of 16, both addresses 16-byte aligned) from global `src` to global `dst`
// (local or a peer's) through the staging buffers, with cp.async.bulk in both directions. Called
// by one thread; returns after the copy has fully completed and been fenced for publication (P3).
struct BulkBytes {
  char* dst;
  const char* src;
  uint64_t total;
  uint32_t chunk;
  __device__ __forceinline__ uint32_t bytes(uint64_t i) const {
    return uint32_t(total - i * chunk < chunk ? total - i * chunk : chunk);
  }
  __device__ __forceinline__ void load(uint64_t i, uint32_t s, uint32_t bar) const {
    bulk_load(s, src + i * chunk, bytes(i), bar);
  }
  __device__ __forceinline__ void store(uint64_t i, uint32_t s) const { bulk_store(dst + i * chunk, s, bytes(i)); }
};
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint64_t bytes, BulkStaging& st) {
  bulk_pipeline<true>((bytes + st.chunk - 1) / st.chunk,
                BulkBytes{static_cast<char*>(dst), static_cast<const char*>(src), bytes, st.chunk}, st);
}

// The same for `rows` rows of `row_bytes` bytes (a multiple of 16, at most st.chunk) at row
// strides dst_ld and src_ld (multiples of 16): a chunk is the rows that fit in a stage, one bulk
// copy per row each way. kReport as for bulk_pipeline.
struct BulkRows {
  char* dst;
  int64_t dst_ld;
  const char* src;
  int64_t src_ld, rows, per;
  uint32_t row_bytes;
  __device__ __forceinline__ int count(uint64_t i) const {
    return int(rows - int64_t(i) * per < per ? rows - int64_t(i) * per : per);
  }
  __device__ __forceinline__ uint32_t bytes(uint64_t i) const { return uint32_t(count(i)) * row_bytes; }
  __device__ __forceinline__ void load(uint64_t i, uint32_t s, uint32_t bar) const {
    for (int r = 0; r < count(i); ++r)
      bulk_load(s + uint32_t(r) * row_bytes, src + (int64_t(i) * per + r) * src_ld, row_bytes, bar);
  }
  __device__ __forceinline__ void store(uint64_t i, uint32_t s) const {
    for (int r = 0; r < count(i); ++r) bulk_store(dst + (int64_t(i) * per + r) * dst_ld, s + uint32_t(r) * row_bytes, row_bytes);
  }
};
template <bool kReport = true>
__device__ __forceinline__ void bulk_copy_rows(char* dst, int64_t dst_ld, const char* src, int64_t src_ld,
                                               int64_t rows, uint32_t row_bytes, BulkStaging& st) {
  const int64_t per = st.chunk / row_bytes;
  bulk_pipeline<kReport>(uint64_t((rows + per - 1) / per), BulkRows{dst, dst_ld, src, src_ld, rows, per, row_bytes}, st);
}

}  // namespace taxfree::dev
