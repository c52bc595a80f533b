// The library from a program: one tensor-parallel step with both fused ops, each checked against
// its bulk-synchronous baseline. Run one process per GPU:
//
//   build/taxfree run -n 2 -- build/examples/tp_step        (or torchrun / mpirun)
//
// 1. all_gather_matmul, tensor-parallel layout (gather_dim 0): every rank holds M / world rows of
//    A and its own weight B [N, K]; C = gather(A) x B^T on every rank, `auto` against `bsp`.
// 2. flash_decode: every rank holds a contiguous slice of each sequence's KV cache; the attention
//    output over the whole sequences ends up on every rank, `fused` against `bsp`.
// Exit code 0 when both agree within bf16 rounding, 5 when not, 1 on an error (named on stderr).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace {

using namespace taxfree;
namespace fd = taxfree::flash_decode;

// Deterministic values in [-1, 1) from (seed, index): every rank can produce any rank's data.
__device__ float hash_value(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i + 0x632BE59BD9B4E019ull);
  x ^= x >> 31, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 29;
  return float(x >> 40) / float(1ull << 23) - 1.f;
}

__global__ void fill(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hash_value(seed, uint64_t(i)));
}

// This rank's slice [start, start + len) of sequence b into a contiguous cache [b][h][capacity][d],
// valued by the token's global position, so the ranks' slices form one consistent sequence.
__global__ void fill_kv(__nv_bfloat16* p, int kv_heads, int capacity, int d, int b, int start, int len, uint64_t seed) {
  const int64_t n = int64_t(kv_heads) * len * d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / (int64_t(len) * d), t = i / d % len, e = i % d;
    const uint64_t global = ((uint64_t(b) * kv_heads + h) * 1000003ull + uint64_t(start + t)) * d + e;
    p[((int64_t(b) * kv_heads + h) * capacity + t) * d + e] = __float2bfloat16(hash_value(seed, global));
  }
}

template <class T>
T* device_alloc(size_t count) {
  T* p = nullptr;
  TF_CUDA(cudaMalloc(&p, count * sizeof(T)));
  return p;
}

std::vector<float> download_bf16(const void* p, size_t count) {
  std::vector<__nv_bfloat16> h(count);
  TF_CUDA(cudaMemcpy(h.data(), p, count * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// Elements of `got` farther from `want` than bf16 rounding of both allows.
size_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += !(std::fabs(got[i] - want[i]) <= 1e-2f * std::fabs(want[i]) + 1e-3f);
  return bad;
}

size_t all_gather_matmul_step(Team& team) {
  const int w = team.world();
  const int64_t m = 512 * w, n = 4096, k = 4096;
  auto* a_shard = device_alloc<__nv_bfloat16>(size_t(m / w * k));
  auto* b = device_alloc<__nv_bfloat16>(size_t(n * k));
  auto* c_auto = device_alloc<__nv_bfloat16>(size_t(m * n));
  auto* c_bsp = device_alloc<__nv_bfloat16>(size_t(m * n));
  fill<<<256, 256, 0, team.stream()>>>(a_shard, m / w * k, 100 + uint64_t(team.rank()));  // this rank's rows
  fill<<<256, 256, 0, team.stream()>>>(b, n * k, 200 + uint64_t(team.rank()));            // this rank's weight

  const uint64_t heap_mark = team.heap().mark();  // the op's heap buffers go back with release()
  size_t bad = 0;
  {
    AgmmConfig cfg;
    cfg.max_m = m, cfg.max_k = k;
    AllGatherMatmul op(team, cfg);
    AgmmArgs a;
    a.a_shard = a_shard, a.lda_shard = k, a.b = b, a.ldb = k, a.m = m, a.n = n, a.k = k;
    a.gather_dim = 0, a.dtype = DType::bf16, a.b_layout = gemm::BLayout::nk;
    a.c = c_auto, a.ldc = n;
    op.launch(AgmmVariant::automatic, a, team.stream());
    a.c = c_bsp;
    op.launch(AgmmVariant::bsp, a, team.stream());
    team.sync(team.stream());
    bad = mismatches(download_bf16(c_auto, size_t(m * n)), download_bf16(c_bsp, size_t(m * n)));
    std::printf("[rank %d] all_gather_matmul M=%lld N=%lld K=%lld: auto (%s) vs bsp, %zu of %lld differ\n",
                team.rank(), (long long)m, (long long)n, (long long)k,
                variant_name(choose_agmm_variant(a, w, cfg)), bad, (long long)(m * n));
  }
  team.heap().release(heap_mark);
  for (void* p : {(void*)a_shard, (void*)b, (void*)c_auto, (void*)c_bsp}) cudaFree(p);
  return bad;
}

size_t flash_decode_step(Team& team) {
  const int batch = 2, q_heads = 32, kv_heads = 4, d = 128;
  const std::vector<int32_t> lens = {5000, 777};  // whole sequences, split over the ranks
  std::vector<int32_t> local(batch);
  int capacity = 1;
  for (int b = 0; b < batch; ++b) {
    local[b] = fd::partition_slice(lens[b], team.world(), team.rank()).len();
    capacity = std::max(capacity, local[b]);
  }
  auto* q = device_alloc<__nv_bfloat16>(size_t(batch) * q_heads * d);
  auto* kc = device_alloc<__nv_bfloat16>(size_t(batch) * kv_heads * capacity * d);
  auto* vc = device_alloc<__nv_bfloat16>(size_t(batch) * kv_heads * capacity * d);
  auto* out_fused = device_alloc<__nv_bfloat16>(size_t(batch) * q_heads * d);
  auto* out_bsp = device_alloc<__nv_bfloat16>(size_t(batch) * q_heads * d);
  auto* len_d = device_alloc<int32_t>(batch);
  // On the stream the kernels reading it run on (a pageable cudaMemcpy is not ordered with it).
  TF_CUDA(cudaMemcpyAsync(len_d, local.data(), batch * 4, cudaMemcpyHostToDevice, team.stream()));
  fill<<<64, 256, 0, team.stream()>>>(q, int64_t(batch) * q_heads * d, 300);  // the same on every rank
  for (int b = 0; b < batch; ++b) {
    const int start = fd::partition_slice(lens[b], team.world(), team.rank()).start;
    fill_kv<<<256, 256, 0, team.stream()>>>(kc, kv_heads, capacity, d, b, start, local[b], 400);
    fill_kv<<<256, 256, 0, team.stream()>>>(vc, kv_heads, capacity, d, b, start, local[b], 500);
  }

  const uint64_t heap_mark = team.heap().mark();
  size_t bad = 0;
  {
    fd::FlashDecodeConfig cfg;
    cfg.max_batch = batch, cfg.max_q_heads = q_heads, cfg.max_kv_heads = kv_heads, cfg.max_head_dim = d;
    fd::FlashDecode op(team, cfg);
    fd::DecodeArgs a;
    a.batch = batch, a.q_heads = q_heads, a.kv_heads = kv_heads, a.head_dim = d, a.dtype = DType::bf16;
    a.q = q, a.k = kc, a.v = vc, a.layout = fd::KvLayout::contiguous, a.capacity = capacity;
    a.slice_len = len_d, a.max_len = capacity, a.host_slice_len = local;
    a.out = out_fused;
    op.launch(fd::FlashDecodeVariant::fused, a, team.stream());
    a.out = out_bsp;
    op.launch(fd::FlashDecodeVariant::bsp, a, team.stream());
    team.sync(team.stream());
    const size_t count = size_t(batch) * q_heads * d;
    bad = mismatches(download_bf16(out_fused, count), download_bf16(out_bsp, count));
    std::printf("[rank %d] flash_decode batch=%d heads=%d/%d lengths %d,%d (this rank %d,%d): fused vs bsp, %zu of %zu differ\n",
                team.rank(), batch, q_heads, kv_heads, lens[0], lens[1], local[0], local[1], bad, count);
  }
  team.heap().release(heap_mark);
  for (void* p : {(void*)q, (void*)kc, (void*)vc, (void*)out_fused, (void*)out_bsp, (void*)len_d}) cudaFree(p);
  return bad;
}

}  // namespace

int main() {
  std::unique_ptr<Team> team;
  try {
    team = Team::join();
    const size_t bad = all_gather_matmul_step(*team) + flash_decode_step(*team);
    team->finish();
    return bad == 0 ? 0 : 5;
  } catch (const Error& e) {
    std::fprintf(stderr, "tp_step: %s\n", e.what());
    if (team && e.status() != Status::RemoteError) team->fail(e.what());
    return e.status() == Status::RemoteError ? int(kExitRemote) : 1;
  }
}
