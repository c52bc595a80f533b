// Copying a block of rows (a sub-matrix) between row-strided buffers with all threads of a block,
// local or into / out of a peer's heap (pass the translated pointer). Device only.
//
// Alignment: dst, src and both row strides 16-byte aligned. A row length that is not a multiple of
// 16 bytes has its tail copied in 2-byte units (16-bit elements). Aliasing: the blocks must not
// overlap. Completion: plain weak stores; publish with a signal (signal.cuh pattern P2).
#pragma once

#include <cstdint>

#include "taxfree/device/tile_copy.cuh"

namespace taxfree::dev {

// Rows [0, rows) of `row_bytes` bytes each; threads tid = 0..nthreads-1 of the block all call.
// Each thread keeps kUnroll 16-byte loads in flight before it stores (NVLink needs many bytes in
// flight). Rows up to nthreads vectors: the thread -> (row, column) assignment is fixed and the
// loop does no division; wider rows are copied one after another (kUnroll in flight only from
// nthreads x kUnroll vectors per row on).
template <int kUnroll = 8>
__device__ __forceinline__ void copy_rows_vec16(char* dst, int64_t dst_ld, const char* src, int64_t src_ld,
                                                int64_t rows, int64_t row_bytes, uint32_t tid, uint32_t nthreads) {
  const int64_t vecs = row_bytes / 16;
  if (vecs > nthreads) {  // wide rows: one row at a time, the whole block on it
    for (int64_t r = 0; r < rows; ++r)
      copy_vec16<kUnroll>(dst + r * dst_ld, src + r * src_ld, uint64_t(vecs) * 16, tid, nthreads);
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
