// flash_decode bandwidth report on one GPU (prints, never fails): a copy kernel's HBM bandwidth
// measured in this run against the decode kernel's KV-read bandwidth on the issue's shapes, plus a
// split-count sweep around the heuristic's choice. Target: decode >= 80% of the copy bandwidth at
// KV >= 32K tokens per rank.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "flash_decode_util.h"
#include "gpu_env.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode {
namespace {

using test::Dev;

// Target: decode >= 80% of the copy bandwidth at KV >= 32K tokens.

__global__ void copy_f4(const float4* __restrict__ src, float4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    p[i] = __float2bfloat16(float((z ^ (z >> 31)) >> 40) * (2.f / 16777216.f) - 1.f);
  }
}

template <class F>
double median_seconds(cudaStream_t s, int iters, F&& f) {
  cudaEvent_t a, b;
  TF_CUDA(cudaEventCreate(&a));
  TF_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    TF_CUDA(cudaEventRecord(a, s));
    f();
    TF_CUDA(cudaEventRecord(b, s));
    TF_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    TF_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

TEST(FlashDecodeGpu, BandwidthReport) {
  TF_REQUIRE_GPUS(1);
  cudaStream_t stream;
  TF_CUDA(cudaStreamCreate(&stream));
  const size_t copy_bytes = size_t(2) << 30;
  Dev<float4> src(copy_bytes / 16), dst(copy_bytes / 16);
  TF_CUDA(cudaMemset(src.p, 1, copy_bytes));
  int sms = 0;
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double copy_s = median_seconds(stream, 20, [&] {
    copy_f4<<<sms * 8, 512, 0, stream>>>(src.p, dst.p, copy_bytes / 16);
  });
  const double copy_bw = 2.0 * copy_bytes / copy_s;
  std::printf("[ decode bw ] copy kernel (read+write): %.0f GB/s\n", copy_bw / 1e9);

  struct S {
    int q, kv_heads, batch, kv;
  };
  for (const S s : {S{96, 12, 1, 8192}, S{96, 12, 1, 32768}, S{96, 12, 4, 32768}, S{96, 12, 16, 32768},
                    S{96, 12, 1, 131072}, S{96, 12, 4, 131072}, S{96, 12, 1, 524288}, S{64, 8, 1, 65536},
                    S{64, 8, 8, 65536}, S{64, 8, 32, 16384}}) {
    const size_t kv_elems = size_t(s.batch) * s.kv_heads * s.kv * 128;
    Dev<__nv_bfloat16> q(size_t(s.batch) * s.q * 128), k(kv_elems), v(kv_elems), out(size_t(s.batch) * s.q * 128);
    Dev<int32_t> lens(static_cast<size_t>(s.batch));
    lens.upload(std::vector<int32_t>(size_t(s.batch), s.kv));
    fill_bf16<<<1024, 256>>>(q.p, q.n, 1), fill_bf16<<<1024, 256>>>(k.p, k.n, 2), fill_bf16<<<1024, 256>>>(v.p, v.n, 3);
    DecodeArgs a;
    a.batch = s.batch, a.q_heads = s.q, a.kv_heads = s.kv_heads, a.head_dim = 128;
    a.q = q.p, a.k = k.p, a.v = v.p, a.capacity = s.kv, a.slice_len = lens.p, a.max_len = s.kv, a.out = out.p;
    const double kv_bytes = 2.0 * kv_elems * 2;
    const int auto_splits = plan_decode(a).num_splits;
    std::vector<int> sweep = {0};  // 0 = the heuristic's choice
    if (auto_splits / 2 >= 1) sweep.push_back(auto_splits / 2);
    if (auto_splits * 2 <= kMaxSplits) sweep.push_back(auto_splits * 2);
    for (int splits : sweep) {
      DecodeConfig cfg;
      cfg.num_splits = splits;
      const DecodePlan plan = plan_decode(a, cfg);
      Dev<unsigned char> ws(plan.workspace_bytes);
      init_decode_workspace(ws.p, plan.workspace_bytes, stream);
      const double t = median_seconds(stream, 20, [&] {
        launch_decode_partial(a, plan, ws.p, plan.workspace_bytes, stream);
      });
      std::printf("[ decode bw ] q/kv=%d/%d batch=%d kv=%d splits=%d%s: %.1f us, %.0f GB/s = %.0f%% of copy\n",
                  s.q, s.kv_heads, s.batch, s.kv, plan.num_splits, splits == 0 ? " (auto)" : "", t * 1e6,
                  kv_bytes / t / 1e9, 100.0 * kv_bytes / t / copy_bw);
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace taxfree::ops::flash_decode
