// Kernel launchers shared by the all_gather_matmul translation units (not a public contract).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <vector_types.h>

#include "push_pieces.cuh"
#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/ops/all_gather_matmul_plan.h"
#include "taxfree/ops/gemm.h"

namespace taxfree::agmm {

// Our GEMM over the gathered A, its producer waiting for each piece's flag before the first TMA
// load that reads it (piece_ready.cuh), tiles of this rank's rows first (gather_dim 0) or each
// tile's k-loop from this rank's columns on (gather_dim 1, fused-ce): push and fused-ce.
struct ReadyGemmLaunch {
  gemm::GemmArgs gemm;         // A = the gathered A
  gemm::GemmConfig config;     // whole tiles (no split-K with a Ready policy)
  int first_m = 0;             // RotatedOrder start: this rank's shard first
  int first_k = 0;             // k-loop rotation (first_k_block): gather_dim 1, this rank's columns first
  const uint64_t* flags = nullptr;  // heap, [grid.flags()]: piece (s, i, j) >= the launch's epoch
  PieceGrid grid;
  int present_source = -1;     // a source whose pieces are in place before the GEMM, or -1
  // own launch counter, or finished == nullptr: counter holds this launch's epoch (piece_ready.cuh)
  dev::LaunchSequence seq;
  dev::FaultContext fault;
  // sm-specialized: mover_ctas CTAs of the GEMM kernel run push_pieces(movers) instead of tiles
  // (a multiple of the config's cluster size; 0: none, the pieces come from elsewhere).
  PushWork movers;
  int mover_ctas = 0;
};
// Enqueues the GEMM on `s`. launch_gemm checks the arguments again before it enqueues; callers
// that enqueue other work first call validate_policy_gemm and GemmStep::prepare before any of it
// (nothing may throw half-way through a launch: the ranks' sequences must advance together).
// split_k_ok: the policy allows split-K (pull); the piece waits do not.
void enqueue_ready_gemm(const ReadyGemmLaunch& l, cudaStream_t s, gemm::GemmStep step = gemm::GemmStep::launch);
void validate_policy_gemm(const gemm::GemmArgs& g, const gemm::GemmConfig& cfg, bool split_k_ok);

// pull's GEMM (pull_ready.cuh): our GEMM over the gathered A whose producer loads each A tile from
// the gathered A of the rank holding it (`sources[q]`: rank q's, in this process; every shard in
// place before the GEMM starts). The order of the waiting GEMMs; their k-loop rotation on whole tiles.
struct PullGemmLaunch {
  gemm::GemmArgs gemm;      // A = this rank's gathered A (its shape and stride)
  gemm::GemmConfig config;  // make_pull_plan's (split-K allowed)
  int first_m = 0;
  int first_k = 0;
  int source_unit = 1;      // m-blocks (gather_dim 0) or k-blocks (gather_dim 1) per shard
  int gather_dim = 0;
  const void* sources[kPullMaxWorld] = {};
};
// validate_policy_gemm first; GemmStep::prepare (gemm_launch.cuh) before anything else is enqueued.
void enqueue_pull_gemm(const PullGemmLaunch& l, cudaStream_t s, gemm::GemmStep step = gemm::GemmStep::launch);

// Everything the push and sm-specialized variants enqueue for one launch.
struct PushLaunch {
  PushWork work;
  int push_ctas = 0;           // push: the push kernel's CTAs; sm-specialized: the GEMM kernel's movers
  ReadyGemmLaunch gemm;        // its flags and grid are work's
};

// Everything the ksplit exchange kernel needs for one launch (the partial GEMM has run before it
// on the same stream).
struct KsplitLaunch {
  dev::SymmetricView view;
  const float* own = nullptr;  // this rank's partial [m, ldp] (the GEMM's output)
  float* recv = nullptr;       // heap [2 parities][world - 1 slots][slot_floats], the same offset on every rank
  int64_t slot_floats = 0;
  uint64_t* flags = nullptr;      // heap [world * kKsplitMaxCtas], KsplitSlices::flag_index: partials arrived
  uint64_t* sum_flags = nullptr;  // heap [world * kKsplitMaxCtas], KsplitSlices::flag_index: summed slices arrived
  bool owner_sums = false;     // reduce-scatter then all-gather (agmm::ksplit_owner_sums), else all-to-all
  bool skip_signal = false;    // fault injection: never raise the peers' partial or sum flags
  void* c = nullptr;
  int64_t ldc = 0;             // elements
  gemm::DType dtype = gemm::DType::bf16;
  KsplitSlices slices;
  dev::LaunchSequence seq;
  dev::FaultContext fault;
};
void enqueue_ksplit_exchange(const KsplitLaunch& l, cudaStream_t s);

// The ksplit GEMM-epilogue path (agmm_ksplit_gemm.cu): our GEMM of A_shard by B's K rows of this
// rank, its fp32 epilogue storing each 64-row band into `own` and into every peer's slot and raising
// the band's flag there, then the band sum kernel.
struct KsplitGemmLaunch {
  dev::SymmetricView view;
  gemm::GemmArgs gemm;          // A_shard x B's rank rows (c unused)
  gemm::GemmConfig config;      // without swap-AB (the fp32 epilogue)
  float* own = nullptr;         // heap [m, ldp]
  float* recv = nullptr;        // heap [2 parities][world - 1 slots][slot_floats]
  int64_t ldp = 0, slot_floats = 0;
  uint64_t* flags = nullptr;    // heap [world][band_capacity]: band (row0 / 64) * bands_n + col0 / bn
                                // (capacity: KsplitHeap::band_flags, 64 x 64 bands: the narrowest non-swap tile)
  int64_t band_capacity = 0;
  int bands_n = 1, bn = 64;     // bands per 64 rows (ceil(n / bn)), the config's tile columns
  int sum_ctas = 1;             // the band sum's grid cap: the share's SMs (its CTAs wait for peers)
  int64_t m = 0, n = 0;
  bool skip_signal = false;     // fault injection: raise no band flag on any peer
  void* c = nullptr;
  int64_t ldc = 0;              // elements
  gemm::DType dtype = gemm::DType::bf16;
  dev::LaunchSequence seq;      // the op's ksplit sequence (shared with the other ksplit paths)
  dev::FaultContext fault;
};
// GemmStep::prepare (gemm_launch.cuh) before anything else is enqueued: split-K may grow the stream's workspace.
void enqueue_ksplit_gemm(const KsplitGemmLaunch& l, cudaStream_t s, gemm::GemmStep step = gemm::GemmStep::launch);
void enqueue_ksplit_band_sum(const KsplitGemmLaunch& l, cudaStream_t s);
void preload_ksplit_gemm_kernels();

// Everything the one-kernel ksplit-skinny path needs for one launch (agmm_ksplit_skinny.cu).
struct KsplitSkinnyLaunch {
  dev::SymmetricView view;
  KsplitSkinny plan;
  const char* a = nullptr;     // A_shard [m, shard_cols]
  int64_t lda = 0;             // elements
  const char* b = nullptr;     // B at this rank's first K row (KN) or K column (NK)
  int64_t ldb = 0;             // elements
  gemm::BLayout b_layout = gemm::BLayout::nk;
  float* own = nullptr;        // heap [m, plan.ldp]: this rank's partial, between the kernel's phases
  uint4* inbox = nullptr;      // heap [2 parities][world - 1 sources][slot_lines] LL lines
  int64_t slot_lines = 0;      // per source: partial_cap partial lines, then the A lines
  int64_t partial_cap = 0;
  char* gathered = nullptr;    // this rank's gathered A (only this rank writes it)
  int64_t ld = 0;              // bytes
  bool copy_local = true;      // false: A_shard already is this rank's slot (in place)
  bool skip_signal = false;    // fault injection: send no line to any peer
  void* c = nullptr;
  int64_t ldc = 0;             // elements
  gemm::DType dtype = gemm::DType::bf16;
  dev::LaunchSequence seq;     // the op's ksplit sequence (shared with the two-kernel path)
  dev::FaultContext fault;
};
// CTAs of the skinny kernel for (dtype, layout, m_tiles) one SM holds at once (occupancy API).
int ksplit_skinny_ctas_per_sm(gemm::DType dtype, gemm::BLayout layout, int m_tiles);
void enqueue_ksplit_skinny(const KsplitSkinnyLaunch& l, cudaStream_t s);

// One block all-gather (agmm_block_gather.cu): rank r's block -- rows x plan.blocks.cols(r)
// 16-bit elements at src -- into columns plan.blocks.begin(r) of every peer's dst (and of this
// rank's own with copy_local), one flag per (source, CTA); with `out`, the peers' blocks are then
// copied from dst into out at the same columns. nsplit's C blocks (from its fp32 partial), ksplit's
// A gather.
struct BlockGather {
  dev::SymmetricView view;
  BlockGatherPlan plan;         // A: blocks of the shard width; C: the plan's column blocks of C
  const char* src = nullptr;    // this rank's block (unused with `partial`)
  int64_t src_ld = 0;           // bytes
  char* dst = nullptr;          // heap (the same offset on every rank)
  int64_t dst_ld = 0;           // bytes
  char* out = nullptr;          // C, or nullptr (A: dst is where the shards belong)
  int64_t out_ld = 0;           // bytes
  const float* partial = nullptr;  // C: this rank's block as fp32 sums [m][partial_ld], rounded into
  int64_t partial_ld = 0;          // out's block first, which is then the block sent (needs out)
  gemm::DType dtype = gemm::DType::bf16;  // of out, when rounding the partial
  bool copy_local = false;      // also this rank's block into its own dst
  uint64_t* ready = nullptr;    // A: heap [world], slot p = epoch at which rank p's buffers are free (raised on
                                // every peer, waited for before storing into one); C: nullptr
  uint64_t* flags = nullptr;    // heap [world * kKsplitMaxCtas], KsplitSlices::flag_index(source, CTA)
  bool after_gemm = false;      // nsplit's C: a programmatic dependent launch after the GEMM
  bool end_sequence = false;    // the launch's last kernel on `seq`: ends it
  bool skip_signal = false;     // fault injection: raise no flag on any peer
  dev::WaitSite site = dev::WaitSite::all_gather_data;
  dev::LaunchSequence seq;      // nsplit: ksplit's; ksplit's side gather: its own
  dev::FaultContext fault;
};
void enqueue_block_gather(const BlockGather& g, cudaStream_t s);
void preload_block_gather_kernel();

// The push kernel on `side` (push_ctas SMs) and the waiting GEMM on `main` (the rest), at once:
// validates everything that can throw first, then forks `side` off `main` (event `fork`),
// enqueues both and joins `side` back into `main` (event `join`).
void enqueue_push(const PushLaunch& l, cudaStream_t main, cudaStream_t side, cudaEvent_t fork, cudaEvent_t join);

// sm-specialized: one kernel on `s`, l.push_ctas mover CTAs (a multiple of the GEMM config's
// cluster size) and the waiting GEMM on the rest of its grid.
void enqueue_sm_specialized(const PushLaunch& l, cudaStream_t s);

// Loads the push kernel now: the GEMM of a peer waits for it, and a first launch that still needs
// module loading waits for this device to go idle (lazy loading; see launcher.cc).
void preload_push_kernel();
void preload_ksplit_kernels();
void preload_ksplit_skinny();
void preload_small_kernels();

// The decomposed variant's synchronization; `epoch` is the op's device counter. Only the main
// stream runs kernels: a persistent cuBLASLt GEMM fills every SM, so a kernel queued on the side
// stream would wait for it to end.
// begin: epoch += 1, then a barrier of all ranks (nobody still uses the previous gathered A).
void enqueue_begin(uint64_t* epoch, const dev::SymmetricView& view, uint64_t* barrier_slots,
                   const dev::FaultContext& fault, cudaStream_t s);
// barrier: a barrier of all ranks at the current epoch (no advance), on slots no other barrier of
// that epoch uses (pull's end: no peer still reads this rank's shard).
void enqueue_barrier(const uint64_t* epoch, const dev::SymmetricView& view, uint64_t* barrier_slots,
                     const dev::FaultContext& fault, cudaStream_t s);
// wait: flag >= epoch (bounded: the team's deadline), naming `peer` and `site` if it gives up.
void enqueue_wait(const uint64_t* flag, const uint64_t* epoch, const dev::FaultContext& fault, dev::WaitSite site,
                  int peer, cudaStream_t s);
// signal without an SM: the copy engine copies the epoch into `flag` (a peer's) once the stream's
// earlier copies have completed (stream order), as cuStreamWriteValue after a copy would, but
// with the value read on the device (CUDA-graph replay). It relies on the peer's SMs seeing the
// earlier copies' writes before this one, which CUDA does not state (it states stream order); NCCL
// 2.28's copy-engine collectives rely on the same (ce_coll.cc: the sequence number copied from
// device memory into each peer's ready/complete slot after the data copies, on the same stream).
void enqueue_signal_copy(uint64_t* flag, const uint64_t* epoch, cudaStream_t s);

// gather_dim 1 BSP: dst[r, s * cols + c] = src[s][r][c] for the world blocks of rows x cols
// (dense) that ncclAllGather produced; dst has row stride dst_ld elements. 16-bit elements, cols a
// multiple of 8.
void enqueue_interleave(const void* src, void* dst, int64_t dst_ld, int world, int64_t rows, int64_t cols,
                        cudaStream_t s);

}  // namespace taxfree::agmm
