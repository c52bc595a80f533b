// Portability for headers shared by host (g++) and device (nvcc) translation units: the PODs are
// visible everywhere, device functions only where nvcc compiles them.
#pragma once

#if defined(__CUDACC__)
#define TF_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TF_HOST_DEVICE inline
#endif
