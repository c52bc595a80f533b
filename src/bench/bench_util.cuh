// Device helpers shared by the benchmark descriptors: reproducible random data that a receiver
// can regenerate without communication, poison, and element-wise checks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace taxfree::bench {

// splitmix64 finaliser: the one hash behind every reproducible benchmark input.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills `bytes` (multiple of 2) with pseudo-random 16-bit values that are finite bf16/fp16
// numbers in [-2, 2) and never all zero, determined by (seed, stream_id, element index).
void fill_random16(void* dst, uint64_t bytes, uint64_t seed, uint64_t stream_id, cudaStream_t s);
// Fills with 0xFFFF per 16-bit element: NaN in bf16 and fp16, so unwritten outputs are caught.
void poison16(void* dst, uint64_t bytes, cudaStream_t s);
// Counts 16-bit elements of `got` that differ from fill_random16(seed, stream_id); synchronizes `s`.
int64_t count_mismatch16(const void* got, uint64_t bytes, uint64_t seed, uint64_t stream_id, cudaStream_t s);
// Counts 16-bit elements that differ between two buffers; synchronizes `s`.
int64_t count_diff16(const void* a, const void* b, uint64_t bytes, cudaStream_t s);

}  // namespace taxfree::bench
