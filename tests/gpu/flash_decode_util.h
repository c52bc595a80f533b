// Helpers of the flash_decode GPU tests: a fast RNG, dtype bit conversions, an owning device
// buffer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode::test {

struct Rng {  // splitmix64: fast enough for the 10^8 values of the long case
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (2.f / 16777216.f) - 1.f; }  // [-1, 1)
  int below(int n) { return int(next() % uint64_t(n)); }
};

inline uint16_t to_bits(DType t, float x) {
  uint16_t u;
  if (t == DType::BF16) {
    const __nv_bfloat16 h = __float2bfloat16(x);
    std::memcpy(&u, &h, 2);
  } else {
    const __half h = __float2half(x);
    std::memcpy(&u, &h, 2);
  }
  return u;
}
inline float from_bits(DType t, uint16_t u) {
  if (t == DType::BF16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &u, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  Dev() = default;
  explicit Dev(size_t count) : n(count) { TF_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T))); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  Dev& operator=(Dev&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~Dev() { if (p) cudaFree(p); }
  void upload(const std::vector<T>& h) { TF_CUDA(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    TF_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { TF_CUDA(cudaMemset(p, 0xFF, n * sizeof(T))); }  // NaN in fp32, bf16 and fp16
};

}  // namespace taxfree::ops::flash_decode::test
