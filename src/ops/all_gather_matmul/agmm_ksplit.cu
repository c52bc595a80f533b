// all_gather_matmul `ksplit`: the exchange kernel that follows the partial GEMM. CTA j owns slice j
// of every rank's partial (KsplitSlices). Two protocols, by the partial's size and the world (owner_sums):
//  * all-to-all (small partials): CTA j stores this rank's slice into every peer's slot for it,
//    raises one flag per peer, waits for every peer's flag of slice j and sums the world partials
//    of slice j into C. One flag latency.
//  * reduce-scatter then all-gather (large partials): rank j % world owns slice j's sum; every other
//    rank stores its partial slice j into the owner's slot for it and raises the owner's flag
//    (source, j); the owner's CTA j waits for those flags, sums, rounds once into its C and into its
//    slot on every other rank (packed 16-bit, in slice j's region), and raises their sum flag
//    (owner, j); they wait for it and copy the slice into C. At world W 1.5 / W of the bytes of
//    all-to-all (three quarters at two ranks), for one more flag latency.
// Either way the partials are summed in rank order in fp32 and rounded once, so C has the same bits
// on every rank and under both protocols. No CTA waits for another CTA of its own rank. The A
// shards travel beside the GEMM, on the op's side stream (agmm_block_gather.cu), not here.
//
// Epochs, buffers, reuse (no host reset between launches, CUDA-graph safe):
//  * epoch e = dev::sequence_begin(seq), +1 per ksplit launch of the op; flags only grow.
//  * Launch e writes parity e & 1 of the receive slots. Slot (source p) on rank r holds p's
//    partial slices (all of them, or those r owns) and p's C slices that p owns: disjoint regions.
//    Whenever p writes into r in a launch, each waits for the other in it (all-to-all: every CTA
//    waits for every peer; otherwise an owner for the partial, a non-owner for the sum; launches
//    of either protocol may follow each other), so p reaches e+2, which writes the parity r reads
//    at e, only after seeing r in e+1, which r enters only after its launch e ended (launches are
//    stream-ordered on each rank). So a slot is free without a handshake (fused flash_decode's
//    argument, fused_decode_kernel.h).
//  * A waiter still in e cannot see a flag of e+1: its peer raises e+1 only after seeing this
//    rank's data of e+1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "agmm_internal.h"
#include "partial_sum.cuh"
#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launch_config.h"

namespace taxfree::agmm {

namespace {

// As the push kernel: 512 threads x 8 x 16 B in flight per SM for the NVLink stores.
constexpr int kThreads = 512, kUnroll = 8;

// C's 8-float groups [g.begin, g.end): the world partials summed in rank order in fp32 and rounded
// once, into this rank's C (columns >= n, the partials' row padding, not stored) and, with
// `forward` (the owner of a reduce-scatter), packed into slice j's region of this rank's slot on
// every peer.
template <class T>
__device__ void sum_slice(const KsplitLaunch& a, float* recv, KsplitSlices::Range g, bool forward) {
  const dev::SymmetricView& v = a.view;
  const int64_t row_groups = a.slices.ldp / 8;
  for (int64_t x = g.begin + threadIdx.x; x < g.end; x += kThreads) {
    float4 lo, hi;
    for (int s = 0; s < v.world; ++s)
      add_partial8(lo, hi, (s == v.rank ? a.own : recv + KsplitSlices::slot(s, v.rank) * a.slot_floats) + x * 8, s == 0);
    const uint4 c8 = round8<T>(lo, hi);
    const int64_t row = x / row_groups, col = (x % row_groups) * 8;
    store8<T>(static_cast<T*>(a.c) + row * a.ldc + col, c8, a.slices.n - col);
    for (int i = 1; forward && i < v.world; ++i) {
      const int q = (v.rank + i) % v.world;
      uint4* const packed = reinterpret_cast<uint4*>(recv + KsplitSlices::slot(v.rank, q) * a.slot_floats + g.begin * 8);
      v.peer(packed, q)[x - g.begin] = c8;
    }
  }
}

// A non-owner's part: the owner's packed slice (in this rank's slot for the owner) into C.
template <class T>
__device__ void copy_slice(const KsplitLaunch& a, const float* slot, KsplitSlices::Range g) {
  const int64_t row_groups = a.slices.ldp / 8;
  const uint4* const packed = reinterpret_cast<const uint4*>(slot + g.begin * 8);
  for (int64_t x = g.begin + threadIdx.x; x < g.end; x += kThreads) {
    const int64_t row = x / row_groups, col = (x % row_groups) * 8;
    store8<T>(static_cast<T*>(a.c) + row * a.ldc + col, packed[x - g.begin], a.slices.n - col);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1) ksplit_exchange_kernel(const __grid_constant__ KsplitLaunch a) {
  const dev::SymmetricView& v = a.view;
  const KsplitSlices& sl = a.slices;
  const int j = blockIdx.x, t = threadIdx.x;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  const bool peer_thread = t < v.world && t != v.rank;  // thread p signals and waits for rank p
  // The partial is the GEMM's output: wait for the GEMM (all of it, memory visible).
  dev::wait_prior_grid();
  float* const recv = a.recv + int64_t(epoch & 1) * (v.world - 1) * a.slot_floats;
  const KsplitSlices::Range g = sl.partial_groups(j);
  bool ok = true;
  const int owner = sl.owner(j);
  if (!a.owner_sums) {
    // P2: this rank's partial slice into its slot on every peer (rank+1, rank+2, ...), bar.sync,
    // then thread p's release on rank p's flag (rank, j).
    for (int i = 1; i < v.world; ++i) {
      const int q = (v.rank + i) % v.world;
      float* dst = recv + KsplitSlices::slot(v.rank, q) * a.slot_floats + g.begin * 8;
      dev::copy_vec16<kUnroll>(v.peer(dst, q), a.own + g.begin * 8, uint64_t(g.end - g.begin) * 32, t, kThreads);
    }
    __syncthreads();
    if (peer_thread && !a.skip_signal)
      dev::signal_set(v.peer(a.flags, t) + KsplitSlices::flag_index(v.rank, j), epoch);
    // P2 consumer: thread p acquires rank p's flag (p, j); bar.sync extends it to the CTA. A false
    // return (deadline, abort) is recorded for the host; the CTA then sums nothing.
    if (peer_thread)
      ok = dev::wait_geq(a.flags + KsplitSlices::flag_index(t, j), epoch, a.fault, dev::WaitSite::ksplit_partial, t);
    ok = __syncthreads_and(ok) != 0;
    if (ok) sum_slice<T>(a, recv, g, false);
  } else if (owner != v.rank) {
    // P2: this rank's partial slice into the owner's slot for it, bar.sync, then thread 0's release
    // on the owner's flag (rank, j).
    float* dst = recv + KsplitSlices::slot(v.rank, owner) * a.slot_floats + g.begin * 8;
    dev::copy_vec16<kUnroll>(v.peer(dst, owner), a.own + g.begin * 8, uint64_t(g.end - g.begin) * 32, t, kThreads);
    __syncthreads();
    if (t == 0 && !a.skip_signal)
      dev::signal_set(v.peer(a.flags, owner) + KsplitSlices::flag_index(v.rank, j), epoch);
    // P2 consumer: thread 0 acquires the owner's sum flag (owner, j); bar.sync extends it to the
    // CTA. A false return (deadline, abort) is recorded for the host; the CTA then copies nothing.
    if (t == 0)
      ok = dev::wait_geq(a.sum_flags + KsplitSlices::flag_index(owner, j), epoch, a.fault, dev::WaitSite::ksplit_sum,
                         owner);
    ok = __syncthreads_and(ok) != 0;
    if (ok) copy_slice<T>(a, recv + KsplitSlices::slot(owner, v.rank) * a.slot_floats, g);
  } else {
    // P2 consumer: thread p acquires rank p's partial flag (p, j); bar.sync extends it to the CTA.
    if (peer_thread)
      ok = dev::wait_geq(a.flags + KsplitSlices::flag_index(t, j), epoch, a.fault, dev::WaitSite::ksplit_partial, t);
    ok = __syncthreads_and(ok) != 0;
    if (ok) {
      sum_slice<T>(a, recv, g, true);
      // P2: every thread's stores of the packed slice, bar.sync, then thread p's release on rank
      // p's sum flag (rank, j).
      __syncthreads();
      if (peer_thread && !a.skip_signal)
        dev::signal_set(v.peer(a.sum_flags, t) + KsplitSlices::flag_index(v.rank, j), epoch);
    }
  }
  dev::sequence_end(a.seq, epoch);
}

}  // namespace

// Programmatic dependent launch: the kernel may start while the partial GEMM before it on the
// stream is still running (its launch overlaps the GEMM's tail);
// dev::wait_prior_grid in the kernel then waits for the GEMM's completion before the partial is read.
void enqueue_ksplit_exchange(const KsplitLaunch& l, cudaStream_t s) {
  TF_REQUIRE(l.slices.ctas >= 1 && l.slices.ctas <= kKsplitMaxCtas, Status::Internal,
             "ksplit exchange with " << l.slices.ctas << " CTAs");
  const LaunchConfig launch(unsigned(l.slices.ctas), kThreads, 0, s, true);
  if (l.dtype == gemm::DType::bf16)
    TF_CUDA(cudaLaunchKernelEx(launch.get(), ksplit_exchange_kernel<__nv_bfloat16>, l));
  else
    TF_CUDA(cudaLaunchKernelEx(launch.get(), ksplit_exchange_kernel<__half>, l));
}

void preload_ksplit_kernels() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_exchange_kernel<__nv_bfloat16>));
  TF_CUDA(cudaFuncGetAttributes(&attr, ksplit_exchange_kernel<__half>));
}

}  // namespace taxfree::agmm
