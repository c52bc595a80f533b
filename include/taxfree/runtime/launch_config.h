// The configuration cudaLaunchKernelEx takes, for the library's kernels: a grid of `block` threads, dynamic shared memory, a stream, and two optional attributes: a programmatic dependent
// launch (`dependent`: the kernel's CTAs may be placed while the kernel ahead on the stream
// finishes; the kernel must call dev::wait_prior_grid() before it touches memory, see
// device/dependent_launch.cuh) and clusters of `cluster` CTAs along x (1: none). Host only; holds no
// resources. Not copyable: the launch configuration points into the object.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace taxfree {

class LaunchConfig {
 public:
  LaunchConfig(dim3 grid, unsigned block, size_t smem, cudaStream_t stream, bool dependent, unsigned cluster = 1) {
    unsigned n = 0;
    if (dependent) {
      attr_[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr_[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
      attr_[n].id = cudaLaunchAttributeClusterDimension;
      attr_[n].val.clusterDim.x = cluster;
      attr_[n].val.clusterDim.y = attr_[n].val.clusterDim.z = 1;
      ++n;
    }
    cfg_.gridDim = grid;
    cfg_.blockDim = dim3(block);
    cfg_.dynamicSmemBytes = smem;
    cfg_.stream = stream;
    cfg_.attrs = attr_;
    cfg_.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
  const cudaLaunchConfig_t* get() const { return &cfg_; }

 private:
  cudaLaunchAttribute attr_[2]{};
  cudaLaunchConfig_t cfg_{};
};

}  // namespace taxfree
