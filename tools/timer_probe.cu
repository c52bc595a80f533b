// timer_probe: what the benchmark's times are made of at the microsecond level. Written when short
// medians kept reading whole microseconds (23.00, 27.00); it showed that the timer and CUDA events
// resolve 32 ns for every kernel shape tried, which led to the real cause: the harness sent each
// rank's times through the coordinator as std::to_string of seconds (f74dfd9 fixed it). On the GPU
// machine it reports:
//   1. the step of %globaltimer as a kernel sees it (smallest nonzero difference of two reads);
//   2. for kernels of several shapes (one CTA; a full grid; a full grid in clusters of 8; a full
//      grid streaming from HBM; both with 200 KB of shared memory; launch_decode_partial), each
//      sized by a fixed count of SM clocks or bytes (no timer in the loop), durations ~5-25 us:
//      CUDA event pairs around one run and around 16 back-to-back runs, queued behind a gate
//      kernel as the benchmark does; per shape the median per run, the spread (max - min over
//      samples) and the fraction of samples that read whole microseconds.
// Run on a GPU machine: build/tools/timer_probe (or `taxfree run -n 1 -- build/tools/timer_probe
// team` to time after Team::join, on the team's stream). docs/PERFORMANCE.md (fifteenth session)
// has what it measured.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "taxfree/device/stream_read.cuh"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// out[0] = smallest nonzero step seen between consecutive reads, out[1] = distinct values seen.
__global__ void timer_step(unsigned long long* out) {
  uint64_t prev = global_ns(), best = ~0ull, distinct = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t t = global_ns();
    if (t != prev) {
      best = std::min<uint64_t>(best, t - prev);
      ++distinct;
      prev = t;
    }
  }
  out[0] = best;
  out[1] = distinct;
}

// Spins `cycles` SM clocks; thread 0 of block 0 records its %globaltimer at entry and exit.
__device__ void spin_body(long long cycles, unsigned long long* span) {
  const uint64_t t0 = global_ns();
  const long long c0 = clock64();
  while (clock64() - c0 < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0 && span) {
    span[0] = t0;
    span[1] = global_ns();
  }
}

__global__ void spin(long long cycles, unsigned long long* span) { spin_body(cycles, span); }

// Reads `n` uint4 (HBM-bound for n well past L2).
__global__ void stream(const uint4* src, int64_t n, unsigned* sink) { taxfree::dev::stream_read(src, n, sink); }

// The same two with dynamic shared memory touched once (as the decode kernels hold ~200 KB).
__global__ void spin_smem(long long cycles) {
  extern __shared__ unsigned smem[];
  smem[threadIdx.x] = threadIdx.x;
  spin_body(cycles, nullptr);
  __syncthreads();
  if (smem[(threadIdx.x + 1) % blockDim.x] == 0xFFFFFFFFu) smem[0] = 1;
}
__global__ void stream_smem(const uint4* src, int64_t n, unsigned* sink) {
  extern __shared__ unsigned smem[];
  smem[threadIdx.x] = threadIdx.x;
  taxfree::dev::stream_read(src, n, sink);
  __syncthreads();
  if (smem[(threadIdx.x + 1) % blockDim.x] == 0xFFFFFFFFu) *sink = 1;
}

// Holds the stream until the host sets *gate (bounded: 1 s), so a whole batch is queued first.
__global__ void gate_kernel(volatile unsigned* gate) {
  const uint64_t t0 = global_ns();
  while (*gate == 0 && global_ns() - t0 < 1'000'000'000ull) {
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  // `team`: join a Team first (run under `taxfree run -n 1`: NCCL, the symmetric heap) and time on
  // its stream, to see whether the process state the benchmark runs in changes what is measured.
  const bool with_team = argc > 1 && std::string(argv[1]) == "team";
  std::unique_ptr<taxfree::Team> team = with_team ? taxfree::Team::join() : nullptr;
  cudaStream_t st = team ? team->stream() : nullptr;
  int dev = 0, clock_khz = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  unsigned long long *d = nullptr, h[2] = {};
  TF_CUDA(cudaMalloc(&d, 2 * sizeof(unsigned long long)));
  timer_step<<<1, 1>>>(d);
  TF_CUDA(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  std::printf("globaltimer: smallest step %llu ns, %llu distinct values in 200000 reads\n", h[0], h[1]);

  // Calibrate clocks per µs from the kernel's own globaltimer span (the SM clock may not be the
  // attribute's nominal rate).
  const long long probe = 20LL * clock_khz;  // ~20 ms at the nominal clock
  spin<<<1, 32>>>(probe, d);
  TF_CUDA(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost));
  const double cycles_per_us = double(probe) / (double(h[1] - h[0]) * 1e-3);
  std::printf("SM clock %.0f MHz (nominal %d MHz)\n", cycles_per_us, clock_khz / 1000);

  unsigned* gate = nullptr;
  TF_CUDA(cudaHostAlloc(&gate, sizeof(unsigned), cudaHostAllocMapped));
  int sms = 0;
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t stream_bytes = int64_t(1) << 30;  // rotated through so runs miss L2
  uint4* buf = nullptr;
  unsigned* sink = nullptr;
  TF_CUDA(cudaMalloc(&buf, size_t(stream_bytes)));
  TF_CUDA(cudaMemset(buf, 1, size_t(stream_bytes)));
  TF_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  constexpr int kSamples = 24, kBackToBack = 16;  // 24 x 19 items fit the stream queue behind the gate
  std::vector<cudaEvent_t> starts(kSamples), stops(kSamples);
  for (int i = 0; i < kSamples; ++i) {
    TF_CUDA(cudaEventCreate(&starts[size_t(i)]));
    TF_CUDA(cudaEventCreate(&stops[size_t(i)]));
  }
  enum Shape { one_cta, grid, clusters, hbm, grid_smem, hbm_smem, decode };
  const char* names[] = {"1 CTA spin", "grid spin", "grid spin, clusters of 8", "grid HBM stream",
                         "grid spin, 200 KB smem", "grid HBM stream, 200 KB smem",
                         "launch_decode_partial, b=1 heads=96/12 d=128, KV = size x 650 tokens (buf as K and V)"};
  namespace fd = taxfree::flash_decode;
  void* q = nullptr;
  void* o = nullptr;
  void* ws = nullptr;
  float* lse = nullptr;
  int32_t* len = nullptr;
  TF_CUDA(cudaMalloc(&q, 96 * 128 * 2));
  TF_CUDA(cudaMemset(q, 0x3c, 96 * 128 * 2));
  TF_CUDA(cudaMalloc(&o, 96 * 128 * 2));
  TF_CUDA(cudaMalloc(&lse, 96 * 4));
  TF_CUDA(cudaMalloc(&len, 4));
  const size_t ws_bytes = size_t(64) << 20;
  TF_CUDA(cudaMalloc(&ws, ws_bytes));
  fd::DecodeArgs da{};
  da.batch = 1, da.q_heads = 96, da.kv_heads = 12, da.head_dim = 128, da.dtype = fd::DType::bf16;
  da.q = q, da.layout = fd::KvLayout::contiguous, da.slice_len = len, da.out = o, da.lse_part = lse;
  constexpr int kBigSmem = 200 * 1024;  // what the decode kernels ask for, with the max carveout
  for (const void* f : {reinterpret_cast<const void*>(spin_smem), reinterpret_cast<const void*>(stream_smem)}) {
    TF_CUDA(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kBigSmem));
    TF_CUDA(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));
  }
  int rotation = 0;
  auto launch = [&](Shape shape, double us) {
    const long long cyc = std::llround(us * cycles_per_us);
    if (shape == one_cta) {
      spin<<<1, 32, 0, st>>>(cyc, nullptr);
    } else if (shape == grid) {
      spin<<<sms, 128, 0, st>>>(cyc, nullptr);
    } else if (shape == clusters) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(unsigned(sms / 8 * 8));
      cfg.blockDim = dim3(128);
      cfg.stream = st;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 8;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      TF_CUDA(cudaLaunchKernelEx(&cfg, spin, cyc, static_cast<unsigned long long*>(nullptr)));
    } else if (shape == decode) {  // K and V: two halves of buf (bytes of 0x01: finite bf16)
      const int kv = int(std::lround(us * 650 / 64)) * 64;
      static int last_kv = -1;
      static fd::DecodePlan plan;
      da.capacity = kv, da.max_len = kv;
      da.k = buf, da.v = reinterpret_cast<char*>(buf) + stream_bytes / 2;
      if (kv != last_kv) {
        TF_CUDA(cudaMemcpy(len, &kv, 4, cudaMemcpyHostToDevice));
        plan = fd::plan_decode(da, fd::DecodeConfig{});
        TF_REQUIRE(plan.workspace_bytes <= ws_bytes, taxfree::Status::Internal, "workspace");
        fd::init_decode_workspace(ws, plan.workspace_bytes, nullptr);
        TF_CUDA(cudaDeviceSynchronize());
        last_kv = kv;
      }
      fd::launch_decode_partial(da, plan, ws, ws_bytes, st);
    } else if (shape == grid_smem) {
      spin_smem<<<sms, 128, kBigSmem, st>>>(cyc);
    } else {  // ~4 TB/s: us * 4e6 bytes, from a rotating offset
      const int64_t n = std::min<int64_t>(int64_t(us * 4e6) / 16, stream_bytes / 16 / 4);
      const int64_t at = (rotation++ % 4) * (stream_bytes / 16 / 4);
      if (shape == hbm) stream<<<sms * 2, 512, 0, st>>>(buf + at, n, sink);
      else stream_smem<<<sms, 512, kBigSmem, st>>>(buf + at, n, sink);
    }
  };
  // kSamples samples of `runs` runs behind a gate; per-run microseconds.
  auto timed = [&](Shape shape, double us, int runs) {
    *gate = 0;
    gate_kernel<<<1, 1, 0, st>>>(gate);
    for (int i = 0; i < kSamples; ++i) {
      spin<<<1, 32, 0, st>>>(1000, nullptr);  // something ahead of the start event, as the barrier is
      TF_CUDA(cudaEventRecord(starts[size_t(i)], st));
      for (int k = 0; k < runs; ++k) launch(shape, us);
      TF_CUDA(cudaEventRecord(stops[size_t(i)], st));
    }
    __atomic_store_n(gate, 1u, __ATOMIC_RELEASE);
    TF_CUDA(cudaDeviceSynchronize());
    std::vector<double> out;
    for (int i = 0; i < kSamples; ++i) {
      float ms = 0;
      TF_CUDA(cudaEventElapsedTime(&ms, starts[size_t(i)], stops[size_t(i)]));
      out.push_back(double(ms) * 1e3 / runs);
    }
    return out;
  };
  auto summary = [](const std::vector<double>& us, int runs) {
    int whole = 0;
    for (double u : us) whole += std::fabs(u * runs - std::round(u * runs)) < 1e-3;
    const auto [lo, hi] = std::minmax_element(us.begin(), us.end());
    std::printf(" | %8.3f %6.3f %4.0f%%", median(us), *hi - *lo, 100.0 * whole / double(us.size()));
  };
  // Team mode times what differed between this tool and the benchmark (r126: a cluster launch on the
  // team's stream crashed the process once; not pursued).
  const std::vector<Shape> shapes =
      team ? std::vector<Shape>{decode, grid} : std::vector<Shape>{decode, one_cta, grid, clusters, hbm, grid_smem, hbm_smem};
  for (Shape shape : shapes) {
    std::printf("%s\n%8s | %8s %6s %5s | %8s %6s %5s\n", names[shape], "size_us", "1 run", "spread", "whole",
                "per b2b", "spread", "whole");
    for (double us = 5; us <= 25.001; us += 1.25) {
      std::printf("%8.2f", us);
      summary(timed(shape, us, 1), 1);
      summary(timed(shape, us, kBackToBack), kBackToBack);
      std::printf("\n");
    }
  }
  for (int i = 0; i < kSamples; ++i) {
    TF_CUDA(cudaEventDestroy(starts[size_t(i)]));
    TF_CUDA(cudaEventDestroy(stops[size_t(i)]));
  }
  TF_CUDA(cudaFreeHost(gate));
  TF_CUDA(cudaFree(buf));
  TF_CUDA(cudaFree(sink));
  for (void* p : {q, o, ws, static_cast<void*>(lse), static_cast<void*>(len)}) TF_CUDA(cudaFree(p));
  TF_CUDA(cudaFree(d));
  if (team) team->finish();
  return 0;
}
