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
// 0..nthreads-1 of the block all call. Four columns per step (a float4 load, an 8-byte store) when
// src, src_ld and dst, dst_ld allow it, else one; as copy_rows_vec16, a fixed thread -> (row,
// column) assignment with kUnroll rows' loads in flight per thread, and no division in the loop.
template <typename T, int kUnroll = 4>
__device__ __forceinline__ void round_rows_f32(char* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                                               int64_t rows, int64_t cols, uint32_t tid, uint32_t nthreads) {
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0 && src_ld % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(dst) % 8 == 0 && dst_ld % 8 == 0;
  const int64_t groups = vec ? cols / 4 : 0;  // 4-column groups per row
  auto put = [](char* d, const float4& x) {
    alignas(8) T y[4] = {T(x.x), T(x.y), T(x.z), T(x.w)};
    *reinterpret_cast<uint2*>(d) = *reinterpret_cast<const uint2*>(y);
  };
  if (groups > nthreads) {  // wide rows: one row at a time
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = tid; g < groups; g += nthreads)
        put(dst + r * dst_ld + g * 8, *reinterpret_cast<const float4*>(src + r * src_ld + g * 4));
  } else if (groups > 0) {  // narrow rows: nthreads / groups rows per pass, kUnroll passes in flight
    const uint32_t per_pass = nthreads / uint32_t(groups);
    if (tid < per_pass * uint32_t(groups)) {
      const int64_t r0 = tid / uint32_t(groups), g = tid % uint32_t(groups);
      for (int64_t r = r0; r < rows; r += int64_t(per_pass) * kUnroll) {
        float4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (r + u * int64_t(per_pass) < rows)
            x[u] = *reinterpret_cast<const float4*>(src + (r + u * int64_t(per_pass)) * src_ld + g * 4);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (r + u * int64_t(per_pass) < rows) put(dst + (r + u * int64_t(per_pass)) * dst_ld + g * 8, x[u]);
      }
    }
  }
  // The columns after the last group (all of them when not vectorized), one per thread and step.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = groups * 4 + tid; c < cols; c += nthreads)
      *reinterpret_cast<T*>(dst + r * dst_ld + c * 2) = T(src[r * src_ld + c]);
}

}  // namespace taxfree::dev
