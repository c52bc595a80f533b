// flash_decode: split-KV decode attention over this rank's slice of every sequence (partial
// output + LSE), the cross-rank LSE combine, the sequence partition, and (end of this file) the
// FlashDecode op that runs the whole thing across the ranks of a Team, or of any RankShare
// (`bsp` and `fused`).
//
//   plan  = plan_decode(args, cfg);                       // validates; picks the split count
//   ws    = device allocation of plan.workspace_bytes, zeroed once (init_decode_workspace)
//   launch_decode_partial(args, plan, ws, bytes, stream); // one kernel; repeatable, graph-safe
//   ... gather the rank partials (o_part, lse_part) of all ranks ...
//   launch_combine(cargs, stream);                         // final output on every rank
//
// Definitions (all ranks, all levels): for query head h of sequence b and a token set J,
//   lse = log(sum_{j in J} exp(s_j)),   s_j = softmax_scale * q_h . k_j   (natural log, fp32)
//   o   = sum_{j in J} exp(s_j - lse) * v_j                             (normalised, fp32)
// An empty J gives lse = -inf and o = 0; combining only empty partials gives lse = -inf, o = 0.
// Query head h uses KV head h / (q_heads / kv_heads).
//
// Every launch function validates all arguments first and throws taxfree::Error
// (Status::InvalidArgument, message naming the constraint and the bad value) before touching the
// GPU; then it launches on `stream` without synchronising. The decode and fused kernels go as
// programmatic dependent launches: their CTAs may be placed while the kernel ahead of them on
// `stream` finishes (its tail hides their launch), and they touch no memory before that kernel has
// completed, so stream order means what it always does. Neither lets the kernel behind it start
// early (no griddepcontrol.launch_dependents): what follows them starts after they end.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/runtime/dtype.h"
#include "taxfree/runtime/gpc_layout.h"
#include "taxfree/runtime/rank_share.h"

namespace taxfree {
class Team;
}

namespace taxfree::flash_decode {

using taxfree::DType;  // runtime/dtype.h: the library's one element type

// K/V cache layouts (D = head_dim, P = page_size):
//   contiguous  [batch][kv_heads][capacity][D]
//   paged_hnd   [num_pages][kv_heads][P][D]    (FlashInfer "HND")
//   paged_nhd   [num_pages][P][kv_heads][D]    (vLLM / FlashInfer "NHD")
// Paged caches map token t of sequence b to page block_table[b*max_pages_per_seq + t/P].
enum class KvLayout { contiguous, paged_hnd, paged_nhd };

inline constexpr int kMinPageSize = 16;   // a 16-token tile never straddles a page
inline constexpr int kMaxPageSize = 256;
inline constexpr int kMaxGqaRatio = 16;   // query heads per KV head: the MMA's 16 rows
inline constexpr int kMaxSplits = 64;     // per (sequence, KV head); also the most ranks combined
inline constexpr int kMaxSplitWaves = 4;  // choose_splits: split CTAs past one per SM, in waves
inline constexpr int kMaxWorld = 64;

// validate_decode_args' limits beyond the field comments below (each an InvalidArgument naming the
// value): batch and kv_heads <= 65535; a cache of at most 2^30 tokens per sequence (capacity, or
// max_pages_per_seq x page_size); max_len <= that capacity; slices inside it.
struct DecodeArgs {
  // Shape.
  int batch = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;              // 64 or 128
  DType dtype = DType::bf16;     // of q, k, v and out
  float softmax_scale = 0.f;     // > 0; 0 means 1/sqrt(head_dim)

  // Inputs (device memory, 16-byte aligned).
  const void* q = nullptr;       // [batch][q_heads][head_dim]
  const void* k = nullptr;       // per `layout`
  const void* v = nullptr;
  KvLayout layout = KvLayout::contiguous;
  int capacity = 0;              // contiguous: tokens per sequence in storage (the seq dim)
  int page_size = 0;             // Paged: power of two in [16, 256]
  int num_pages = 0;             // Paged: pages in k (and in v)
  int max_pages_per_seq = 0;     // Paged: row length of block_table
  const int32_t* block_table = nullptr;  // Paged: [batch][max_pages_per_seq] (device)

  // This launch's slice of each sequence: tokens [slice_start[b], slice_start[b] + slice_len[b])
  // of the stored sequence (slice_start null = 0). A rank holding only its own tokens passes its
  // local lengths; one cache simulating several ranks passes each rank's [start, len).
  const int32_t* slice_start = nullptr;  // [batch] (device) or null
  const int32_t* slice_len = nullptr;    // [batch] (device)
  int max_len = 0;               // >= every slice_len; sizes the split heuristic only

  // Optional host copies of the device arrays above: when non-empty they are validated (lengths
  // >= 0, slices inside the capacity; with host_slice_len, and host_slice_start where slice_start
  // is given, the pages each slice touches in [0, num_pages): without them nothing says which
  // entries are read, and the others may hold anything, so none is checked), and host_slice_len
  // plans the splits of a ragged batch (choose_splits with lengths: 0.77-1.0 of the time planned
  // from max_len, r205) and the order its CTAs start in (longest_first). They must hold the same
  // values. Without them the device values are trusted as far as memory goes: a slice past the
  // capacity is clamped to it, and an entry a slice reads outside [0, num_pages) reads page 0; the
  // output is then unspecified, but nothing outside the cache is read.
  std::span<const int32_t> host_slice_start;
  std::span<const int32_t> host_slice_len;
  std::span<const int32_t> host_block_table;

  // Outputs (device memory; any subset, at least one). Outputs must not overlap inputs (q, the
  // cache's k and v, the slice arrays, the block table) or each other: InvalidArgument naming both.
  float* o_part = nullptr;       // [batch][q_heads][head_dim] fp32, 16-byte aligned
  float* lse_part = nullptr;     // [batch][q_heads] fp32
  void* out = nullptr;           // [batch][q_heads][head_dim] dtype, 16-byte aligned
};

struct DecodeConfig {
  int num_splits = 0;   // 0: heuristic; else 1..kMaxSplits (tuning/tests)
  int num_sms = 0;      // heuristic input; 0: the current device's
  int waves = 1;        // heuristic target while batch x kv_heads <= waves x num_sms: that many CTAs
};

struct DecodePlan {
  int num_splits = 1;          // grid.x of the decode kernel
  size_t workspace_bytes = 0;  // 0 when num_splits == 1
};

// Validates `args` and `cfg`, then picks the split count (queries the current device's SM count
// when cfg leaves both num_splits and num_sms 0).
DecodePlan plan_decode(const DecodeArgs& args, const DecodeConfig& cfg = {});

// Workspace for `num_splits` splits: [counters | split LSEs | split outputs], 256-byte aligned
// sections. The counters must be 0 before the first launch; kernels leave them 0.
size_t decode_workspace_bytes(int batch, int q_heads, int kv_heads, int head_dim, int num_splits);

// Zero the whole workspace (once after allocating it).
void init_decode_workspace(void* workspace, size_t bytes, cudaStream_t stream);

// Partial decode attention of this launch's slices. `workspace` (bytes >= plan.workspace_bytes,
// 256-byte aligned, initialised) may be null when plan.num_splits == 1. One workspace must not be
// used by two launches that may run concurrently.
void launch_decode_partial(const DecodeArgs& args, const DecodePlan& plan, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream);

// Checks only (what launch_decode_partial checks before launching); for callers that build their
// own kernels on these pieces.
void validate_decode_args(const DecodeArgs& args);

struct CombineArgs {
  int world = 0;
  int batch = 0;
  int q_heads = 0;
  int head_dim = 0;
  DType dtype = DType::bf16;
  // Rank r's partial of row i = b*q_heads + h: o_parts[r*o_rank_stride + i*head_dim + d] and
  // lse_parts[r*lse_rank_stride + i]. 0 strides mean dense: batch*q_heads*head_dim, batch*q_heads.
  const float* o_parts = nullptr;   // 16-byte aligned; o_rank_stride a multiple of 4
  int64_t o_rank_stride = 0;
  const float* lse_parts = nullptr;
  int64_t lse_rank_stride = 0;
  // Outputs (at least one). No output may overlap the partials (every rank's, as the strides
  // place them) or another output, in place included: CTAs read partials that others' rows
  // overwrite. InvalidArgument naming both.
  void* out = nullptr;       // [batch][q_heads][head_dim] dtype, or null
  float* o_out = nullptr;    // [batch][q_heads][head_dim] fp32, or null
  float* lse_out = nullptr;  // [batch][q_heads] fp32, or null
};

void launch_combine(const CombineArgs& args, cudaStream_t stream);
void validate_combine_args(const CombineArgs& args);

// The split count the heuristic picks (pure). G = batch x kv_heads groups.
// - G <= num_sms x waves: about one CTA per SM's worth of splits, num_sms x waves / G (b=1: 11
//   splits for 12 KV heads, 16 for 8; b=4 with 12: 2). Every split adds a partial to the merge in
//   the launch's tail, and the decode cost beyond the KV bytes is a per-launch constant
//   (docs/notes/decode-latency.md), so the fewest CTAs that keep HBM busy win: measured on the
//   H200, one CTA per SM beat two (b=1 96/12 8K: 11 splits 18.0 us, 22 splits 22.0 us; b=4: 2
//   splits 59.4 us, 5 splits 60.4 us).
// - G > num_sms x waves: CTAs run in waves of kCtasPerSm x num_sms slots; the fewest splits whose
//   waves are at least 90% full, with G x splits <= kMaxSplitWaves waves and >= 1024 tokens per
//   split (else the fullest, the fewest splits on a tie). A partly filled wave leaves SMs with one
//   CTA beside SMs with two, and those finish late: b=16 96/12 (192 groups) at 8K-512K tokens, 4
//   splits 0.93-0.95 of 1 split's time (r197); b=32 64/8 (256 groups, 97% of a wave) keeps 1.
//   Shorter splits pay each CTA's fixed cost once per wave (4 splits at 1024 tokens: 1.27x, r200).
// Never below one 256-token chunk per split, at most kMaxSplits, at least 1.
int choose_splits(int batch, int kv_heads, int max_len, int num_sms, int waves = 1);
// The same with every sequence's length (plan_decode uses it when DecodeArgs::host_slice_len is
// given): for a ragged batch (longest > 1.2x the mean length) at least enough splits for
// kMaxSplitWaves waves of kCtasPerSm x num_sms CTAs, each split >= 1024 tokens, so short
// sequences' CTAs backfill slots while the longest run (r205, lengths in [1, kv]: 0.77-0.99 of the
// time planned from the longest alone on 9 ragged shapes, b=8 64/8 64K 230 -> 188 us, 0.93 of the
// floor); else as above with max_len the longest.
int choose_splits(int kv_heads, std::span<const int32_t> lens, int num_sms, int waves = 1);

// The order in which a launch starts the sequences of a batch of these lengths: longest first,
// equal lengths in batch order. Under the ragged plan a sequence's CTAs are as long as its splits,
// so in batch order a long sequence late in the batch starts its CTAs last and finishes alone;
// longest first, the short sequences' CTAs fill the slots the long ones leave. Empty (the batch's
// own order) when that is already the order, or past 256 sequences (attention::kMaxOrderedBatch).
// The decode kernels take it from DecodeArgs::host_slice_len when given; the fused kernel only in
// its persistent schedule (the others run every item at once) and in a team of one (its deadlock
// argument needs the same order on every rank, fused_schedule.h).
std::vector<int> longest_first(std::span<const int32_t> lens);

// Rank r's slice [start, end) of a sequence of `len` tokens split contiguously over `world`
// ranks, balanced in units of `align` tokens: with U = ceil(len/align) units, rank r gets
// floor(U/world) units plus one more if r < U % world; slices follow rank order, the last unit may
// be partial, and ranks get empty slices when U < world. Every token lands in exactly one rank.
struct Slice {
  int32_t start = 0;
  int32_t end = 0;
  int32_t len() const { return end - start; }
};
Slice partition_slice(int64_t len, int world, int rank, int align = 1);
// [rank][batch] slices of every sequence.
std::vector<std::vector<Slice>> partition(std::span<const int32_t> lens, int world, int align = 1);

// ---- Across ranks -----------------------------------------------------------------------------
//
// Each rank holds a contiguous slice of every sequence's KV (any lengths, empty slices included)
// and calls FlashDecode::launch with its local DecodeArgs; afterwards `out` holds, on every rank,
// the attention output over the whole sequences (the union of all ranks' slices), bitwise
// identical across ranks. Variants:
//   bsp    decode kernel (local split combine) -> ncclAllGather of one [O | LSE] block per rank
//          -> combine kernel. The blocks live in the symmetric heap, passed to NCCL at their
//          window address (its symmetric path), or in plain device memory (config).
//   fused  one kernel per rank: each (sequence, KV head) group's partial (fp32 O rows + LSE) is
//          sent straight into every peer's inbox as low-latency lines (each 16-byte store
//          carries 8 data bytes and the launch's epoch: no fence, no separate flag); the CTA that
//          sent it polls the peers' lines of that group (deadline) and combines them as they
//          arrive. No host work or reset between steps; CUDA-graph capturable.
//
// Preconditions (collective; checked across ranks only in the launch check mode,
// TeamOptions::check_launches, all but q: describe_flash_decode_launch): every rank constructs the
// op with the same maxima and bsp_buffers, and calls launch with the same variant, batch, heads,
// head_dim, dtype, softmax_scale and q, in the same order. A rank's slices, lengths, layout, cache, num_splits and
// split_merge may differ from its peers' (each rank plans its own splits), except that
// SplitMerge::direct must be every rank's or none's (its lines have their own layout: a rank
// configured otherwise never sees them, and the waits give up at the deadline, naming the rank),
// and so must a fused launch's taking it: it does where batch x kv_heads <= the GPU's SM count
// (direct_merge_applies), so under it the ranks' GPUs must have one SM count.
// Launches of one FlashDecode are ordered on one stream per rank (the epochs depend on it). A fused
// launch needs every CTA of its grid resident at once (it sizes the grid by the kernel's
// occupancy): do not run it beside kernels that hold SMs until it finishes.

enum class FlashDecodeVariant { bsp, fused };
FlashDecodeVariant parse_flash_decode_variant(const std::string& name);  // "bsp" | "fused"; throws InvalidArgument
const char* variant_name(FlashDecodeVariant v);

// Where bsp's gathered blocks live: the symmetric heap (NCCL's symmetric-window kernels; measured
// faster than plain buffers from 1 KiB to 8 MiB per rank on 2xH200) or plain device memory.
enum class BspBuffers { symmetric, plain };

struct FlashDecodeConfig {
  // Largest shapes any launch will use: the buffers are sized for them at construction.
  int max_batch = 0;
  int max_q_heads = 0;
  int max_kv_heads = 0;
  int max_head_dim = 128;  // 64 or 128
  int num_splits = 0;      // splits per (sequence, KV head) inside a rank; 0: heuristic
  BspBuffers bsp_buffers = BspBuffers::symmetric;
  // fused: where a group's splits are merged (FusedPlan says what a launch gets; at the same split
  // count all three give the same bits, and bsp's):
  //   cluster  inside a thread-block cluster (distributed shared memory) when one cluster of 2..16
  //            splits per (sequence, KV head) fits at once on this GPU, one CTA per SM (for slices
  //            up to 16K tokens the heuristic's split count may shrink to fit, to no less than half
  //            of it); otherwise as `global`;
  //   global   through global memory, by the last split to finish (the persistent grid);
  //   direct   not before the exchange: every split sends its raw partial to every rank, and the
  //            rows' owners merge splits and ranks in one step (up to 16 splits). Taken when the
  //            launch has at most min(max rows, 128) rows, at most batch x kv_heads <= SMs groups,
  //            world <= 8 and world x (q_heads / kv_heads) <= 80 (head_dim 128; 81 for 64), the same
  //            answer on every rank; otherwise as `cluster`. Its inbox region takes world x 16 x
  //            min(max rows, 128) x (max_head_dim/2 + 1) x 16 bytes per parity more.
  enum class SplitMerge { cluster, global, direct };
  SplitMerge split_merge = SplitMerge::cluster;
};

// One rank's partial block in bsp's gather buffer (fp32): [O: rows*head_dim | LSE: rows | pad to
// 256 bytes], rows = batch*q_heads, row = b*q_heads + h.
struct GatherLayout {
  int64_t rows = 0;
  int64_t lse_offset = 0;    // floats from the block's start to the LSE section
  int64_t block_floats = 0;  // block stride between ranks; multiple of 64
};
GatherLayout gather_layout(int batch, int q_heads, int head_dim);

// Per-rank memory of a FlashDecode on a GPU of `num_sms` SMs.
struct FlashDecodeBuffers {
  uint64_t fused_inbox_bytes = 0;   // symmetric heap: 2 parities of fused_parity_lines 16-byte lines
  uint64_t fused_parity_lines = 0;  // the merged layout (attention::fused_inbox_span), then the direct one's
  uint64_t fused_direct_begin = 0;  // world x max rows x (max_head_dim/2 + 1): where the direct region starts
  uint64_t fused_direct_sender_lines = 0;  // 16 x min(max rows, 128) x (max_head_dim/2 + 1); 0 unless direct
  uint64_t fused_direct_rows = 0;   // most rows of a direct launch: min(max rows, 128); 0 unless direct
  uint64_t bsp_gather_bytes = 0;    // heap (symmetric) or device memory (plain): [world] blocks
  uint64_t workspace_bytes = 0;     // device memory: split partials of the largest plan
};
FlashDecodeBuffers flash_decode_buffers(const FlashDecodeConfig& cfg, int world, int num_sms);

// Whether a fused launch of this shape takes the direct split merge, given the op's buffers (sized
// for it only under SplitMerge::direct): a function of values every rank shares (the shape, the
// op's maxima, the world, the GPU's SM count), so every rank gives the same answer.
bool direct_merge_applies(const FlashDecodeBuffers& b, int world, int num_sms, int batch, int q_heads, int kv_heads,
                          int head_dim);
// What the launch check mode (RankShare::check_launch) compares across ranks for a launch: the
// variant, batch, heads, head_dim, dtype, the softmax scale (exact), the op's maxima and
// bsp_buffers, whether its split merge is direct, and whether this launch takes the direct merge
// (`direct`: FusedPlan::direct; false for bsp); not the slices, lengths, layout or cache (each
// rank's own). Pure.
std::string describe_flash_decode_launch(FlashDecodeVariant variant, const DecodeArgs& args,
                                        const FlashDecodeConfig& config, bool direct);
// The checks FlashDecode's constructor and launch() make first (InvalidArgument naming the value).
void validate_flash_decode_config(const FlashDecodeConfig& cfg, int world);
// `a` is this rank's DecodeArgs: all of validate_decode_args, plus `out` set, o_part and lse_part
// null (the partials live in the op's buffers), and the shape within cfg's maxima.
void validate_flash_decode_args(const DecodeArgs& a, const FlashDecodeConfig& cfg);

// How a fused launch splits its work (fused_schedule.h): `items` = num_splits x batch x kv_heads
// work items over `grid` = min(items, resident) persistent CTAs, or, when `direct`, over `items`
// resident CTAs that send raw split partials, or, when `cluster` is not 0,
// over `items` CTAs in clusters of `cluster` = num_splits (one cluster per group, splits merged in
// distributed shared memory).
struct FusedPlan {
  int num_splits = 1;
  int64_t items = 0;
  int resident = 0;  // resident CTAs of the fused kernel on this GPU
  int grid = 0;
  int cluster = 0;   // CTAs per cluster; 0: persistent grid
  bool direct = false;  // the direct split merge (FlashDecodeConfig::split_merge)
};

// What one rank's fused kernel may fill: its share of the GPU (RankShare::sm_count; the whole GPU
// on a Team), and what fits on it.
struct FusedDevice {
  int world = 1;
  int num_sms = 0;             // SMs the rank's fused kernel may fill
  int ctas_per_sm = 0;         // resident CTAs per SM of the persistent / clustered kernel
  int direct_ctas_per_sm = 0;  // ... of the direct kernel
  // Clusters of `cluster` CTAs of the clustered kernel resident at once on that share.
  std::function<int(int cluster)> max_clusters;
  // The GPCs as the clustered kernel's clusters see them (unknown: no preference among sizes).
  GpcLayout gpcs;
};

// The fused plan of `a` (validated) given its split plan, the op's config and buffers, and the
// device share: the direct schedule where configured and it fits, else the clustered one where all
// clusters fit at once (of the sizes allowed, the largest; for slices up to 7K tokens the largest
// whose clusters land one per GPC where the layout is known and one does), else the persistent
// grid (fused_schedule.h). Throws NotSupported where the
// share holds no fused CTA.
FusedPlan plan_fused(const DecodeArgs& a, const DecodePlan& plan, const FlashDecodeConfig& cfg,
                     const FlashDecodeBuffers& sizes, const FusedDevice& device);

class FlashDecode {
 public:
  // Collective (every rank, same maxima and bsp_buffers): allocates the fused inbox, bsp's gather
  // buffer (BspBuffers::plain: in device memory instead) and two launch sequences (the epochs, the
  // persistent grid's item tickets) in the share's symmetric heap (released with the heap's
  // mark/release, after the op is destroyed), the split workspace in device memory; zeroes the
  // inbox; host barrier (where the share has one). Plans fill share.sm_count SMs (a Team: the whole
  // GPU); bsp needs the share's NCCL communicator (NotSupported without). Blocks: synchronizes the
  // device (the zeroed inbox is in memory before the barrier lets a peer write it) and the barrier.
  FlashDecode(Team& team, const FlashDecodeConfig& cfg);
  FlashDecode(RankShare share, const FlashDecodeConfig& cfg);
  ~FlashDecode();
  FlashDecode(const FlashDecode&) = delete;
  FlashDecode& operator=(const FlashDecode&) = delete;

  // Validates (InvalidArgument before any launch; out and q must not overlap the op's own buffers
  // and flags), then enqueues on `stream`. Collective.
  void launch(FlashDecodeVariant variant, const DecodeArgs& args, cudaStream_t stream);

  // The bsp pipeline one stage at a time (benchmark tax breakdown): `decode` writes this rank's
  // block, `gather` all-gathers the blocks (collective), `combine` writes `out`. launch(bsp) =
  // decode, gather, combine. Stages called one by one are not compared across ranks in the launch
  // check mode (launch() is).
  enum class Stage { decode, gather, combine };
  void launch_bsp_stage(Stage stage, const DecodeArgs& args, cudaStream_t stream);

  FusedPlan fused_plan(const DecodeArgs& args);  // validates `args`
  const FlashDecodeConfig& config() const { return cfg_; }
  // Fault injection for tests: this rank's fused launches never send their partials to peers.
  void set_skip_signal(bool skip) { skip_signal_ = skip; }
  // Fault injection for tests: this rank's fused CTAs sleep `ns` between sending their partial and
  // reading their peers', so the peers run up to a launch ahead (0: off, the default).
  void set_combine_delay_ns(uint32_t ns) { combine_delay_ns_ = ns; }
  // Diagnostics: fused launches record their timeline into `trace` (device memory of
  // fused_plan(args).grid * taxfree::attention::kFusedTraceEvents uint64, FusedDecodeParams::trace), or
  // nothing when null (the default).
  void set_trace(uint64_t* trace) { trace_ = trace; }

 private:
  int fused_ctas_per_sm(DType dtype, int head_dim, bool paged, bool direct);
  int fused_max_clusters(DType dtype, int head_dim, bool paged, int cluster);
  FusedDevice fused_device(const DecodeArgs& a);
  DecodeConfig split_config() const;
  void require_comm() const;  // NotSupported without NCCL (bsp's gather)
  // validate_flash_decode_args, and out and every input (q, k, v, slice arrays, block table) apart
  // from the op's own memory (its heap part: the inbox peers write, bsp's symmetric gather buffer,
  // the sequences; bsp's plain gather buffer; the split workspace): InvalidArgument naming both.
  // Once per launch: the stages after it plan and launch without checking again.
  void validate(const DecodeArgs& args) const;
  // One bsp stage of `args` already validated (launch validates once for its three stages).
  void enqueue_bsp_stage(Stage stage, const DecodeArgs& args, cudaStream_t stream);
  void launch_fused(const DecodeArgs& args, cudaStream_t stream);

  RankShare share_;
  int device_sms_ = 0;             // of the whole GPU (share_.sm_count may be part of it)
  FlashDecodeConfig cfg_;
  uint4* inbox_ = nullptr;         // heap: fused LL lines, 2 parities of parity_lines_
  FlashDecodeBuffers sizes_{};
  float* bsp_gather_ = nullptr;    // heap or device memory (plain)
  void* workspace_ = nullptr;      // device memory
  size_t workspace_bytes_ = 0;
  dev::LaunchSequence seq_{};      // the fused kernel's epochs
  dev::LaunchSequence work_{};     // the persistent fused schedule's item tickets
  int occupancy_[16] = {};         // fused_ctas_per_sm cache, 0 = not queried yet
  std::map<int, int> max_clusters_;  // fused_max_clusters cache
  GpcLayout gpcs_;                   // of the whole GPU (unknown for a share of it)
  bool skip_signal_ = false;
  uint32_t combine_delay_ns_ = 0;
  uint64_t* trace_ = nullptr;
};

}  // namespace taxfree::flash_decode
