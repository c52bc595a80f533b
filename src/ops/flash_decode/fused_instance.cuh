// Private: definitions of the fused kernel's launchers (kernels.h), included by one small .cu per
// (dtype, head_dim): distributed_<dtype>_d<D>.cu.
#pragma once

#include "decode_instance.cuh"
#include "taxfree/kernels/attention/fused_decode_kernel.h"

namespace taxfree::ops::flash_decode::detail {

namespace {
// Clustered launches of one fused kernel: `grid` CTAs in clusters of `cluster` along x. Clusters
// of more than 8 CTAs need the non-portable size opt-in (sm_90: up to 16), set once per kernel
// with the decode family's attributes.
template <auto kKernel, int D>
struct Clustered {
  static constexpr int kSmem = attention::decode_smem_bytes<D>();

  static void prepare() {
    static const bool done = [] {
      prepare_kernel<kKernel, kSmem>();
      TF_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(kKernel),
                                   cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      return true;
    }();
    (void)done;
  }
  struct Config {
    cudaLaunchAttribute attr{};
    cudaLaunchConfig_t cfg{};
    Config(int grid, int cluster, cudaStream_t stream) {
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = unsigned(cluster);
      attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(unsigned(grid));
      cfg.blockDim = dim3(attention::kThreads);
      cfg.dynamicSmemBytes = size_t(kSmem);
      cfg.stream = stream;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
    }
  };
  static void launch(const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
    prepare();
    Config c(grid, p.cluster, stream);
    TF_CUDA(cudaLaunchKernelEx(&c.cfg, kKernel, p));
  }
  static int max_active(int cluster) {
    prepare();
    Config c(cluster, cluster, nullptr);
    int n = 0;
    TF_CUDA(cudaOccupancyMaxActiveClusters(&n, kKernel, &c.cfg));
    return n;
  }
};
}  // namespace

template <class T, int D>
void launch_fused_t(bool paged, const attention::FusedDecodeParams& p, int grid, cudaStream_t stream) {
  constexpr auto kPaged = &attention::fused_decode_kernel<T, D, true>;
  constexpr auto kContiguous = &attention::fused_decode_kernel<T, D, false>;
  if (p.cluster != 0) {
    if (paged) Clustered<kPaged, D>::launch(p, grid, stream);
    else Clustered<kContiguous, D>::launch(p, grid, stream);
  } else if (paged) {
    launch_prepared<kPaged, D>(p, grid, stream);
  } else {
    launch_prepared<kContiguous, D>(p, grid, stream);
  }
}

template <class T, int D>
int fused_ctas_per_sm_t(bool paged) {
  constexpr int kSmem = attention::decode_smem_bytes<D>();
  return paged ? ctas_per_sm<&attention::fused_decode_kernel<T, D, true>, kSmem>()
               : ctas_per_sm<&attention::fused_decode_kernel<T, D, false>, kSmem>();
}

template <class T, int D>
int fused_max_clusters_t(bool paged, int cluster) {
  return paged ? Clustered<&attention::fused_decode_kernel<T, D, true>, D>::max_active(cluster)
               : Clustered<&attention::fused_decode_kernel<T, D, false>, D>::max_active(cluster);
}

#define TF_FLASH_DECODE_FUSED_INSTANTIATE(T, D)                                                 \
  template void launch_fused_t<T, D>(bool, const attention::FusedDecodeParams&, int, cudaStream_t); \
  template int fused_ctas_per_sm_t<T, D>(bool);                                                 \
  template int fused_max_clusters_t<T, D>(bool, int);

}  // namespace taxfree::ops::flash_decode::detail
