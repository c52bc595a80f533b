// FlashDecode: flash_decode across the ranks of a RankShare, `bsp` (decode -> ncclAllGather -> combine)
// and `fused` (one kernel per rank, fused_decode_kernel.h). Host side: buffers, plans, launches.
#include <nccl.h>

#include <algorithm>
#include <utility>

#include "kernels.h"
#include "taxfree/kernels/attention/fused_schedule.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::flash_decode {
namespace {
bool is_paged(KvLayout l) { return l != KvLayout::contiguous; }
// Index of the fused kernel instantiation (dtype, head_dim, paged), 0..7: the occupancy caches' key.
int instance_index(DType dtype, int head_dim, bool paged) {
  return (dtype == DType::fp16 ? 4 : 0) + (head_dim == 128 ? 2 : 0) + (paged ? 1 : 0);
}
// Longest slice for which a fused plan gives up splits to run clustered (see fused_plan).
constexpr int kClusterShrinkMaxTokens = 16384;
// Longest slice for which a fused plan prefers clusters that land one per GPC (see fused_plan).
constexpr int kClusterOnePerGpcMaxTokens = 7168;
}  // namespace

FlashDecode::FlashDecode(Team& team, const FlashDecodeConfig& cfg) : FlashDecode(team.share(), cfg) {}

FlashDecode::FlashDecode(RankShare share, const FlashDecodeConfig& cfg) : share_(std::move(share)), cfg_(cfg) {
  check_rank_share(share_, "flash_decode");
  validate_flash_decode_config(cfg, share_.world);
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_CUDA(cudaDeviceGetAttribute(&device_sms_, cudaDevAttrMultiProcessorCount, dev));
  TF_REQUIRE(share_.sm_count <= device_sms_, Status::InvalidArgument,
             "flash_decode: rank " << share_.rank << "'s share of " << share_.sm_count << " SMs exceeds the device's "
                                   << device_sms_);
  // Where clusters land (the clustered plan's choice of size): a fact of the whole GPU, of no use
  // to a share of it, whose clusters land among other shares'.
  if (share_.sm_count == device_sms_) gpcs_ = device_gpc_layout(dev);
  const FlashDecodeBuffers bytes = flash_decode_buffers(cfg, share_.world, share_.sm_count);

  // Collective and ordered: the same allocations on every rank (same config, same world). The
  // inbox first and work_ last: validate() takes the op's heap part as the span between them.
  auto& heap = *share_.heap;
  inbox_ = static_cast<uint4*>(heap.allocate(bytes.fused_inbox_bytes, 256, "flash_decode.fused_inbox"));
  sizes_ = bytes;
  if (cfg.bsp_buffers == BspBuffers::symmetric)
    bsp_gather_ = static_cast<float*>(heap.allocate(bytes.bsp_gather_bytes, 256, "flash_decode.bsp_gather"));
  else
    TF_CUDA(cudaMalloc(&bsp_gather_, bytes.bsp_gather_bytes));
  workspace_bytes_ = bytes.workspace_bytes;
  if (workspace_bytes_ > 0) {
    TF_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
    init_decode_workspace(workspace_, workspace_bytes_, nullptr);  // split counters start at 0
  }
  TF_CUDA(cudaMemset(inbox_, 0, bytes.fused_inbox_bytes));  // 0 is no launch's flag (dev::ll_flag)
  TF_CUDA(cudaDeviceSynchronize());
  seq_ = heap.allocate_sequence("flash_decode.sequence");
  work_ = heap.allocate_sequence("flash_decode.work_tickets");
  // Peers write into this rank's inbox only after it is zero.
  if (share_.host_barrier) share_.host_barrier("flash_decode.init");
}

FlashDecode::~FlashDecode() {
  if (workspace_) cudaFree(workspace_);
  if (cfg_.bsp_buffers == BspBuffers::plain && bsp_gather_) cudaFree(bsp_gather_);
  // Heap buffers go back with the heap's release(mark) (stack discipline).
}

int FlashDecode::fused_ctas_per_sm(DType dtype, int head_dim, bool paged, bool direct) {
  int& n = occupancy_[instance_index(dtype, head_dim, paged) * 2 + (direct ? 1 : 0)];
  if (n == 0)
    n = detail::dispatch(dtype, head_dim,
                         [&]<class T, int D>() { return detail::fused_ctas_per_sm_t<T, D>(paged, direct); });
  return n;
}

int FlashDecode::fused_max_clusters(DType dtype, int head_dim, bool paged, int cluster) {
  const int key = instance_index(dtype, head_dim, paged) * 64 + cluster;
  auto it = max_clusters_.find(key);
  if (it == max_clusters_.end())
    it = max_clusters_
             .emplace(key, detail::dispatch(dtype, head_dim,
                                            [&]<class T, int D>() { return detail::fused_max_clusters_t<T, D>(paged, cluster); }))
             .first;
  return it->second;
}

DecodeConfig FlashDecode::split_config() const {
  DecodeConfig dc;
  dc.num_splits = cfg_.num_splits;
  dc.num_sms = share_.sm_count;
  return dc;
}

FusedDevice FlashDecode::fused_device(const DecodeArgs& a) {
  const bool paged = is_paged(a.layout);
  FusedDevice d;
  d.world = share_.world;
  d.num_sms = share_.sm_count;
  d.ctas_per_sm = fused_ctas_per_sm(a.dtype, a.head_dim, paged, false);
  d.direct_ctas_per_sm = fused_ctas_per_sm(a.dtype, a.head_dim, paged, true);
  // A share's part of the clusters the whole GPU holds at once, rounded down, so the shares of
  // ranks on one GPU never claim more than it holds together.
  d.max_clusters = [this, dtype = a.dtype, head_dim = a.head_dim, paged](int c) {
    return int(int64_t(fused_max_clusters(dtype, head_dim, paged, c)) * share_.sm_count / device_sms_);
  };
  d.gpcs = gpcs_;
  return d;
}

void FlashDecode::require_comm() const {
  TF_REQUIRE(share_.comm != nullptr, Status::NotSupported,
             "flash_decode bsp: rank " << share_.rank << "'s share has no NCCL communicator (simulated ranks)");
}

void FlashDecode::validate(const DecodeArgs& a) const {
  validate_flash_decode_args(a, cfg_);
  // The op writes its own memory while a launch reads the inputs and writes out: none may overlap.
  const std::pair<const char*, ByteRange> own[] = {
      {"flags and buffers in the symmetric heap", SymmetricHeap::span_through(inbox_, work_)},
      {"bsp gather buffer", cfg_.bsp_buffers == BspBuffers::plain ? byte_range(bsp_gather_, int64_t(sizes_.bsp_gather_bytes))
                                                                   : ByteRange{}},
      {"split workspace", byte_range(workspace_, int64_t(workspace_bytes_))}};
  const auto inputs = detail::decode_input_ranges(a);
  const ByteRange out = byte_range(a.out, int64_t(a.batch) * a.q_heads * a.head_dim * 2);
  for (const auto& [name, range] : own) {
    TF_REQUIRE(!overlap(out, range), Status::InvalidArgument,
               "flash_decode: out=" << a.out << " overlaps the op's " << name);
    for (const auto& [input, bytes] : inputs)
      TF_REQUIRE(!overlap(bytes, range), Status::InvalidArgument,
                 "flash_decode: " << input << "=" << reinterpret_cast<const void*>(bytes.begin) << " overlaps the op's "
                                  << name);
  }
}

FusedPlan FlashDecode::fused_plan(const DecodeArgs& a) {
  validate(a);
  const DecodePlan plan = detail::plan_validated(a, split_config());
  TF_REQUIRE(plan.workspace_bytes <= workspace_bytes_, Status::Internal,
             "fused plan needs " << plan.workspace_bytes << " workspace bytes, FlashDecode has " << workspace_bytes_);
  return plan_fused(a, plan, cfg_, sizes_, fused_device(a));
}

FusedPlan plan_fused(const DecodeArgs& a, const DecodePlan& plan, const FlashDecodeConfig& cfg,
                     const FlashDecodeBuffers& sizes, const FusedDevice& device) {
  FusedPlan fp;
  fp.num_splits = plan.num_splits;
  fp.items = int64_t(plan.num_splits) * a.batch * a.kv_heads;
  const int64_t groups = int64_t(a.batch) * a.kv_heads;
  using M = FlashDecodeConfig::SplitMerge;
  if (cfg.split_merge == M::direct &&
      direct_merge_applies(sizes, device.world, device.num_sms, a.batch, a.q_heads, a.kv_heads, a.head_dim)) {
    // One resident CTA per (group, split): as many of the plan's splits as fit, up to 16 (a rank's
    // count may differ from its peers'; its lines say it). groups <= SMs: one split always fits.
    fp.resident = device.num_sms * device.direct_ctas_per_sm;
    const int64_t c = std::min<int64_t>({plan.num_splits, attention::kMaxDirectSplits, fp.resident / groups});
    TF_REQUIRE(c >= 1, Status::NotSupported,
               "the direct fused decode needs " << groups << " resident CTAs; this device holds " << fp.resident);
    fp.direct = true;
    fp.num_splits = int(c);
    fp.items = fp.grid = int(c * groups);
    return fp;
  }
  fp.resident = device.num_sms * device.ctas_per_sm;
  TF_REQUIRE(fp.resident >= 1, Status::NotSupported, "the fused decode kernel does not fit on an SM of this device");
  fp.grid = attention::fused_grid(fp.items, fp.resident);
  if (cfg.split_merge == M::global || plan.num_splits < 2) return fp;
  // The clustered schedule (fused_schedule.h): one cluster of C splits per group, at one CTA per SM,
  // when all of them fit at once (its no-deadlock condition). A forced split count is kept or not
  // clustered. The heuristic's may shrink to the largest C that fits, down to half of it, while
  // slices are short: the merge in shared memory saves a constant, but clusters stream KV slower
  // on some GPUs, more so the longer the slice (world 1, 96/12 heads, batch 1, 8 splits either way:
  // clustered 58.6 vs 56.2 us at 32K, r231; auto plans on another H200, r233: 0.3 us faster at 8K,
  // 0.2-0.9 slower at 12K-24K, 1.4-2.3 slower at 32K; 64/8's 9 clusters of 9 were 0.7-1.2 faster up
  // to 32K there but 2.4 slower at 32K on r231's GPU).
  const int hi = std::min(plan.num_splits, attention::kMaxClusterCtas);
  const bool shrink = cfg.num_splits == 0 && a.max_len <= kClusterShrinkMaxTokens;
  const int lo = shrink ? std::max(2, (plan.num_splits + 1) / 2) : plan.num_splits;
  // Of the sizes that fit, the largest, or while slices are short the largest whose clusters land
  // one per GPC where there is one: the scheduler deals clusters round-robin over the GPCs, 64/8's
  // 8 clusters of 9 put two on one GPC (of 8, one on each), and a plan of 9 was measured ~1 us
  // slower to start, then 1/9 faster per token (b=1, 9 vs 8 clusters: 10.90 vs 10.15 us at 4K,
  // 14.75 vs 14.84 at 8K, 22.94 vs 24.12 at 16K, r237; r238 the same within 0.1 us): even below
  // ~7.5K tokens.
  const bool one_per_gpc = a.max_len <= kClusterOnePerGpcMaxTokens;
  int c_fit = 0;
  for (int c = hi; c >= lo; --c) {
    if (device.max_clusters(c) < groups) continue;
    if (c_fit == 0) c_fit = c;
    if (one_per_gpc && device.gpcs.holding(c) >= groups) {
      c_fit = c;
      break;
    }
  }
  if (c_fit > 0) {
    fp.cluster = fp.num_splits = c_fit;
    fp.items = int64_t(c_fit) * groups;
    fp.grid = int(fp.items);
  }
  return fp;
}

void FlashDecode::launch(FlashDecodeVariant variant, const DecodeArgs& a, cudaStream_t stream) {
  TF_REQUIRE(variant == FlashDecodeVariant::bsp || variant == FlashDecodeVariant::fused, Status::InvalidArgument,
             "variant=" << int(variant) << " is not a FlashDecodeVariant");
  if (variant == FlashDecodeVariant::fused) return launch_fused(a, stream);
  validate(a);  // before the first stage is enqueued
  require_comm();
  if (share_.check_launch) share_.check_launch(describe_flash_decode_launch(variant, a, cfg_, false));
  for (Stage s : {Stage::decode, Stage::gather, Stage::combine}) enqueue_bsp_stage(s, a, stream);
}

void FlashDecode::launch_fused(const DecodeArgs& a, cudaStream_t stream) {
  const FusedPlan fp = fused_plan(a);  // validates
  if (share_.check_launch)
    share_.check_launch(describe_flash_decode_launch(FlashDecodeVariant::fused, a, cfg_, fp.direct));
  attention::FusedDecodeParams p{};
  // Only the persistent schedule takes the batch order (the others run every item at once), and
  // only in a team of one: each rank's order follows its own slice lengths, and the schedule's
  // no-deadlock argument needs one order on every rank (fused_schedule.h).
  const bool persistent = fp.cluster == 0 && !fp.direct;
  p.d = detail::make_decode_params(a, fp.num_splits, workspace_, persistent && share_.world == 1);
  p.view = share_.heap->view();
  p.ll = inbox_;
  p.parity_lines = int64_t(sizes_.fused_parity_lines);
  p.rows = int64_t(a.batch) * a.q_heads;
  p.seq = seq_;
  p.work = work_;
  p.fault = share_.fault;
  p.items = int(fp.items);
  p.cluster = fp.cluster;
  p.direct = fp.direct ? 1 : 0;
  p.direct_begin = int64_t(sizes_.fused_direct_begin);
  p.direct_sender_lines = int64_t(sizes_.fused_direct_sender_lines);
  p.skip_signal = skip_signal_ ? 1 : 0;
  p.combine_delay_ns = combine_delay_ns_;
  p.trace = trace_;
  const bool paged = is_paged(a.layout);
  detail::dispatch(a.dtype, a.head_dim,
                   [&]<class T, int D>() { detail::launch_fused_t<T, D>(paged, p, fp.grid, stream); });
}

void FlashDecode::launch_bsp_stage(Stage stage, const DecodeArgs& a, cudaStream_t stream) {
  TF_REQUIRE(stage == Stage::decode || stage == Stage::gather || stage == Stage::combine, Status::InvalidArgument,
             "stage=" << int(stage) << " is not a FlashDecode::Stage");
  validate(a);
  enqueue_bsp_stage(stage, a, stream);
}

void FlashDecode::enqueue_bsp_stage(Stage stage, const DecodeArgs& a, cudaStream_t stream) {
  const GatherLayout l = gather_layout(a.batch, a.q_heads, a.head_dim);
  float* const mine = bsp_gather_ + int64_t(share_.rank) * l.block_floats;
  switch (stage) {
    case Stage::decode: {
      DecodeArgs d = a;  // this rank's partial into its own block
      d.out = nullptr;
      d.o_part = mine;
      d.lse_part = mine + l.lse_offset;
      const DecodePlan plan = detail::plan_validated(d, split_config());
      TF_REQUIRE(plan.workspace_bytes <= workspace_bytes_, Status::Internal,
                 "decode plan needs " << plan.workspace_bytes << " workspace bytes, FlashDecode has "
                                      << workspace_bytes_);
      detail::launch_validated(d, plan, workspace_, workspace_bytes_, stream);
      return;
    }
    case Stage::gather: {
      // In place (send = recv + rank * count). Heap blocks go at their window address, so NCCL
      // takes its symmetric-memory path.
      require_comm();
      const bool window = cfg_.bsp_buffers == BspBuffers::symmetric;
      const void* send = window ? share_.heap->nccl_address(mine) : mine;
      void* recv = window ? share_.heap->nccl_address(bsp_gather_) : bsp_gather_;
      const CallDeadline deadline(share_.coordinator, "ncclAllGather (flash_decode bsp)", share_.nccl_call_limit_s);
      TF_NCCL(ncclAllGather(send, recv, size_t(l.block_floats), ncclFloat, share_.comm, stream));
      return;
    }
    case Stage::combine: {
      CombineArgs c;
      c.world = share_.world;
      c.batch = a.batch;
      c.q_heads = a.q_heads;
      c.head_dim = a.head_dim;
      c.dtype = a.dtype;
      c.o_parts = bsp_gather_;
      c.o_rank_stride = l.block_floats;
      c.lse_parts = bsp_gather_ + l.lse_offset;
      c.lse_rank_stride = l.block_floats;
      c.out = a.out;
      launch_combine(c, stream);
      return;
    }
  }
}

}  // namespace taxfree::flash_decode
