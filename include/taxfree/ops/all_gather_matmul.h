// all_gather_matmul (AG+GEMM): A is sharded across the ranks, gathered, and multiplied by this
// rank's B: C[m, n] = gather(A_shard)[m, k] * B, with fp32 accumulation, bf16 or fp16 in and out.
//
//   gather_dim 0 (tensor-parallel layout): A_shard is [m / world, k]; rank r's rows land at rows
//                [r * m / world, (r + 1) * m / world) of the gathered A.
//   gather_dim 1 (the paper's layout):    A_shard is [m, k / world]; rank r's columns land at
//                columns [r * k / world, (r + 1) * k / world).
//   B is [n, k] (BLayout::nk, a Linear weight) or [k, n] (BLayout::kn), as in ops/gemm.h.
//
// Variants (one interface, AllGatherMatmul::launch; every one produces C, equal up to rounding, and
// the same gathered A, bit for bit on every rank):
//   bsp        ncclAllGather, then cuBLASLt. NCCL gets the registered symmetric window or plain
//              buffers per AgmmConfig::bsp_symmetric (the benchmark runs both). gather_dim 1 adds a
//              pass that interleaves the gathered [world][m][k/world] blocks into [m, k].
//   bsp-own    the same with our GEMM (ops/gemm.h) instead of cuBLASLt.
//   decomposed a begin barrier, then copy-engine copies of the shard into every peer's gathered A,
//              each followed by a copy-engine write of the arrival flag (no SM moves data or
//              signals); cuBLASLt per source shard as it arrives, this rank's shard first
//              (gather_dim 0; for shards of <= kDecEarlyGemmMaxRows rows that one does not wait
//              for the barrier). gather_dim 1 cannot be split by source without a split-K sum, so it
//              waits for every shard and runs one cuBLASLt. gather_dim 0: this rank's own slot of
//              the gathered A (unless in place) is read back over NVLink from the first peer's copy,
//              after the peer copies, so no local copy competes with cuBLASLt for HBM.
//   pull       the shard goes into this rank's own slot of its gathered A (unless in place), a
//              begin barrier, then our GEMM's producer loads every A tile straight from the
//              gathered A of the rank holding it (TMA over NVLink: one tensor map per rank), tiles
//              of this rank's shard first (gather_dim 0) or, without split-K, each k-loop from this
//              rank's columns on (gather_dim 1); meanwhile the copy engine copies the peers' shards into this rank's
//              gathered A (the one returned). An end barrier: no peer still reads this rank's slot
//              when the launch ends. Remote loads are not cached in this GPU's L2, so each A tile
//              crosses NVLink once per n-block (N / BN times the shard bytes): correct everywhere
//              it runs, slow wherever N spans many n-blocks. NotSupported unless every tile reads
//              one rank (make_pull_plan) and for more than agmm::kPullMaxWorld ranks.
//   push       a push kernel on a few SMs copies the shard into this rank's gathered A and every
//              peer's, piece by piece, raising a per-(source, piece) epoch flag after each; our GEMM
//              runs on the other SMs at the same time, its producer waiting for a piece's flag
//              before the first TMA load that reads it, tiles of this rank's shard first, then
//              rank+1's, rank+2's, ...
//   sm-specialized  push's protocol in one persistent kernel: its first CTAs (push's CTA count,
//              rounded up to whole clusters of the GEMM config) copy the pieces and raise the flags
//              as the push kernel does, and the waiting GEMM runs on the CTAs after them. No second
//              stream, no fork and join; the block scheduler dispatches the movers first.
//   fused-ce   the copy engine moves the shards in a few row chunks, each followed by a copy-engine
//              write of its flag (no SM moves data or signals), and our GEMM runs once over the
//              whole gathered A on every SM, its producer waiting for a chunk's flag before the
//              first TMA load of it: this rank's rows first, then rank+1's, ... (gather_dim 0);
//              gather_dim 1: where shards are whole 64-column k-blocks, each tile's k-loop starts
//              at this rank's columns and wraps around, so every CTA multiplies the shard this
//              rank holds while the others arrive (else it runs from column 0) (C's fp32
//              sums then run in a different k order on each rank: equal to rounding, not bits).
//              No per-shard GEMM launches, no tail of a first GEMM to wait out.
//   ksplit     gather_dim 1 only (NotSupported for 0): that split-K sum. Each rank multiplies its
//              A_shard by B's matching K rows (1/world of B, 1/world of the FLOPs) into an fp32
//              partial P_rank [m, n], the partials travel to every peer, and every rank writes
//              C = P_0 + P_1 + ... + P_{world-1}, summed in rank order in fp32 and rounded once: C
//              is the same bits on every rank (not the other variants' bits: another summation
//              order). Needs AgmmArgs::b_replicated: each rank multiplies by its own copy of B's K
//              rows (InvalidArgument otherwise), and AgmmConfig::ksplit_max_m / ksplit_max_n
//              capacity (InvalidArgument naming them otherwise). Partial slots and inboxes
//              alternate by launch parity with no handshake. Three paths, by M:
//              - skinny (M <= agmm::kSkinnyMaxM = 32): the whole op is one kernel per rank
//                (make_ksplit_skinny_plan: one CTA per 32-column slice of C, all resident). Each
//                CTA multiplies A_shard by its slice of B's rank rows on tensor cores (fp32),
//                sends the partial and its range of A_shard to every peer as low-latency lines
//                (data and epoch in one 16-byte store: no fence, no flag), waits (bounded) for the
//                peers' lines of its slice, writes C and copies the peers' A lines into this
//                rank's gathered A (no rank writes a peer's gathered A on this path).
//              - two-kernel (kSkinnyMaxM < M < agmm::kBandsMinM = 512): cuBLASLt into P_rank,
//                then one exchange kernel (make_ksplit_plan: one CTA per slice of P, on the
//                share less the side gather's SMs, ksplit_exchange_sms(); a programmatic
//                dependent launch, so it starts during the GEMM's tail). For small
//                partials (agmm::ksplit_owner_sums: by the bytes it saves, which grow with the
//                world), all-to-all: every rank sends its partial slice to every peer, raises a
//                flag, and sums every slice itself. Else reduce-scatter + all-gather: rank
//                j % world owns slice j's sum, the others store their partial slice into the
//                owner and raise its flag, the owner sums in
//                rank order, writes C and stores the rounded slice into every peer with a second
//                flag, and they copy it into C (fewer bytes, one more flag latency). Beside the
//                GEMM, on the op's side stream, a block all-gather of the A shards on
//                side_gather_ctas() SMs at most (agmm::kSideGatherCtas on a whole GPU;
//                stores into a peer once it raised its "free" flag for this launch, as push).
//              - bands (M >= kBandsMinM): our GEMM's fp32 epilogue stores each 64-row band of
//                P_rank into this rank's partial and straight into every peer's slot (whole
//                128-byte rows), then raises the band's flag there (release after the stores),
//                while the GEMM goes on; a band sum kernel (no more CTAs than the share has SMs)
//                waits (bounded) for every peer's band and writes C. A_shard goes into every peer's
//                gathered A by copy engine on the op's side stream after a begin barrier (as
//                decomposed), during the GEMM; that stream then waits for the peers' shards.
//              TAXFREE_AGMM_KSPLIT_PATH=two-kernel or bands in the environment forces that path at
//              every M, TAXFREE_AGMM_KSPLIT_EXCHANGE=all-to-all or owner-sums the two-kernel path's
//              exchange (read at each launch; the same on every rank; another value:
//              InvalidArgument).
//   nsplit     gather_dim 1 only (NotSupported for 0), B replicated and within ksplit's capacity
//              (InvalidArgument otherwise, as ksplit): C's columns are cut into world blocks
//              (make_nsplit_plan) and rank r computes block r over the whole K, then the blocks
//              are all-gathered. The copy engine sends A_shard into every peer's gathered A after a
//              begin barrier, each copy followed by its arrival flag (as decomposed), while
//              cuBLASLt multiplies this rank's own shard by B's matching K rows and block columns
//              into an fp32 block (nsplit_partial_floats, device memory); each peer's shard, once
//              arrived, adds its K rows to it in fp32 (cuBLASLt again, in the order rank+1,
//              rank+2, ...; one rank: its one product straight into C). Then one kernel (a
//              programmatic dependent launch) rounds the block into C once, stores it into every
//              peer's receive buffer (ksplit's own partial buffer) with one epoch flag per (source,
//              CTA), and copies each peer's block from there into C. Moves the shards plus M x N 16-bit values per rank (ksplit moves M x N fp32
//              partials); C is the same bits on every rank. Shares ksplit's launch sequence.
//   auto       one of the above per shape, from a table of measurements (choose_agmm_variant).
//
// Contract:
//  - Collective: every rank constructs the op with the same config and calls launch() with the
//    same variant, shape (m, n, k, gather_dim, dtype), B layout and b_replicated in the same order
//    (plans, and the ksplit band flags they index, depend on them). Pointers and strides may differ
//    per rank. Checked across ranks only in the launch check mode
//    (TeamOptions::check_launches: describe_agmm_launch); otherwise a mismatch is undefined.
//  - M, N in [1, 2^31), K in [1, 2^30 - 8] (a gathered row, K rounded up to 8 elements, is one
//    copy-engine pitch of at most 2^31 - 1 bytes); gather_dim 0 needs M divisible by the world,
//    gather_dim 1 K divisible by it with K / world a multiple of 8 ("divisible" in the message).
//  - A_shard, B, C: device memory of this rank, 16-byte aligned, row strides multiples of 8
//    elements (A_shard's at most 2^30 - 1 elements: the copy engine's pitch). C must not overlap A_shard,
//    B or the op's buffers and flags, nor B the op's buffers and flags. A_shard may lie anywhere
//    outside the op's buffers and flags (symmetric heap or not), or exactly at local_slot() with its
//    stride (in place: no local copy).
//  - push and sm-specialized, with push_ctas 0 (the per-shape choice), need a share of more than
//    4 SMs (NotSupported); a configured push_ctas must leave the GEMM an SM, sm-specialized's
//    (rounded up to whole clusters of the GEMM) one cluster (InvalidArgument).
//  - launch() validates everything first (throws taxfree::Error, InvalidArgument naming the
//    constraint, e.g. "divisible" for a shape the ranks cannot split) and then enqueues on `stream`
//    without blocking; it returns where the gathered A of this launch lives (an op buffer, valid
//    until the next launch of this op). When the stream reaches the end of the launch, C and the
//    gathered A are complete on this rank and A_shard may be overwritten.
//  - Epochs, not resets: the fused variants keep their launch counters on the device, so launches
//    can run back to back and inside CUDA graphs (capture and replay) with no host work between.
//    Launches of one op are ordered on one stream per rank: the epochs depend on it, and the
//    variants that fork to the op's side stream share one set of events.
//  - A peer that never delivers ends this rank's waits at the team's deadline with a diagnostic
//    (Team::sync reports it).
//  - ksplit's exchange kernel and its skinny kernel assume their CTAs (<= what the GPU holds at
//    once) can all be resident at once, as when
//    no other kernel holds the SMs; a CTA that cannot start delays its peers' CTAs of the same slice
//    (bounded by the deadline, never a silent wrong result).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/ops/all_gather_matmul_plan.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/rank_share.h"

namespace taxfree {

class Team;

enum class AgmmVariant { bsp, bsp_own, decomposed, pull, push, sm_specialized, fused_ce, ksplit, nsplit, automatic };
// "bsp", "bsp-own", "decomposed", "pull", "push", "sm-specialized", "fused-ce", "ksplit", "nsplit",
// "auto"; throws InvalidArgument for unknown names.
AgmmVariant parse_agmm_variant(const std::string& name);
const char* variant_name(AgmmVariant v);

struct AgmmConfig {
  int64_t max_m = 16384;       // capacity of the gathered A (rows)
  int64_t max_k = 8192;        // capacity of the gathered A (columns)
  bool bsp_symmetric = false;  // bsp / bsp-own: NCCL on the symmetric window (true) or plain buffers
  int push_ctas = 0;           // push: SMs for the push kernel; 0 = choose per shape (make_push_plan)
  int64_t col_chunk = 0;       // push: piece width in columns, a multiple of 64 (wider than the shard:
                               // one piece across it); 0 = per shape
  int side_gather_ctas = 0;    // ksplit's two-kernel path: SMs for the A gather beside the GEMM, at
                               // most agmm::kKsplitMaxCtas (and half the rank's share when used:
                               // side_gather_ctas()); 0 = side_gather_ctas()'s default
  // ksplit: capacity of the fp32 partials, (2 * (world - 1) + 1) * ksplit_max_m * ksplit_max_n * 4
  // bytes of heap, plus the skinny path's line inboxes (ksplit_heap: 9 MiB per peer at the
  // defaults and world 2); 201 MiB for 2 ranks at the defaults, about 1.0 GiB for 8 (the default
  // heap is max(4, world + 2) GiB). nsplit's fp32 block of C takes nsplit_partial_floats * 4 bytes
  // of device memory beside it (32 MiB for 2 ranks at the defaults; none for 1). 0 in either: no
  // ksplit or nsplit buffers; ksplit and nsplit launches are rejected and auto never picks them.
  int64_t ksplit_max_m = 1024;
  int64_t ksplit_max_n = 16384;
};

// The checks AllGatherMatmul's constructor makes on its config, for callers that want them before
// building one (the bench, before any rank starts): capacities >= 1, push_ctas >= 0, col_chunk a
// multiple of 64 (0: per shape), side_gather_ctas in [0, agmm::kKsplitMaxCtas], ksplit_max_m / _n
// in [0, 2^31). Throws InvalidArgument naming the field and its value. Host only, no GPU. (A
// push_ctas that leaves the GEMM no SM is refused by the plan, which knows the SM count.)
void validate_agmm_config(const AgmmConfig& config);

struct AgmmArgs {
  const void* a_shard = nullptr;
  int64_t lda_shard = 0;  // row stride of A_shard, elements (>= its columns)
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t m = 0, n = 0, k = 0;  // of the whole product: C [m, n], gathered A [m, k]
  int gather_dim = 0;
  gemm::DType dtype = gemm::DType::bf16;
  gemm::BLayout b_layout = gemm::BLayout::nk;
  // The caller promises B holds the same values on every rank (a replicated weight). ksplit needs
  // it (it multiplies each shard by its own rank's K rows of B) and auto picks ksplit only then.
  bool b_replicated = false;
};

// Where a launch left the gathered A: [m, k] at ptr with row stride ld (elements).
struct GatheredA {
  const void* ptr = nullptr;
  int64_t ld = 0;
};

// Geometry of one shard for `world` ranks; throws InvalidArgument naming "divisible" when the
// gathered dimension does not split evenly (and for the other shape rules). Pure.
struct ShardShape {
  int64_t rows, cols;  // of A_shard
  int64_t ld;          // row stride of the gathered A: k rounded up to 8 (16-byte rows)
};
ShardShape agmm_shard_shape(int64_t m, int64_t k, int gather_dim, int world);

// All argument checks that need no Team (shape, dtype, layout, pointers, strides, capacity,
// overlaps between the caller's buffers); throws InvalidArgument. Pure.
void validate_agmm_args(const AgmmArgs& args, int world, const AgmmConfig& config);

// The bytes A_shard, B and C span (first element to the end of the last row, at their strides):
// what the aliasing checks compare. Pure.
struct AgmmOperandRanges {
  ByteRange a_shard, b, c;
};
AgmmOperandRanges agmm_operand_ranges(const AgmmArgs& args, int world);

// What the push variant runs for a shape: the GEMM config (on the SMs left over), the push
// kernel's CTAs and the piece grid. Pure; `num_sms` is the GPU's SM count.
struct PushPlan {
  gemm::GemmConfig gemm;  // max_ctas = num_sms - push_ctas
  int push_ctas = 0;
  agmm::PieceGrid grid;
};
PushPlan make_push_plan(const AgmmArgs& args, int world, const AgmmConfig& config, int num_sms);
// The piece flags push and sm-specialized need at most for any shape within the capacity: a piece
// is at least 64 columns and min(M, 64) rows (the GEMM's bm: 64 or more, or a swap-AB tile's, which
// covers M), so a shard holds at most ceil(max_m / 64) x ceil(max_k / 64) pieces. Pure.
int64_t push_flag_capacity(int64_t max_m, int64_t max_k, int world);
// sm-specialized: the push plan with push_ctas rounded up to whole clusters of the GEMM config
// (the movers are CTAs of the GEMM kernel) and max_ctas the SMs left after them. Pure.
PushPlan make_sm_specialized_plan(const AgmmArgs& args, int world, const AgmmConfig& config, int num_sms);

// The tile order of the GEMM that waits for pieces (push, sm-specialized, fused-ce) on `rank`:
// gather_dim 0 starts RotatedOrder at this rank's shard, in m-blocks of the config's cluster tiles
// (bm x cluster_m rows, what the GEMM's order walks), and keeps the rasterisation group inside one
// shard (at most the shard's whole cluster tiles), so the first wave multiplies rows this rank
// already holds instead of waiting for a peer's; gather_dim 1: no rotation, the config's group.
// Pure.
struct WaitingGemmOrder {
  int first_m = 0;
  int group_m = 1;
};
WaitingGemmOrder waiting_gemm_order(const AgmmArgs& args, const gemm::GemmConfig& cfg, int rank, int world);

// What fused-ce runs for a shape: our GEMM on every SM (whole tiles) and the row chunks the shards
// travel in (one piece per chunk, all columns of the shard; kFusedCeRowChunks at most). Pure.
inline constexpr int kFusedCeRowChunks = 4;
struct FusedCePlan {
  gemm::GemmConfig gemm;
  agmm::PieceGrid grid;
};
FusedCePlan make_fused_ce_plan(const AgmmArgs& args, int world, int num_sms);

// What pull runs for a shape: our GEMM (the heuristic's config, split-K included; the waiting
// GEMMs' tile order) whose producer reads each A tile from the rank holding it, and how many m-blocks (gather_dim 0) or
// k-blocks (gather_dim 1) each shard spans. Throws NotSupported when a tile would read two ranks
// (gather_dim 0: M / world not a multiple of the config's bm; gather_dim 1: K / world not a
// multiple of 64) and for more than agmm::kPullMaxWorld ranks (after agmm_shard_shape's checks).
// Pure.
struct PullPlan {
  gemm::GemmConfig gemm;
  int source_unit = 1;
};
PullPlan make_pull_plan(const AgmmArgs& args, int world, int num_sms);

// What ksplit runs for a shape: the slices of its exchange kernel (one CTA each, at most `num_sms`).
// Throws NotSupported for gather_dim 0, InvalidArgument naming b_replicated when it is false and
// naming ksplit_max_m / ksplit_max_n for a shape over the op's capacity (after the checks of
// agmm_shard_shape). Pure.
agmm::KsplitSlices make_ksplit_plan(const AgmmArgs& args, int world, const AgmmConfig& config, int num_sms);

// CTAs of ksplit's side gather (the two-kernel path's block all-gather of the A shards beside its
// GEMM) on a share of `num_sms` SMs: AgmmConfig::side_gather_ctas when set, else an eighth of the
// SMs, from 1 to agmm::kSideGatherCtas (16 on a 132-SM GPU); at most half the share either way
// (but never below 1: a share of one SM is overfilled, one gather and one exchange CTA). It
// scales with the share because its CTAs wait for peers: W ranks simulated on one GPU must fit
// their waiting grids together. Pure.
int side_gather_ctas(const AgmmConfig& config, int num_sms);
// SMs the two-kernel path's exchange kernel may fill (make_ksplit_plan's num_sms): the share less
// the side gather, which may still wait beside it. Pure.
int ksplit_exchange_sms(const AgmmConfig& config, int num_sms);

// What ksplit's skinny path runs for a shape (m <= agmm::kSkinnyMaxM): the column slices, one CTA
// per slice up to `resident_ctas` (CTAs of the kernel the GPU holds at once: SMs x CTAs per SM,
// from the occupancy API; co-residency is what makes the cross-rank waits deadlock-free), and the
// MMA row tiles. Throws as make_ksplit_plan, and InvalidArgument naming M when m > kSkinnyMaxM or
// resident_ctas < 1. Pure.
agmm::KsplitSkinny make_ksplit_skinny_plan(const AgmmArgs& args, int world, const AgmmConfig& config,
                                           int resident_ctas);

// What nsplit runs for a shape: C's column blocks, one per rank, and its all-gather CTAs (one per
// row, at most num_sms and kKsplitMaxCtas). Throws as make_ksplit_plan (naming nsplit). Pure.
agmm::BlockGatherPlan make_nsplit_plan(const AgmmArgs& args, int world, const AgmmConfig& config, int num_sms);

// The heap ksplit's buffers take (the constructor allocates exactly this when enabled): one fp32
// partial of ksplit_max_m x ksplit_max_n (rounded up to 8) for this rank, 2 * (world - 1) for the
// peers' (two parities), and the flags. Zeros when ksplit is disabled. Pure.
// The skinny path's LL inbox adds, per parity and per peer source, skinny_partial_lines partial
// lines (min(kSkinnyMaxM, ksplit_max_m) rows x ksplit_max_n rounded up to a slice, 16 bytes per 2
// floats) and skinny_a_lines A lines (those rows x ceil(max_k / world) columns, 16 bytes per 4
// elements): 2 * (world - 1) * 16 * (skinny_partial_lines + skinny_a_lines) bytes.
struct KsplitHeap {
  int64_t partial_floats = 0;        // one partial slot
  int64_t skinny_partial_lines = 0;  // per sender and parity
  int64_t skinny_a_lines = 0;        // per sender and parity, after the partial lines
  int64_t band_flags = 0;            // per source: the band path's 64 x 64 bands within capacity
  int64_t bytes = 0;                 // everything
};
KsplitHeap ksplit_heap(const AgmmConfig& config, int world);

// nsplit's fp32 partial, in floats: ksplit_max_m rows of the widest column block make_nsplit_plan
// cuts at ksplit_max_n (device memory, not heap: only this rank reads and writes it; allocated only
// for two ranks or more). 0 when ksplit is disabled. Pure.
int64_t nsplit_partial_floats(const AgmmConfig& config, int world);

// The variant `auto` runs for a launch on `world` ranks (a table filled from measurements), among
// those the arguments and the op's config allow (ksplit only with b_replicated, within capacity).
AgmmVariant choose_agmm_variant(const AgmmArgs& args, int world, const AgmmConfig& config);

// What the launch check mode (RankShare::check_launch) compares across ranks for a launch: the
// variant asked for and the one that runs, the shape (m, n, k, gather_dim, dtype), B's layout and
// b_replicated, the op's config and the ksplit environment knobs; no pointers or strides (they may
// differ). Pure but for the environment.
std::string describe_agmm_launch(AgmmVariant requested, AgmmVariant runs, const AgmmArgs& args,
                                 const AgmmConfig& config);

class AllGatherMatmul {
 public:
  // Collective: allocates the gathered A (and the BSP staging buffers) in the symmetric heap or in
  // plain device memory, the ksplit partials (when enabled), the flags and launch sequences; ends
  // with a host barrier. The heap part is not returned when the op is destroyed (the heap is a
  // stack): take Team::heap().mark() before constructing and release it after the op is gone.
  // Blocks: synchronizes the device (zeroed flags in memory before the barrier lets a peer write
  // them) and the barrier; the destructor waits for the op's side stream (its kernels end by their
  // own deadlines).
  explicit AllGatherMatmul(Team& team, AgmmConfig config = {});
  // The same on a rank share (rank_share.h): tests run W simulated ranks on one GPU this way. The
  // variants that call NCCL (bsp, bsp-own, and auto where it picks them) throw NotSupported on a
  // share without a communicator.
  AllGatherMatmul(RankShare share, AgmmConfig config);
  ~AllGatherMatmul();
  AllGatherMatmul(const AllGatherMatmul&) = delete;
  AllGatherMatmul& operator=(const AllGatherMatmul&) = delete;

  GatheredA launch(AgmmVariant variant, const AgmmArgs& args, cudaStream_t stream);
  // This rank alone (not collective): runs on `stream` the cuBLASLt GEMMs launch(variant, args)
  // would run, with the same arguments (and grows this stream's split-K workspace where ksplit's
  // band path needs it), and nothing else: their kernels are loaded and their plans
  // made before a launch that must not stall. cuBLASLt loads a kernel at its first use, and the
  // driver may wait for the device to go idle first, which never comes while another rank's
  // kernels on the same GPU wait for this one (ranks simulated on one GPU). Touches no peer; leaves
  // meaningless values in C and this rank's op buffers. Variants of our kernels only: validate().
  // Throws as launch() would.
  void warm_up(AgmmVariant variant, const AgmmArgs& args, cudaStream_t stream);
  // validate_agmm_args plus the checks that need the op (A_shard in place or apart from the op's
  // buffers). Throws InvalidArgument.
  void validate(const AgmmArgs& args) const;

  // Where this rank's shard sits in the op's gathered A (heap): A_shard passed here with stride
  // local_slot().ld is used in place (no local copy) by every variant but bsp on plain buffers and
  // bsp at gather_dim 1 (which gathers into staging first).
  GatheredA local_slot(int64_t m, int64_t k, int gather_dim) const;
  const AgmmConfig& config() const { return config_; }
  // Fills every gathered / staging buffer with `byte` (tests and benchmarks poison them with 0xFF,
  // a NaN pattern, so a piece that never lands is caught). Call between launches with a barrier of
  // every rank on each side (Team::device_barrier): before, because a peer's launch may still be
  // reading from them (decomposed at gather_dim 0 and nsplit read their own shard back from rank-1's
  // gathered A, with no barrier at their end); after, because the peers' next launch writes into them.
  void fill_buffers(int byte, cudaStream_t stream);
  // Fault injection for tests: this rank's ksplit, nsplit, push and sm-specialized launches never
  // raise the peers' partial / block / piece flags (the peers' waits end at the deadline with a
  // diagnostic naming this rank).
  void set_skip_signal(bool skip) { skip_signal_ = skip; }

 private:
  struct Impl;
  GatheredA launch_bsp(const AgmmArgs& args, bool own_gemm, cudaStream_t stream);
  GatheredA launch_decomposed(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_pull(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_push(const AgmmArgs& args, bool movers_in_gemm, cudaStream_t stream);
  GatheredA launch_fused_ce(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_ksplit(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_ksplit_skinny(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_ksplit_bands(const AgmmArgs& args, cudaStream_t stream);
  GatheredA launch_nsplit(const AgmmArgs& args, cudaStream_t stream);

  RankShare share_;
  AgmmConfig config_;
  bool skip_signal_ = false;
  bool warm_only_ = false;  // warm_up(): the launch functions run their cuBLASLt GEMMs only
  std::unique_ptr<Impl> impl_;
};

}  // namespace taxfree
