// Device primitives on real GPUs: values, ordering under rank skew, the timeout path.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <random>
#include <vector>

#include "gpu_env.h"
#include "taxfree/device/barrier.cuh"
#include "taxfree/device/copy_rows.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/signal.cuh"
#include "taxfree/device/tile_copy.cuh"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree {
namespace {

using test::team;

// A wait deadline of its own for tests that exercise the timeout path without poisoning the team.
struct LocalFault {
  uint32_t* host = nullptr;
  dev::FaultContext ctx;
  explicit LocalFault(double timeout_s) {
    TF_CUDA(cudaHostAlloc(&host, 4096, cudaHostAllocMapped));
    std::memset(host, 0, 4096);
    ctx.abort = host;
    ctx.record = reinterpret_cast<dev::WaitRecord*>(reinterpret_cast<char*>(host) + 256);
    ctx.heap_base = team().view().local_base;
    ctx.timeout_ns = uint64_t(timeout_s * 1e9);
    ctx.rank = team().rank();
  }
  ~LocalFault() { cudaFreeHost(host); }
  const dev::WaitRecord& record() const { return *ctx.record; }
};

void sync() { team().sync(team().stream()); }

// ---- scoped atomics --------------------------------------------------------------------------

__global__ void atomics_kernel(dev::SymmetricView v, uint64_t* counter, uint32_t* counter32, uint64_t* cas_slot,
                               int iters) {
  uint64_t* c0 = v.peer(counter, 0);
  uint32_t* c32 = v.peer(counter32, 0);
  for (int i = 0; i < iters; ++i) {
    dev::red_add<dev::Sem::relaxed, dev::Scope::sys>(c0, 1ull);
    dev::fetch_add<dev::Sem::acq_rel, dev::Scope::sys>(c32, 2u);
  }
  // Exactly one thread in the whole team wins the CAS from 0 to (rank+1).
  if (threadIdx.x == 0 && blockIdx.x == 0)
    dev::cas<dev::Sem::acq_rel, dev::Scope::sys>(v.peer(cas_slot, 0), 0ull, uint64_t(v.rank) + 1);
}

TEST(Primitives, AtomicsOnPeerMemoryCountEveryUpdate) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const uint64_t mark = t.heap().mark();
  auto* counter = t.heap().allocate_array<uint64_t>(1, "test.counter");
  auto* counter32 = t.heap().allocate_array<uint32_t>(1, "test.counter32");
  auto* cas_slot = t.heap().allocate_array<uint64_t>(1, "test.cas");
  TF_CUDA(cudaMemset(counter, 0, 8));
  TF_CUDA(cudaMemset(counter32, 0, 4));
  TF_CUDA(cudaMemset(cas_slot, 0, 8));
  TF_CUDA(cudaDeviceSynchronize());
  t.host_barrier("atomics.zero");
  const int blocks = 8, threads = 256, iters = 100;
  atomics_kernel<<<blocks, threads, 0, t.stream()>>>(t.view(), counter, counter32, cas_slot, iters);
  sync();
  t.device_barrier(t.stream());
  sync();
  if (t.rank() == 0) {
    uint64_t c = 0, cs = 0;
    uint32_t c32 = 0;
    TF_CUDA(cudaMemcpy(&c, counter, 8, cudaMemcpyDeviceToHost));
    TF_CUDA(cudaMemcpy(&c32, counter32, 4, cudaMemcpyDeviceToHost));
    TF_CUDA(cudaMemcpy(&cs, cas_slot, 8, cudaMemcpyDeviceToHost));
    const uint64_t expect = uint64_t(t.world()) * blocks * threads * iters;
    EXPECT_EQ(c, expect);
    EXPECT_EQ(c32, uint32_t(2 * expect));
    EXPECT_GE(cs, 1u);
    EXPECT_LE(cs, uint64_t(t.world()));
  }
  t.host_barrier("atomics.done");
  t.heap().release(mark);
}

// ---- signals: data published before the flag is seen after it, under rank skew ----------------

// Producer (rank 0) writes `n` words of generation `e` into the consumer's buffer, then releases
// the flag (pattern P2). Consumer (rank 1) acquires, then checks every word.
__global__ void produce_kernel(dev::SymmetricView v, uint64_t* data, uint64_t n, uint64_t* flag, uint64_t e, int to) {
  uint64_t* remote = v.peer(data, to);
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x) remote[i] = e * 1000003ull + i;
  __syncthreads();
  if (threadIdx.x == 0) dev::signal_set(v.peer(flag, to), e);
}
__global__ void consume_kernel(const uint64_t* data, uint64_t n, const uint64_t* flag, uint64_t e,
                               dev::FaultContext fc, unsigned long long* bad) {
  __shared__ int ok;
  if (threadIdx.x == 0) ok = dev::wait_geq(flag, e, fc, dev::WaitSite::test_signal, 0);
  __syncthreads();
  if (!ok) {
    if (threadIdx.x == 0) atomicAdd(bad, 1ull << 40);
    return;
  }
  for (uint64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (data[i] != e * 1000003ull + i) atomicAdd(bad, 1ull);
}

TEST(Primitives, SignalOrdersDataUnderRankSkew) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  const uint64_t n = 1 << 20, mark = t.heap().mark();
  auto* data = t.heap().allocate_array<uint64_t>(n, "test.signal.data");
  auto* flag = t.heap().allocate_array<uint64_t>(1, "test.signal.flag");
  TF_CUDA(cudaMemset(flag, 0, 8));
  unsigned long long* bad = nullptr;
  TF_CUDA(cudaMalloc(&bad, sizeof *bad));
  TF_CUDA(cudaMemset(bad, 0, sizeof *bad));
  TF_CUDA(cudaDeviceSynchronize());
  t.host_barrier("signal.zero");
  std::mt19937 rng(7);
  for (uint64_t e = 1; e <= 20; ++e) {
    // Alternate which side starts late so the consumer both waits and finds the flag already set.
    const int late = int(e % 2);
    if (t.rank() == late) usleep(1000 * (rng() % 20));
    if (t.rank() == 0) produce_kernel<<<1, 1024, 0, t.stream()>>>(t.view(), data, n, flag, e, 1);
    if (t.rank() == 1) consume_kernel<<<1, 1024, 0, t.stream()>>>(data, n, flag, e, t.fault(), bad);
    sync();
    t.host_barrier("signal.round");  // the next round's writes must not race this round's reads
  }
  unsigned long long h = 0;
  TF_CUDA(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0ull) << "words seen stale after the flag (or waits that gave up: " << (h >> 40) << ")";
  cudaFree(bad);
  t.heap().release(mark);
}

__global__ void wait_forever_kernel(const uint64_t* flag, dev::FaultContext fc, int* result) {
  *result = dev::wait_geq(flag, 5, fc, dev::WaitSite::test_signal, 3) ? 1 : 0;
}

TEST(Primitives, WaitGivesUpAtDeadlineWithDiagnostic) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const uint64_t mark = t.heap().mark();
  auto* flag = t.heap().allocate_array<uint64_t>(4, "test.deadline.flag");
  TF_CUDA(cudaMemset(flag, 0, 32));
  TF_CUDA(cudaMemset(flag + 2, 0x02, 1));  // flag[2] = 2: never reaches 5
  int* result = nullptr;
  TF_CUDA(cudaMalloc(&result, sizeof(int)));
  TF_CUDA(cudaMemset(result, 0xFF, sizeof(int)));
  LocalFault lf(0.3);
  const auto t0 = std::chrono::steady_clock::now();
  wait_forever_kernel<<<1, 1, 0, t.stream()>>>(flag + 2, lf.ctx, result);
  sync();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int h = -1;
  TF_CUDA(cudaMemcpy(&h, result, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0);
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 5.0);
  const auto& r = lf.record();
  EXPECT_EQ(r.complete, 1u);
  EXPECT_EQ(r.rank, t.rank());
  EXPECT_EQ(r.peer, 3);
  EXPECT_EQ(r.site, uint32_t(dev::WaitSite::test_signal));
  EXPECT_EQ(r.expected, 5u);
  EXPECT_EQ(r.observed, 2u);
  EXPECT_EQ(r.flag_offset, t.view().offset_of(flag + 2));
  EXPECT_NE(*lf.host, 0u) << "the abort flag must be raised";
  const std::string text = describe_wait_record(r);
  EXPECT_NE(text.find("for rank 3"), std::string::npos) << text;
  EXPECT_NE(text.find("expected >= 5, observed 2"), std::string::npos) << text;
  const std::string named = describe_wait_record(r, &t.heap());
  EXPECT_NE(named.find("('test.deadline.flag' + 16 B of a 32-byte allocation)"), std::string::npos) << named;
  cudaFree(result);
  t.heap().release(mark);
}

TEST(Primitives, WaitStopsWhenAbortIsRaised) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const uint64_t mark = t.heap().mark();
  auto* flag = t.heap().allocate_array<uint64_t>(1, "test.abort.flag");
  TF_CUDA(cudaMemset(flag, 0, 8));
  int* result = nullptr;
  TF_CUDA(cudaMalloc(&result, sizeof(int)));
  TF_CUDA(cudaMemset(result, 0xFF, sizeof(int)));  // -1 until the wait stores its outcome
  LocalFault lf(60);
  wait_forever_kernel<<<1, 1, 0, t.stream()>>>(flag, lf.ctx, result);
  usleep(200 * 1000);
  EXPECT_EQ(cudaStreamQuery(t.stream()), cudaErrorNotReady) << "the wait should still be spinning";
  __atomic_store_n(lf.host, 1u, __ATOMIC_RELEASE);  // what the coordinator's thread does on a remote failure
  const auto t0 = std::chrono::steady_clock::now();
  sync();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  int h = -1;
  TF_CUDA(cudaMemcpy(&h, result, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0);
  EXPECT_EQ(lf.record().complete, 0u) << "an abort is not a timeout: no record";
  cudaFree(result);
  t.heap().release(mark);
}

// ---- barrier: everything before it on every rank is visible after it --------------------------

// Two slot arrays: the barrier after the reads must not share epochs with the one before them.
__global__ void barrier_order_kernel(dev::SymmetricView v, uint64_t* slots, uint64_t* slots2, uint64_t* stamp, int n,
                                     dev::FaultContext fc, unsigned long long* bad) {
  for (int i = 1; i <= n; ++i) {
    // A rank-dependent, iteration-dependent delay so ranks arrive in varying order.
    const uint64_t delay = ((v.rank * 7919 + i * 104729) % 5) * 2000;
    const uint64_t t0 = dev::global_timer_ns();
    while (dev::global_timer_ns() - t0 < delay) {}
    if (threadIdx.x == 0) dev::store<dev::Sem::relaxed, dev::Scope::sys>(stamp, uint64_t(i));
    if (!dev::block_barrier(v, slots, uint64_t(i), fc)) {
      if (threadIdx.x == 0) atomicAdd(bad, 1ull << 40);
      return;
    }
    for (int p = threadIdx.x; p < v.world; p += blockDim.x)
      if (dev::load<dev::Sem::relaxed, dev::Scope::sys>(v.peer(stamp, p)) < uint64_t(i)) atomicAdd(bad, 1ull);
    if (!dev::block_barrier(v, slots2, uint64_t(i), fc)) return;  // nobody overwrites before all have read
  }
}

TEST(Primitives, BarrierOrdersStampsAcrossRanks) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  const uint64_t mark = t.heap().mark();
  auto* slots = t.heap().allocate_array<uint64_t>(2 * uint64_t(t.world()), "test.barrier.slots");
  auto* stamp = t.heap().allocate_array<uint64_t>(1, "test.barrier.stamp");
  TF_CUDA(cudaMemset(slots, 0, 16 * t.world()));
  TF_CUDA(cudaMemset(stamp, 0, 8));
  unsigned long long* bad = nullptr;
  TF_CUDA(cudaMalloc(&bad, sizeof *bad));
  TF_CUDA(cudaMemset(bad, 0, sizeof *bad));
  TF_CUDA(cudaDeviceSynchronize());
  t.host_barrier("barrier.zero");
  barrier_order_kernel<<<1, 64, 0, t.stream()>>>(t.view(), slots, slots + t.world(), stamp, 200, t.fault(), bad);
  sync();
  unsigned long long h = 0;
  TF_CUDA(cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost));
  EXPECT_EQ(h, 0ull);
  cudaFree(bad);
  t.host_barrier("barrier.done");
  t.heap().release(mark);
}

// ---- put / get / bulk copy values ------------------------------------------------------------

__global__ void put_only_kernel(dev::SymmetricView v, char* dst_local, const char* src, uint64_t bytes, int to) {
  dev::put(v, dst_local, src, bytes, to, threadIdx.x, blockDim.x);
}
__global__ void get_only_kernel(dev::SymmetricView v, char* dst, const char* src_local, uint64_t bytes, int from) {
  dev::get(v, dst, src_local, bytes, from, threadIdx.x, blockDim.x);
}
__global__ void bulk_kernel(dev::SymmetricView v, char* dst_local, const char* src, uint64_t bytes, int to) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bars[3];
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i) dev::mbar_init(dev::smem_addr(&bars[i]), 1);
    dev::fence_mbar_init();
    uint32_t phase = 0;
    dev::bulk_copy(v.peer(dst_local, to), src, bytes, smem, 4096, 3, bars, phase);
    dev::bulk_copy(v.peer(dst_local, to), src, bytes, smem, 4096, 3, bars, phase);  // phases carry over
  }
}
__global__ void pattern_kernel(char* p, uint64_t bytes, uint32_t salt) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes; i += uint64_t(gridDim.x) * blockDim.x)
    p[i] = char((i * 2654435761u + salt) >> 7);
}

// Generic over the team size: on one rank, put, get and the bulk copy go to and from this rank.
// One Team per process at a time (team.h): a second join while the suite's Team lives is refused
// before it contacts anyone, and the live Team and the job go on.
TEST(Team, SecondLiveTeamInOneProcessIsRefused) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  try {
    const auto second = Team::join();
    ADD_FAILURE() << "a second Team joined while the first lives";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidUsage) << e.what();
    EXPECT_NE(std::string(e.what()).find("still alive: one Team per process at a time"), std::string::npos)
        << e.what();
  }
  t.device_barrier(t.stream());
  t.sync(t.stream());
  t.host_barrier("team.second-join-refused");
}

TEST(Primitives, PutGetAndBulkCopyMoveExactBytes) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const int to = (t.rank() + 1) % t.world(), from = (t.rank() + t.world() - 1) % t.world();
  for (uint64_t bytes : {16ull, 48ull, 4096ull + 16, 1000000ull, (8ull << 20) + 48}) {
    const uint64_t mark = t.heap().mark();
    char* src = static_cast<char*>(t.heap().allocate(bytes, 256, "test.src"));
    char* dst = static_cast<char*>(t.heap().allocate(bytes + 512, 256, "test.dst"));
    char* got = nullptr;
    TF_CUDA(cudaMalloc(&got, bytes));
    pattern_kernel<<<64, 256, 0, t.stream()>>>(src, bytes, uint32_t(t.rank() * 131 + bytes));
    TF_CUDA(cudaMemsetAsync(dst, 0x5A, bytes + 512, t.stream()));
    sync();
    t.host_barrier("putget.ready");
    std::vector<char> expect_from(bytes), h(bytes + 512);
    {
      char* tmp = nullptr;
      TF_CUDA(cudaMalloc(&tmp, bytes));
      pattern_kernel<<<64, 256, 0, t.stream()>>>(tmp, bytes, uint32_t(from * 131 + bytes));
      sync();
      TF_CUDA(cudaMemcpy(expect_from.data(), tmp, bytes, cudaMemcpyDeviceToHost));
      cudaFree(tmp);
    }
    for (int mode = 0; mode < 3; ++mode) {
      // Fresh poison before every mode: the peer writes into this rank's dst only after the barrier.
      TF_CUDA(cudaMemsetAsync(dst, 0x5A, bytes + 512, t.stream()));
      TF_CUDA(cudaMemsetAsync(got, 0x5A, bytes, t.stream()));
      sync();
      t.host_barrier("putget.poison");
      if (mode == 0) put_only_kernel<<<1, 256, 0, t.stream()>>>(t.view(), dst, src, bytes, to);
      if (mode == 1) get_only_kernel<<<1, 256, 0, t.stream()>>>(t.view(), got, src, bytes, from);
      if (mode == 2) {
        bulk_kernel<<<1, 32, 3 * 4096, t.stream()>>>(t.view(), dst, src, bytes, to);
      }
      TF_CUDA(cudaGetLastError());
      sync();
      t.device_barrier(t.stream());
      sync();
      TF_CUDA(cudaMemcpy(h.data(), mode == 1 ? got : dst, mode == 1 ? bytes : bytes + 512, cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(h.data(), expect_from.data(), bytes), 0) << "mode " << mode << ", " << bytes << " bytes";
      if (mode != 1)
        for (uint64_t i = bytes; i < bytes + 512; ++i)
          if (h[i] != 0x5A) {
            ADD_FAILURE() << "guard byte " << i - bytes << " past the end was overwritten (mode " << mode << ")";
            break;
          }
      t.host_barrier("putget.mode");
    }
    cudaFree(got);
    t.heap().release(mark);
  }
}

// ---- rounding fp32 rows into 16-bit rows ------------------------------------------------------

template <class T>
__global__ void round_rows_kernel(char* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                                  int64_t cols) {
  dev::round_rows_f32<T>(dst, dst_ld, src, src_ld, rows, cols, threadIdx.x, blockDim.x);
}

// dev::round_rows_f32 against the host's round-to-nearest-even, bit for bit: rows 1-9, columns on
// both sides of a 4-column group and of the block's width in groups (narrow and wide rows), strides
// that allow the vector path and ones that do not (odd dst stride, src stride not a multiple of 4),
// both types; nothing outside the block written.
TEST(CopyRows, RoundRowsF32MatchesHostRoundingBitForBit) {
  TF_REQUIRE_GPUS(1);
  constexpr uint16_t kGuard = 0xA5A5;
  std::mt19937 rng(uint32_t(::taxfree::test::value_seed(7)));  // fresh values every run
  std::uniform_real_distribution<float> u(-300.f, 300.f);
  for (bool bf16 : {true, false})
    for (int64_t rows : {1, 3, 9})
      for (int64_t cols : {1, 3, 4, 5, 448, 1003, 2100})
        for (bool aligned : {true, false}) {
          // Aligned: both strides allow float4 loads and 8-byte stores. Not: an odd number of elements
          // per row on both sides, so neither does (every column takes the one-column path).
          const int64_t src_ld = aligned ? (cols + 3) / 4 * 4 + 4 : cols | 1;          // floats
          const int64_t dst_ld = aligned ? ((cols + 3) / 4 * 4 + 8) * 2 : (cols | 1) * 2;  // bytes
          std::vector<float> h_src(size_t(rows * src_ld));
          for (float& x : h_src) x = u(rng) * (rng() % 7 == 0 ? 1e-30f : 1.f);  // subnormal-range values too
          const size_t dst_bytes = size_t(rows * dst_ld);
          float* d_src = nullptr;
          char* d_dst = nullptr;
          TF_CUDA(cudaMalloc(&d_src, h_src.size() * 4));
          TF_CUDA(cudaMalloc(&d_dst, dst_bytes));
          TF_CUDA(cudaMemcpy(d_src, h_src.data(), h_src.size() * 4, cudaMemcpyHostToDevice));
          std::vector<uint16_t> fill(dst_bytes / 2, kGuard);
          TF_CUDA(cudaMemcpy(d_dst, fill.data(), dst_bytes, cudaMemcpyHostToDevice));
          if (bf16) round_rows_kernel<__nv_bfloat16><<<1, 512>>>(d_dst, dst_ld, d_src, src_ld, rows, cols);
          else round_rows_kernel<__half><<<1, 512>>>(d_dst, dst_ld, d_src, src_ld, rows, cols);
          TF_CUDA(cudaGetLastError());
          std::vector<uint16_t> got(dst_bytes / 2);
          TF_CUDA(cudaMemcpy(got.data(), d_dst, dst_bytes, cudaMemcpyDeviceToHost));
          cudaFree(d_src);
          cudaFree(d_dst);
          const std::string what = std::string(bf16 ? "bf16" : "fp16") + " rows " + std::to_string(rows) + " cols " +
                                   std::to_string(cols) + (aligned ? " vector" : " scalar");
          int64_t bad = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < dst_ld / 2; ++c) {
              uint16_t want = kGuard;
              if (c < cols) {
                const float x = h_src[size_t(r * src_ld + c)];
                want = bf16 ? __nv_bfloat16_raw(__float2bfloat16_rn(x)).x : __half_raw(__float2half_rn(x)).x;
              }
              if (got[size_t(r * dst_ld / 2 + c)] != want && bad++ < 5)
                ADD_FAILURE() << what << ": [" << r << ", " << c << "] = " << got[size_t(r * dst_ld / 2 + c)]
                              << ", want " << want;
            }
          EXPECT_EQ(bad, 0) << what;
        }
}

// ---- launch sequences ------------------------------------------------------------------------

// Each block records the epoch it took; begin / end, or enter / entered with the ticket turned
// into the epoch at the block's start or (every third block) after a delay at its end.
__global__ void sequence_kernel(dev::LaunchSequence seq, bool enter, uint64_t* epochs) {
  uint64_t e = 0;
  if (enter) {
    if (threadIdx.x == 0) {
      const uint64_t ticket = dev::sequence_enter(seq);
      if (blockIdx.x % 3 == 0) __nanosleep(2000);
      e = dev::sequence_entered(seq, ticket, gridDim.x);
    }
  } else {
    e = dev::sequence_begin(seq);
    dev::sequence_end(seq, e);
  }
  if (threadIdx.x == 0) epochs[blockIdx.x] = e;
}

// Both ways give every block of launch i the epoch i + 1 (from a fresh counter), for grids of 1 to
// 4096 blocks (more than fit at once: blocks enter while others have finished) over 120 launches,
// and leave the counter ready for the next launch.
TEST(LaunchSequence, BothWaysGiveEveryBlockTheLaunchsEpoch) {
  TF_REQUIRE_GPUS(1);
  constexpr int kLaunches = 120;
  for (bool enter : {false, true})
    for (int grid : {1, 2, 131, 4096}) {
      uint64_t* d = nullptr;
      TF_CUDA(cudaMalloc(&d, sizeof(uint64_t) * (2 + size_t(kLaunches) * grid)));
      TF_CUDA(cudaMemset(d, 0, 2 * sizeof(uint64_t)));
      TF_CUDA(cudaMemset(d + 2, 0xFF, sizeof(uint64_t) * size_t(kLaunches) * grid));  // poison
      const dev::LaunchSequence seq{d, reinterpret_cast<uint32_t*>(d + 1)};
      for (int i = 0; i < kLaunches; ++i) sequence_kernel<<<grid, 64, 0, team().stream()>>>(seq, enter, d + 2 + i * grid);
      TF_CUDA(cudaGetLastError());
      std::vector<uint64_t> h(2 + size_t(kLaunches) * grid);
      TF_CUDA(cudaMemcpyAsync(h.data(), d, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, team().stream()));
      TF_CUDA(cudaStreamSynchronize(team().stream()));
      TF_CUDA(cudaFree(d));
      const std::string what = std::string(enter ? "enter" : "begin") + " grid " + std::to_string(grid);
      int64_t bad = 0;
      for (int i = 0; i < kLaunches; ++i)
        for (int b = 0; b < grid; ++b)
          if (h[2 + size_t(i) * grid + b] != uint64_t(i + 1) && bad++ < 5)
            ADD_FAILURE() << what << ": launch " << i << " block " << b << " took epoch " << h[2 + size_t(i) * grid + b];
      EXPECT_EQ(bad, 0) << what;
      EXPECT_EQ(h[0], enter ? uint64_t(kLaunches) << 32 : uint64_t(kLaunches)) << what << ": counter";
      EXPECT_EQ(h[1] & 0xFFFFFFFFu, 0u) << what << ": finished count";
    }
}

// A sequence allocated over memory a released user left dirty starts at zero, on its own 128-byte
// line, and goes back with release(): the next allocation takes the same bytes.
TEST(Heap, SequencesStartAtZeroOnTheirOwnLineAndGoBackWithRelease) {
  TF_REQUIRE_GPUS(1);
  auto& heap = team().heap();
  const uint64_t mark = heap.mark();
  void* dirty = heap.allocate(1024, 16, "test.dirty");
  TF_CUDA(cudaMemset(dirty, 0xAB, 1024));
  heap.release(mark);
  char* pad = static_cast<char*>(heap.allocate(16, 16, "test.pad"));  // the next byte is not line-aligned
  const dev::LaunchSequence s = heap.allocate_sequence("test.sequence");  // inside the dirty kilobyte
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.counter) % 128, 0u);
  EXPECT_GE(reinterpret_cast<char*>(s.counter), pad + 16);
  EXPECT_LE(reinterpret_cast<char*>(s.counter + 2), static_cast<char*>(dirty) + 1024);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.finished), reinterpret_cast<uintptr_t>(s.counter + 1));
  EXPECT_TRUE(heap.contains(s.counter, 16));
  uint64_t words[2] = {1, 1};
  TF_CUDA(cudaMemcpy(words, s.counter, sizeof words, cudaMemcpyDeviceToHost));
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(words[1], 0u);
  // Many more than any fixed pool would hold (a Team's was 4096), each left dirty by the one before:
  // every one takes the same line, zeroed.
  const uint64_t m = heap.mark();
  uint64_t* line = nullptr;
  for (int i = 0; i < 10000; ++i) {
    const dev::LaunchSequence t = heap.allocate_sequence("test.cycle");
    if (i == 0) line = t.counter;
    ASSERT_EQ(t.counter, line) << "cycle " << i;
    TF_CUDA(cudaMemcpy(words, t.counter, sizeof words, cudaMemcpyDeviceToHost));
    ASSERT_TRUE(words[0] == 0 && words[1] == 0) << "cycle " << i << ": " << words[0] << ", " << words[1];
    TF_CUDA(cudaMemset(t.counter, 0xCD, sizeof words));
    heap.release(m);
  }
  heap.release(mark);
}

// A launch counter has its 128-byte line to itself: an allocation after it, even of 16-byte
// alignment, starts on the next line; both words start at zero.
TEST(Heap, SequenceHasItsLineToItself) {
  TF_REQUIRE_GPUS(1);
  auto& t = team();
  const uint64_t mark = t.heap().mark();
  const dev::LaunchSequence seq = t.heap().allocate_sequence("test.sequence");
  const auto* next = static_cast<const char*>(t.heap().allocate(16, 16, "test.after_sequence"));
  const uint64_t at = t.view().offset_of(seq.counter);
  EXPECT_EQ(at % 128, 0u);
  EXPECT_GE(t.view().offset_of(next), at + 128);
  uint64_t words[2] = {1, 1};
  TF_CUDA(cudaMemcpy(words, seq.counter, sizeof words, cudaMemcpyDeviceToHost));
  EXPECT_EQ(words[0], 0u);
  EXPECT_EQ(words[1], 0u);
  t.heap().release(mark);
}

TEST(Heap, CheckModeNamesMismatchedAllocations) {
  TF_REQUIRE_GPUS(2);
  auto& t = team();
  // Fresh heap in check mode, sized differently on purpose to also show the exhaustion message.
  SymmetricHeap heap(t.comm(), t.coordinator(), t.rank(), t.world(), 64ull << 20, true);
  void* a = heap.allocate(4096, 256, "same");
  EXPECT_TRUE(heap.contains(a, 4096));
  try {
    heap.allocate(t.rank() == 1 ? 8192 : 4096, 256, "different");
    ADD_FAILURE() << "mismatch not detected";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidUsage);
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 did allocate('different', 8192 B"), std::string::npos) << m;
  }
  try {
    heap.allocate(128ull << 20, 256, "too-big");
    ADD_FAILURE() << "exhaustion not detected";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::OutOfMemory);
    EXPECT_NE(std::string(e.what()).find("asked for 134217728 B"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace taxfree
