// Double-precision CPU reference of decode attention and of the LSE combine, for tests and the
// benchmark's check. Same definitions as include/taxfree/ops/flash_decode.h: natural-log LSE of
// scaled scores, normalised output, empty token set -> lse = -inf, o = 0.
#pragma once

#include <cstdint>
#include <vector>

namespace taxfree::flash_decode::ref {

// Attention of `group` query rows q[g][d] over tokens [begin, end) of one KV head whose rows are
// k[t*row_stride + d], v[t*row_stride + d] (t is the absolute token index). Writes out[g][d] and
// lse[g].
void attend_group(int group, int head_dim, const float* q, const float* k, const float* v,
                  int64_t row_stride, int begin, int end, double scale, double* out, double* lse);

// Whole batch over a contiguous float cache [batch][kv_heads][capacity][head_dim]; q and out are
// [batch][q_heads][head_dim], lse [batch][q_heads]. starts may be null (all 0).
void attention(int batch, int q_heads, int kv_heads, int head_dim, int capacity, const float* q,
               const float* k, const float* v, const int32_t* starts, const int32_t* lens,
               double scale, double* out, double* lse);

// Merge n partials of `dim` values (o[i*dim + d], lse[i]) in double: the combine formula.
double combine(int n, int dim, const double* o, const double* lse, double* out);

// Softmax-weighted average computed directly from raw scores (no partials): the ground truth
// the combine is checked against. scores[j] = -inf marks an absent token.
double direct(int n_tokens, int dim, const double* scores, const double* values, double* out);

}  // namespace taxfree::flash_decode::ref
