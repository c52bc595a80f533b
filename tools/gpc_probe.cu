// gpc_probe: how thread-block clusters sit on this GPU's GPCs. Written to test why the clustered
// fused flash_decode kernel streams KV slower with some cluster counts than with others (twelve
// clusters of 8 on an H200 lost to the same splits unclustered, eight did not). CUDA names no GPC,
// but every CTA of a cluster runs on one GPC, so SMs that share a cluster share a GPC. On the GPU
// machine, `build/tools/gpc_probe` prints:
//   1. max active clusters of C CTAs at one CTA per SM, C = 1..16 (device_cluster_counts), and
//      the GPC sizes the library infers from them (GpcLayout, the fused plan reads it);
//   2. the GPCs: SMs joined by sharing a cluster over launches of the most clusters of 16, 8, 4 and
//      2 CTAs (union-find on %smid), with each group's size;
//   3. where the scheduler puts N clusters of C (every CTA resident at once): clusters per GPC,
//      for C = 8 and 9 and N = 1 .. the most that fit, and for C = 4 at a few N.
// docs/PERFORMANCE.md (twenty-eighth session) has what it measured.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <vector>

#include "taxfree/runtime/error.h"
#include "taxfree/runtime/gpc_layout.h"

namespace {

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One CTA per SM (the launch asks for the SM's shared memory): CTA i writes its SM to sm[i], then
// stays ~20 us so that every CTA of the launch is resident together, as in the fused kernel.
__global__ void record_sm(int* sm) {
  if (threadIdx.x == 0) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = int(id);
    const unsigned long long end = global_ns() + 20000;
    while (global_ns() < end) {
    }
  }
}

int g_smem = 0;

cudaLaunchConfig_t config(int clusters, int size, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t c{};
  c.gridDim = dim3(unsigned(clusters * size));
  c.blockDim = dim3(128);
  c.dynamicSmemBytes = size_t(g_smem);
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = unsigned(size);
  attr->val.clusterDim.y = attr->val.clusterDim.z = 1;
  c.attrs = attr;
  c.numAttrs = 1;
  return c;
}

// The SM of every CTA of one launch of `clusters` clusters of `size`.
std::vector<int> placement(int clusters, int size) {
  const int n = clusters * size;
  int* d = nullptr;
  TF_CUDA(cudaMalloc(&d, sizeof(int) * size_t(n)));
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t c = config(clusters, size, &attr);
  TF_CUDA(cudaLaunchKernelEx(&c, record_sm, d));
  TF_CUDA(cudaDeviceSynchronize());
  std::vector<int> sm(size_t(n), 0);
  TF_CUDA(cudaMemcpy(sm.data(), d, sizeof(int) * size_t(n), cudaMemcpyDeviceToHost));
  TF_CUDA(cudaFree(d));
  return sm;
}

struct Groups {
  std::vector<int> parent;
  explicit Groups(int n) : parent(size_t(n)) { std::iota(parent.begin(), parent.end(), 0); }
  int find(int x) { return parent[size_t(x)] == x ? x : parent[size_t(x)] = find(parent[size_t(x)]); }
  void join(int a, int b) { parent[size_t(find(a))] = find(b); }
};

}  // namespace

int main() {
  int dev = 0, sms = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TF_CUDA(cudaDeviceGetAttribute(&g_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TF_CUDA(cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem));
  TF_CUDA(cudaFuncSetAttribute(record_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  std::printf("SMs %d, shared memory per CTA %d bytes (one CTA per SM)\n", sms, g_smem);

  // most[c]: max active clusters of c, as the library counts them (record_sm also takes an SM).
  std::vector<int> most = taxfree::device_cluster_counts(dev);
  TF_REQUIRE(most.size() == size_t(taxfree::GpcLayout::kMaxCluster), taxfree::Status::NotSupported,
             "gpc_probe: this device reports no cluster occupancy");
  most.insert(most.begin(), 0);
  std::printf("max active clusters by size:");
  for (int c = 1; c <= taxfree::GpcLayout::kMaxCluster; ++c) std::printf(" %d:%d", c, most[size_t(c)]);
  std::printf("\n");
  std::printf("layout the library infers from those counts (gpc_layout.h): %s\n",
              taxfree::to_string(taxfree::device_gpc_layout(dev)).c_str());
  Groups g(sms);
  for (int size : {16, 8, 4, 2})
    for (int rep = 0; rep < 4 && most[size_t(size)] > 0; ++rep) {
      const std::vector<int> sm = placement(most[size_t(size)], size);
      for (size_t i = 0; i < sm.size(); ++i)
        if (i % size_t(size) != 0) g.join(sm[i], sm[i - i % size_t(size)]);
    }
  std::map<int, std::vector<int>> gpcs;
  for (int s = 0; s < sms; ++s) gpcs[g.find(s)].push_back(s);
  std::map<int, int> gpc_of;  // root -> GPC index in order of first SM
  std::printf("GPCs (SMs joined by shared clusters): %zu\n", gpcs.size());
  for (auto& [root, list] : gpcs) {
    const int i = int(gpc_of.size());
    gpc_of[root] = i;
    std::printf("  gpc %d: %zu SMs:", i, list.size());
    for (int s : list) std::printf(" %d", s);
    std::printf("\n");
  }

  auto show = [&](int size, int n) {
    const std::vector<int> sm = placement(n, size);
    std::vector<int> per(gpcs.size(), 0);
    for (int k = 0; k < n; ++k) ++per[size_t(gpc_of[g.find(sm[size_t(k * size)])])];
    std::printf("  %2d clusters of %2d: per GPC", n, size);
    for (int x : per) std::printf(" %d", x);
    std::printf("  (max %d)\n", *std::max_element(per.begin(), per.end()));
  };
  std::printf("placement (clusters per GPC, in the GPC order above):\n");
  for (int size : {8, 9})
    for (int n = 1; n <= most[size_t(size)]; ++n) show(size, n);
  for (int n : {8, 12, 16, 20, 24, 32}) if (n <= most[4]) show(4, n);
  return 0;
}
