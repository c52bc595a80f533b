// Log-sum-exp combine of attention partials: the one formula every level uses (splits of a CTA
// group, ranks of a team), host and device alike, so the CPU tests exercise the kernel's code.
//
// A partial over a set of tokens J is (o, lse) with, in natural log and scaled scores
// s_j = softmax_scale * q.k_j:
//     lse = log(sum_{j in J} exp(s_j))          (= -inf when J is empty)
//     o   = sum_{j in J} exp(s_j - lse) * v_j   (normalised; = 0 when J is empty)
// Merging partials i = 1..n over disjoint token sets:
//     m   = max_i lse_i
//     S   = sum_i exp(lse_i - m)                (>= 1 when m is finite)
//     lse = m + log(S),   o = sum_i (exp(lse_i - m) / S) * o_i
// Subtracting m keeps every exponent <= 0 (no overflow) and S >= 1 (no division by ~0).
// Empty partials (lse_i = -inf) get weight exactly 0 and their o_i is skipped (host) or
// discarded by a select (device), so an unwritten/poisoned o_i of an empty partial cannot leak NaN. All partials empty: lse = -inf,
// o = 0 (documented result for "no tokens anywhere"). NaN or +inf lse inputs are out of contract.
#pragma once

#include <cmath>
#include <cstdint>

#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

struct LseStats {
  float max;  // m: largest lse_i; -inf when every partial is empty
  float sum;  // S: sum_i exp(lse_i - m); 0 when every partial is empty
};

// Partial i's term of S, exp(lse_i - m) (0 for an empty partial).
TF_HD inline float lse_term(float lse_i, float max) { return lse_i == -INFINITY ? 0.f : expf(lse_i - max); }

// Stats over lse[0], lse[stride], ..., lse[(n-1)*stride].
TF_HD inline LseStats lse_stats(const float* lse, int n, int64_t stride = 1) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = fmaxf(m, lse[i * stride]);
  if (m == -INFINITY) return {m, 0.f};
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += lse_term(lse[i * stride], m);
  return {m, s};
}

// lse of the merged partial.
TF_HD inline float lse_total(LseStats st) {
  return st.max == -INFINITY ? -INFINITY : st.max + logf(st.sum);
}

// Weight of partial i in the merged output, from its term (lse_term(lse_i, st.max), which a caller
// that summed S has at hand); weights of non-empty partials sum to 1.
TF_HD inline float lse_weight_of_term(float lse_i, float term, LseStats st) {
  return lse_i == -INFINITY ? 0.f : term / st.sum;
}
TF_HD inline float lse_weight(float lse_i, LseStats st) {
  return lse_weight_of_term(lse_i, lse_term(lse_i, st.max), st);
}

// Host reference use and small device cases: merge n partials of `dim` values each.
// o_i = o + i*o_stride. out may not alias any o_i.
TF_HD inline float lse_combine(const float* o, int64_t o_stride, const float* lse, int64_t lse_stride,
                               int n, int dim, float* out) {
  const LseStats st = lse_stats(lse, n, lse_stride);
  for (int d = 0; d < dim; ++d) out[d] = 0.f;
  for (int i = 0; i < n; ++i) {
    const float w = lse_weight(lse[i * lse_stride], st);
    if (w == 0.f) continue;  // empty partial: its o is ignored
    for (int d = 0; d < dim; ++d) out[d] += w * o[i * o_stride + d];
  }
  return lse_total(st);
}

}  // namespace taxfree::attention
