// Helpers of the flash_decode tests that run ranks (FlashDecodeDist on a Team, FlashDecodeSim on
// one GPU): the whole problem drawn identically for every rank, its double reference, and one
// rank's slice of it on the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../../src/ops/flash_decode/reference.h"
#include "flash_decode_util.h"
#include "taxfree/ops/flash_decode.h"

namespace taxfree::flash_decode::test {

// Tolerance of the dtype output against the double reference (P is rounded to the dtype before
// P V, as in the single-GPU tests).
struct Tol {
  double atol, rtol;
};
inline Tol tol_out(DType t) { return t == DType::bf16 ? Tol{6e-3, 1.2e-2} : Tol{1.5e-3, 5e-3}; }

struct Problem {
  DType dtype = DType::bf16;
  int batch = 1, q_heads = 8, kv_heads = 1, head_dim = 128;
  std::vector<std::vector<int32_t>> lens;  // [rank][batch]: tokens of each rank's slice, in rank order
  int num_splits = 0;                      // FlashDecodeConfig::num_splits
  int64_t rows() const { return int64_t(batch) * q_heads; }
};

// Slices that the issue asks for: sequence 0 has 12345 tokens on rank 0, 1 on rank 1, none on the
// others; sequence 1 none on rank 0 and ragged elsewhere; sequence 2 is empty everywhere;
// sequence 3 grows with the rank.
inline std::vector<std::vector<int32_t>> odd_lens(int world) {
  std::vector<std::vector<int32_t>> l(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) l[size_t(r)] = {r == 0 ? 12345 : r == 1 ? 1 : 0, r == 0 ? 0 : 700 + 77 * r, 0, 16 * r + 3};
  return l;
}
inline std::vector<std::vector<int32_t>> same_lens(int world, std::vector<int32_t> per_rank) {
  return std::vector<std::vector<int32_t>>(size_t(world), per_rank);
}

// The whole problem, identical on every rank: q, the full cache [batch][kv_heads][cap][D], the
// reference over each whole sequence.
struct Global {
  Problem p;
  int cap = 1;
  std::vector<int32_t> total;  // [batch]
  std::vector<uint16_t> q, k, v;
  std::vector<float> qf, kf, vf;
  std::vector<double> ref;  // [rows][D]
};

inline void draw_q(Global& g, uint64_t seed) {
  Rng rng{::taxfree::test::value_seed(seed)};
  g.q.resize(size_t(g.p.rows()) * g.p.head_dim), g.qf.resize(g.q.size());
  for (size_t i = 0; i < g.q.size(); ++i) g.q[i] = float_to_bits(g.p.dtype, rng.uniform()), g.qf[i] = bits_to_float(g.p.dtype, g.q[i]);
}

inline void draw_kv(Global& g, uint64_t seed) {
  const Problem& p = g.p;
  Rng rng{::taxfree::test::value_seed(seed)};
  const size_t n = size_t(p.batch) * p.kv_heads * g.cap * p.head_dim;
  g.k.assign(n, 0xFFFF), g.v.assign(n, 0xFFFF);
  g.kf.assign(n, NAN), g.vf.assign(n, NAN);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.kv_heads; ++h)
      for (size_t i = 0; i < size_t(g.total[size_t(b)]) * p.head_dim; ++i) {
        const size_t e = (size_t(b) * p.kv_heads + h) * g.cap * p.head_dim + i;
        g.k[e] = float_to_bits(p.dtype, rng.uniform()), g.v[e] = float_to_bits(p.dtype, rng.uniform());
        g.kf[e] = bits_to_float(p.dtype, g.k[e]), g.vf[e] = bits_to_float(p.dtype, g.v[e]);
      }
}

inline void compute_reference(Global& g) {
  const Problem& p = g.p;
  std::vector<double> lse(size_t(p.rows()));
  g.ref.assign(size_t(p.rows()) * p.head_dim, 0);
  ref::attention(p.batch, p.q_heads, p.kv_heads, p.head_dim, g.cap, g.qf.data(), g.kf.data(), g.vf.data(), nullptr,
                 g.total.data(), 1.0 / std::sqrt(double(p.head_dim)), g.ref.data(), lse.data());
}

inline Global make_global(const Problem& p, uint64_t seed) {
  Global g;
  g.p = p;
  g.total.assign(size_t(p.batch), 0);
  for (const auto& r : p.lens)
    for (int b = 0; b < p.batch; ++b) g.total[size_t(b)] += r[size_t(b)];
  g.cap = std::max(1, *std::max_element(g.total.begin(), g.total.end()));
  draw_q(g, seed);
  draw_kv(g, seed + 1);
  compute_reference(g);
  return g;
}

// The same problem with another q (fresh values) and its reference. Steps that alternate the two,
// each checked against its own, go wrong if a step reads a partial a peer sent for the step before
// it: with one q every step, that partial would hold the same values.
inline Global with_other_q(const Global& g, uint64_t seed) {
  Global o = g;
  draw_q(o, seed);
  compute_reference(o);
  return o;
}

// q on the device, for steps that switch between q's: args(p) with .q = this.
struct DeviceQ {
  Dev<uint16_t> d;
  explicit DeviceQ(const Global& g) : d(g.q.size()) { d.upload(g.q); }
};

// This rank's slice on the device: slice b at local positions [start[b], start[b] + len[b]),
// holding global tokens [offset_b, offset_b + len[b]) where offset_b = tokens of the lower ranks.
struct Local {
  int cap = 1;
  std::vector<int32_t> start, len;
  std::vector<uint16_t> k, v;  // [batch][kv_heads][cap][D]
  Dev<uint16_t> q_d, k_d, v_d, out_d;
  Dev<int32_t> start_d, len_d;
  std::unique_ptr<Paged> paged;  // when set, launches use it instead of the contiguous cache

  DecodeArgs args(const Problem& p) const {
    DecodeArgs a;
    a.batch = p.batch, a.q_heads = p.q_heads, a.kv_heads = p.kv_heads, a.head_dim = p.head_dim, a.dtype = p.dtype;
    a.q = q_d.p;
    if (paged) {
      a.k = paged->k.p, a.v = paged->v.p, a.layout = paged->layout, a.page_size = paged->page_size;
      a.num_pages = paged->num_pages, a.max_pages_per_seq = paged->max_pages, a.block_table = paged->table_d.p;
      a.host_block_table = paged->table;
    } else {
      a.k = k_d.p, a.v = v_d.p, a.capacity = cap;
    }
    a.slice_start = start_d.p, a.slice_len = len_d.p;
    a.host_slice_start = start, a.host_slice_len = len;
    a.max_len = std::max(0, *std::max_element(len.begin(), len.end()));
    a.out = out_d.p;
    return a;
  }
};

// Uploads this rank's slice of `g` (K/V and q; the device buffers are reused when sizes match, so
// a captured graph sees fresh data).
inline void upload_local(const Global& g, Local& l, int rank) {
  const Problem& p = g.p;
  const int d = p.head_dim;
  l.len = p.lens[size_t(rank)];
  l.start.resize(size_t(p.batch));
  l.cap = 1;
  for (int b = 0; b < p.batch; ++b) {
    l.start[size_t(b)] = (5 * rank + 3 * b) % 17;  // mid-tile, rank-dependent
    l.cap = std::max(l.cap, l.start[size_t(b)] + l.len[size_t(b)]);
  }
  l.cap += 9;  // NaN tail
  l.k.assign(size_t(p.batch) * p.kv_heads * l.cap * d, 0xFFFF), l.v.assign(l.k.size(), 0xFFFF);
  for (int b = 0; b < p.batch; ++b) {
    int offset = 0;
    for (int r = 0; r < rank; ++r) offset += p.lens[size_t(r)][size_t(b)];
    for (int h = 0; h < p.kv_heads; ++h) {
      const size_t src = ((size_t(b) * p.kv_heads + h) * g.cap + offset) * d;
      const size_t dst = ((size_t(b) * p.kv_heads + h) * l.cap + l.start[size_t(b)]) * d;
      std::copy_n(&g.k[src], size_t(l.len[size_t(b)]) * d, &l.k[dst]);
      std::copy_n(&g.v[src], size_t(l.len[size_t(b)]) * d, &l.v[dst]);
    }
  }
  if (l.k_d.n != l.k.size()) l.k_d = Dev<uint16_t>(l.k.size()), l.v_d = Dev<uint16_t>(l.v.size());
  if (l.q_d.n != g.q.size()) l.q_d = Dev<uint16_t>(g.q.size()), l.out_d = Dev<uint16_t>(g.q.size());
  if (l.len_d.n != size_t(p.batch)) l.len_d = Dev<int32_t>(size_t(p.batch)), l.start_d = Dev<int32_t>(size_t(p.batch));
  l.k_d.upload(l.k), l.v_d.upload(l.v), l.q_d.upload(g.q), l.len_d.upload(l.len), l.start_d.upload(l.start);
}

// Output elements outside tolerance of the whole-sequence reference, plus rows (batch, head) whose
// relative Frobenius error is over 2u, plus nonzero elements of empty sequences (first few
// reported). The row bound is what catches a lost split, tile or rank: long sequences average to
// outputs smaller than the element tolerance's atol (12346 tokens: |out| ~ 4e-3), while a correct
// result is within ~0.6u of the reference (output and P rounded to the dtype).
inline int64_t count_wrong(const Global& g, const std::vector<uint16_t>& out, const std::string& what) {
  const Tol tol = tol_out(g.p.dtype);
  const double u = unit_roundoff(g.p.dtype);
  const int d = g.p.head_dim;
  int64_t bad = 0;
  const auto report = [&](const auto& message) {
    if (++bad <= 5) ADD_FAILURE() << what << ": " << message;
  };
  for (int64_t row = 0; row < g.p.rows(); ++row) {
    const bool empty = g.total[size_t(row / g.p.q_heads)] == 0;
    double err2 = 0, ref2 = 0;
    for (size_t i = size_t(row) * d; i < size_t(row + 1) * d; ++i) {
      const double got = bits_to_float(g.p.dtype, out[i]), want = g.ref[i];
      err2 += (got - want) * (got - want), ref2 += want * want;
      if (empty ? got != 0 : !(std::isfinite(got) && std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want)))
        report(testing::Message() << "out[" << i << "] (row " << row << (empty ? ", an empty sequence" : "")
                                  << ") = " << got << ", want " << want);
    }
    if (!empty && !(std::sqrt(err2) <= 2 * u * std::sqrt(ref2)))
      report(testing::Message() << "row " << row << ": relative Frobenius error " << std::sqrt(err2 / ref2)
                                << " over 2u = " << 2 * u);
  }
  return bad;
}

}  // namespace taxfree::flash_decode::test
