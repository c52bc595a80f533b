#include "bench_util.cuh"

#include "taxfree/runtime/error.h"

namespace taxfree::bench {

namespace {
// A finite 16-bit float pattern: sign, exponent 0x3F..0x40 region (|x| in [2^-1, 2)), random
// mantissa. The same bits are a finite number in both bf16 and fp16.
__device__ inline uint16_t random16(uint64_t seed, uint64_t stream_id, uint64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(stream_id * 0x100000001B3ull + (i >> 2)));
  const uint16_t r = uint16_t(h >> (16 * (i & 3)));
  return uint16_t((r & 0x80FFu) | 0x3800u);  // fp16: exponent 0b01110 (0.5..1); bf16: ~2^-15..2^-14 scaled
}

__global__ void fill_kernel(uint16_t* d, uint64_t n, uint64_t seed, uint64_t sid) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    d[i] = random16(seed, sid, i);
}
__global__ void poison_kernel(uint16_t* d, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    d[i] = 0xFFFFu;
}
__global__ void mismatch_kernel(const uint16_t* g, uint64_t n, uint64_t seed, uint64_t sid, unsigned long long* bad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    local += g[i] != random16(seed, sid, i);
  if (local) atomicAdd(bad, local);
}
__global__ void diff_kernel(const uint16_t* a, const uint16_t* b, uint64_t n, unsigned long long* bad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(bad, local);
}

unsigned grid_for(uint64_t n) { return unsigned(std::min<uint64_t>((n + 255) / 256, 4096)); }

int64_t finish_count(unsigned long long* d, cudaStream_t s) {
  unsigned long long h = 0;
  TF_CUDA(cudaGetLastError());
  TF_CUDA(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, s));
  TF_CUDA(cudaStreamSynchronize(s));
  TF_CUDA(cudaFree(d));
  return int64_t(h);
}
}  // namespace

void fill_random16(void* dst, uint64_t bytes, uint64_t seed, uint64_t stream_id, cudaStream_t s) {
  const uint64_t n = bytes / 2;
  if (n == 0) return;
  fill_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint16_t*>(dst), n, seed, stream_id);
  TF_CUDA(cudaGetLastError());
}

void poison16(void* dst, uint64_t bytes, cudaStream_t s) {
  const uint64_t n = bytes / 2;
  if (n == 0) return;
  poison_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<uint16_t*>(dst), n);
  TF_CUDA(cudaGetLastError());
}

int64_t count_mismatch16(const void* got, uint64_t bytes, uint64_t seed, uint64_t stream_id, cudaStream_t s) {
  unsigned long long* d = nullptr;
  TF_CUDA(cudaMalloc(&d, sizeof *d));
  TF_CUDA(cudaMemsetAsync(d, 0, sizeof *d, s));
  const uint64_t n = bytes / 2;
  if (n) mismatch_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const uint16_t*>(got), n, seed, stream_id, d);
  return finish_count(d, s);
}

int64_t count_diff16(const void* a, const void* b, uint64_t bytes, cudaStream_t s) {
  unsigned long long* d = nullptr;
  TF_CUDA(cudaMalloc(&d, sizeof *d));
  TF_CUDA(cudaMemsetAsync(d, 0, sizeof *d, s));
  const uint64_t n = bytes / 2;
  if (n) diff_kernel<<<grid_for(n), 256, 0, s>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, d);
  return finish_count(d, s);
}

}  // namespace taxfree::bench
