#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace taxfree::flash_decode::ref {

namespace {
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}

void attend_group(int group, int head_dim, const float* q, const float* k, const float* v,
                  int64_t row_stride, int begin, int end, double scale, double* out, double* lse) {
  const int n = std::max(0, end - begin);
  std::vector<double> s(static_cast<size_t>(n));
  for (int g = 0; g < group; ++g) {
    const float* qg = q + int64_t(g) * head_dim;
    double m = kNegInf;
    for (int j = 0; j < n; ++j) {
      const float* kr = k + int64_t(begin + j) * row_stride;
      double dot = 0;
      for (int d = 0; d < head_dim; ++d) dot += double(qg[d]) * double(kr[d]);
      s[size_t(j)] = dot * scale;
      m = std::max(m, s[size_t(j)]);
    }
    double* o = out + int64_t(g) * head_dim;
    std::fill(o, o + head_dim, 0.0);
    if (n == 0) {
      lse[g] = kNegInf;
      continue;
    }
    double sum = 0;
    for (int j = 0; j < n; ++j) {
      const double p = std::exp(s[size_t(j)] - m);
      sum += p;
      const float* vr = v + int64_t(begin + j) * row_stride;
      for (int d = 0; d < head_dim; ++d) o[d] += p * double(vr[d]);
    }
    for (int d = 0; d < head_dim; ++d) o[d] /= sum;
    lse[g] = m + std::log(sum);
  }
}

void attention(int batch, int q_heads, int kv_heads, int head_dim, int capacity, const float* q,
               const float* k, const float* v, const int32_t* starts, const int32_t* lens,
               double scale, double* out, double* lse) {
  const int group = q_heads / kv_heads;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < kv_heads; ++h) {
      const int64_t kv_off = (int64_t(b) * kv_heads + h) * capacity * head_dim;
      const int64_t row0 = int64_t(b) * q_heads + int64_t(h) * group;
      const int begin = starts ? starts[b] : 0;
      attend_group(group, head_dim, q + row0 * head_dim, k + kv_off, v + kv_off, head_dim, begin,
                   begin + lens[b], scale, out + row0 * head_dim, lse + row0);
    }
}

double combine(int n, int dim, const double* o, const double* lse, double* out) {
  double m = kNegInf;
  for (int i = 0; i < n; ++i) m = std::max(m, lse[i]);
  std::fill(out, out + dim, 0.0);
  if (m == kNegInf) return kNegInf;
  double sum = 0;
  for (int i = 0; i < n; ++i)
    if (lse[i] != kNegInf) sum += std::exp(lse[i] - m);
  for (int i = 0; i < n; ++i) {
    if (lse[i] == kNegInf) continue;
    const double w = std::exp(lse[i] - m) / sum;
    for (int d = 0; d < dim; ++d) out[d] += w * o[int64_t(i) * dim + d];
  }
  return m + std::log(sum);
}

double direct(int n_tokens, int dim, const double* scores, const double* values, double* out) {
  double m = kNegInf;
  for (int j = 0; j < n_tokens; ++j) m = std::max(m, scores[j]);
  std::fill(out, out + dim, 0.0);
  if (m == kNegInf) return kNegInf;
  double sum = 0;
  for (int j = 0; j < n_tokens; ++j)
    if (scores[j] != kNegInf) sum += std::exp(scores[j] - m);
  for (int j = 0; j < n_tokens; ++j) {
    if (scores[j] == kNegInf) continue;
    const double p = std::exp(scores[j] - m) / sum;
    for (int d = 0; d < dim; ++d) out[d] += p * values[int64_t(j) * dim + d];
  }
  return m + std::log(sum);
}

}  // namespace taxfree::flash_decode::ref
