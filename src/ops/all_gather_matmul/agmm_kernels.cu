// Small kernels of all_gather_matmul: the one-warp barrier (decomposed's begin, pull's end) and wait
// kernels, the copy-engine flag writes, and the gather_dim 1 BSP interleave.
#include <algorithm>

#include "agmm_internal.h"
#include "taxfree/device/barrier.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// advance (begin): e = epoch + 1 is stored for the rest of the launch, and after the barrier every
// rank has started launch e: the previous launch, and every use of its gathered A, is over
// everywhere. Otherwise (pull's end) the barrier is at the current epoch. A false return is
// recorded for the host; the launch then runs on.
__global__ void barrier_kernel(uint64_t* epoch, bool advance, dev::SymmetricView v, uint64_t* barrier_slots,
                               dev::FaultContext fault) {
  __shared__ uint64_t e;
  if (threadIdx.x == 0) {
    e = *epoch + (advance ? 1 : 0);  // the next operations of this launch read it after this kernel (stream order)
    if (advance) *epoch = e;
  }
  __syncthreads();
  dev::block_barrier(v, barrier_slots, e, fault);
}

__global__ void wait_kernel(const uint64_t* flag, const uint64_t* epoch, dev::FaultContext fault, dev::WaitSite site,
                            int peer) {
  // P1 consumer: the kernels after this one on the stream see what the signaller published. A
  // false return is recorded for the host (Team::sync); the stream then runs on.
  if (threadIdx.x == 0) dev::wait_geq(flag, *epoch, fault, site, peer);
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

void enqueue_begin(uint64_t* epoch, const dev::SymmetricView& view, uint64_t* barrier_slots,
                   const dev::FaultContext& fault, cudaStream_t s) {
  barrier_kernel<<<1, 32, 0, s>>>(epoch, true, view, barrier_slots, fault);
  TF_CUDA(cudaGetLastError());
}

void enqueue_barrier(const uint64_t* epoch, const dev::SymmetricView& view, uint64_t* barrier_slots,
                     const dev::FaultContext& fault, cudaStream_t s) {
  barrier_kernel<<<1, 32, 0, s>>>(const_cast<uint64_t*>(epoch), false, view, barrier_slots, fault);
  TF_CUDA(cudaGetLastError());
}

void enqueue_wait(const uint64_t* flag, const uint64_t* epoch, const dev::FaultContext& fault, dev::WaitSite site,
                  int peer, cudaStream_t s) {
  wait_kernel<<<1, 32, 0, s>>>(flag, epoch, fault, site, peer);
  TF_CUDA(cudaGetLastError());
}

void enqueue_signal_copy(uint64_t* flag, const uint64_t* epoch, cudaStream_t s) {
  TF_CUDA(cudaMemcpyAsync(flag, epoch, sizeof(uint64_t), cudaMemcpyDeviceToDevice, s));
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
  TF_CUDA(cudaFuncGetAttributes(&attr, barrier_kernel));
  TF_CUDA(cudaFuncGetAttributes(&attr, wait_kernel));
  TF_CUDA(cudaFuncGetAttributes(&attr, interleave_kernel));
}

}  // namespace taxfree::agmm
