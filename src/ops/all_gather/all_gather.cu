#include "taxfree/ops/all_gather.h"

#include <nccl.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "taxfree/device/ll_line.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {

namespace {

// Direct protocol. Each block owns chunks blockIdx.x, +gridDim.x, ... of the shard and sends them
// to every rank (peers rank+1, rank+2, ... first, its own copy last), then waits for the same
// block index of every peer (the grid is the same on every rank).
__global__ void __launch_bounds__(512) all_gather_direct_kernel(AllGatherPushArgs a) {
  const auto& v = a.view;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  // This rank's recv is free once this launch has started: tell every peer (pattern P1; the flag
  // publishes nothing else).
  if (blockIdx.x == 0)
    for (int p = threadIdx.x; p < v.world; p += blockDim.x)
      if (p != v.rank) dev::signal_set(v.peer(a.ready, p) + v.rank, epoch);

  char* mine = a.recv + uint64_t(v.rank) * a.bytes;
  __shared__ int ok;
  if (threadIdx.x == 0) ok = 1;
  __syncthreads();  // on one rank no wait's barrier follows before the final loop reads `ok` (racecheck, r89)
  for (int i = 1; i <= v.world; ++i) {
    const int p = (v.rank + i) % v.world;
    if (p != v.rank) {
      if (threadIdx.x == 0 && ok) ok = dev::wait_geq(a.ready + p, epoch, a.fault, dev::WaitSite::all_gather_ready, p);
      __syncthreads();
      if (!ok) break;
      dev::block_copy_chunks(v.peer(mine, p), a.send, a.bytes, a.chunk, blockIdx.x, gridDim.x);
      __syncthreads();  // pattern P2: the block's stores, then one release
      if (threadIdx.x == 0 && !a.skip_signal)
        dev::signal_set(v.peer(a.arrived, p) + uint64_t(v.rank) * AllGather::kMaxBlocks + blockIdx.x, epoch);
    } else if (a.send != mine) {
      dev::block_copy_chunks(mine, a.send, a.bytes, a.chunk, blockIdx.x, gridDim.x);
    }
  }
  for (int p = threadIdx.x; p < v.world && ok; p += blockDim.x)
    if (p != v.rank)
      dev::wait_geq(a.arrived + uint64_t(p) * AllGather::kMaxBlocks + blockIdx.x, epoch, a.fault,
                    dev::WaitSite::all_gather_data, p);
  dev::sequence_end(a.seq, epoch);
}

// Low-latency protocol: every thread owns lines (8 data bytes each) gid, gid + threads, ...
__global__ void __launch_bounds__(512) all_gather_ll_kernel(AllGatherPushArgs a) {
  const auto& v = a.view;
  const uint64_t epoch = dev::sequence_begin(a.seq);
  const uint32_t flag = dev::ll_flag(epoch);
  const uint64_t parity = epoch & 1;
  const uint64_t lines = a.bytes / 8, stride = uint64_t(gridDim.x) * blockDim.x;
  const uint64_t first = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto* src = reinterpret_cast<const uint2*>(a.send);
  auto* mine = reinterpret_cast<uint2*>(a.recv + uint64_t(v.rank) * a.bytes);
  uint4* inbox = a.ll + parity * uint64_t(v.world) * a.ll_lines;  // [sender][line] of this parity
  for (uint64_t l = first; l < lines; l += stride) {
    const uint2 d = src[l];
    if (!a.skip_signal)
      for (int i = 1; i < v.world; ++i) {
        const int p = (v.rank + i) % v.world;
        dev::ll_store(v.peer(inbox, p) + uint64_t(v.rank) * a.ll_lines + l, d.x, d.y, flag);
      }
    if (reinterpret_cast<const void*>(src) != reinterpret_cast<const void*>(mine)) mine[l] = d;
  }
  bool ok = true;
  for (int i = 1; i < v.world && ok; ++i) {
    const int p = (v.rank + v.world - i) % v.world;
    auto* dst = reinterpret_cast<uint2*>(a.recv + uint64_t(p) * a.bytes);
    for (uint64_t l = first; l < lines && ok; l += stride) {
      uint2 d;
      ok = dev::ll_load(inbox + uint64_t(p) * a.ll_lines + l, flag, d, a.fault, dev::WaitSite::all_gather_data, p);
      if (ok) dst[l] = d;
    }
  }
  dev::sequence_end(a.seq, epoch);
}

// Threads per block of both push kernels (their launch bounds are 512).
constexpr bool valid_push_threads(int threads) { return threads >= 32 && threads <= 512 && threads % 32 == 0; }

// The push kernels' shape limits: the flag row of a sender holds kMaxBlocks blocks.
void require_push_shape(const char* where, const char* blocks_name, int blocks, int threads) {
  TF_REQUIRE(blocks >= 1 && blocks <= AllGather::kMaxBlocks, Status::InvalidArgument,
             where << ": " << blocks_name << "=" << blocks << " must be in [1, " << AllGather::kMaxBlocks << "]");
  TF_REQUIRE(valid_push_threads(threads), Status::InvalidArgument,
             where << ": threads=" << threads << " per block must be a multiple of 32 in [32, 512]");
}

}  // namespace

AllGatherVariant parse_all_gather_variant(const std::string& name) {
  if (name == "nccl") return AllGatherVariant::nccl;
  if (name == "push") return AllGatherVariant::push;
  TF_THROW(Status::InvalidArgument, "unknown all_gather variant '" << name << "' (known: nccl, push)");
}

const char* variant_name(AllGatherVariant v) { return v == AllGatherVariant::nccl ? "nccl" : "push"; }

AllGather::AllGather(Team& team, AllGatherConfig config) : AllGather(team.share(), config) {}

AllGather::AllGather(RankShare share, AllGatherConfig config) : share_(std::move(share)), config_(config) {
  check_rank_share(share_, "all_gather");
  TF_REQUIRE(valid_push_threads(config_.threads), Status::InvalidArgument,
             "all_gather threads per block " << config_.threads << " must be a multiple of 32 in [32, 512]");
  TF_REQUIRE(config_.ll_max_bytes % 16 == 0 && config_.ll_max_bytes <= kMaxShardBytes, Status::InvalidArgument,
             "all_gather ll_max_bytes " << config_.ll_max_bytes << " must be a multiple of 16, at most 2^40");
  TF_REQUIRE(config_.max_blocks >= 0, Status::InvalidArgument,
             "all_gather max_blocks " << config_.max_blocks << " must be >= 0 (0: the blocks resident at once)");
  const int resident = std::min(all_gather_push_resident_blocks(config_.threads, share_.sm_count), kMaxBlocks);
  if (config_.max_blocks == 0) config_.max_blocks = resident;
  TF_REQUIRE(config_.max_blocks <= resident, Status::InvalidArgument,
             "all_gather max_blocks " << config_.max_blocks << " exceeds the " << resident
                                      << " blocks resident at once (a block waits for the same block of every peer)");
  const uint64_t w = uint64_t(share_.world);
  ready_ = share_.heap->allocate_array<uint64_t>(w, "all_gather.ready");
  arrived_ = share_.heap->allocate_array<uint64_t>(w * kMaxBlocks, "all_gather.arrived");
  TF_CUDA(cudaMemset(ready_, 0, w * sizeof(uint64_t)));
  TF_CUDA(cudaMemset(arrived_, 0, w * kMaxBlocks * sizeof(uint64_t)));
  if (config_.ll_max_bytes > 0) {
    const uint64_t n = 2 * w * (config_.ll_max_bytes / 8);
    ll_ = share_.heap->allocate_array<uint4>(n, "all_gather.ll");
    TF_CUDA(cudaMemset(ll_, 0, n * sizeof(uint4)));  // 0 is no launch's flag (dev::ll_flag)
  }
  TF_CUDA(cudaDeviceSynchronize());
  seq_ = share_.heap->allocate_sequence("all_gather.sequence");
  // Flags must be zero on every rank before any peer may write into them.
  if (share_.host_barrier) share_.host_barrier("all_gather.init");
}

AllGatherPushGrid all_gather_push_grid(const AllGatherConfig& config, uint64_t bytes) {
  require_push_shape("all_gather_push_grid", "config.max_blocks", config.max_blocks, config.threads);
  AllGatherPushGrid g;
  g.low_latency = bytes <= config.ll_max_bytes;
  // One chunk is what a block of 512 threads keeps in flight (8 x 16 B each): a block streams at
  // full rate, and mid sizes use few blocks (fewer flags and fences per launch).
  g.chunk = uint64_t(config.threads) * 8 * 16;
  if (g.low_latency) {
    // Two lines per thread: enough blocks to send at full rate; a single block of 16-line threads
    // measured 1.5x slower at 64 KiB (r3 in docs/PERFORMANCE.md).
    constexpr uint64_t kLinesPerThread = 2;
    const uint64_t per_block = uint64_t(config.threads) * kLinesPerThread, lines = bytes / 8;
    g.blocks = int(std::clamp<uint64_t>((lines + per_block - 1) / per_block, 1, uint64_t(config.max_blocks)));
  } else {
    g.blocks = int(std::clamp<uint64_t>((bytes + g.chunk - 1) / g.chunk, 1, uint64_t(config.max_blocks)));
  }
  return g;
}

std::string describe_all_gather_launch(AllGatherVariant variant, uint64_t bytes, const AllGatherConfig& config) {
  std::ostringstream os;
  os << "all_gather " << variant_name(variant) << " bytes=" << bytes;
  if (variant == AllGatherVariant::push) {
    const AllGatherPushGrid g = all_gather_push_grid(config, bytes);
    os << (g.low_latency ? " low-latency" : " direct") << " blocks=" << g.blocks << " chunk=" << g.chunk
       << " threads=" << config.threads;
  }
  return os.str();
}

int all_gather_push_resident_blocks(int threads, int sm_count) {
  int direct = 0, ll = 0;
  TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&direct, all_gather_direct_kernel, threads, 0));
  TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ll, all_gather_ll_kernel, threads, 0));
  TF_REQUIRE(direct >= 1 && ll >= 1, Status::NotSupported,
             "all_gather push kernels of " << threads << " threads do not fit an SM (" << direct << ", " << ll << ")");
  return std::min(direct, ll) * sm_count;
}

void launch_all_gather_push(const AllGatherPushArgs& a, const AllGatherPushGrid& g, int threads, cudaStream_t stream) {
  require_push_shape("launch_all_gather_push", "blocks", g.blocks, threads);
  if (g.low_latency) all_gather_ll_kernel<<<g.blocks, threads, 0, stream>>>(a);
  else all_gather_direct_kernel<<<g.blocks, threads, 0, stream>>>(a);
  TF_CUDA(cudaGetLastError());
}

void AllGather::validate(AllGatherVariant variant, const void* send, const void* recv, uint64_t bytes) const {
  TF_REQUIRE(bytes > 0 && bytes <= kMaxShardBytes, Status::InvalidArgument,
             "all_gather of " << bytes << " bytes per rank (must be in [1, 2^40])");
  TF_REQUIRE(bytes % 16 == 0, Status::InvalidArgument,
             "all_gather bytes per rank " << bytes << " must be a multiple of 16");
  TF_REQUIRE(send != nullptr && recv != nullptr, Status::InvalidArgument, "all_gather with a null buffer");
  TF_REQUIRE(reinterpret_cast<uintptr_t>(send) % 16 == 0 && reinterpret_cast<uintptr_t>(recv) % 16 == 0,
             Status::InvalidArgument, "all_gather buffers must be 16-byte aligned (send " << send << ", recv " << recv << ")");
  const uint64_t total = bytes * uint64_t(share_.world);
  const bool recv_in_heap = share_.heap->contains(recv, total);
  TF_REQUIRE(variant != AllGatherVariant::push || recv_in_heap, Status::InvalidArgument,
             "all_gather push: recv (" << recv << ", " << total
                                       << " bytes) must lie in the symmetric heap (allocate it with Team::heap())");
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const bool in_place = s == r + uint64_t(share_.rank) * bytes;
  TF_REQUIRE(in_place || s + bytes <= r || r + total <= s, Status::InvalidArgument,
             "all_gather send and recv overlap (only send == recv + rank * bytes is allowed)");
  // Peers write this op's flags and staging lines during a launch.
  const ByteRange own = SymmetricHeap::span_through(ready_, seq_);
  TF_REQUIRE(!overlap(byte_range(send, int64_t(bytes)), own), Status::InvalidArgument,
             "all_gather: send=" << send << " overlaps the op's flags and staging lines in the symmetric heap");
  TF_REQUIRE(!overlap(byte_range(recv, int64_t(total)), own), Status::InvalidArgument,
             "all_gather: recv=" << recv << " overlaps the op's flags and staging lines in the symmetric heap");
}

void AllGather::launch(AllGatherVariant variant, const void* send, void* recv, uint64_t bytes, cudaStream_t stream) {
  validate(variant, send, recv, bytes);
  if (share_.check_launch) share_.check_launch(describe_all_gather_launch(variant, bytes, config_));
  if (variant == AllGatherVariant::nccl) {
    TF_REQUIRE(share_.comm != nullptr, Status::NotSupported,
               "all_gather nccl: rank " << share_.rank << "'s share has no NCCL communicator (simulated ranks)");
    auto& heap = *share_.heap;
    const uint64_t total = bytes * uint64_t(share_.world);
    // Heap buffers are passed at their registered (window) address so NCCL takes its symmetric path.
    const void* s = heap.contains(send, bytes) ? heap.nccl_address(send) : send;
    void* r = heap.contains(recv, total) ? heap.nccl_address(recv) : recv;
    const CallDeadline deadline(share_.coordinator, "ncclAllGather (all_gather nccl)", share_.nccl_call_limit_s);
    TF_NCCL(ncclAllGather(s, r, bytes, ncclUint8, share_.comm, stream));
    return;
  }
  const AllGatherPushGrid g = all_gather_push_grid(config_, bytes);
  AllGatherPushArgs a;
  a.view = share_.heap->view();
  a.send = static_cast<const char*>(send);
  a.recv = static_cast<char*>(recv);
  a.bytes = bytes;
  a.chunk = g.chunk;
  a.ready = ready_;
  a.arrived = arrived_;
  a.ll = ll_;
  a.ll_lines = config_.ll_max_bytes / 8;
  a.seq = seq_;
  a.fault = share_.fault;
  a.skip_signal = skip_signal_ ? 1 : 0;
  launch_all_gather_push(a, g, config_.threads, stream);
}

}  // namespace taxfree
