// Helpers of the flash_decode GPU tests: a fast RNG, dtype bit conversions, an owning device
// buffer, a paged copy of a contiguous cache.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "gpu_env.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode::test {

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

// Unit roundoff of the 16-bit type (what the outputs' row bounds are in).
inline double unit_roundoff(DType t) { return t == DType::bf16 ? 0x1p-8 : 0x1p-11; }

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
  void upload(const std::vector<T>& h) { ::taxfree::test::copy_to_device(p, h.data(), h.size() * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    TF_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { TF_CUDA(cudaMemset(p, 0xFF, n * sizeof(T))); }  // NaN in fp32, bf16 and fp16
};

// A paged copy of a contiguous cache [batch][kv_heads][capacity][head_dim] (16-bit values): the
// pages in random order, plus unreferenced pages of NaN, so a read outside the table shows up.
struct Paged {
  KvLayout layout;
  int page_size, max_pages, num_pages;
  std::vector<int32_t> table;
  Dev<uint16_t> k, v;
  Dev<int32_t> table_d;
};

inline Paged make_paged(const std::vector<uint16_t>& k_in, const std::vector<uint16_t>& v_in, int batch, int kv_heads,
                        int capacity, int head_dim, KvLayout layout, int page_size, uint64_t seed) {
  Paged pg;
  pg.layout = layout, pg.page_size = page_size;
  pg.max_pages = (capacity + page_size - 1) / page_size;
  const int used = batch * pg.max_pages;
  pg.num_pages = used + 7;
  std::vector<int32_t> perm(size_t(pg.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng{seed};
  for (int i = pg.num_pages - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[size_t(rng.below(i + 1))]);
  pg.table.assign(perm.begin(), perm.begin() + used);
  const size_t page_elems = size_t(page_size) * kv_heads * head_dim;
  std::vector<uint16_t> k(page_elems * pg.num_pages, 0xFFFF), v(k.size(), 0xFFFF);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < kv_heads; ++h)
      for (int t = 0; t < capacity; ++t) {
        const size_t page = size_t(pg.table[size_t(b) * pg.max_pages + t / page_size]), off = t % page_size;
        const size_t dst = layout == KvLayout::paged_hnd ? ((page * kv_heads + h) * page_size + off) * head_dim
                                                        : ((page * page_size + off) * kv_heads + h) * head_dim;
        const size_t src = ((size_t(b) * kv_heads + h) * capacity + t) * head_dim;
        std::copy_n(&k_in[src], head_dim, &k[dst]);
        std::copy_n(&v_in[src], head_dim, &v[dst]);
      }
  pg.k = Dev<uint16_t>(k.size()), pg.v = Dev<uint16_t>(v.size()), pg.table_d = Dev<int32_t>(pg.table.size());
  pg.k.upload(k), pg.v.upload(v), pg.table_d.upload(pg.table);
  return pg;
}

}  // namespace taxfree::flash_decode::test
