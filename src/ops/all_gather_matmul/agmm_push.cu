// all_gather_matmul `push`: a push kernel on a few SMs and our GEMM, waiting per piece, on the rest
// (agmm_ready_gemm.cu); `sm-specialized`: the same movers as CTAs of the GEMM kernel itself.
#include "agmm_internal.h"
#include "push_pieces.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// 512 threads x 8 x 16 B = 64 KiB of loads in flight per SM (NVLink needs many bytes in flight;
// more per thread, or 1024 threads, spill registers).
constexpr int kPushThreads = 512, kPushUnroll = 8;

__global__ void __launch_bounds__(kPushThreads, 1) push_kernel(PushWork a) {
  push_pieces<kPushUnroll>(a, int(blockIdx.x), int(gridDim.x), dev::ThreadGroup::block());
}

}  // namespace

void enqueue_push(const PushLaunch& l, cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join) {
  // Everything that can throw is checked before the first kernel goes out: the two sequences
  // must advance together.
  validate_policy_gemm(l.gemm.gemm, l.gemm.config, false);
  TF_REQUIRE(l.push_ctas >= 1 && l.gemm.mover_ctas == 0, Status::Internal,
             "push kernel with " << l.push_ctas << " CTAs beside a GEMM with " << l.gemm.mover_ctas << " movers");
  // The GEMM's own launch checks too (residency, tensor maps, its attributes): the push kernel
  // advances this rank's push sequence, and a GEMM that then failed to launch would leave the
  // GEMM's sequence one behind for good.
  enqueue_ready_gemm(l.gemm, main, gemm::GemmStep::prepare);

  TF_CUDA(cudaEventRecord(fork, main));
  TF_CUDA(cudaStreamWaitEvent(side, fork, 0));
  push_kernel<<<l.push_ctas, kPushThreads, 0, side>>>(l.work);
  TF_CUDA(cudaGetLastError());
  enqueue_ready_gemm(l.gemm, main);
  TF_CUDA(cudaEventRecord(join, side));
  TF_CUDA(cudaStreamWaitEvent(main, join, 0));
}

void enqueue_sm_specialized(const PushLaunch& l, cudaStream_t s) {
  ReadyGemmLaunch g = l.gemm;
  g.movers = l.work;
  g.mover_ctas = l.push_ctas;
  enqueue_ready_gemm(g, s);  // validates before it enqueues: one kernel, nothing half-launched
}

void preload_push_kernel() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, push_kernel));
}

}  // namespace taxfree::agmm
