// The GEMM epilogue, per consumer warpgroup (64 rows of C): the split-K reduction and the write of
// C through the Epilogue policy (sm_90a, device only).
//
// Accumulator fragment of m64nNk16 (fp32, N/2 registers per thread; tid = thread in the
// warpgroup, warp = tid / 32, lane = tid % 32):
//   acc[4 j + 0], acc[4 j + 1]  row 16 warp + lane / 4,      columns 8 j + 2 (lane % 4) + {0, 1}
//   acc[4 j + 2], acc[4 j + 3]  row 16 warp + lane / 4 + 8,  same columns
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "taxfree/kernels/gemm/pipeline.cuh"

namespace taxfree::gemm::device {

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return reinterpret_cast<uint32_t&>(v);
  }
}

// Element i of 8 packed 16-bit values, without a trip through local memory.
template <class T>
__device__ __forceinline__ T element(const uint4& x, int i) {
  const uint32_t w = i < 2 ? x.x : i < 4 ? x.y : i < 6 ? x.z : x.w;
  const auto bits = static_cast<unsigned short>(w >> (16 * (i & 1)));
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __ushort_as_bfloat16(bits);
  else
    return __ushort_as_half(bits);
}

// Split-K workspace: fp32 partial sums of the split tiles, and one arrival counter per (split
// tile, CTA of the cluster, consumer warpgroup). Counters start at zero and are reset by the last
// arrival, so a workspace can be reused by the next launch on the same stream without a memset.
// Partials are stored in fragment order ([j][row half][tid] float2: every warp store is 256
// contiguous bytes) at partials + (((slot * max_parts + part) * kCluster + rank) * kConsumers +
// consumer) * 64 * BN / 2.
struct SplitWorkspace {
  float2* partials = nullptr;
  uint32_t* counters = nullptr;
};

// Parks this part's partial sum of a 64 x BN band and counts the arrival. The last of the
// `splits` (parts of the tile) arrivals replaces acc by the sum of all partials, added in part
// (K) order, so the result does not depend on which part finished last, and returns true; the
// others return false and write nothing. Only the band's first `valid_rows` rows (those < M) are stored and read: for
// decode shapes the traffic is proportional to M, not to 64. `flag` is this warpgroup's word of
// shared memory; the named barrier `bar` is this warpgroup's.
template <int BN>
__device__ __forceinline__ bool reduce_splits(float (&acc)[BN / 2], float2* split0, int64_t split_stride, int split,
                                              int splits, uint32_t* counter, volatile uint32_t* flag, uint32_t bar,
                                              int valid_rows) {
  const int tid = threadIdx.x % 128, r0 = (tid / 32) * 16 + (tid % 32) / 4;
  const bool v0 = r0 < valid_rows, v1 = r0 + 8 < valid_rows;
  float2* mine = split0 + split * split_stride;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    if (v0) store_partial(mine + (2 * j) * 128 + tid, make_float2(acc[4 * j], acc[4 * j + 1]));
    if (v1) store_partial(mine + (2 * j + 1) * 128 + tid, make_float2(acc[4 * j + 2], acc[4 * j + 3]));
  }
  named_barrier_sync(bar, 128);  // every store of the band happens before the release below
  if (tid == 0) {
    const bool last = arrive_counter(counter) == uint32_t(splits - 1);
    if (last) reset_counter(counter);  // all `splits` arrivals are in: nobody else touches it this launch
    *flag = last;
  }
  named_barrier_sync(bar, 128);  // the acquire above happens before every load below
  if (!*flag) return false;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    if (v0) {
      const float2 x = load_partial(split0 + (2 * j) * 128 + tid);
      acc[4 * j] = x.x, acc[4 * j + 1] = x.y;
    }
    if (v1) {
      const float2 x = load_partial(split0 + (2 * j + 1) * 128 + tid);
      acc[4 * j + 2] = x.x, acc[4 * j + 3] = x.y;
    }
  }
  for (int s = 1; s < splits; ++s) {
    const float2* part = split0 + s * split_stride;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      if (v0) {
        const float2 x = load_partial(part + (2 * j) * 128 + tid);
        acc[4 * j] += x.x, acc[4 * j + 1] += x.y;
      }
      if (v1) {
        const float2 x = load_partial(part + (2 * j + 1) * 128 + tid);
        acc[4 * j + 2] += x.x, acc[4 * j + 3] += x.y;
      }
    }
  }
  return true;
}

// Writes the kRows x kCols block of C held in `staging` (row r at staging + r * kPitch) to
// (row0, col0), clipped to rows in [row_lo, m) (row_lo: the first row of the tile's own m-block,
// tile_scheduler.cuh: overlapped_row0) and columns < n, through the Epilogue policy: 16-byte
// row-contiguous reads, so global writes are whole rows of the block (full 128 B lines for 64
// columns, 112 B for the 56-column chunks of BN = 224 and 168). The caller has synchronised the
// staging writes (named barrier) and syncs again before reusing `staging`.
template <int kRows, int kCols, uint32_t kPitch, class T, class Epi>
__device__ __forceinline__ void flush_staging(const typename Epi::Params& epi, int64_t row_lo, int m, int n,
                                              const uint8_t* staging, int64_t row0, int64_t col0) {
  constexpr int kVecPerRow = kCols / 8;
  const int tid = threadIdx.x % 128;
  const auto put = [&](int r, int v) {
    const int64_t row = row0 + r, col = col0 + v * 8;
    if (row >= row_lo && row < m && col < n) {
      const uint4 x = *reinterpret_cast<const uint4*>(staging + r * kPitch + v * 16);
      if (col + 8 <= n) {
        Epi::template put8<T>(epi, row, col, x);
      } else {
        for (int i = 0; i < n - col; ++i) Epi::template put1<T>(epi, row, col + i, element<T>(x, i));
      }
    }
  };
  if constexpr (128 % kVecPerRow == 0) {  // whole rows per pass of the warpgroup
    constexpr int kRowsPerPass = 128 / kVecPerRow;
    static_assert(kRows % kRowsPerPass == 0, "whole passes of the warpgroup");
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) put(pass * kRowsPerPass + tid / kVecPerRow, tid % kVecPerRow);
  } else {  // e.g. 7 vectors per row (BN = 224, 168: 56-column chunks): vector x of the block, the last pass partial
    constexpr int kVectors = kRows * kVecPerRow;
#pragma unroll
    for (int pass = 0; pass < (kVectors + 127) / 128; ++pass) {
      const int x = pass * 128 + tid;
      if (x < kVectors) put(x / kVecPerRow, x % kVecPerRow);
    }
  }
}

// Writes the 64 x BN band of C at (row0, col0), clipped to rows in [row_lo, m) and columns < n,
// through the Epilogue policy. Per 64 x kChunkN slice: registers -> staging (rows padded by 16 B so the 8 rows
// a warp writes at once fall into distinct banks) -> flush_staging. `staging` holds 64 x pitch
// bytes; `bar` is the warpgroup's barrier.
template <int BN, int kChunkN, uint32_t kPitch, class T, class Epi>
__device__ __forceinline__ void store_band(const typename Epi::Params& epi, int64_t row_lo, int m, int n,
                                           const float (&acc)[BN / 2], uint8_t* staging, uint32_t bar, int64_t row0,
                                           int64_t col0) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
#pragma unroll
  for (int chunk = 0; chunk < BN / kChunkN; ++chunk) {
#pragma unroll
    for (int j = 0; j < kChunkN / 8; ++j) {
      const int f = (chunk * kChunkN / 8 + j) * 4;
      uint8_t* cell = staging + frag_row * kPitch + (j * 8 + frag_col) * 2;
      *reinterpret_cast<uint32_t*>(cell) = pack2<T>(acc[f], acc[f + 1]);
      *reinterpret_cast<uint32_t*>(cell + 8 * kPitch) = pack2<T>(acc[f + 2], acc[f + 3]);
    }
    named_barrier_sync(bar, 128);
    flush_staging<64, kChunkN, kPitch, T, Epi>(epi, row_lo, m, n, staging, row0, col0 + chunk * kChunkN);
    named_barrier_sync(bar, 128);  // staging is free for the next slice
  }
}

// fp32 epilogues (policies.cuh: kFloatOut): the 64 x BN band at (row0, col0), clipped to rows < m
// and columns < n, 32 columns at a time through `staging` (64 rows x kPitch bytes, kPitch >= 128):
// fragments -> staging, then each row leaves as 8 x 16-byte vectors (a whole 128-byte line, which
// remote NVLink stores need to run near their rate: 8-byte stores straight from the fragments
// moved a 15 MB partial at well under half of it), then Epi::band_done by one thread once every
// thread's puts are ordered before it (the named barrier `bar`).
template <int BN, uint32_t kPitch, class Epi>
__device__ __forceinline__ void store_band_f32(const typename Epi::Params& epi, int m, int n, const float (&acc)[BN / 2],
                                               uint8_t* staging, uint32_t bar, int64_t row0, int64_t col0) {
  constexpr int kCols = 32;  // fp32 columns per pass: 128 bytes of a row
  static_assert(BN % kCols == 0 && kPitch >= kCols * 4, "a staged row holds 32 floats");
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
  const uint64_t ctx = Epi::band_begin(epi);
#pragma unroll
  for (int chunk = 0; chunk < BN / kCols; ++chunk) {
#pragma unroll
    for (int jj = 0; jj < kCols / 8; ++jj) {
      const int f = (chunk * kCols / 8 + jj) * 4;
      uint8_t* cell = staging + frag_row * kPitch + (jj * 8 + frag_col) * 4;
      *reinterpret_cast<float2*>(cell) = make_float2(acc[f], acc[f + 1]);
      *reinterpret_cast<float2*>(cell + 8 * kPitch) = make_float2(acc[f + 2], acc[f + 3]);
    }
    named_barrier_sync(bar, 128);
#pragma unroll
    for (int pass = 0; pass < 64 / 16; ++pass) {  // 16 rows x 8 vectors per pass
      const int r = pass * 16 + tid / 8, v = tid % 8;
      const int64_t row = row0 + r, col = col0 + chunk * kCols + v * 4;
      if (row < m && col < n) {
        const float4 x = *reinterpret_cast<const float4*>(staging + r * kPitch + v * 16);
        Epi::put4(epi, ctx, row, col, x, n - col < 4 ? int(n - col) : 4);
      }
    }
    named_barrier_sync(bar, 128);  // staging is free for the next chunk; after the last, every put is done
  }
  if (tid == 0) Epi::band_done(epi, ctx, row0, col0);
}

// Swap-AB: the accumulator is a 64 x BM band of C^T (fragment rows = 64 columns of C from col0,
// fragment columns = BM rows of C from row0). It is transposed through staging (BM rows of C x 64
// columns, pitch kPitch) so that C is still written in row-contiguous 16-byte vectors. Single
// 16-bit stores: the two values a thread holds per column pair sit in different rows of C. Lanes
// with equal lane % 4 write adjacent halves of one word, the four lane % 4 groups land 2 rows
// (2 * kPitch = 72 words: +8 banks) apart, so a warp's stores hit 16 distinct banks.
template <int BM, uint32_t kPitch, class T, class Epi>
__device__ __forceinline__ void store_band_transposed(const typename Epi::Params& epi, int64_t row_lo, int m, int n,
                                                      const float (&acc)[BM / 2], uint8_t* staging, uint32_t bar,
                                                      int64_t row0, int64_t col0) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int frag_row = warp * 16 + lane / 4, frag_col = 2 * (lane % 4);
  auto* cells = reinterpret_cast<T*>(staging);
  constexpr int kPitchElems = int(kPitch / 2);
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const int c = j * 8 + frag_col;  // row of C (within the band)
    cells[c * kPitchElems + frag_row] = T(acc[4 * j]);
    cells[(c + 1) * kPitchElems + frag_row] = T(acc[4 * j + 1]);
    cells[c * kPitchElems + frag_row + 8] = T(acc[4 * j + 2]);
    cells[(c + 1) * kPitchElems + frag_row + 8] = T(acc[4 * j + 3]);
  }
  named_barrier_sync(bar, 128);
  flush_staging<BM, 64, kPitch, T, Epi>(epi, row_lo, m, n, staging, row0, col0);
  named_barrier_sync(bar, 128);  // staging is free for the next band
}

}  // namespace taxfree::gemm::device
