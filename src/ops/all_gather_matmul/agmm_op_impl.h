// The all_gather_matmul op object's state (AllGatherMatmul::Impl) and the host helpers its launch
// functions share: agmm_op.cc (the object, validation, bsp, decomposed, push, fused-ce) and
// agmm_op_split.cc (ksplit's paths, nsplit). Not a public contract.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "agmm_internal.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/rank_share.h"

namespace taxfree {

namespace agmm {

inline constexpr int64_t kElem = 2;  // bf16 / fp16

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A_shard passed as the op's own slot with its stride (local_slot): no local copy needed.
inline bool in_place(const AgmmArgs& a, const GatheredA& slot) {
  return a.a_shard == slot.ptr && a.lda_shard == slot.ld;
}

// B's K rows [k0, ...) ([K, N]) or K columns ([N, K]): ksplit's share of B on this rank.
inline const char* b_from_k(const AgmmArgs& a, int64_t k0) {
  return static_cast<const char*>(a.b) + (a.b_layout == gemm::BLayout::kn ? k0 * a.ldb : k0) * kElem;
}

struct Buffer {
  const void* p;
  int64_t bytes;
};

// rows x cols 16-bit elements between row-strided buffers (strides in elements), by the copy
// engine, on `s`.
inline void copy_rows(void* dst, int64_t dst_ld, const void* src, int64_t src_ld, int64_t rows, int64_t cols,
                      cudaStream_t s) {
  TF_CUDA(cudaMemcpy2DAsync(dst, size_t(dst_ld * kElem), src, size_t(src_ld * kElem), size_t(cols * kElem),
                            size_t(rows), cudaMemcpyDeviceToDevice, s));
}

// This rank's shard into its own slot of the gathered A, enqueued on `s` after the copies into the
// peers' slots: read back over NVLink from the slot of the peer it went to first, (rank - 1) % world,
// not copied locally from A_shard. A local device-to-device copy beside cuBLASLt slowed the GEMM by
// about as long as the copy takes alone; the copies over NVLink (a tenth of the HBM rate) cost it
// little. r44, decomposed, N = 4096: M = 8192 751-772 against 787-810 us, M = 16384 1489-1530 against
// 1585-1621, the same as with A_shard already in place. Not for ksplit's bands, whose epilogue sends
// the partials over NVLink at the same time (r44: M = 512 76 against 65-68 us). Safe: the peer's
// slot for this rank holds exactly the shard (stream order), and whatever writes it later, in any
// variant, writes data this rank sends in a later launch (its copies, its lines, its part of an
// NCCL all-gather), which this rank starts only after this launch, side stream included, ended.
// One rank: the local copy. decomposed (gather_dim 0) and nsplit.
inline void copy_own_shard(const dev::SymmetricView& view, const GatheredA& slot, const AgmmArgs& a,
                           int64_t rows, int64_t cols, cudaStream_t s) {
  const void* src = a.a_shard;
  int64_t src_ld = a.lda_shard;
  if (view.world > 1) src = view.peer(slot.ptr, (view.rank - 1 + view.world) % view.world), src_ld = slot.ld;
  copy_rows(const_cast<void*>(slot.ptr), slot.ld, src, src_ld, rows, cols, s);
}

// The whole product's GEMM arguments with A at `gathered` (row stride ld elements).
inline gemm::GemmArgs gemm_args(const AgmmArgs& a, const void* gathered, int64_t ld) {
  gemm::GemmArgs g;
  g.a = gathered, g.lda = ld, g.b = a.b, g.ldb = a.ldb, g.c = a.c, g.ldc = a.ldc;
  g.m = a.m, g.n = a.n, g.k = a.k, g.dtype = a.dtype, g.b_layout = a.b_layout;
  return g;
}

// The A shards as a block all-gather into every rank's gathered A (ksplit's two-kernel path, on
// its side stream); the caller sets ready, flags and the sequence.
inline BlockGather shard_gather(const RankShare& share, const AgmmArgs& a, const GatheredA& slot, char* gathered,
                                int max_ctas) {
  BlockGather g;
  g.view = share.heap->view();
  g.plan = shard_gather_plan(a.m, agmm_shard_shape(a.m, a.k, a.gather_dim, share.world).cols, share.world,
                             max_ctas);
  g.src = static_cast<const char*>(a.a_shard), g.src_ld = a.lda_shard * kElem;
  g.dst = gathered, g.dst_ld = slot.ld * kElem;
  g.copy_local = !in_place(a, slot);
  g.fault = share.fault;
  return g;
}

}  // namespace agmm

struct AllGatherMatmul::Impl {
  int64_t capacity_bytes = 0;        // each gathered / staging buffer
  char* gathered = nullptr;          // heap: the gathered A of bsp-sym, decomposed and push
  char* staging_sym = nullptr;       // heap: gather_dim 1 NCCL output (bsp_symmetric only)
  char* gathered_plain = nullptr;    // device memory: bsp on plain buffers (!bsp_symmetric)
  char* staging_plain = nullptr;
  int64_t flag_capacity = 0;
  uint64_t* push_ready = nullptr;    // heap [world]
  uint64_t* push_flags = nullptr;    // heap [flag_capacity]
  uint64_t* dec_barrier = nullptr;   // heap [world]: the begin barrier's slots (decomposed, fused-ce, pull)
  uint64_t* dec_arrived = nullptr;   // heap [world]: slot s = epoch of source s's shard
  int64_t ce_flag_capacity = 0;
  uint64_t* ce_flags = nullptr;      // heap [ce_flag_capacity]: fused-ce's row-chunk flags (dec_seq epochs)
  uint64_t* pull_end = nullptr;      // heap [world]: pull's end barrier slots (dec_seq epochs)
  int64_t ksplit_slot_floats = 0;    // one partial: ksplit_max_m x ksplit_max_n rounded up to 8
  float* ksplit_own = nullptr;       // heap [slot]: this rank's partial (the GEMM's output); nsplit: the
                                     // peers' C blocks (16-bit), written by them once every rank is in the launch
  float* ksplit_recv = nullptr;      // heap [2][world - 1][slot]: peers' partials by launch parity
  uint64_t* ksplit_flags = nullptr;  // heap [world * kKsplitMaxCtas]: two-kernel path, partials arrived
  uint64_t* ksplit_sum_flags = nullptr;  // heap [world * kKsplitMaxCtas]: two-kernel path, summed slices arrived
  uint64_t* ksplit_band_flags = nullptr;  // heap [world][ksplit_sizes.band_flags]
  uint64_t* nsplit_flags = nullptr;       // heap [world * kKsplitMaxCtas]: nsplit's C all-gather
  float* nsplit_partial = nullptr;        // device memory [nsplit_partial_floats], two ranks or more: nsplit's fp32 block
  int64_t nsplit_partial_floats = 0;      // ksplit_max_m x its widest column block
  uint64_t* side_ready = nullptr;         // heap [world]: ksplit's side-stream A gather ("free", side_seq epochs)
  uint64_t* side_flags = nullptr;         // heap [world * kKsplitMaxCtas]: its arrival flags
  KsplitHeap ksplit_sizes;           // the skinny path's inbox geometry among them
  uint4* skinny_inbox = nullptr;     // heap [2][world - 1][skinny lines]: LL lines by launch parity
  // dec_seq.counter: decomposed's, fused-ce's, pull's, ksplit bands' and nsplit's begin-barrier epoch
  dev::LaunchSequence push_seq{}, gemm_seq{}, dec_seq{}, ksplit_seq{}, side_seq{};
  cudaStream_t side = nullptr;       // the op's second stream (push kernel, copy-engine copies)
  cudaEvent_t fork = nullptr, join = nullptr;
  cudaEvent_t begun = nullptr;       // decomposed, nsplit: the side stream's begin barrier is done
  // A share of fewer SMs than the GPU has (ranks simulated on one GPU) shares it with the other
  // ranks' grids, which wait for this rank's GEMMs: cuBLASLt keeps to small clusters there
  // (cublaslt_gemm.h). A whole GPU keeps the heuristic's pick, as the bsp baseline does.
  gemm::Clusters lt_clusters = gemm::Clusters::any;

  void lt_prepare(const gemm::GemmArgs& g, cudaStream_t s, gemm::OutType out = gemm::OutType::same) const {
    gemm::cublaslt_prepare(g, s, out, lt_clusters);
  }
  void lt_launch(const gemm::GemmArgs& g, cudaStream_t s, gemm::OutType out = gemm::OutType::same) const {
    gemm::cublaslt_launch(g, s, out, lt_clusters);
  }

  // On the side stream, after the begin barrier: the copy engine sends A_shard (rows x cols) into
  // every peer's slot of the gathered A, the peer that consumes it soonest first (rank - 1,
  // rank - 2, ...), each copy followed by the arrival flag dec_arrived[rank] = *epoch there
  // (decomposed's scheme; bands and nsplit too).
  void send_shard_with_arrival_flags(const dev::SymmetricView& view, const GatheredA& slot, const AgmmArgs& a,
                                     int64_t rows, int64_t cols, const uint64_t* epoch) const {
    for (int i = 1; i < view.world; ++i) {
      const int q = (view.rank - i + view.world) % view.world;
      agmm::copy_rows(view.peer(const_cast<void*>(slot.ptr), q), slot.ld, a.a_shard, a.lda_shard, rows, cols, side);
      agmm::enqueue_signal_copy(view.peer(dec_arrived, q) + view.rank, epoch, side);
    }
  }

  int64_t skinny_slot_lines() const { return ksplit_sizes.skinny_partial_lines + ksplit_sizes.skinny_a_lines; }
  // Every buffer the variants or the peers write (the flags excepted).
  std::vector<agmm::Buffer> buffers(int world) const {
    std::vector<agmm::Buffer> out;
    for (const char* buf : {gathered, staging_sym, gathered_plain, staging_plain})
      if (buf) out.push_back({buf, capacity_bytes});
    if (ksplit_own) out.push_back({ksplit_own, ksplit_slot_floats * 4});
    if (ksplit_recv) out.push_back({ksplit_recv, 2 * (world - 1) * ksplit_slot_floats * 4});
    if (nsplit_partial) out.push_back({nsplit_partial, nsplit_partial_floats * 4});
    if (skinny_inbox) out.push_back({skinny_inbox, 2 * (world - 1) * skinny_slot_lines() * 16});
    return out;
  }
};


}  // namespace taxfree
