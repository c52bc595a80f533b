// Private: definitions of the fused kernel's launchers (kernels.h), included by one small .cu per
// (dtype, head_dim): distributed_<dtype>_d<D>.cu.
#pragma once

#include "decode_instance.cuh"
#include "taxfree/kernels/attention/fused_decode_kernel.h"

namespace taxfree::flash_decode::detail {

namespace {
using attention::FusedSchedule;
template <class T, int D, FusedSchedule kSchedule>
constexpr auto fused_kernel(bool paged) {
  return paged ? &attention::fused_decode_kernel<T, D, true, kSchedule>
               : &attention::fused_decode_kernel<T, D, false, kSchedule>;
}

// Dynamic shared memory of clustered launches: the device's per-CTA maximum, so that one CTA fits
// an SM. At two per SM the cluster scheduler doubled CTAs up on some SMs while others stayed idle
// (r53: 30 of 102 SMs held two of a launch's 132 CTAs, and the slowest split attended 3 us later).
int cluster_launch_smem() {
  static const int bytes = [] {
    int dev = 0, v = 0;
    TF_CUDA(cudaGetDevice(&dev));
    TF_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return v;
  }();
  return bytes;
}

// Clustered launches of the clustered fused kernel: `grid` CTAs in clusters of `cluster` along x.
// Clusters of more than 8 CTAs need the non-portable size opt-in (sm_90: up to 16), set once per
// kernel with the decode family's attributes.
template <class T, int D>
struct Clustered {
  static void prepare() {
    static const bool done[2] = {opt_in(reinterpret_cast<const void*>(fused_kernel<T, D, FusedSchedule::clustered>(false))),
                                 opt_in(reinterpret_cast<const void*>(fused_kernel<T, D, FusedSchedule::clustered>(true)))};
    (void)done;
  }
  static bool opt_in(const void* k) {
    TF_REQUIRE(cluster_launch_smem() >= attention::fused_cluster_smem_bytes<D>(), Status::NotSupported,
               "the clustered fused decode needs " << attention::fused_cluster_smem_bytes<D>()
                                                   << " bytes of shared memory per CTA; this device has "
                                                   << cluster_launch_smem());
    TF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, cluster_launch_smem()));
    TF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));
    TF_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    return true;
  }
  static void launch(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
    const auto k = fused_kernel<T, D, FusedSchedule::clustered>(paged);
    prepare();
    const LaunchConfig l(unsigned(grid), attention::kThreads, size_t(cluster_launch_smem()), stream, true,
                         unsigned(p.cluster));
    TF_CUDA(cudaLaunchKernelEx(l.get(), k, p));
  }
  static int max_active(bool paged, int cluster) {
    const auto k = fused_kernel<T, D, FusedSchedule::clustered>(paged);
    prepare();
    const LaunchConfig l(unsigned(cluster), attention::kThreads, size_t(cluster_launch_smem()), nullptr, false,
                         unsigned(cluster));
    int n = 0;
    TF_CUDA(cudaOccupancyMaxActiveClusters(&n, k, l.get()));
    return n;
  }
};

// The persistent and direct schedules: decode_smem_bytes, no clusters.
template <class T, int D, FusedSchedule kSchedule>
void launch_plain(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  if (paged) launch_prepared<&attention::fused_decode_kernel<T, D, true, kSchedule>, D>(p, grid, stream);
  else launch_prepared<&attention::fused_decode_kernel<T, D, false, kSchedule>, D>(p, grid, stream);
}
template <class T, int D, FusedSchedule kSchedule>
int plain_ctas_per_sm(bool paged) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  return paged ? ctas_per_sm<&attention::fused_decode_kernel<T, D, true, kSchedule>, kSmem>()
               : ctas_per_sm<&attention::fused_decode_kernel<T, D, false, kSchedule>, kSmem>();
}
}  // namespace

template <class T, int D>
void launch_fused_t(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  if (p.cluster != 0) Clustered<T, D>::launch(paged, p, grid, stream);
  else if (p.direct != 0) launch_plain<T, D, FusedSchedule::direct>(paged, p, grid, stream);
  else launch_plain<T, D, FusedSchedule::persistent>(paged, p, grid, stream);
}

template <class T, int D>
int fused_ctas_per_sm_t(bool paged, bool direct) {
  return direct ? plain_ctas_per_sm<T, D, FusedSchedule::direct>(paged)
                : plain_ctas_per_sm<T, D, FusedSchedule::persistent>(paged);
}

template <class T, int D>
int fused_max_clusters_t(bool paged, int cluster) {
  return Clustered<T, D>::max_active(paged, cluster);
}

#define TF_FLASH_DECODE_FUSED_INSTANTIATE(T, D)                                                 \
  template void launch_fused_t<T, D>(bool, const attention::FusedDecodeParams&, int, cudaStream_t); \
  template int fused_ctas_per_sm_t<T, D>(bool, bool);                                               \
  template int fused_max_clusters_t<T, D>(bool, int);

}  // namespace taxfree::flash_decode::detail
