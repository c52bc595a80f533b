// Small kernels of all_gather_matmul: the decomposed variant's one-warp flag kernels and the
// gather_dim 1 BSP interleave.
#include <algorithm>

#include "agmm_internal.h"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

__global__ void begin_kernel(uint64_t* epoch, dev::SymmetricView v, uint64_t* ready) {
  __shared__ uint64_t e;
  if (threadIdx.x == 0) {
    e = *epoch + 1;  // the next kernels of this launch read it after this one (stream order)
    *epoch = e;
  }
  __syncthreads();
  // P1 (the flag publishes nothing else): the previous launch, and the caller's use of its
  // gathered A, ended before this kernel started; peers may write into it now.
  for (int p = threadIdx.x; p < v.world; p += blockDim.x)
    if (p != v.rank) dev::signal_set(v.peer(ready, p) + v.rank, e);
}

__global__ void wait_kernel(const uint64_t* flag, const uint64_t* epoch, dev::FaultContext fault, dev::WaitSite site,
                            int peer) {
  // P1 consumer: the kernels after this one on the stream see what the signaller published. A
  // false return is recorded for the host (Team::sync); the stream then runs on.
  if (threadIdx.x == 0) dev::wait_geq(flag, *epoch, fault, site, peer);
}

__global__ void signal_kernel(uint64_t* flag, const uint64_t* epoch) {
  // The copy before this kernel on the stream has completed (stream order) when the release goes
  // out: the copy-engine analogue of pattern P3, as cuStreamWriteValue after a copy.
  if (threadIdx.x == 0) dev::signal_set(flag, *epoch);
}

__global__ void interleave_kernel(const uint4* src, uint4* dst, int64_t dst_ld, int world, int64_t rows,
                                  int64_t cols) {
  const int64_t block = rows * cols, total = block * world;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = i / block, r = (i % block) / cols, c = i % cols;
    dst[r * dst_ld + s * cols + c] = src[i];
  }
}

}  // namespace

void enqueue_begin(uint64_t* epoch, const dev::SymmetricView& view, uint64_t* ready, cudaStream_t s) {
  begin_kernel<<<1, 32, 0, s>>>(epoch, view, ready);
  TF_CUDA(cudaGetLastError());
}

void enqueue_wait(const uint64_t* flag, const uint64_t* epoch, const dev::FaultContext& fault, dev::WaitSite site,
                  int peer, cudaStream_t s) {
  wait_kernel<<<1, 32, 0, s>>>(flag, epoch, fault, site, peer);
  TF_CUDA(cudaGetLastError());
}

void enqueue_signal(uint64_t* flag, const uint64_t* epoch, cudaStream_t s) {
  signal_kernel<<<1, 32, 0, s>>>(flag, epoch);
  TF_CUDA(cudaGetLastError());
}

void enqueue_interleave(const void* src, void* dst, int64_t dst_ld, int world, int64_t rows, int64_t cols,
                        cudaStream_t s) {
  TF_REQUIRE(cols % 8 == 0 && dst_ld % 8 == 0, Status::Internal, "interleave of " << cols << " columns, ld " << dst_ld);
  const int64_t vecs = int64_t(world) * rows * cols / 8;
  const int blocks = int(std::clamp<int64_t>((vecs + 255) / 256, 1, 4096));
  interleave_kernel<<<blocks, 256, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), dst_ld / 8, world,
                                           rows, cols / 8);
  TF_CUDA(cudaGetLastError());
}

void preload_small_kernels() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, begin_kernel));
  TF_CUDA(cudaFuncGetAttributes(&attr, wait_kernel));
  TF_CUDA(cudaFuncGetAttributes(&attr, signal_kernel));
  TF_CUDA(cudaFuncGetAttributes(&attr, interleave_kernel));
}

}  // namespace taxfree::agmm
