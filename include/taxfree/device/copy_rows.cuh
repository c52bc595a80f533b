// Copying a block of rows (a sub-matrix) between row-strided buffers with all threads of a block,
// local or into / out of a peer's heap (pass the translated pointer). Device only.
//
// Alignment: dst, src and both row strides 16-byte aligned. A row length that is not a multiple of
// 16 bytes has its tail copied in 2-byte units (16-bit elements). Aliasing: the blocks must not
// overlap. Completion: plain weak stores; publish with a signal (signal.cuh pattern P2).
#pragma once

#include <cstdint>

namespace taxfree::dev {

// Rows [0, rows) of `row_bytes` bytes each; threads tid = 0..nthreads-1 of the block all call.
// Each thread keeps kUnroll 16-byte loads in flight before it stores (NVLink needs many bytes in
// flight); the thread -> (row, column) assignment is fixed, so the loop does no division.
template <int kUnroll = 8>
__device__ __forceinline__ void copy_rows_vec16(char* dst, int64_t dst_ld, const char* src, int64_t src_ld,
                                                int64_t rows, int64_t row_bytes, uint32_t tid, uint32_t nthreads) {
  const int64_t vecs = row_bytes / 16;
  if (vecs >= nthreads) {  // wide rows: the block sweeps one row at a time
    for (int64_t r = 0; r < rows; ++r) {
      const uint4* s = reinterpret_cast<const uint4*>(src + r * src_ld);
      uint4* d = reinterpret_cast<uint4*>(dst + r * dst_ld);
      int64_t v = tid;
      for (; v + (kUnroll - 1) * int64_t(nthreads) < vecs; v += int64_t(nthreads) * kUnroll) {
        uint4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) x[u] = s[v + u * int64_t(nthreads)];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) d[v + u * int64_t(nthreads)] = x[u];
      }
      for (; v < vecs; v += nthreads) d[v] = s[v];
    }
  } else if (vecs > 0) {  // narrow rows: nthreads / vecs rows per pass, kUnroll passes in flight
    const uint32_t per_pass = nthreads / uint32_t(vecs);
    if (tid < per_pass * uint32_t(vecs)) {
      const int64_t r0 = tid / uint32_t(vecs), v = tid % uint32_t(vecs);
      const char* s = src + v * 16;
      char* d = dst + v * 16;
      const int64_t src_step = int64_t(per_pass) * src_ld, dst_step = int64_t(per_pass) * dst_ld;
      for (int64_t r = r0; r < rows; r += int64_t(per_pass) * kUnroll) {
        // Running pointers: one live address per direction, so the registers go to data in flight.
        uint4 x[kUnroll];
        const char* sp = s + r * src_ld;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u, sp += src_step)
          if (r + u * int64_t(per_pass) < rows) x[u] = *reinterpret_cast<const uint4*>(sp);
        char* dp = d + r * dst_ld;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u, dp += dst_step)
          if (r + u * int64_t(per_pass) < rows) *reinterpret_cast<uint4*>(dp) = x[u];
      }
    }
  }
  const int64_t tail = (row_bytes - vecs * 16) / 2;  // 16-bit elements after the last full vector
  for (int64_t x = tid; x < rows * tail; x += nthreads) {
    const int64_t r = x / tail, off = vecs * 16 + (x % tail) * 2;
    *reinterpret_cast<uint16_t*>(dst + r * dst_ld + off) = *reinterpret_cast<const uint16_t*>(src + r * src_ld + off);
  }
}

}  // namespace taxfree::dev
