// Device helpers of ksplit's fp32 partial sums (the exchange kernel, the band sum): eight
// consecutive columns at a time, read as two float4 and written as one 16-byte vector of T.
#pragma once

#include <cstdint>

#include "taxfree/kernels/gemm/epilogue.cuh"  // pack2, element

namespace taxfree::agmm {

// lo/hi = the 8 floats at p (first) or lo/hi + them; p 16-byte aligned. Plain loads, not the
// read-only path: peers may have written them during the kernel.
__device__ __forceinline__ void add_partial8(float4& lo, float4& hi, const float* p, bool first) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  if (first) {
    lo = a, hi = b;
    return;
  }
  lo.x += a.x, lo.y += a.y, lo.z += a.z, lo.w += a.w;
  hi.x += b.x, hi.y += b.y, hi.z += b.z, hi.w += b.w;
}

// The 8 sums rounded to T once, as one 16-byte vector.
template <class T>
__device__ __forceinline__ uint4 round8(const float4& lo, const float4& hi) {
  return {gemm::device::pack2<T>(lo.x, lo.y), gemm::device::pack2<T>(lo.z, lo.w), gemm::device::pack2<T>(hi.x, hi.y),
          gemm::device::pack2<T>(hi.z, hi.w)};
}

// Stores the first min(8, cols_left) elements of v at dst: one 16-byte store when all 8 fit (dst
// 16-byte aligned there: C's row stride is a multiple of 8 elements).
template <class T>
__device__ __forceinline__ void store8(T* dst, const uint4& v, int64_t cols_left) {
  if (cols_left >= 8) *reinterpret_cast<uint4*>(dst) = v;
  else
    for (int i = 0; i < int(cols_left); ++i) dst[i] = gemm::device::element<T>(v, i);
}

}  // namespace taxfree::agmm
