// all_gather_matmul `ksplit`: the exchange kernel that follows the partial GEMM. CTA j owns slice
// j of every rank's partial (KsplitSlices); it pushes this rank's slice to every peer, raises one
// flag per peer, waits for every peer's flag of slice j and sums the partials of slice j into C. No
// CTA waits for another CTA of its own rank. The A shards travel beside the GEMM, on the op's side
// stream (agmm_block_gather.cu), not here.
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * epoch e = dev::sequence_begin(seq), +1 per ksplit launch of the op; flags only grow.
//  * Partials: launch e writes parity e & 1. A sender at e+2 writes the parity a receiver reads at
//    e; it got there only after its launch e+1 had seen the receiver's flags of e+1 (every CTA
//    waits for every peer), which the receiver raises only after its launch e ended (launches are
//    stream-ordered on each rank). So a slot is free without a handshake, whatever the shapes of
//    e, e+1 and e+2 (fused flash_decode's argument, fused_decode_kernel.h).
//  * A receiver still in e may see a flag of e+1 (>= e passes): the sender's e+1 partial goes to
//    the other parity, and its e data was complete before its launch e ended.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "agmm_internal.h"
#include "partial_sum.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// As the push kernel: 512 threads x 8 x 16 B in flight per SM for the NVLink stores.
constexpr int kThreads = 512, kUnroll = 8;

// C's 8-float groups [g.begin, g.end): the W partials summed in rank order in fp32 (the same
// operations on every rank, so the same bits), rounded once. Columns >= n (row padding of the
// partials) are not stored.
template <class T>
__device__ void sum_into_c(const KsplitLaunch& a, const float* recv, KsplitSlices::Range g) {
  const dev::SymmetricView& v = a.view;
  const int64_t row_groups = a.slices.ldp / 8;
  for (int64_t x = g.begin + threadIdx.x; x < g.end; x += kThreads) {
    float4 lo, hi;
    for (int s = 0; s < v.world; ++s)
      add_partial8(lo, hi, (s == v.rank ? a.own : recv + KsplitSlices::slot(s, v.rank) * a.slot_floats) + x * 8, s == 0);
    const int64_t row = x / row_groups, col = (x % row_groups) * 8;
    store_rounded8(static_cast<T*>(a.c) + row * a.ldc + col, lo, hi, a.slices.n - col);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1) ksplit_exchange_kernel(const __grid_constant__ KsplitLaunch a) {
  const dev::SymmetricView& v = a.view;
  const KsplitSlices& sl = a.slices;
  const int j = blockIdx.x, t = threadIdx.x;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  const bool peer_thread = t < v.world && t != v.rank;  // thread p signals and waits for rank p
  // The partial is the GEMM's output: wait for the GEMM (all of it, memory visible), then this
  // rank's partial slice into its slot in every peer's buffer, peers rank+1, rank+2, ...
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float* const recv = a.recv + int64_t(epoch & 1) * (v.world - 1) * a.slot_floats;
  const KsplitSlices::Range g = sl.partial_groups(j);
  for (int i = 1; i < v.world; ++i) {
    const int q = (v.rank + i) % v.world;
    float* dst = recv + KsplitSlices::slot(v.rank, q) * a.slot_floats + g.begin * 8;
    dev::copy_vec16<kUnroll>(v.peer(dst, q), a.own + g.begin * 8, uint64_t(g.end - g.begin) * 32, t, kThreads);
  }
  // P2: every thread's stores of the slice, bar.sync, then thread p's release on rank p's flag.
  __syncthreads();
  if (peer_thread && !a.skip_signal) dev::signal_set(v.peer(a.flags, t) + KsplitSlices::flag_index(v.rank, j), epoch);
  // P2 consumer: thread p acquires rank p's flag of slice j; bar.sync extends it to the CTA. A false
  // return (deadline, abort) is recorded for the host; the CTA then sums nothing.
  bool ok = true;
  if (peer_thread)
    ok = dev::wait_geq(a.flags + KsplitSlices::flag_index(t, j), epoch, a.fault, dev::WaitSite::ksplit_partial, t);
  ok = __syncthreads_and(ok) != 0;
  if (ok) sum_into_c<T>(a, recv, g);
  dev::sequence_end(a.seq, epoch);
}

}  // namespace

// Programmatic dependent launch: the kernel may start while the partial GEMM before it on the
// stream is still running (its launch overlaps the GEMM's tail);
// griddepcontrol.wait in the kernel then waits for the GEMM's completion before the partial is read.
void enqueue_ksplit_exchange(const KsplitLaunch& l, cudaStream_t s) {
  TF_REQUIRE(l.slices.ctas >= 1 && l.slices.ctas <= kKsplitMaxCtas, Status::Internal,
             "ksplit exchange with " << l.slices.ctas << " CTAs");
  const KernelLaunch launch(l.slices.ctas, kThreads, s, true);
  if (l.dtype == gemm::DType::bf16) TF_CUDA(cudaLaunchKernelEx(launch.config(), ksplit_exchange_kernel<__nv_bfloat16>, l));
  else TF_CUDA(cudaLaunchKernelEx(launch.config(), ksplit_exchange_kernel<__half>, l));
}

void preload_ksplit_kernels() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_exchange_kernel<__nv_bfloat16>));
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_exchange_kernel<__half>));
}

}  // namespace taxfree::agmm
