#include "matrix_check.cuh"

#include "bench_util.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "taxfree/runtime/error.h"

namespace taxfree::bench {

namespace {

template <class T>
__device__ inline T from_float(float f) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16(f);
  else return __float2half(f);
}
template <class T>
__device__ inline float to_float(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return __half2float(v);
}

__device__ inline bool within(float x, float ref, Tolerance t) {
  return isfinite(x) && fabsf(x - ref) <= t.atol + t.rtol * fabsf(ref);
}

template <class T>
__global__ void fill_kernel(T* p, int64_t rows, int64_t cols, int64_t ld, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    p[(i / cols) * ld + i % cols] = from_float<T>(float(splitmix64(seed ^ uint64_t(i)) >> 40) * (2.0f / 16777216.0f) - 1.0f);
}

template <class T>
__global__ void outside_kernel(const T* x, int64_t ldx, const T* ref, int64_t ldr, int64_t rows, int64_t cols,
                               Tolerance tol, unsigned long long* bad) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    local += !within(to_float(x[r * ldx + c]), to_float(ref[r * ldr + c]), tol);
  }
  if (local) atomicAdd(bad, local);
}

// One warp per sample.
template <class T>
__global__ void sampled_kernel(const T* a, int64_t lda, const T* b, int64_t ldb, bool b_nk, const T* c, int64_t ldc,
                               int64_t m, int64_t n, int64_t k, int samples, uint64_t seed, Tolerance tol,
                               unsigned long long* bad) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= samples) return;
  int64_t i = (warp & 1) ? m - 1 : 0, j = (warp & 2) ? n - 1 : 0;
  if (warp >= 4) {
    const uint64_t h = splitmix64(seed + uint64_t(warp));
    i = int64_t(h % uint64_t(m));
    j = int64_t((h >> 32) % uint64_t(n));
  }
  float sum = 0;
  for (int64_t kk = lane; kk < k; kk += 32)
    sum += to_float(a[i * lda + kk]) * to_float(b_nk ? b[j * ldb + kk] : b[kk * ldb + j]);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0 && !within(to_float(c[i * ldc + j]), sum, tol)) atomicAdd(bad, 1ull);
}

__global__ void diff_kernel(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, int64_t rows, int64_t cols,
                            unsigned long long* bad) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    local += a[r * lda + c] != b[r * ldb + c];
  }
  if (local) atomicAdd(bad, local);
}

unsigned grid_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 4096)); }

// A zeroed device counter; finish() reads it after the stream's kernels and frees it.
struct Counter {
  unsigned long long* d = nullptr;
  explicit Counter(cudaStream_t s) {
    TF_CUDA(cudaMalloc(&d, sizeof *d));
    TF_CUDA(cudaMemsetAsync(d, 0, sizeof *d, s));
  }
  ~Counter() { cudaFree(d); }
  int64_t finish(cudaStream_t s) {
    unsigned long long h = 0;
    TF_CUDA(cudaGetLastError());
    TF_CUDA(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
    TF_CUDA(cudaStreamSynchronize(s));
    return int64_t(h);
  }
};

}  // namespace

void fill_uniform(void* p, int64_t rows, int64_t cols, int64_t ld, uint64_t seed, gemm::DType t, cudaStream_t s) {
  if (rows * cols == 0) return;
  if (t == gemm::DType::bf16)
    fill_kernel<<<grid_for(rows * cols), 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), rows, cols, ld, seed);
  else
    fill_kernel<<<grid_for(rows * cols), 256, 0, s>>>(static_cast<__half*>(p), rows, cols, ld, seed);
  TF_CUDA(cudaGetLastError());
}

Tolerance product_tolerance(int64_t k, gemm::DType t) {
  const float rtol = t == gemm::DType::bf16 ? 1.0f / 64 : 1.0f / 512;
  return {rtol, rtol * 0.05f * std::sqrt(float(k) / 9.0f)};
}

int64_t count_outside(const void* x, int64_t ldx, const void* ref, int64_t ldr, int64_t rows, int64_t cols,
                      Tolerance tol, gemm::DType t, cudaStream_t s) {
  Counter bad(s);
  if (t == gemm::DType::bf16)
    outside_kernel<<<grid_for(rows * cols), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(x), ldx,
                                                        static_cast<const __nv_bfloat16*>(ref), ldr, rows, cols, tol,
                                                        bad.d);
  else
    outside_kernel<<<grid_for(rows * cols), 256, 0, s>>>(static_cast<const __half*>(x), ldx,
                                                        static_cast<const __half*>(ref), ldr, rows, cols, tol, bad.d);
  return bad.finish(s);
}

int64_t count_sampled_wrong(const gemm::GemmArgs& g, int samples, uint64_t seed, Tolerance tol, cudaStream_t s) {
  Counter bad(s);
  const unsigned blocks = unsigned((samples * 32 + 255) / 256);
  const bool nk = g.b_layout == gemm::BLayout::nk;
  if (g.dtype == gemm::DType::bf16)
    sampled_kernel<<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(g.a), g.lda,
                                          static_cast<const __nv_bfloat16*>(g.b), g.ldb, nk,
                                          static_cast<const __nv_bfloat16*>(g.c), g.ldc, g.m, g.n, g.k, samples, seed,
                                          tol, bad.d);
  else
    sampled_kernel<<<blocks, 256, 0, s>>>(static_cast<const __half*>(g.a), g.lda, static_cast<const __half*>(g.b),
                                          g.ldb, nk, static_cast<const __half*>(g.c), g.ldc, g.m, g.n, g.k, samples,
                                          seed, tol, bad.d);
  return bad.finish(s);
}

int64_t count_diff_2d(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t rows, int64_t cols,
                      cudaStream_t s) {
  Counter bad(s);
  diff_kernel<<<grid_for(rows * cols), 256, 0, s>>>(static_cast<const uint16_t*>(a), lda,
                                                    static_cast<const uint16_t*>(b), ldb, rows, cols, bad.d);
  return bad.finish(s);
}

}  // namespace taxfree::bench
