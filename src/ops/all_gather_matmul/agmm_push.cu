// all_gather_matmul `push`: a push kernel on a few SMs and our GEMM, waiting per piece, on the rest
// (agmm_ready_gemm.cu).
#include "agmm_internal.h"
#include "taxfree/device/copy_rows.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// 512 threads x 8 x 16 B = 64 KiB of loads in flight per SM (NVLink needs many bytes in flight;
// more per thread, or 1024 threads, spill registers).
constexpr int kPushThreads = 512, kPushUnroll = 8;

// Each block takes work items blockIdx.x, + gridDim.x, ... of push_item(): copies the piece from
// A_shard into the target's gathered A, then raises the target's flag for (this rank, piece).
// Before its first piece for a peer, a block waits until that peer has started this launch (its
// gathered A is free: the caller's use of the previous launch's result is over).
__global__ void __launch_bounds__(kPushThreads, 1) push_kernel(PushLaunch a) {
  const auto& v = a.view;
  const uint64_t epoch = dev::sequence_begin(a.push_seq);
  // P1 (the flag publishes nothing else): this rank's gathered A is free from now on.
  if (blockIdx.x == 0)
    for (int p = threadIdx.x; p < v.world; p += blockDim.x)
      if (p != v.rank) dev::signal_set(v.peer(a.ready, p) + v.rank, epoch);

  __shared__ int ok;
  if (threadIdx.x == 0) ok = 1;
  __syncthreads();
  const PieceGrid& g = a.grid;
  const int64_t items = push_items(g, a.copy_local);
  uint64_t confirmed = 0;  // bit p: peer p was seen ready (ranks >= 64 are checked every time)
  for (int64_t x = blockIdx.x; x < items; x += gridDim.x) {
    const PushItem item = push_item(g, v.rank, a.copy_local, x);
    const uint64_t bit = item.target < 64 ? 1ull << item.target : 0;
    if (item.target != v.rank && !(confirmed & bit)) {
      if (threadIdx.x == 0)
        ok = dev::wait_geq(a.ready + item.target, epoch, a.fault, dev::WaitSite::all_gather_ready, item.target);
      __syncthreads();
      if (!ok) break;  // the waits of the peer's GEMM give up at their deadline too
      confirmed |= bit;
    }
    const Piece pc = g.piece_in_order(item.t);
    char* dst = a.gathered + (g.row0(v.rank) + pc.r0) * a.ld + (g.col0(v.rank) + pc.c0) * 2;
    if (item.target != v.rank) dst = v.peer(dst, item.target);
    dev::copy_rows_vec16<kPushUnroll>(dst, a.ld, a.src + pc.r0 * a.src_ld + pc.c0 * 2, a.src_ld, pc.rows, pc.cols * 2,
                         threadIdx.x, blockDim.x);
    __syncthreads();  // P2: the block's stores, then one release
    if (threadIdx.x == 0) {
      uint64_t* flag = a.flags + g.flag_index(v.rank, pc.i, pc.j);
      dev::signal_set(item.target == v.rank ? flag : v.peer(flag, item.target), epoch);
    }
  }
  dev::sequence_end(a.push_seq, epoch);
}

}  // namespace

void enqueue_push(const PushLaunch& l, cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join) {
  // Everything that can throw is checked before the first kernel goes out: the two sequences
  // must advance together.
  validate_ready_gemm(l.gemm);
  TF_REQUIRE(l.push_ctas >= 1, Status::Internal, "push kernel with " << l.push_ctas << " CTAs");

  TF_CUDA(cudaEventRecord(fork, main));
  TF_CUDA(cudaStreamWaitEvent(side, fork, 0));
  push_kernel<<<l.push_ctas, kPushThreads, 0, side>>>(l);
  TF_CUDA(cudaGetLastError());
  enqueue_ready_gemm(l.gemm, main);
  TF_CUDA(cudaEventRecord(join, side));
  TF_CUDA(cudaStreamWaitEvent(main, join, 0));
}

void preload_push_kernel() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, push_kernel));
}

}  // namespace taxfree::agmm
