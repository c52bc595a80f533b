// The block all-gather kernel of all_gather_matmul: rank r's block of 16-bit columns into every
// peer's destination at the same columns. nsplit runs it twice per launch (the A shards before its
// GEMM, the C blocks after it); ksplit's two-kernel path runs it for the A shards on the op's side
// stream, beside its partial GEMM. CTA j of every rank owns rows plan.rows(j) of its rank's block:
// it stores them into every peer's destination, raises one flag per peer, waits for every peer's
// flag j and, for C, copies the peers' rows from the receive buffer into C. No CTA waits for
// another CTA of its own rank.
//
// Epochs and reuse (no host reset between launches, CUDA-graph safe): every kernel of a launch
// reads the same epoch e from the sequence it is given, and the one with end_sequence ends it.
// nsplit's two kernels use ksplit's launch sequence (the C kernel ends it), so ksplit and nsplit
// launches share one growing epoch and the same "free" flags; ksplit's side-stream gather has a
// sequence, "free" flags and arrival flags of its own (it runs beside the exchange kernel, which
// ends ksplit's sequence). `ready` (this rank's gathered A and receive buffer are free for launch
// e) is raised at the start of the A kernel, which runs after every earlier launch of the op on
// this rank. A sender stores A rows into a peer only after that peer's ready reached e, and C rows
// only later in the same launch, so neither lands in a buffer the peer still reads for launch e - 1.
#include "agmm_internal.h"
#include "taxfree/device/copy_rows.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/error.h"

namespace taxfree::agmm {

namespace {

// As ksplit's exchange kernel: 512 threads x 8 x 16 B in flight per SM for the NVLink stores.
constexpr int kThreads = 512, kUnroll = 8;

__global__ void __launch_bounds__(kThreads, 1) block_gather_kernel(const __grid_constant__ BlockGather a) {
  const dev::SymmetricView& v = a.view;
  const int j = blockIdx.x, t = threadIdx.x;
  const uint64_t e = dev::sequence_begin(a.seq);
  const bool peer_thread = t < v.world && t != v.rank;  // thread p signals and waits for rank p
  // P1 (publishes nothing else): this rank's buffers are free for launch e. Every CTA raises it.
  if (a.ready && peer_thread) dev::signal_set(v.peer(a.ready, t) + v.rank, e);
  // The C kernel's source is the GEMM's output: wait for the GEMM (all of it, memory visible).
  if (a.after_gemm) asm volatile("griddepcontrol.wait;" ::: "memory");
  const KsplitSlices::Range rows = a.plan.rows(j);
  const int64_t n_rows = rows.end - rows.begin;
  const int64_t col = a.plan.blocks.begin(v.rank) * 2, bytes = a.plan.blocks.cols(v.rank) * 2;
  const char* src = a.src + rows.begin * a.src_ld;
  char* dst = a.dst + rows.begin * a.dst_ld + col;
  if (a.copy_local) dev::copy_rows_vec16<kUnroll>(dst, a.dst_ld, src, a.src_ld, n_rows, bytes, t, kThreads);
  bool ok = true;
  // P1 consumer: rank p's buffers are free once its ready reaches e. A false return (deadline,
  // abort) is recorded for the host; the CTA then stores and signals nothing.
  if (a.ready && peer_thread) ok = dev::wait_geq(a.ready + t, e, a.fault, dev::WaitSite::all_gather_ready, t);
  ok = __syncthreads_and(ok) != 0;
  for (int i = 1; ok && i < v.world; ++i)
    dev::copy_rows_vec16<kUnroll>(v.peer(dst, (v.rank + i) % v.world), a.dst_ld, src, a.src_ld, n_rows, bytes, t,
                                  kThreads);
  if (ok) {
    // P2: every thread's stores, bar.sync, then thread p's release on rank p's flag.
    __syncthreads();
    if (peer_thread && !a.skip_signal) dev::signal_set(v.peer(a.flags, t) + KsplitSlices::flag_index(v.rank, j), e);
    // P2 consumer: thread p acquires rank p's flag j; bar.sync extends it to the CTA.
    if (peer_thread) ok = dev::wait_geq(a.flags + KsplitSlices::flag_index(t, j), e, a.fault, a.site, t);
    ok = __syncthreads_and(ok) != 0;
  }
  for (int i = 1; ok && a.out && i < v.world; ++i) {
    const int s = (v.rank + i) % v.world;
    const int64_t c = a.plan.blocks.begin(s) * 2;
    dev::copy_rows_vec16<kUnroll>(a.out + rows.begin * a.out_ld + c, a.out_ld, a.dst + rows.begin * a.dst_ld + c,
                                  a.dst_ld, n_rows, a.plan.blocks.cols(s) * 2, t, kThreads);
  }
  if (a.end_sequence) dev::sequence_end(a.seq, e);
}

}  // namespace

void enqueue_block_gather(const BlockGather& g, cudaStream_t s) {
  TF_REQUIRE(g.plan.ctas >= 1 && g.plan.ctas <= kKsplitMaxCtas, Status::Internal,
             "block all-gather with " << g.plan.ctas << " CTAs");
  // After the GEMM: a programmatic dependent launch (its launch overlaps the GEMM's tail;
  // griddepcontrol.wait in the kernel waits for the GEMM before C is read).
  const KernelLaunch launch(g.plan.ctas, kThreads, s, g.after_gemm);
  TF_CUDA(cudaLaunchKernelEx(launch.config(), block_gather_kernel, g));
}

void preload_block_gather_kernel() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, block_gather_kernel));
}

}  // namespace taxfree::agmm
