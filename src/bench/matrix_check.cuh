// Device helpers for benchmarks of matrix ops (16-bit elements, row-major with a row stride):
// reproducible inputs any rank can regenerate, and the comparisons a check() needs. Every count
// synchronizes `s`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "taxfree/ops/gemm.h"

namespace taxfree::bench {

// Element (r, c) = uniform in [-1, 1) from (seed, r * cols + c): the same values for the same
// (seed, rows, cols) on any rank, whatever the stride. Padding is left untouched.
void fill_uniform(void* p, int64_t rows, int64_t cols, int64_t ld, uint64_t seed, gemm::DType t, cudaStream_t s);

struct Tolerance {
  float rtol, atol;  // |x - ref| <= atol + rtol |ref|, x finite
};
// The tolerance for a K-long fp32-accumulated product of inputs uniform in [-1, 1), rounded to t:
// two summation orders rounded to 16 bits differ by an ulp or two.
Tolerance product_tolerance(int64_t k, gemm::DType t);

// Elements of x (rows x cols) outside `tol` of ref.
int64_t count_outside(const void* x, int64_t ldx, const void* ref, int64_t ldr, int64_t rows, int64_t cols,
                      Tolerance tol, gemm::DType t, cudaStream_t s);
// `samples` elements of g.c (the four corners and random ones) against an fp32 dot product of
// g.a's row and g.b's column; the number outside `tol`.
int64_t count_sampled_wrong(const gemm::GemmArgs& g, int samples, uint64_t seed, Tolerance tol, cudaStream_t s);
// 16-bit elements that differ bit for bit between two rows x cols matrices.
int64_t count_diff_2d(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t rows, int64_t cols,
                      cudaStream_t s);

}  // namespace taxfree::bench
