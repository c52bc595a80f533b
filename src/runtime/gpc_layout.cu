#include "taxfree/runtime/gpc_layout.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "taxfree/runtime/error.h"

namespace taxfree {
namespace {
// What the counts are asked of: a kernel that takes a whole SM's shared memory, as the library's
// clustered launches do.
__global__ void one_cta_per_sm_kernel() {}
}  // namespace

int GpcLayout::holding(int cluster) const {
  if (!known || cluster < 1 || cluster > kMaxSms) return 0;
  int n = 0;
  for (int s = cluster; s <= kMaxSms; ++s) n += gpcs_of_size[s];
  return n;
}

GpcLayout infer_gpc_layout(std::span<const int> max_clusters) {
  constexpr int kMax = GpcLayout::kMaxSms;
  GpcLayout layout;
  if (int(max_clusters.size()) < GpcLayout::kMaxCluster || max_clusters[0] < 1) return layout;
  auto f = [&](int c) { return max_clusters[size_t(c - 1)]; };
  // at_least[x]: GPCs with >= x SMs. A GPC of S SMs holds floor(S / c) clusters of c, so
  // f(c) = sum over k >= 1 of at_least[k c], solved from the largest x down. Sizes past 16 cannot
  // be asked for: f(9) counts a GPC of 10-16 SMs once and one of 18 twice, f(10) every GPC of
  // 10-18 once, and no GPC has exactly 9 (S even), so f(9) - f(10) GPCs have 18 (none has 17).
  std::array<int, kMax + 2> at_least{};
  at_least[kMax] = at_least[kMax - 1] = f(9) - f(10);
  for (int x = GpcLayout::kMaxCluster; x >= 1; --x) {
    int more = 0;
    for (int k = 2; k * x <= kMax; ++k) more += at_least[size_t(k * x)];
    at_least[size_t(x)] = f(x) - more;
  }
  for (int s = 1; s <= kMax; ++s) {
    layout.gpcs_of_size[size_t(s)] = at_least[size_t(s)] - at_least[size_t(s + 1)];
    if (layout.gpcs_of_size[size_t(s)] < 0 || (s % 2 == 1 && layout.gpcs_of_size[size_t(s)] != 0)) return GpcLayout{};
  }
  for (int c = 1; c <= GpcLayout::kMaxCluster; ++c) {  // the layout must give back every count
    int n = 0;
    for (int s = 1; s <= kMax; ++s) n += layout.gpcs_of_size[size_t(s)] * (s / c);
    if (n != f(c)) return GpcLayout{};
  }
  layout.known = true;
  return layout;
}

std::vector<int> device_cluster_counts(int device) {
  static std::mutex mu;
  static std::map<int, std::vector<int>> cache;
  const std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(device); it != cache.end()) return it->second;
  int current = 0, smem = 0, major = 0;
  TF_CUDA(cudaGetDevice(&current));
  TF_CUDA(cudaSetDevice(device));
  std::vector<int> counts;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9 &&
      cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      cudaFuncSetAttribute(one_cta_per_sm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess &&
      cudaFuncSetAttribute(one_cta_per_sm_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    for (int c = 1; c <= GpcLayout::kMaxCluster; ++c) {
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      cfg.gridDim = dim3(unsigned(c));
      cfg.blockDim = dim3(32);
      cfg.dynamicSmemBytes = size_t(smem);
      attr.id = cudaLaunchAttributeClusterDimension;  // also for c = 1: a query needs a cluster size
      attr.val.clusterDim.x = unsigned(c);
      attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, one_cta_per_sm_kernel, &cfg) != cudaSuccess) {
        counts.clear();
        break;
      }
      counts.push_back(n);
    }
  }
  (void)cudaGetLastError();  // a refused query (no clusters on this device) is an answer, not an error
  TF_CUDA(cudaSetDevice(current));
  return cache.emplace(device, counts).first->second;
}

GpcLayout device_gpc_layout(int device) { return infer_gpc_layout(device_cluster_counts(device)); }

std::string to_string(const GpcLayout& layout) {
  if (!layout.known) return "unknown";
  std::string text;
  for (int s = GpcLayout::kMaxSms; s >= 1; --s)
    if (const int n = layout.gpcs_of_size[size_t(s)]; n > 0)
      text += (text.empty() ? "" : " ") + std::to_string(n) + "x" + std::to_string(s);
  return text;
}

}  // namespace taxfree
