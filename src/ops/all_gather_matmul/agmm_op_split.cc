// all_gather_matmul's ksplit (cross-rank split-K: the skinny, two-kernel and band paths) and
// nsplit (column blocks of C) host sides.
#include <cstdlib>
#include <string>

#include "agmm_op_impl.h"
#include "taxfree/ops/cublaslt_gemm.h"

namespace taxfree {

using namespace agmm;

namespace {
// A launch-time knob from the environment: empty when `name` is unset or empty, else `a` or `b`
// (read at each launch, so one benchmark process can time both; every rank must see the same
// value). Throws InvalidArgument naming the variable and the value for anything else.
std::string launch_knob(const char* name, const char* a, const char* b) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return {};
  const std::string v(e);
  TF_REQUIRE(v == a || v == b, Status::InvalidArgument, name << "='" << v << "': " << a << " or " << b);
  return v;
}

// The ksplit path of a launch: by M (below), or TAXFREE_AGMM_KSPLIT_PATH=two-kernel | bands at
// every M.
enum class KsplitPath { skinny, two_kernel, bands };
KsplitPath ksplit_path(const AgmmArgs& a) {
  const std::string v = launch_knob(kKsplitPathEnv, "two-kernel", "bands");
  if (v.empty()) {
    if (a.m <= agmm::kSkinnyMaxM) return KsplitPath::skinny;
    return a.m >= agmm::kBandsMinM ? KsplitPath::bands : KsplitPath::two_kernel;
  }
  return v == "two-kernel" ? KsplitPath::two_kernel : KsplitPath::bands;
}

// The two-kernel path's exchange: agmm::ksplit_owner_sums by the partial's size and the world, or
// TAXFREE_AGMM_KSPLIT_EXCHANGE=all-to-all | owner-sums.
bool owner_sums_of_launch(int64_t partial_bytes, int world) {
  const std::string v = launch_knob(kKsplitExchangeEnv, "all-to-all", "owner-sums");
  return v.empty() ? agmm::ksplit_owner_sums(partial_bytes, world) : v == "owner-sums";
}
}  // namespace

void agmm::check_ksplit_knobs() {
  launch_knob(kKsplitPathEnv, "two-kernel", "bands");
  launch_knob(kKsplitExchangeEnv, "all-to-all", "owner-sums");
}

// By M: up to kSkinnyMaxM one kernel (agmm_ksplit_skinny.cu); from kBandsMinM our GEMM with the
// band epilogue and the band sum (agmm_ksplit_gemm.cu); between, the two-kernel path: cuBLASLt on
// this rank's shard and B's matching K rows into the fp32 partial, then the exchange kernel
// (agmm_ksplit.cu: all-to-all of the partials, or where agmm::ksplit_owner_sums says so
// reduce-scatter and all-gather of C, slice by slice); beside them, on the side stream (forked off
// and joined back into the caller's), the block all-gather of the A shards on a few SMs, with a
// launch sequence and flags of its own (the exchange kernel ends ksplit's sequence, possibly before the gather starts).
GatheredA AllGatherMatmul::launch_ksplit(const AgmmArgs& a, cudaStream_t s) {
  switch (ksplit_path(a)) {  // warm_up(): only the two-kernel path calls cuBLASLt
    case KsplitPath::skinny: return launch_ksplit_skinny(a, s);
    case KsplitPath::bands: return launch_ksplit_bands(a, s);
    case KsplitPath::two_kernel: break;
  }
  // The exchange and the side gather both wait for peers, possibly at once: together in the share.
  const agmm::KsplitSlices sl = make_ksplit_plan(a, share_.world, config_, ksplit_exchange_sms(config_, share_.sm_count));
  Impl& im = *impl_;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const int64_t k0 = share_.rank * sl.shard_cols;  // this rank's K rows of B
  gemm::GemmArgs g = gemm_args(a, a.a_shard, a.lda_shard);
  g.b = b_from_k(a, k0);
  g.c = im.ksplit_own, g.ldc = sl.ldp;
  g.k = sl.shard_cols;

  agmm::KsplitLaunch l;
  l.view = share_.heap->view();
  l.own = im.ksplit_own;
  l.recv = im.ksplit_recv;
  l.slot_floats = im.ksplit_slot_floats;
  l.flags = im.ksplit_flags;
  l.sum_flags = im.ksplit_sum_flags;
  l.owner_sums = owner_sums_of_launch(sl.m * sl.ldp * 4, share_.world);
  l.skip_signal = skip_signal_;
  l.c = a.c, l.ldc = a.ldc;
  l.dtype = a.dtype;
  l.slices = sl;
  l.seq = im.ksplit_seq;
  l.fault = share_.fault;
  agmm::BlockGather ga = shard_gather(share_, a, slot, im.gathered, side_gather_ctas(config_, share_.sm_count));
  ga.ready = im.side_ready;
  ga.flags = im.side_flags;
  ga.seq = im.side_seq;
  ga.end_sequence = true;
  im.lt_prepare(g, s, gemm::OutType::fp32);  // all that can throw, first
  if (warm_only_) {
    im.lt_launch(g, s, gemm::OutType::fp32);
    return {};
  }

  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  agmm::enqueue_block_gather(ga, im.side);
  TF_CUDA(cudaEventRecord(im.join, im.side));
  im.lt_launch(g, s, gemm::OutType::fp32);
  agmm::enqueue_ksplit_exchange(l, s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  return {im.gathered, slot.ld};
}

GatheredA AllGatherMatmul::launch_ksplit_skinny(const AgmmArgs& a, cudaStream_t s) {
  const int per_sm = agmm::ksplit_skinny_ctas_per_sm(a.dtype, a.b_layout, agmm::skinny_m_tiles(a.m));
  const agmm::KsplitSkinny p = make_ksplit_skinny_plan(a, share_.world, config_, share_.sm_count * per_sm);
  if (warm_only_) return {};  // warm_up(): the plan checked; no cuBLASLt to warm
  Impl& im = *impl_;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const int64_t k0 = share_.rank * p.shard_cols;  // this rank's K rows of B
  agmm::KsplitSkinnyLaunch l;
  l.view = share_.heap->view();
  l.plan = p;
  l.a = static_cast<const char*>(a.a_shard), l.lda = a.lda_shard;
  l.b = b_from_k(a, k0);
  l.ldb = a.ldb;
  l.b_layout = a.b_layout;
  l.own = im.ksplit_own;
  l.inbox = im.skinny_inbox;
  l.slot_lines = im.skinny_slot_lines();
  l.partial_cap = im.ksplit_sizes.skinny_partial_lines;
  l.gathered = im.gathered;
  l.ld = slot.ld * kElem;
  l.copy_local = !in_place(a, slot);
  l.skip_signal = skip_signal_;
  l.c = a.c, l.ldc = a.ldc;
  l.dtype = a.dtype;
  l.seq = im.ksplit_seq;
  l.fault = share_.fault;
  agmm::enqueue_ksplit_skinny(l, s);  // checks the inbox's capacity before it enqueues
  return {im.gathered, slot.ld};
}

// Side stream: the begin barrier (every peer's gathered A is free), then the copy engine moves A_shard
// into every peer's gathered A, each followed by its arrival flag (decomposed's scheme), then into
// this rank's own slot, then waits for the peers' shards. Main stream: our GEMM with the band
// epilogue (no wait: it reads only this rank's data), then the band sum, which waits for the peers'
// bands only (agmm_ksplit_gemm.cu: why it waits for no copy).
GatheredA AllGatherMatmul::launch_ksplit_bands(const AgmmArgs& a, cudaStream_t s) {
  const agmm::KsplitSlices sl = make_ksplit_plan(a, share_.world, config_, share_.sm_count);  // validates
  Impl& im = *impl_;
  const auto& view = share_.heap->view();
  const int w = share_.world, rank = share_.rank;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const int64_t k0 = rank * sl.shard_cols;  // this rank's K rows of B
  agmm::KsplitGemmLaunch l;
  l.view = view;
  l.gemm = gemm_args(a, a.a_shard, a.lda_shard);
  l.gemm.b = b_from_k(a, k0);
  l.gemm.k = sl.shard_cols;
  l.config = gemm::choose_gemm_config(a.m, a.n, sl.shard_cols, a.dtype, a.b_layout, share_.sm_count, gemm::KCuts::split,
                                      gemm::SwapAB::never, gemm::EpilogueOutput::fp32);
  l.config.max_ctas = share_.sm_count;  // as pull's: the rank's share
  l.own = im.ksplit_own, l.recv = im.ksplit_recv;
  l.ldp = sl.ldp, l.slot_floats = im.ksplit_slot_floats;
  l.flags = im.ksplit_band_flags, l.band_capacity = im.ksplit_sizes.band_flags;
  l.bn = l.config.bn;
  l.bands_n = int((a.n + l.bn - 1) / l.bn);
  l.sum_ctas = share_.sm_count;
  l.m = a.m, l.n = a.n;
  l.skip_signal = skip_signal_;
  l.c = a.c, l.ldc = a.ldc;
  l.dtype = a.dtype;
  l.seq = im.ksplit_seq;
  l.fault = share_.fault;
  TF_REQUIRE((a.m + 63) / 64 * l.bands_n <= l.band_capacity, Status::Internal,
             "ksplit: " << (a.m + 63) / 64 * l.bands_n << " bands exceed the " << l.band_capacity << " flags");
  agmm::enqueue_ksplit_gemm(l, s, gemm::GemmStep::prepare);  // validation, split-K's workspace
  if (warm_only_) return {};  // warm_up(): checked (and the workspace grown) as a launch is

  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  agmm::enqueue_begin(im.dec_seq.counter, view, im.dec_barrier, l.fault, im.side);
  im.send_shard_with_arrival_flags(view, slot, a, sl.m, sl.shard_cols, im.dec_seq.counter);
  if (!in_place(a, slot)) copy_rows(const_cast<void*>(slot.ptr), slot.ld, a.a_shard, a.lda_shard, sl.m, sl.shard_cols, im.side);
  for (int i = 1; i < w; ++i) {
    const int src = (rank + i) % w;
    agmm::enqueue_wait(im.dec_arrived + src, im.dec_seq.counter, l.fault, dev::WaitSite::all_gather_data, src, im.side);
  }
  TF_CUDA(cudaEventRecord(im.join, im.side));

  agmm::enqueue_ksplit_gemm(l, s);
  agmm::enqueue_ksplit_band_sum(l, s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  return {im.gathered, slot.ld};
}

// This rank's column block of C, summed over K in fp32 as the shards arrive, then the all-gather
// of the C blocks. Side stream: the begin barrier, then the copy engine moves A_shard into every
// peer's gathered A, each copy followed by its arrival flag (decomposed's scheme), then into this
// rank's own slot. Main stream: cuBLASLt on this rank's K rows straight from A_shard (it reads and
// writes only this rank's buffers, so it starts before the barrier and overlaps the copies), then,
// per arriving shard (rank+1, rank+2, ...: the order they are sent in), its K rows added in fp32;
// then the C kernel rounds the block into C and all-gathers it (a programmatic dependent launch).
GatheredA AllGatherMatmul::launch_nsplit(const AgmmArgs& a, cudaStream_t s) {
  const agmm::BlockGatherPlan plan = make_nsplit_plan(a, share_.world, config_, share_.sm_count);  // validates
  const ShardShape sh = agmm_shard_shape(a.m, a.k, a.gather_dim, share_.world);
  Impl& im = *impl_;
  const auto& view = share_.heap->view();
  const int w = share_.world, rank = share_.rank;
  const GatheredA slot = local_slot(a.m, a.k, a.gather_dim);
  const int64_t c0 = plan.blocks.begin(rank), cols = plan.blocks.cols(rank);
  uint64_t* epoch = im.dec_seq.counter;
  const dev::FaultContext fault = share_.fault;
  // Source src's K rows of B times its shard (this rank's from A_shard, the others' from the
  // gathered A), for this rank's columns, into (the first) or onto the fp32 block; one rank has a
  // single source: straight into C, rounded by cuBLASLt.
  const bool one_source = w == 1;
  char* const c_block = static_cast<char*>(a.c) + c0 * kElem;
  auto source_gemm = [&](int src) {
    gemm::GemmArgs g = src == rank ? gemm_args(a, a.a_shard, a.lda_shard)
                                   : gemm_args(a, im.gathered + src * sh.cols * kElem, sh.ld);
    g.b = b_from_k(a, src * sh.cols) + (a.b_layout == gemm::BLayout::kn ? c0 : c0 * a.ldb) * kElem;
    g.n = cols, g.k = sh.cols;
    if (one_source) g.c = c_block, g.ldc = a.ldc;
    else g.c = im.nsplit_partial, g.ldc = plan.blocks.width;
    return g;
  };
  auto out_type = [&](int src) {
    if (one_source) return gemm::OutType::same;
    return src == rank ? gemm::OutType::fp32 : gemm::OutType::fp32_accumulate;
  };
  if (cols > 0)  // all that can throw, first
    for (int src = 0; src < w; ++src) im.lt_prepare(source_gemm(src), s, out_type(src));
  if (warm_only_) {
    if (cols > 0)
      for (int src = 0; src < w; ++src) im.lt_launch(source_gemm(src), s, out_type(src));
    return {};
  }

  agmm::BlockGather gc;
  gc.view = view;
  gc.plan = plan;
  if (one_source) gc.src = c_block, gc.src_ld = a.ldc * kElem;
  else gc.partial = im.nsplit_partial, gc.partial_ld = plan.blocks.width;
  gc.dtype = a.dtype;
  gc.dst = reinterpret_cast<char*>(im.ksplit_own), gc.dst_ld = ceil_div(a.n, 8) * 8 * kElem;  // receive buffer
  gc.out = static_cast<char*>(a.c), gc.out_ld = a.ldc * kElem;
  gc.flags = im.nsplit_flags;
  gc.after_gemm = true;
  gc.end_sequence = true;
  gc.skip_signal = skip_signal_;
  gc.site = dev::WaitSite::nsplit_block;
  gc.seq = im.ksplit_seq;
  gc.fault = fault;

  TF_CUDA(cudaEventRecord(im.fork, s));
  TF_CUDA(cudaStreamWaitEvent(im.side, im.fork, 0));
  agmm::enqueue_begin(epoch, view, im.dec_barrier, fault, im.side);
  TF_CUDA(cudaEventRecord(im.begun, im.side));
  im.send_shard_with_arrival_flags(view, slot, a, sh.rows, sh.cols, epoch);
  if (!in_place(a, slot)) copy_own_shard(view, slot, a, sh.rows, sh.cols, im.side);  // read back from a peer
  TF_CUDA(cudaEventRecord(im.join, im.side));

  if (cols > 0) im.lt_launch(source_gemm(rank), s, out_type(rank));
  TF_CUDA(cudaStreamWaitEvent(s, im.begun, 0));  // the arrival waits read the begin barrier's epoch
  for (int i = 1; i < w; ++i) {
    const int src = (rank + i) % w;
    agmm::enqueue_wait(im.dec_arrived + src, epoch, fault, dev::WaitSite::all_gather_data, src, s);
    if (cols > 0) im.lt_launch(source_gemm(src), s, out_type(src));
  }
  agmm::enqueue_block_gather(gc, s);
  TF_CUDA(cudaStreamWaitEvent(s, im.join, 0));
  return {im.gathered, slot.ld};
}

}  // namespace taxfree
