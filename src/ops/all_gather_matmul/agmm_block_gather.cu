// The block all-gather kernel of all_gather_matmul: rank r's block of 16-bit columns into every
// peer's destination at the same columns. nsplit runs it once per launch, for the C blocks after
// its GEMMs (rounding its fp32 partial into C first); ksplit's two-kernel path runs it for the A
// shards on the op's side stream, beside its partial GEMM. CTA j of every rank owns rows
// plan.rows(j) of its rank's block: it stores them into every peer's destination, raises one flag
// per peer, waits for every peer's flag j and, for C, copies the peers' rows from the receive
// buffer into C. No CTA waits for another CTA of its own rank.
//
// Epochs and reuse (no host reset between launches, CUDA-graph safe): every kernel of a launch
// reads the same epoch e from the sequence it is given, and the one with end_sequence ends it.
// nsplit's kernel uses ksplit's launch sequence (it ends it), so ksplit and nsplit launches share
// one growing epoch; ksplit's side-stream gather has a sequence, "free" flags and arrival flags of
// its own (it runs beside the exchange kernel, which ends ksplit's sequence). With `ready` (the A
// gather), this rank's gathered A is free for launch e once the kernel starts, which is after every
// earlier launch of the op on this rank: it raises ready = e on every peer at the start, and a
// sender stores into a peer only after that peer's ready reached e. nsplit's C kernel has no
// `ready`: it runs after the launch's arrival waits, which every rank passes only once every rank
// is in the launch (the begin barrier before the shards are sent), so no peer still reads its
// receive buffer for launch e - 1.
#include "agmm_internal.h"
#include "taxfree/device/copy_rows.cuh"
#include "taxfree/device/dependent_launch.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/launch_config.h"

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
  if (a.after_gemm) dev::wait_prior_grid();
  const KsplitSlices::Range rows = a.plan.rows(j);
  const int64_t n_rows = rows.end - rows.begin;
  const int64_t col = a.plan.blocks.begin(v.rank) * 2, bytes = a.plan.blocks.cols(v.rank) * 2;
  const char* src = nullptr;
  int64_t src_ld = a.src_ld;
  if (!a.partial) {
    src = a.src + rows.begin * a.src_ld;
  } else {  // round this CTA's rows of the partial into C; they are the block sent below
    char* o = a.out + rows.begin * a.out_ld + col;
    const float* p = a.partial + rows.begin * a.partial_ld;
    if (a.dtype == gemm::DType::bf16)
      dev::round_rows_f32<__nv_bfloat16>(o, a.out_ld, p, a.partial_ld, n_rows, bytes / 2, t, kThreads);
    else
      dev::round_rows_f32<__half>(o, a.out_ld, p, a.partial_ld, n_rows, bytes / 2, t, kThreads);
    __syncthreads();  // the CTA's rounded rows, visible to all its threads
    src = o, src_ld = a.out_ld;
  }
  char* dst = a.dst + rows.begin * a.dst_ld + col;
  if (a.copy_local) dev::copy_rows_vec16<kUnroll>(dst, a.dst_ld, src, src_ld, n_rows, bytes, t, kThreads);
  bool ok = true;
  // P1 consumer: rank p's buffers are free once its ready reaches e. A false return (deadline,
  // abort) is recorded for the host; the CTA then stores and signals nothing.
  if (a.ready && peer_thread) ok = dev::wait_geq(a.ready + t, e, a.fault, dev::WaitSite::all_gather_ready, t);
  ok = __syncthreads_and(ok) != 0;
  for (int i = 1; ok && i < v.world; ++i)
    dev::copy_rows_vec16<kUnroll>(v.peer(dst, (v.rank + i) % v.world), a.dst_ld, src, src_ld, n_rows, bytes, t,
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
  TF_REQUIRE(!g.partial || g.out, Status::Internal, "block all-gather: a partial to round needs out");
  // After the GEMM: a programmatic dependent launch (its launch overlaps the GEMM's tail;
  // dev::wait_prior_grid in the kernel waits for the GEMM before C is read).
  const LaunchConfig launch(unsigned(g.plan.ctas), kThreads, 0, s, g.after_gemm);
  TF_CUDA(cudaLaunchKernelEx(launch.get(), block_gather_kernel, g));
}

void preload_block_gather_kernel() {
  cudaFuncAttributes attr;
  TF_CUDA(cudaFuncGetAttributes(&attr, block_gather_kernel));
}

}  // namespace taxfree::agmm
