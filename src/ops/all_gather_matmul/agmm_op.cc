// all_gather_matmul op object: buffers, flags and streams; validation; the bsp, decomposed, push,
// sm-specialized and fused-ce variants' host sides (ksplit and nsplit: agmm_op_split.cc).
#include <nccl.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "agmm_op_impl.h"
#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/team.h"

namespace taxfree {

using namespace agmm;

AllGatherMatmul::AllGatherMatmul(Team& team, AgmmConfig config) : AllGatherMatmul(team.share(), config) {}

AllGatherMatmul::AllGatherMatmul(RankShare share, AgmmConfig config)
    : share_(std::move(share)), config_(config), impl_(std::make_unique<Impl>()) {
  check_rank_share(share_, "all_gather_matmul");
  validate_agmm_config(config_);
  Impl& im = *impl_;
  const uint64_t w = uint64_t(share_.world);
  if (share_.sm_count < gemm::device_sm_count()) im.lt_clusters = gemm::Clusters::small;
  im.capacity_bytes = config_.max_m * ceil_div(config_.max_k, 8) * 8 * kElem;
  im.flag_capacity = push_flag_capacity(config_.max_m, config_.max_k, share_.world);
  auto& heap = *share_.heap;
  // gathered first and dec_seq last: validate() takes the op's heap part (buffers and the flags
  // peers write) as the span between them.
  im.gathered = static_cast<char*>(heap.allocate(uint64_t(im.capacity_bytes), 4096, "all_gather_matmul.gathered"));
  if (config_.bsp_symmetric)
    im.staging_sym = static_cast<char*>(heap.allocate(uint64_t(im.capacity_bytes), 4096, "all_gather_matmul.staging"));
  im.push_ready = heap.allocate_array<uint64_t>(w, "all_gather_matmul.push_ready");
  im.push_flags = heap.allocate_array<uint64_t>(uint64_t(im.flag_capacity), "all_gather_matmul.push_flags");
  im.dec_barrier = heap.allocate_array<uint64_t>(w, "all_gather_matmul.dec_barrier");
  im.dec_arrived = heap.allocate_array<uint64_t>(w, "all_gather_matmul.dec_arrived");
  im.ce_flag_capacity = int64_t(w) * kFusedCeRowChunks;
  im.ce_flags = heap.allocate_array<uint64_t>(uint64_t(im.ce_flag_capacity), "all_gather_matmul.ce_flags");
  TF_CUDA(cudaMemset(im.push_ready, 0, w * sizeof(uint64_t)));
  TF_CUDA(cudaMemset(im.push_flags, 0, uint64_t(im.flag_capacity) * sizeof(uint64_t)));
  TF_CUDA(cudaMemset(im.dec_barrier, 0, w * sizeof(uint64_t)));
  TF_CUDA(cudaMemset(im.dec_arrived, 0, w * sizeof(uint64_t)));
  TF_CUDA(cudaMemset(im.ce_flags, 0, uint64_t(im.ce_flag_capacity) * sizeof(uint64_t)));
  im.pull_end = heap.allocate_array<uint64_t>(w, "all_gather_matmul.pull_end");
  TF_CUDA(cudaMemset(im.pull_end, 0, w * sizeof(uint64_t)));
  im.ksplit_sizes = ksplit_heap(config_, share_.world);
  im.ksplit_slot_floats = im.ksplit_sizes.partial_floats;
  if (im.ksplit_slot_floats > 0) {
    const auto slot = uint64_t(im.ksplit_slot_floats);
    im.ksplit_own = heap.allocate_array<float>(slot, "all_gather_matmul.ksplit_own");
    if (w > 1) {
      im.ksplit_recv = heap.allocate_array<float>(2 * (w - 1) * slot, "all_gather_matmul.ksplit_recv");
      const uint64_t lines = 2 * (w - 1) * uint64_t(im.skinny_slot_lines());
      im.skinny_inbox = heap.allocate_array<uint4>(lines, "all_gather_matmul.ksplit_skinny_inbox");
      // Zero is no epoch's flag (dev::ll_flag): no line is current before its sender stores it.
      TF_CUDA(cudaMemset(im.skinny_inbox, 0, lines * sizeof(uint4)));
    }
    im.ksplit_flags = heap.allocate_array<uint64_t>(w * agmm::kKsplitMaxCtas, "all_gather_matmul.ksplit_flags");
    TF_CUDA(cudaMemset(im.ksplit_flags, 0, w * agmm::kKsplitMaxCtas * sizeof(uint64_t)));
    im.ksplit_sum_flags = heap.allocate_array<uint64_t>(w * agmm::kKsplitMaxCtas, "all_gather_matmul.ksplit_sum_flags");
    TF_CUDA(cudaMemset(im.ksplit_sum_flags, 0, w * agmm::kKsplitMaxCtas * sizeof(uint64_t)));
    const uint64_t bands = w * uint64_t(im.ksplit_sizes.band_flags);
    im.ksplit_band_flags = heap.allocate_array<uint64_t>(bands, "all_gather_matmul.ksplit_band_flags");
    TF_CUDA(cudaMemset(im.ksplit_band_flags, 0, bands * sizeof(uint64_t)));
    im.nsplit_flags = heap.allocate_array<uint64_t>(w * agmm::kKsplitMaxCtas, "all_gather_matmul.nsplit_flags");
    TF_CUDA(cudaMemset(im.nsplit_flags, 0, w * agmm::kKsplitMaxCtas * sizeof(uint64_t)));
    if (w > 1) {  // one rank's nsplit multiplies straight into C
      im.nsplit_partial_floats = nsplit_partial_floats(config_, share_.world);
      TF_CUDA(cudaMalloc(&im.nsplit_partial, size_t(im.nsplit_partial_floats) * 4));
    }
    im.side_ready = heap.allocate_array<uint64_t>(w, "all_gather_matmul.ksplit_side_ready");
    im.side_flags = heap.allocate_array<uint64_t>(w * agmm::kKsplitMaxCtas, "all_gather_matmul.ksplit_side_flags");
    TF_CUDA(cudaMemset(im.side_ready, 0, w * sizeof(uint64_t)));
    TF_CUDA(cudaMemset(im.side_flags, 0, w * agmm::kKsplitMaxCtas * sizeof(uint64_t)));
    im.ksplit_seq = heap.allocate_sequence("all_gather_matmul.ksplit_sequence");
    im.side_seq = heap.allocate_sequence("all_gather_matmul.side_sequence");
  }
  if (!config_.bsp_symmetric) {
    TF_CUDA(cudaMalloc(&im.gathered_plain, size_t(im.capacity_bytes)));
    TF_CUDA(cudaMalloc(&im.staging_plain, size_t(im.capacity_bytes)));
  }
  im.push_seq = heap.allocate_sequence("all_gather_matmul.push_sequence");
  im.gemm_seq = heap.allocate_sequence("all_gather_matmul.gemm_sequence");
  im.dec_seq = heap.allocate_sequence("all_gather_matmul.dec_sequence");
  // The second stream at the highest priority: the data movers should never queue behind the GEMM.
  int least = 0, greatest = 0;
  TF_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TF_CUDA(cudaStreamCreateWithPriority(&im.side, cudaStreamNonBlocking, greatest));
  TF_CUDA(cudaEventCreateWithFlags(&im.fork, cudaEventDisableTiming));
  TF_CUDA(cudaEventCreateWithFlags(&im.join, cudaEventDisableTiming));
  TF_CUDA(cudaEventCreateWithFlags(&im.begun, cudaEventDisableTiming));
  agmm::preload_push_kernel();
  agmm::preload_ksplit_kernels();
  agmm::preload_block_gather_kernel();
  if (im.ksplit_slot_floats > 0) agmm::preload_ksplit_skinny();
  agmm::preload_ksplit_gemm_kernels();
  agmm::preload_small_kernels();
  TF_CUDA(cudaDeviceSynchronize());
  // Flags must be zero on every rank before any peer may write into them.
  if (share_.host_barrier) share_.host_barrier("all_gather_matmul.init");
}

AllGatherMatmul::~AllGatherMatmul() {
  Impl& im = *impl_;
  if (im.side) cudaStreamSynchronize(im.side);
  if (im.fork) cudaEventDestroy(im.fork);
  if (im.join) cudaEventDestroy(im.join);
  if (im.begun) cudaEventDestroy(im.begun);
  if (im.side) cudaStreamDestroy(im.side);
  if (im.gathered_plain) cudaFree(im.gathered_plain);
  if (im.nsplit_partial) cudaFree(im.nsplit_partial);
  if (im.staging_plain) cudaFree(im.staging_plain);
}

void AllGatherMatmul::fill_buffers(int byte, cudaStream_t stream) {
  for (const Buffer& b : impl_->buffers(share_.world))
    TF_CUDA(cudaMemsetAsync(const_cast<void*>(b.p), byte, size_t(b.bytes), stream));
}

GatheredA AllGatherMatmul::local_slot(int64_t m, int64_t k, int gather_dim) const {
  const ShardShape s = agmm_shard_shape(m, k, gather_dim, share_.world);
  const int64_t r = share_.rank;
  if (gather_dim == 0) return {impl_->gathered + r * s.rows * s.ld * kElem, s.ld};
  return {impl_->gathered + r * s.cols * kElem, s.ld};
}

void AllGatherMatmul::validate(const AgmmArgs& a) const {
  validate_agmm_args(a, share_.world, config_);
  const bool own_slot = in_place(a, local_slot(a.m, a.k, a.gather_dim));
  const AgmmOperandRanges r = agmm_operand_ranges(a, share_.world);
  // A launch writes the op's buffers and flags while it reads A_shard and B and writes C: none of
  // them may lie there (but A_shard in its own slot, with its stride: in_place above).
  const std::pair<const char*, ByteRange> args[] = {
      {"A_shard", own_slot ? ByteRange{} : r.a_shard}, {"B", r.b}, {"C", r.c}};
  const ByteRange heap_part = SymmetricHeap::span_through(impl_->gathered, impl_->dec_seq);
  const std::vector<Buffer> buffers = impl_->buffers(share_.world);
  for (size_t i = 0; i < std::size(args); ++i) {
    const auto& [name, range] = args[i];
    for (const Buffer& b : buffers)
      TF_REQUIRE(!overlap(range, byte_range(b.p, b.bytes)), Status::InvalidArgument,
                 "all_gather_matmul: " << name << " overlaps the op's gathered / staging / partial buffers"
                                       << (i == 0 ? " (only local_slot() with its stride is allowed)" : ""));
    TF_REQUIRE(!overlap(range, heap_part), Status::InvalidArgument,
               "all_gather_matmul: " << name << " overlaps the op's flags in the symmetric heap");
  }
}

GatheredA AllGatherMatmul::launch(AgmmVariant variant, const AgmmArgs& args, cudaStream_t stream) {
  validate(args);
  const AgmmVariant requested = variant;
  if (variant == AgmmVariant::automatic)
    variant = choose_agmm_variant(args, share_.world, config_);
  if (share_.check_launch && !warm_only_)  // warm_up() is this rank's alone
    share_.check_launch(describe_agmm_launch(requested, variant, args, config_));
  switch (variant) {
    case AgmmVariant::bsp: return launch_bsp(args, false, stream);
    case AgmmVariant::bsp_own: return launch_bsp(args, true, stream);
    case AgmmVariant::decomposed: return launch_decomposed(args, stream);
    case AgmmVariant::pull: return launch_pull(args, stream);
    case AgmmVariant::push: return launch_push(args, false, stream);
    case AgmmVariant::sm_specialized: return launch_push(args, true, stream);
    case AgmmVariant::fused_ce: return launch_fused_ce(args, stream);
    case AgmmVariant::ksplit: return launch_ksplit(args, stream);
    case AgmmVariant::nsplit: return launch_nsplit(args, stream);
    case AgmmVariant::automatic: break;
  }
  TF_THROW(Status::InvalidArgument, "all_gather_matmul: variant " << int(variant) << " is not a variant");
}

void AllGatherMatmul::warm_up(AgmmVariant variant, const AgmmArgs& args, cudaStream_t stream) {
  validate(args);
  if (variant == AgmmVariant::automatic) variant = choose_agmm_variant(args, share_.world, config_);
  if (variant != AgmmVariant::bsp && variant != AgmmVariant::decomposed && variant != AgmmVariant::nsplit &&
      variant != AgmmVariant::ksplit)
    return;  // our kernels only
  warm_only_ = true;
  try {
    launch(variant, args, stream);
  } catch (...) {
    warm_only_ = false;
    throw;
  }
  warm_only_ = false;
}

namespace {
// Our GEMM over `gathered` with the piece waits; the caller sets present_source and seq.
agmm::ReadyGemmLaunch ready_gemm(const RankShare& share, const char* gathered, const AgmmArgs& a,
                                 const gemm::GemmConfig& cfg, const uint64_t* flags, const agmm::PieceGrid& grid) {
  agmm::ReadyGemmLaunch g;
  g.gemm = gemm_args(a, gathered, agmm_shard_shape(a.m, a.k, a.gather_dim, share.world).ld);
  g.config = cfg;
  const WaitingGemmOrder order = waiting_gemm_order(a, cfg, share.rank, share.world);
  g.first_m = order.first_m;
  g.config.group_m = order.group_m;
  g.flags = flags;
  g.grid = grid;
  g.fault = share.fault;
  return g;
}
}  // namespace

// ncclAllGather into the gathered A (gather_dim 0) or into [world][m][k / world] staging plus an
// interleave pass (gather_dim 1), then one GEMM. NCCL's send buffer is A_shard itself when it is
// dense (and, for the symmetric path, in the window); otherwise the shard is packed into this
// rank's slot first and gathered in place.
GatheredA AllGatherMatmul::launch_bsp(const AgmmArgs& a, bool own_gemm, cudaStream_t s) {
  const ShardShape sh = agmm_shard_shape(a.m, a.k, a.gather_dim, share_.world);
  TF_REQUIRE(share_.comm != nullptr, Status::NotSupported,
             "all_gather_matmul " << (own_gemm ? "bsp-own" : "bsp") << ": rank " << share_.rank
                                  << "'s share has no NCCL communicator (simulated ranks)");
  const bool sym = config_.bsp_symmetric;
  Impl& im = *impl_;
  auto& heap = *share_.heap;
  char* gathered = sym ? im.gathered : im.gathered_plain;
  const gemm::GemmArgs g = gemm_args(a, gathered, sh.ld);
  // All that can throw, first: the GEMM's plan and workspace before NCCL's collective is enqueued.
  if (own_gemm) gemm::prepare(g, s);
  else im.lt_prepare(g, s);
  if (warm_only_) {
    if (!own_gemm) im.lt_launch(g, s);
    return {};
  }
  char* recv = a.gather_dim == 0 ? gathered : (sym ? im.staging_sym : im.staging_plain);
  const int64_t row_ld = a.gather_dim == 0 ? sh.ld : sh.cols;  // of one shard inside recv
  const int64_t bytes = sh.rows * row_ld * kElem;               // per rank
  char* slot = recv + share_.rank * bytes;
  const bool dense = a.lda_shard == row_ld && row_ld == sh.cols;
  const void* send = a.a_shard;
  if (a.a_shard != slot || a.lda_shard != row_ld) {
    if (!dense || (sym && !heap.contains(a.a_shard, uint64_t(bytes)))) {
      copy_rows(slot, row_ld, a.a_shard, a.lda_shard, sh.rows, sh.cols, s);
      send = slot;
    }
  }
  {
    const CallDeadline deadline(share_.coordinator, "ncclAllGather (all_gather_matmul bsp)", share_.nccl_call_limit_s);
    TF_NCCL(ncclAllGather(sym ? heap.nccl_address(send) : send, sym ? heap.nccl_address(recv) : recv, size_t(bytes),
                          ncclUint8, share_.comm, s));
  }
  if (a.gather_dim == 1) agmm::enqueue_interleave(recv, gathered, sh.ld, share_.world, sh.rows, sh.cols, s);
  if (own_gemm) gemm::launch(g, s);
  else im.lt_launch(g, s);
  return {gathered, sh.ld};
}

// The copy engine moves the data and writes the arrival flags; no SM waits for a peer while
// cuBLASLt runs. A begin barrier (every rank is in this launch, so every gathered A is free; for
// small gather_dim 0 shards on the side stream, see below). Main stream: cuBLASLt on this rank's
// shard straight from A_shard, then on each arriving shard, rank+1, rank+2, ... (gather_dim 0).
// Side stream: the shard into every peer's slot, peers rank-1, rank-2, ... (the one that consumes
// it soonest first), each followed by its arrival flag, then into this rank's own slot for the
// returned gathered A, read back from the first peer (copy_own_shard; gather_dim 1: a local copy on
// the main stream, as every k-block needs it). Staging the peer copies through the own slot made
// M = 4096-16384 slower (r30: 950 vs 800 us at M = 8192); a cudaMalloc'd A_shard copies as fast as a
// heap one.
GatheredA AllGatherMatmul::launch_decomposed(const AgmmArgs& a, cudaStream_t s) {
  const ShardShape sh = agmm_shard_shape(a.m, a.k, a.gather_dim, share_.world);
  Impl& im = *impl_;
  const auto& view = share_.heap->view();
  const int w = share_.world, rank = share_.rank;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const bool shard_in_place = in_place(a, slot);
  uint64_t* epoch = im.dec_seq.counter;
  const dev::FaultContext fault = share_.fault;
  // Source src's rows of C (gather_dim 0), or the whole product (gather_dim 1: every k-block needs
  // every source, so it waits for all of them).
  auto source_gemm = [&](int src) {
    if (a.gather_dim == 1) return gemm_args(a, im.gathered, sh.ld);
    gemm::GemmArgs g = src == rank ? gemm_args(a, a.a_shard, a.lda_shard)
                                   : gemm_args(a, im.gathered + src * sh.rows * sh.ld * kElem, sh.ld);
    g.m = sh.rows;
    g.c = static_cast<char*>(a.c) + src * sh.rows * a.ldc * kElem;
    return g;
  };
  // All that can throw, first (gather_dim 1: one GEMM, the same for every source).
  for (int src = 0; src < (a.gather_dim == 0 ? w : 1); ++src) im.lt_prepare(source_gemm(src), s);
  if (warm_only_) {
    for (int src = 0; src < (a.gather_dim == 0 ? w : 1); ++src) im.lt_launch(source_gemm(src), s);
    return {};
  }

  // gather_dim 0, small shards: this rank's GEMM reads and writes only the caller's buffers, so it
  // need not wait for the begin barrier: the barrier runs on the side stream, enqueued before the
  // GEMM, and the main stream waits for it (the epoch it advances) only before the first arrival
  // wait. Large shards keep the barrier first (kDecEarlyGemmMaxRows).
  const bool early_gemm = a.gather_dim == 0 && sh.rows <= agmm::kDecEarlyGemmMaxRows;
  if (!early_gemm) agmm::enqueue_begin(epoch, view, im.dec_barrier, fault, s);
  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  if (early_gemm) {
    agmm::enqueue_begin(epoch, view, im.dec_barrier, fault, im.side);
    TF_CUDA(cudaEventRecord(im.begun, im.side));
  }
  im.send_shard_with_arrival_flags(view, slot, a, sh.rows, sh.cols, epoch);
  if (!shard_in_place && a.gather_dim == 0)  // last: nothing waits for it but the returned gathered A
    copy_own_shard(view, slot, a, sh.rows, sh.cols, im.side);
  TF_CUDA(cudaEventRecord(im.join, im.side));

  if (a.gather_dim == 0) {
    im.lt_launch(source_gemm(rank), s);
    if (early_gemm) TF_CUDA(cudaStreamWaitEvent(s, im.begun, 0));
  } else if (!shard_in_place) {
    copy_rows(const_cast<void*>(slot.ptr), slot.ld, a.a_shard, a.lda_shard, sh.rows, sh.cols, s);
  }
  for (int i = 1; i < w; ++i) {
    const int src = (rank + i) % w;
    agmm::enqueue_wait(im.dec_arrived + src, epoch, fault, dev::WaitSite::all_gather_data, src, s);
    if (a.gather_dim == 0) im.lt_launch(source_gemm(src), s);
  }
  if (a.gather_dim == 1) im.lt_launch(source_gemm(rank), s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  return {im.gathered, sh.ld};
}

// Every rank puts its shard in its own slot (unless in place), and a begin barrier makes every slot
// readable. Our GEMM then loads each A tile from the gathered A of the rank holding it (TMA over
// NVLink, pull_ready.cuh), while the copy engine brings the peers' shards into this rank's gathered
// A on the side stream (the gathered A the launch returns). An end barrier keeps every shard in
// place until no peer reads it: once the launch ends, the caller may overwrite A_shard, or the
// slot in place.
GatheredA AllGatherMatmul::launch_pull(const AgmmArgs& a, cudaStream_t s) {
  const int w = share_.world, rank = share_.rank;
  const PullPlan plan = make_pull_plan(a, w, share_.sm_count);
  const ShardShape sh = agmm_shard_shape(a.m, a.k, a.gather_dim, w);
  Impl& im = *impl_;
  const auto& view = share_.heap->view();
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  // Rank q's slot in this rank's gathered A.
  const auto slot_of = [&](int q) {
    return im.gathered + (a.gather_dim == 0 ? q * sh.rows * sh.ld : q * sh.cols) * kElem;
  };
  agmm::PullGemmLaunch g;
  g.gemm = gemm_args(a, im.gathered, sh.ld);
  g.config = plan.gemm;
  const WaitingGemmOrder order = waiting_gemm_order(a, plan.gemm, rank, w);
  g.first_m = order.first_m;
  g.config.group_m = order.group_m;
  // This rank's columns first (whole tiles only: policies.cuh).
  g.first_k = a.gather_dim == 1 && !plan.gemm.splits_k() ? int(rank * plan.source_unit) : 0;
  g.source_unit = plan.source_unit;
  g.gather_dim = a.gather_dim;
  for (int q = 0; q < w; ++q) g.sources[q] = view.peer(im.gathered, q);
  agmm::validate_policy_gemm(g.gemm, g.config, true);  // before anything is enqueued
  agmm::enqueue_pull_gemm(g, s, gemm::GemmStep::prepare);  // split-K's workspace, too

  uint64_t* epoch = im.dec_seq.counter;
  if (!in_place(a, slot)) copy_rows(const_cast<void*>(slot.ptr), slot.ld, a.a_shard, a.lda_shard, sh.rows, sh.cols, s);
  agmm::enqueue_begin(epoch, view, im.dec_barrier, share_.fault, s);
  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  for (int i = 1; i < w; ++i) {
    const int q = (rank + i) % w;
    copy_rows(slot_of(q), sh.ld, view.peer(slot_of(q), q), sh.ld, sh.rows, sh.cols, im.side);
  }
  TF_CUDA(cudaEventRecord(im.join, im.side));
  agmm::enqueue_pull_gemm(g, s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  agmm::enqueue_barrier(epoch, view, im.pull_end, share_.fault, s);
  return {im.gathered, slot.ld};
}

// push (movers_in_gemm false: a push kernel on the side stream) and sm-specialized (the movers are
// CTAs of the GEMM kernel): the same pieces, flags, sequences and waiting GEMM.
GatheredA AllGatherMatmul::launch_push(const AgmmArgs& a, bool movers_in_gemm, cudaStream_t s) {
  const int w = share_.world, sms = share_.sm_count;
  const PushPlan plan =
      movers_in_gemm ? make_sm_specialized_plan(a, w, config_, sms) : make_push_plan(a, w, config_, sms);
  Impl& im = *impl_;
  TF_REQUIRE(plan.grid.flags() <= im.flag_capacity, Status::Internal,
             "all_gather_matmul: " << plan.grid.flags() << " piece flags exceed the " << im.flag_capacity
                                   << " allocated");
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  agmm::PushLaunch l;
  agmm::PushWork& work = l.work;
  work.view = share_.heap->view();
  work.src = static_cast<const char*>(a.a_shard);
  work.src_ld = a.lda_shard * kElem;
  work.gathered = im.gathered;
  work.ld = slot.ld * kElem;
  work.ready = im.push_ready;
  work.flags = im.push_flags;
  work.grid = plan.grid;
  work.copy_local = !in_place(a, slot);
  work.skip_signal = skip_signal_;
  work.seq = im.push_seq;
  work.fault = share_.fault;
  l.push_ctas = plan.push_ctas;
  l.gemm = ready_gemm(share_, im.gathered, a, plan.gemm, im.push_flags, plan.grid);
  // In place: the movers raise no flag for this rank's own pieces.
  l.gemm.present_source = work.copy_local ? -1 : share_.rank;
  l.gemm.seq = im.gemm_seq;
  if (movers_in_gemm) agmm::enqueue_sm_specialized(l, s);
  else agmm::enqueue_push(l, s, im.side, im.fork, im.join);
  return {im.gathered, slot.ld};
}

// The copy engine moves the shards in row chunks, each followed by a copy-engine write of its
// flag (as decomposed does), and our GEMM runs once over the whole gathered A on every SM, its
// producer waiting for a chunk's flag before the first load of it: this rank's rows first, then
// rank+1's, ... (gather_dim 0), or each tile's k-loop from this rank's columns on, then rank+1's,
// ... (gather_dim 1: the shards arrive while every CTA multiplies the one it holds). This rank's
// shard, unless in place, is copied on the main stream before the GEMM: a copy on another stream
// could not be waited for by a GEMM that holds every SM if the driver ran it as a kernel.
GatheredA AllGatherMatmul::launch_fused_ce(const AgmmArgs& a, cudaStream_t s) {
  const ShardShape sh = agmm_shard_shape(a.m, a.k, a.gather_dim, share_.world);
  const FusedCePlan plan = make_fused_ce_plan(a, share_.world, share_.sm_count);
  Impl& im = *impl_;
  TF_REQUIRE(plan.grid.flags() <= im.ce_flag_capacity, Status::Internal,
             "all_gather_matmul: " << plan.grid.flags() << " chunk flags exceed the " << im.ce_flag_capacity
                                   << " allocated");
  const auto& view = share_.heap->view();
  const int w = share_.world, rank = share_.rank;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const bool shard_in_place = in_place(a, slot);
  uint64_t* epoch = im.dec_seq.counter;
  agmm::ReadyGemmLaunch g = ready_gemm(share_, im.gathered, a, plan.gemm, im.ce_flags, plan.grid);
  g.present_source = rank;
  g.first_k = agmm::first_k_block(plan.grid, rank);
  g.seq = {epoch, nullptr};  // the begin kernel below advances the epoch for this launch
  agmm::validate_policy_gemm(g.gemm, g.config, false);  // before anything is enqueued
  agmm::enqueue_ready_gemm(g, s, gemm::GemmStep::prepare);

  agmm::enqueue_begin(epoch, view, im.dec_barrier, share_.fault, s);
  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  const agmm::PieceGrid& pg = plan.grid;
  for (int i = 1; i < w; ++i) {
    const int q = (rank - i + w) % w;  // the peer that consumes this shard soonest first
    char* dst = static_cast<char*>(view.peer(const_cast<void*>(slot.ptr), q));
    for (int64_t c = 0; c < pg.row_chunks; ++c) {
      const agmm::Piece p = pg.piece(c, 0);
      copy_rows(dst + p.r0 * slot.ld * kElem, slot.ld, static_cast<const char*>(a.a_shard) + p.r0 * a.lda_shard * kElem,
                a.lda_shard, p.rows, sh.cols, im.side);
      agmm::enqueue_signal_copy(view.peer(im.ce_flags, q) + pg.flag_index(rank, c, 0), epoch, im.side);
    }
  }
  TF_CUDA(cudaEventRecord(im.join, im.side));
  if (!shard_in_place) copy_rows(const_cast<void*>(slot.ptr), slot.ld, a.a_shard, a.lda_shard, sh.rows, sh.cols, s);
  agmm::enqueue_ready_gemm(g, s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  return {im.gathered, slot.ld};
}

}  // namespace taxfree
