#include "taxfree/runtime/driver_api.h"

#include <cuda_runtime_api.h>

#include <string>

#include "taxfree/runtime/error.h"

namespace taxfree::driver {

void* entry_point(const char* name, int cuda_version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, cuda_version, cudaEnableDefault, &q);
  TF_REQUIRE(e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn != nullptr, Status::NotSupported,
             "CUDA driver entry point " << name << " unavailable (" << cudaGetErrorName(e) << ", query result "
                                        << int(q) << ")");
  return fn;
}

const char* error_name(CUresult r) {
  using Fn = CUresult (*)(CUresult, const char**);
  static Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    return cudaGetDriverEntryPointByVersion("cuGetErrorName", &p, 12000, cudaEnableDefault, &q) == cudaSuccess
               ? reinterpret_cast<Fn>(p)
               : nullptr;
  }();
  const char* name = nullptr;
  if (fn && fn(r, &name) == CUDA_SUCCESS && name) return name;
  static thread_local std::string buf;
  buf = "CUresult " + std::to_string(int(r));
  return buf.c_str();
}

}  // namespace taxfree::driver
