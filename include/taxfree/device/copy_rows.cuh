// Copying a block of rows (a sub-matrix) between row-strided buffers with all threads of a block,
// local or into / out of a peer's heap (pass the translated pointer); and rounding a block of fp32
// sums into 16-bit elements. Device only.
//
// Alignment: copy_rows_vec16 needs dst, src and both row strides 16-byte aligned; a row length that
// is not a multiple of 16 bytes has its tail copied in 2-byte units (16-bit elements).
// round_rows_f32 takes any 4-byte aligned fp32 rows and 2-byte aligned 16-bit rows (vectorized
// where both allow it). Aliasing: the blocks must not overlap. Completion: plain weak stores;
// publish with a signal (signal.cuh pattern P2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// dst[r][c] = T(src[r][c]) (round to nearest even) for rows [0, rows) of `cols` fp32 sums (src row
// stride src_ld floats; dst row stride dst_ld bytes); T is __nv_bfloat16 or __half. Threads tid =
// 0..nthreads-1 of the block all call. Four columns per step, kUnroll steps (float4 loads) in flight
// per thread, when src, src_ld and dst, dst_ld allow 16- and 8-byte accesses; else one column per step.
template <typename T, int kUnroll = 4>
__device__ __forceinline__ void round_rows_f32(char* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                                               int64_t rows, int64_t cols, uint32_t tid, uint32_t nthreads) {
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && src_ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 8 == 0 && dst_ld % 8 == 0;
  const int64_t groups = vec ? cols / 4 : 0, done = groups * 4;  // 4-column groups per row
  const int64_t total = rows * groups;
  for (int64_t i = tid; i < total; i += int64_t(nthreads) * kUnroll) {
    float4 x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = i + u * int64_t(nthreads);
      if (g < total) x[u] = *reinterpret_cast<const float4*>(src + (g / groups) * src_ld + (g % groups) * 4);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = i + u * int64_t(nthreads);
      if (g >= total) continue;
      alignas(8) T y[4] = {T(x[u].x), T(x[u].y), T(x[u].z), T(x[u].w)};
      *reinterpret_cast<uint2*>(dst + (g / groups) * dst_ld + (g % groups) * 8) = *reinterpret_cast<const uint2*>(y);
    }
  }
  const int64_t tail = cols - done;  // columns after the last group (all of them when not vectorized)
  for (int64_t x = tid; x < rows * tail; x += nthreads) {
    const int64_t r = x / tail, c = done + x % tail;
    *reinterpret_cast<T*>(dst + r * dst_ld + c * 2) = T(src[r * src_ld + c]);
  }
}

}  // namespace taxfree::dev
