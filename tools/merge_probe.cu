// merge_probe: SM clocks of the split merge the fused flash_decode kernel runs in its tail
// (cta_merge_inbox_rows, cluster_merge.h: n partials of `rows` rows from a CTA's shared-memory
// inbox), by n and rows, and of its pieces: two CTA barriers alone, and segment_lse_weights (the
// LSE statistics and weights of one warp's row; its merged lse is never read there, so the
// compiler drops lse_total's logf from that piece). One CTA of kThreads threads repeats each piece
// `kIters` times between clock64 reads of thread 0 (each merge starts and ends with a CTA
// barrier, so repeats do not overlap). Run on a GPU machine: build/tools/merge_probe.
// docs/notes/decode-latency.md (twenty-sixth session) has what it measured.
#include <cuda_runtime.h>

#include <cstdio>

#include "taxfree/kernels/attention/cluster_merge.h"
#include "taxfree/runtime/error.h"

namespace {

namespace at = taxfree::attention;
constexpr int kIters = 256;

enum class Piece { barriers, weights, merge };

template <int D, Piece P>
__global__ void __launch_bounds__(at::kThreads) time_piece(int n, int rows, long long* out) {
  __shared__ at::ClusterInbox<D> inbox;
  __shared__ at::CombineScratch scratch;
  __shared__ at::PartialTile<D> tile;
  for (int i = threadIdx.x; i < at::kClusterSlots * D; i += blockDim.x) (&inbox.o[0][0])[i] = __sinf(0.37f * i);
  for (int i = threadIdx.x; i < at::kClusterSlots; i += blockDim.x) inbox.lse[i] = 1.5f * __cosf(1.3f * i);
  __syncthreads();
  const long long c0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if constexpr (P == Piece::barriers) {
      __syncthreads();
      __syncthreads();
    } else if constexpr (P == Piece::weights) {  // warp 0's row 0: the LSE reductions and weights only
      if (threadIdx.x < 32) {
        constexpr int kLanes = at::MergeLayout<D>::kLanes, kLse = at::MergeLayout<D>::kLse;
        const int col = threadIdx.x % kLanes;
        float l[1][kLse];
        for (int k = 0; k < kLse; ++k) l[0][k] = col + k * kLanes < n ? inbox.lse[(col + k * kLanes) * rows] : -INFINITY;
        const bool owner[1] = {true};
        float* const w[1] = {scratch.w[0]};
        float lse[1];
        at::segment_lse_weights<kLanes>(l, n, col, owner, w, lse);
        if (col == 0) tile.lse[0] = lse[0];
      }
      __syncthreads();
    } else {
      at::cta_merge_inbox_rows<D>(inbox, n, rows, rows, scratch, tile);
    }
  }
  const long long c1 = clock64();
  if (threadIdx.x == 0) out[0] = (c1 - c0) / kIters;
}

template <int D, Piece P>
long long cycles(int n, int rows, long long* out) {
  time_piece<D, P><<<1, at::kThreads>>>(n, rows, out);
  TF_CUDA(cudaGetLastError());
  long long c = 0;
  TF_CUDA(cudaMemcpy(&c, out, sizeof(c), cudaMemcpyDeviceToHost));
  return c;
}

}  // namespace

int main() try {
  long long* out = nullptr;
  TF_CUDA(cudaMalloc(&out, sizeof(long long)));
  cycles<128, Piece::barriers>(1, 1, out);  // first launch: module load
  std::printf("SM clocks per repeat (one CTA of %d threads, %d repeats)\n", at::kThreads, kIters);
  std::printf("two CTA barriers: %lld\n", cycles<128, Piece::barriers>(1, 1, out));
  for (const int n : {1, 2, 8, 16})
    std::printf("segment_lse_weights, D 128, n %2d: %lld   D 64: %lld\n", n, cycles<128, Piece::weights>(n, 1, out),
                cycles<64, Piece::weights>(n, 1, out));
  std::printf("cta_merge_inbox_rows, D 128 (rows x n):\n");
  for (const int rows : {1, 2, 4, 8}) {
    std::printf("  rows %d:", rows);
    for (const int n : {1, 2, 4, 8, 9, 16})
      if (n * rows <= at::kClusterSlots)  // inbox slot p * rows + r for partial p, row r
        std::printf("  n %2d %5lld", n, cycles<128, Piece::merge>(n, rows, out));
    std::printf("\n");
  }
  std::printf("cta_merge_inbox_rows, D 64, rows 1 / 2, n 8: %lld / %lld\n", cycles<64, Piece::merge>(8, 1, out),
              cycles<64, Piece::merge>(8, 2, out));
  TF_CUDA(cudaFree(out));
  return 0;
} catch (const taxfree::Error& e) {
  std::fprintf(stderr, "merge_probe: %s\n", e.what());
  return 1;
}
