// flash_decode on one GPU against the double-precision CPU reference.
//
// Fresh random inputs every case (never zeros); outputs and workspace poisoned with NaN before
// every launch; K/V beyond each sequence's length hold NaN, and paged caches carry unreferenced
// NaN pages, so reading outside a slice shows up as NaN. W ranks are simulated on one GPU by
// running the partial kernel on W slices of one cache and then the combine kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../../src/ops/flash_decode/reference.h"
#include "flash_decode_util.h"
#include "gpu_env.h"
#include "random_draws.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/captured_graph.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

using namespace test;
using ::taxfree::test::Draws;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Tol {
  double atol, rtol;
};
// (o_part fp32, out in dtype, lse): P is rounded to the input dtype before P V.
Tol tol_o(DType t) { return t == DType::bf16 ? Tol{4e-3, 1e-2} : Tol{1e-3, 4e-3}; }
Tol tol_out(DType t) { return t == DType::bf16 ? Tol{6e-3, 1.2e-2} : Tol{1.5e-3, 5e-3}; }
const Tol kTolLse{1e-3, 1e-5};

// Number of elements outside tolerance (an expected -inf must be matched exactly), plus, with `row`
// > 0, rows of that many elements whose relative Frobenius error is over 2u (rows whose reference
// is all zero excepted). The row bound is what catches a lost split or zero output on a long
// sequence: its outputs average to less than the element tolerance's atol (300007 tokens: |out| ~
// 3e-3), while a correct row is within ~0.6u of the reference (flash_decode_dist_util.h).
int64_t count_bad(const std::vector<float>& got, const std::vector<double>& want, Tol t, const std::string& what,
                  size_t row = 0, double u = 0) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const bool ok = std::isinf(w) ? g == w : (std::isfinite(g) && std::fabs(g - w) <= t.atol + t.rtol * std::fabs(w));
    if (!ok && ++bad <= 5) ADD_FAILURE() << what << "[" << i << "] = " << g << ", want " << w;
  }
  for (size_t r0 = 0; row > 0 && r0 < want.size(); r0 += row) {
    double err2 = 0, ref2 = 0;
    for (size_t i = r0; i < r0 + row; ++i) err2 += (got[i] - want[i]) * (got[i] - want[i]), ref2 += want[i] * want[i];
    if (ref2 > 0 && !(std::sqrt(err2) <= 2 * u * std::sqrt(ref2)) && ++bad <= 5)
      ADD_FAILURE() << what << " row " << r0 / row << ": relative Frobenius error " << std::sqrt(err2 / ref2)
                    << " > 2u = " << 2 * u;
  }
  return bad;
}

// ---------------------------------------------------------------------------------------------
// One problem: shapes, host data (bits + exact floats), device copies of a contiguous cache.

struct Problem {
  DType dtype = DType::bf16;
  int batch = 1, q_heads = 8, kv_heads = 1, head_dim = 128;
  std::vector<int32_t> lens;  // whole-sequence lengths
  int capacity = 0;
  float q_scale = 1.f;        // > 1 sharpens the softmax
  float softmax_scale = 0.f;  // 0: 1/sqrt(head_dim)
  double scale() const { return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim)); }
  int64_t rows() const { return int64_t(batch) * q_heads; }
};

struct Data {
  Problem pb;
  std::vector<uint16_t> q, k, v;  // dtype bits
  std::vector<float> qf, kf, vf;  // exact values (NaN past each sequence's length)
  Dev<uint16_t> qd, kd, vd;
};

// Fresh host values (the device copies are (re)made by upload()).
void fill_host(Data& d, uint64_t seed) {
  const Problem& p = d.pb;
  Rng rng{::taxfree::test::value_seed(seed)};
  d.q.resize(size_t(p.rows()) * p.head_dim);
  d.qf.resize(d.q.size());
  for (size_t i = 0; i < d.q.size(); ++i) {
    d.q[i] = float_to_bits(p.dtype, p.q_scale * rng.uniform());
    d.qf[i] = bits_to_float(p.dtype, d.q[i]);
  }
  const size_t kv = size_t(p.batch) * p.kv_heads * p.capacity * p.head_dim;
  d.k.resize(kv), d.v.resize(kv), d.kf.resize(kv), d.vf.resize(kv);
  const uint16_t nan_bits = 0xFFFF;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.kv_heads; ++h)
      for (int t = 0; t < p.capacity; ++t) {
        const size_t row = ((size_t(b) * p.kv_heads + h) * p.capacity + t) * p.head_dim;
        for (int e = 0; e < p.head_dim; ++e) {
          const bool live = t < p.lens[b];
          d.k[row + e] = live ? float_to_bits(p.dtype, rng.uniform()) : nan_bits;
          d.v[row + e] = live ? float_to_bits(p.dtype, rng.uniform()) : nan_bits;
          d.kf[row + e] = live ? bits_to_float(p.dtype, d.k[row + e]) : kNaN;
          d.vf[row + e] = live ? bits_to_float(p.dtype, d.v[row + e]) : kNaN;
        }
      }
}

void upload(Data& d) {
  if (d.qd.n != d.q.size()) d.qd = Dev<uint16_t>(d.q.size());
  if (d.kd.n != d.k.size()) d.kd = Dev<uint16_t>(d.k.size()), d.vd = Dev<uint16_t>(d.v.size());
  d.qd.upload(d.q), d.kd.upload(d.k), d.vd.upload(d.v);
}

Data make_data(Problem p, uint64_t seed) {
  if (p.capacity == 0) p.capacity = std::max(1, *std::max_element(p.lens.begin(), p.lens.end()));
  Data d;
  d.pb = p;
  fill_host(d, seed);
  upload(d);
  return d;
}

Paged make_paged(const Data& d, KvLayout layout, int page_size, uint64_t seed) {
  const Problem& p = d.pb;
  return test::make_paged(d.k, d.v, p.batch, p.kv_heads, p.capacity, p.head_dim, layout, page_size, seed);
}

// ---------------------------------------------------------------------------------------------
// Running the partial kernel on slices [starts[b], starts[b] + lens[b]).

struct Result {
  std::vector<float> o, lse, out;  // out converted to float
  int num_splits = 0;
};

struct Runner {
  cudaStream_t stream = nullptr;
  Runner() { TF_CUDA(cudaStreamCreate(&stream)); }
  ~Runner() { cudaStreamDestroy(stream); }

  Result run(const Data& d, const std::vector<int32_t>& starts, const std::vector<int32_t>& lens,
             const Paged* pg = nullptr, DecodeConfig cfg = {}, int repeats = 1, bool host_lens = true) {
    const Problem& p = d.pb;
    Dev<int32_t> s_d(starts.size()), l_d(lens.size());
    s_d.upload(starts), l_d.upload(lens);
    Dev<float> o(size_t(p.rows()) * p.head_dim), lse(size_t(p.rows()));
    Dev<uint16_t> out(size_t(p.rows()) * p.head_dim);
    DecodeArgs a;
    a.batch = p.batch, a.q_heads = p.q_heads, a.kv_heads = p.kv_heads, a.head_dim = p.head_dim;
    a.dtype = p.dtype, a.softmax_scale = p.softmax_scale;
    a.q = d.qd.p;
    if (pg) {
      a.k = pg->k.p, a.v = pg->v.p, a.layout = pg->layout, a.page_size = pg->page_size;
      a.num_pages = pg->num_pages, a.max_pages_per_seq = pg->max_pages, a.block_table = pg->table_d.p;
      a.host_block_table = pg->table;
    } else {
      a.k = d.kd.p, a.v = d.vd.p, a.capacity = p.capacity;
    }
    a.slice_start = s_d.p, a.slice_len = l_d.p;
    a.max_len = std::max(0, *std::max_element(lens.begin(), lens.end()));
    if (host_lens) a.host_slice_start = starts, a.host_slice_len = lens;  // else no batch order
    a.o_part = o.p, a.lse_part = lse.p, a.out = out.p;
    const DecodePlan plan = plan_decode(a, cfg);
    Dev<unsigned char> ws(plan.workspace_bytes);
    Result r;
    r.num_splits = plan.num_splits;
    const size_t counters = (size_t(p.batch) * p.kv_heads * 4 + 255) / 256 * 256;  // first section
    if (plan.workspace_bytes) {  // poison the split partials, zero the counters once
      ws.poison();
      TF_CUDA(cudaMemset(ws.p, 0, counters));
    }
    for (int it = 0; it < repeats; ++it) {
      o.poison(), lse.poison(), out.poison();
      launch_decode_partial(a, plan, ws.p, plan.workspace_bytes, stream);
      TF_CUDA(cudaStreamSynchronize(stream));
      Result cur{o.download(), lse.download(), {}, plan.num_splits};
      const auto bits = out.download();
      cur.out.resize(bits.size());
      for (size_t i = 0; i < bits.size(); ++i) cur.out[i] = bits_to_float(p.dtype, bits[i]);
      if (it > 0) {  // deterministic: same inputs, same bits, counters reset by the kernel
        EXPECT_EQ(0, std::memcmp(cur.o.data(), r.o.data(), r.o.size() * 4)) << "launch " << it;
        EXPECT_EQ(0, std::memcmp(cur.lse.data(), r.lse.data(), r.lse.size() * 4)) << "launch " << it;
      }
      r = std::move(cur);
      // The next launch must work without re-zeroing the counters (the kernel leaves them 0):
      // poison only the partials section.
      if (it + 1 < repeats && plan.workspace_bytes)
        TF_CUDA(cudaMemset(ws.p + counters, 0xFF, plan.workspace_bytes - counters));
    }
    return r;
  }
};

// Reference over slices; returns (o, lse) as flat [rows][D], [rows].
void reference(const Data& d, const std::vector<int32_t>& starts, const std::vector<int32_t>& lens,
               std::vector<double>& o, std::vector<double>& lse) {
  const Problem& p = d.pb;
  o.assign(size_t(p.rows()) * p.head_dim, 0), lse.assign(size_t(p.rows()), 0);
  ref::attention(p.batch, p.q_heads, p.kv_heads, p.head_dim, p.capacity, d.qf.data(), d.kf.data(),
                 d.vf.data(), starts.data(), lens.data(), p.scale(), o.data(), lse.data());
}

void expect_matches(const Data& d, const Result& r, const std::vector<double>& o, const std::vector<double>& lse,
                    const std::string& what) {
  const size_t row = size_t(d.pb.head_dim);
  const double u = unit_roundoff(d.pb.dtype);
  EXPECT_EQ(count_bad(r.o, o, tol_o(d.pb.dtype), what + " o_part", row, u), 0);
  EXPECT_EQ(count_bad(r.lse, lse, kTolLse, what + " lse_part"), 0);
  // Empty sequences: out = 0 (and o = 0, lse = -inf via the reference).
  EXPECT_EQ(count_bad(r.out, o, tol_out(d.pb.dtype), what + " out", row, u), 0);
}

std::string name(const Problem& p) {
  return std::string(dtype_name(p.dtype)) + " D=" + std::to_string(p.head_dim) +
         " q/kv=" + std::to_string(p.q_heads) + "/" + std::to_string(p.kv_heads);
}

// ---------------------------------------------------------------------------------------------

TEST(FlashDecodeGpu, RaggedBatchEveryGqaRatioBothDtypesBothHeadDims) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  uint64_t seed = 1;
  for (DType dt : {DType::bf16, DType::fp16})
    for (int hd : {64, 128})
      for (int g : {1, 2, 4, 8, 16}) {
        Problem p;
        p.dtype = dt, p.head_dim = hd, p.kv_heads = 2, p.q_heads = 2 * g, p.batch = 4;
        p.lens = {12345, 1, 0, 777};
        const Data d = make_data(p, ++seed);
        const std::vector<int32_t> starts(4, 0);
        std::vector<double> o, lse;
        reference(d, starts, p.lens, o, lse);
        const Result r = run.run(d, starts, p.lens);
        SCOPED_TRACE(name(p) + " splits=" + std::to_string(r.num_splits));
        expect_matches(d, r, o, lse, name(p));
      }
}

// Forced split counts up to kMaxSplits (several batches of partials in the split merge), D = 64
// (two rows per warp in the merge) with odd group sizes.
TEST(FlashDecodeGpu, ForcedSplitCounts) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  struct Heads {
    int q, kv, d;
  };
  uint64_t seed = 11;
  for (const Heads h : {Heads{24, 3, 128}, Heads{9, 3, 64}, Heads{3, 3, 64}}) {
    Problem p;
    p.q_heads = h.q, p.kv_heads = h.kv, p.head_dim = h.d, p.batch = 3, p.lens = {5000, 33, 4097};
    const Data d = make_data(p, ++seed);
    const std::vector<int32_t> starts(3, 0);
    std::vector<double> o, lse;
    reference(d, starts, p.lens, o, lse);
    for (int s : {1, 2, 3, 7, 16, 33, 64}) {
      DecodeConfig cfg;
      cfg.num_splits = s;
      expect_matches(d, run.run(d, starts, p.lens, nullptr, cfg), o, lse, name(p) + " num_splits=" + std::to_string(s));
    }
  }
}

// The issue's small-batch shapes with the heuristic's plan (about one CTA per SM), fresh inputs
// per case, odd lengths, against the float64 reference; a paged cache gives the contiguous
// cache's bits.
TEST(FlashDecodeGpu, SmallBatchAutoPlanFreshInputs) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  struct Case {
    int q, kv, len;
  };
  uint64_t seed = 500;
  for (const Case c : {Case{96, 12, 8192}, Case{96, 12, 12345}, Case{96, 12, 1}, Case{64, 8, 4096}}) {
    Problem p;
    p.q_heads = c.q, p.kv_heads = c.kv, p.batch = 1, p.lens = {c.len};
    const Data d = make_data(p, ++seed);
    const std::vector<int32_t> starts = {0};
    std::vector<double> o, lse;
    reference(d, starts, p.lens, o, lse);
    const Result r = run.run(d, starts, p.lens);
    const std::string what = name(p) + " len=" + std::to_string(c.len) + " splits=" + std::to_string(r.num_splits);
    expect_matches(d, r, o, lse, what);
    if (c.len >= 4096) EXPECT_GT(r.num_splits, 1) << what;  // 11 or 16 on an H100/H200 (132 SMs)
    if (c.len == 12345) {
      DecodeConfig cfg;
      cfg.num_splits = r.num_splits;
      const Paged pg = make_paged(d, KvLayout::paged_nhd, 64, seed);
      const Result rp = run.run(d, starts, p.lens, &pg, cfg);
      EXPECT_EQ(0, std::memcmp(rp.o.data(), r.o.data(), r.o.size() * 4)) << what << " paged";
      EXPECT_EQ(0, std::memcmp(rp.out.data(), r.out.data(), r.out.size() * 4)) << what << " paged";
    }
  }
}

// More groups (batch x KV heads) than SMs: the heuristic's plan fills waves of two CTAs per SM
// with more than one split per group. The plan is made for 16 SMs (DecodeConfig::num_sms), so 48
// groups take that branch with a small problem (2 splits: 96 CTAs, three full waves of 32 slots;
// at 132 SMs the bench's batch 16 with 12 KV heads runs it, checked); ragged lengths with an empty
// sequence, three launches on one workspace (the split counters reset by the kernel).
TEST(FlashDecodeGpu, MoreGroupsThanSmsAutoPlanFillsWaves) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 96, p.kv_heads = 12, p.batch = 4;
  Rng rng{777};
  p.lens = {3001, 0, 1 + int((rng.uniform() + 1.f) * 1499.f), 1 + int((rng.uniform() + 1.f) * 1499.f)};
  const Data d = make_data(p, 778);
  const std::vector<int32_t> starts(p.batch, 0);
  std::vector<double> o, lse;
  reference(d, starts, p.lens, o, lse);
  DecodeConfig cfg;
  cfg.num_sms = 16;
  const Result r = run.run(d, starts, p.lens, nullptr, cfg, 3);
  const std::string what = name(p) + " b=4 on 16 SMs, splits=" + std::to_string(r.num_splits);
  EXPECT_EQ(r.num_splits, 2) << what;
  expect_matches(d, r, o, lse, what);
}

// The batch order (longest first, from host lengths; params.h) decides which CTAs start first, not
// what they compute: the same bits as the batch's own order (no host lengths) at one split count,
// with the longest sequence last, an empty one and a one-token one.
TEST(FlashDecodeGpu, LongestFirstOrderSameBitsAsBatchOrder) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 16, p.kv_heads = 2, p.head_dim = 64, p.batch = 37;
  Rng rng{4242};
  for (int b = 0; b < p.batch; ++b) p.lens.push_back(1 + int((rng.uniform() + 1.f) * 700.f));
  p.lens[0] = 1, p.lens[5] = 0, p.lens[36] = 2100;
  ASSERT_FALSE(longest_first(p.lens).empty());
  const Data d = make_data(p, 4243);
  const std::vector<int32_t> starts(size_t(p.batch), 0);
  std::vector<double> o, lse;
  reference(d, starts, p.lens, o, lse);
  DecodeConfig cfg;
  cfg.num_splits = 3;
  const Result ordered = run.run(d, starts, p.lens, nullptr, cfg, 2);
  const Result plain = run.run(d, starts, p.lens, nullptr, cfg, 1, false);
  expect_matches(d, ordered, o, lse, name(p) + " longest first");
  expect_matches(d, plain, o, lse, name(p) + " batch order");
  EXPECT_EQ(0, std::memcmp(ordered.o.data(), plain.o.data(), plain.o.size() * 4));
  EXPECT_EQ(0, std::memcmp(ordered.lse.data(), plain.lse.data(), plain.lse.size() * 4));
  EXPECT_EQ(ordered.out, plain.out);
}

TEST(FlashDecodeGpu, PagedMatchesContiguousBitwise) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  for (int hd : {64, 128}) {
    Problem p;
    p.head_dim = hd, p.q_heads = 32, p.kv_heads = 4, p.batch = 3, p.lens = {3001, 0, 1500};
    const Data d = make_data(p, 100 + hd);
    // Slices that start mid-page and end mid-page, as a rank's slice would.
    const std::vector<int32_t> starts = {37, 0, 250}, lens = {2900, 0, 1111};
    std::vector<double> o, lse;
    reference(d, starts, lens, o, lse);
    DecodeConfig cfg;
    cfg.num_splits = 5;
    const Result c = run.run(d, starts, lens, nullptr, cfg);
    expect_matches(d, c, o, lse, "contiguous");
    for (KvLayout lay : {KvLayout::paged_hnd, KvLayout::paged_nhd})
      for (int ps : {16, 64, 256}) {
        const Paged pg = make_paged(d, lay, ps, 7 * ps + hd);
        const Result r = run.run(d, starts, lens, &pg, cfg);
        const std::string what = std::string(lay == KvLayout::paged_hnd ? "HND" : "NHD") + " page " +
                                 std::to_string(ps) + " D=" + std::to_string(hd);
        // Same tiles (aligned to absolute positions), same splits, same math: same bits.
        EXPECT_EQ(0, std::memcmp(r.o.data(), c.o.data(), c.o.size() * 4)) << what;
        EXPECT_EQ(0, std::memcmp(r.lse.data(), c.lse.data(), c.lse.size() * 4)) << what;
        EXPECT_EQ(0, std::memcmp(r.out.data(), c.out.data(), c.out.size() * 4)) << what;
        expect_matches(d, r, o, lse, what);
      }
  }
}

// Block-table entries no slice reads may hold anything (flash_decode.h): junk there (-1, INT32_MIN,
// INT32_MAX, num_pages) changes nothing. Out of contract, a device slice_len past the pages filled
// in reads such entries: each reads page 0, so the launch ends without a fault (its output is
// unspecified). Before, INT32_MAX's page lay terabytes past k: an illegal address.
TEST(FlashDecodeGpu, PagedEntriesOutsideTheSlicesMayHoldAnything) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.head_dim = 128, p.q_heads = 32, p.kv_heads = 4, p.batch = 3, p.lens = {3001, 0, 1500};
  const Data d = make_data(p, 4242);
  const std::vector<int32_t> starts = {37, 0, 250}, lens = {2900, 0, 1111};
  std::vector<double> o, lse;
  reference(d, starts, lens, o, lse);
  DecodeConfig cfg;
  cfg.num_splits = 5;
  constexpr int kPage = 64;
  for (KvLayout lay : {KvLayout::paged_hnd, KvLayout::paged_nhd}) {
    Paged pg = make_paged(d, lay, kPage, 99);
    const int32_t junk[] = {-1, INT32_MIN, INT32_MAX, pg.num_pages};
    for (int b = 0; b < p.batch; ++b) {
      const int first = starts[size_t(b)] / kPage, end = (starts[size_t(b)] + lens[size_t(b)] + kPage - 1) / kPage;
      for (int i = 0; i < pg.max_pages; ++i)
        if (lens[size_t(b)] == 0 || i < first || i >= end)
          pg.table[size_t(b) * pg.max_pages + i] = junk[(b + i) % 4];
    }
    pg.table_d.upload(pg.table);
    const std::string what = std::string(lay == KvLayout::paged_hnd ? "HND" : "NHD") + " junk outside the slices";
    expect_matches(d, run.run(d, starts, lens, &pg, cfg), o, lse, what);
    // Every sequence to the capacity (the pages of junk too), no host lengths to check it.
    const int32_t capacity = pg.max_pages * kPage;
    run.run(d, std::vector<int32_t>(3, 0), std::vector<int32_t>(3, capacity), &pg, cfg, 1, /*host_lens=*/false);
    TF_CUDA(cudaDeviceSynchronize());  // a fault would be sticky: seen here at the latest
  }
}

// W ranks on one GPU: partial kernel per rank slice, then the combine kernel.
void simulate_ranks(Runner& run, const Data& d, const std::vector<std::vector<Slice>>& slices, bool interleaved,
                    const std::string& what) {
  const Problem& p = d.pb;
  const int world = int(slices.size());
  const int64_t orows = p.rows() * p.head_dim;
  // Rank r's partial at [r * stride]: dense ([W][rows][D] + [W][rows]) or one [O | LSE] block per
  // rank (what a single all-gather produces).
  const int64_t o_stride = interleaved ? orows + (p.rows() + 3) / 4 * 4 : orows;  // 16-byte aligned
  const int64_t l_stride = interleaved ? o_stride : p.rows();
  Dev<float> obuf(size_t(o_stride) * world), lbuf(interleaved ? 0 : size_t(l_stride) * world);
  float* lse_base = interleaved ? obuf.p + orows : lbuf.p;
  for (int r = 0; r < world; ++r) {
    std::vector<int32_t> st, ln;
    for (const Slice& s : slices[size_t(r)]) st.push_back(s.start), ln.push_back(s.len());
    const Result pr = run.run(d, st, ln);
    std::vector<double> o, lse;
    reference(d, st, ln, o, lse);
    expect_matches(d, pr, o, lse, what + " rank " + std::to_string(r));
    ::taxfree::test::copy_to_device(obuf.p + r * o_stride, pr.o.data(), orows * 4);
    ::taxfree::test::copy_to_device(lse_base + r * l_stride, pr.lse.data(), p.rows() * 4);
  }
  Dev<uint16_t> out(static_cast<size_t>(orows));
  Dev<float> o_out(static_cast<size_t>(orows)), lse_out(size_t(p.rows()));
  out.poison(), o_out.poison(), lse_out.poison();
  CombineArgs c;
  c.world = world, c.batch = p.batch, c.q_heads = p.q_heads, c.head_dim = p.head_dim, c.dtype = p.dtype;
  c.o_parts = obuf.p, c.o_rank_stride = o_stride, c.lse_parts = lse_base, c.lse_rank_stride = l_stride;
  c.out = out.p, c.o_out = o_out.p, c.lse_out = lse_out.p;
  launch_combine(c, run.stream);
  TF_CUDA(cudaStreamSynchronize(run.stream));

  std::vector<double> o, lse;
  reference(d, std::vector<int32_t>(size_t(p.batch), 0), p.lens, o, lse);
  Result r{o_out.download(), lse_out.download(), {}, 0};
  const auto bits = out.download();
  for (auto b : bits) r.out.push_back(bits_to_float(p.dtype, b));
  expect_matches(d, r, o, lse, what + " combined");
}

TEST(FlashDecodeGpu, SimulatedRanksBalancedPartition) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 16, p.kv_heads = 2, p.batch = 4, p.lens = {12345, 1, 0, 4000};
  const Data d = make_data(p, 21);
  for (int world : {1, 2, 3, 4, 8}) {
    simulate_ranks(run, d, partition(p.lens, world), world == 3, "W=" + std::to_string(world));
    simulate_ranks(run, d, partition(p.lens, world, 64), false, "W=" + std::to_string(world) + " align 64");
  }
}

// D = 64 and 27 rows: the combine kernel's last CTA has 3 rows, one warp merges only one of two.
TEST(FlashDecodeGpu, SimulatedRanksHeadDim64OddRows) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 9, p.kv_heads = 3, p.head_dim = 64, p.batch = 3, p.lens = {12345, 1, 0};
  const Data d = make_data(p, 27);
  for (int world : {2, 3, 5}) simulate_ranks(run, d, partition(p.lens, world), world == 3, "D=64 W=" + std::to_string(world));
}

TEST(FlashDecodeGpu, SimulatedRanksOddSlices) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  for (DType dt : {DType::bf16, DType::fp16}) {
    Problem p;
    p.dtype = dt, p.q_heads = 64, p.kv_heads = 8, p.batch = 3, p.lens = {12346, 12346, 0};
    const Data d = make_data(p, 31);
    // Sequence 0: 12345 tokens on rank 0, 1 on rank 1, none on rank 2; sequence 1: the reverse
    // order; sequence 2 is empty everywhere (combined: o = 0, lse = -inf).
    std::vector<std::vector<Slice>> s = {{{0, 12345}, {0, 0}, {0, 0}},
                                         {{12345, 12346}, {0, 1}, {0, 0}},
                                         {{12346, 12346}, {1, 12346}, {0, 0}}};
    simulate_ranks(run, d, s, false, std::string("odd slices ") + dtype_name(dt));
  }
}

TEST(FlashDecodeGpu, PeakedSoftmaxAndCustomScale) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  for (float qs : {8.f, 40.f}) {
    Problem p;
    p.q_heads = 32, p.kv_heads = 2, p.batch = 2, p.lens = {3000, 2049}, p.q_scale = qs, p.softmax_scale = 0.3f;
    const Data d = make_data(p, 41 + int(qs));
    std::vector<double> o, lse;
    const std::vector<int32_t> starts(2, 0);
    reference(d, starts, p.lens, o, lse);
    expect_matches(d, run.run(d, starts, p.lens), o, lse, "q_scale=" + std::to_string(qs));
  }
}

TEST(FlashDecodeGpu, EmptyEverywhere) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 8, p.kv_heads = 1, p.batch = 2, p.lens = {0, 0}, p.capacity = 64;
  const Data d = make_data(p, 51);
  const std::vector<int32_t> starts(2, 0);
  std::vector<double> o, lse;
  reference(d, starts, p.lens, o, lse);
  expect_matches(d, run.run(d, starts, p.lens), o, lse, "empty");
  simulate_ranks(run, d, partition(p.lens, 4), false, "empty W=4");
}

TEST(FlashDecodeGpu, RepeatedLaunchesAndCudaGraphReplay) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 96, p.kv_heads = 12, p.batch = 2, p.lens = {6000, 3333}, p.capacity = 6000;
  Data d = make_data(p, 61);
  const std::vector<int32_t> starts(2, 0);
  DecodeConfig cfg;
  cfg.num_splits = 9;
  std::vector<double> o, lse;
  reference(d, starts, p.lens, o, lse);
  expect_matches(d, run.run(d, starts, p.lens, nullptr, cfg, /*repeats=*/4), o, lse, "repeated");

  // Graph: capture one launch, replay it with fresh Q each time (same buffers).
  Dev<int32_t> s_d(2), l_d(2);
  s_d.upload(starts), l_d.upload(p.lens);
  Dev<uint16_t> out(size_t(p.rows()) * p.head_dim);
  Dev<float> lse_d(size_t(p.rows()));
  DecodeArgs a;
  a.batch = p.batch, a.q_heads = p.q_heads, a.kv_heads = p.kv_heads, a.head_dim = p.head_dim;
  a.q = d.qd.p, a.k = d.kd.p, a.v = d.vd.p, a.capacity = p.capacity;
  a.slice_start = s_d.p, a.slice_len = l_d.p, a.max_len = 6000, a.out = out.p, a.lse_part = lse_d.p;
  const DecodePlan plan = plan_decode(a, cfg);
  Dev<unsigned char> ws(plan.workspace_bytes);
  init_decode_workspace(ws.p, plan.workspace_bytes, run.stream);
  const CapturedGraph graph(run.stream,
                                             [&] { launch_decode_partial(a, plan, ws.p, plan.workspace_bytes, run.stream); });
  for (int it = 0; it < 3; ++it) {
    fill_host(d, 1000 + it);  // fresh Q, K, V into the same device buffers the graph captured
    upload(d);
    ASSERT_EQ(a.q, d.qd.p);
    out.poison(), lse_d.poison();
    graph.launch(run.stream);
    TF_CUDA(cudaStreamSynchronize(run.stream));
    reference(d, starts, p.lens, o, lse);
    std::vector<float> got;
    for (auto b : out.download()) got.push_back(bits_to_float(p.dtype, b));
    EXPECT_EQ(count_bad(got, o, tol_out(p.dtype), "graph replay out", size_t(p.head_dim), unit_roundoff(p.dtype)), 0)
        << "replay " << it;
    EXPECT_EQ(count_bad(lse_d.download(), lse, kTolLse, "graph replay lse"), 0) << "replay " << it;
  }
}

TEST(FlashDecodeGpu, LongSequenceSmoke) {
  TF_REQUIRE_GPUS(1);
  Runner run;
  Problem p;
  p.q_heads = 16, p.kv_heads = 2, p.batch = 1, p.lens = {300007};
  const Data d = make_data(p, 71);
  const std::vector<int32_t> starts = {0};
  std::vector<double> o, lse;
  reference(d, starts, p.lens, o, lse);
  const Result r = run.run(d, starts, p.lens);
  EXPECT_GT(r.num_splits, 1);
  expect_matches(d, r, o, lse, "300007 tokens");
}

// Shapes nobody listed, fresh every run (TAXFREE_TEST_SEED=N repeats one; its seed is in every
// failure): either dtype and head_dim, 1-16 KV heads at any GQA ratio, batch 1-48 (or 200-600) of
// lengths drawn log-uniform (empty and one-token sequences among them), slices starting and ending mid-tile, a
// contiguous or paged cache (either layout, any page size), the plan made for the device or for
// fewer SMs (the wave-filling branches), or a split count of 1-64 forced. Each plan runs twice on
// one workspace (bitwise equal: the kernel leaves its counters reset) against the double reference.
TEST(FlashDecodeGpu, RandomShapesHeuristicPlan) {
  TF_REQUIRE_GPUS(1);
  Draws rnd;
  int sms = 0;
  TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Runner run;
  for (int i = 0; i < 20; ++i) {
    Problem p;
    p.dtype = rnd.uni(0, 1) ? DType::bf16 : DType::fp16;
    p.head_dim = rnd.uni(0, 1) ? 128 : 64;
    p.kv_heads = rnd.log_uni(1, 16), p.q_heads = p.kv_heads * rnd.uni(1, kMaxGqaRatio);
    p.batch = rnd.uni(0, 7) ? rnd.log_uni(1, 48) : rnd.log_uni(200, 600);  // past 256: no longest-first order
    if (rnd.uni(0, 3) == 0) p.q_scale = 6.f, p.softmax_scale = 0.2f;
    // Lengths that keep the reference near 1e8 multiply-adds and the host cache near 1.6e7 values.
    const double cap = std::min(1e8 / (2.0 * p.q_heads * p.head_dim), 1.6e7 / (double(p.kv_heads) * p.head_dim)) / p.batch;
    // The longest sequence log-uniform over problems, the others within 4x of it.
    const int top = rnd.log_uni(1, std::max(1, std::min(int(cap), 60000)));
    for (int b = 0; b < p.batch; ++b) {
      const int kind = rnd.uni(0, 9);
      p.lens.push_back(kind == 0 ? 0 : kind == 1 ? 1 : rnd.uni(std::max(1, top / 4), top));
    }
    std::vector<int32_t> starts(size_t(p.batch), 0), lens = p.lens;
    if (rnd.uni(0, 1))
      for (int b = 0; b < p.batch; ++b)
        if (p.lens[size_t(b)] > 1) {
          starts[size_t(b)] = rnd.uni(0, p.lens[size_t(b)] - 1);
          lens[size_t(b)] = rnd.uni(0, p.lens[size_t(b)] - starts[size_t(b)]);
        }
    const Data d = make_data(p, rnd.bits());
    std::unique_ptr<Paged> pg;
    std::string what = name(p) + " batch=" + std::to_string(p.batch) + " max_len=" +
                       std::to_string(*std::max_element(lens.begin(), lens.end()));
    if (rnd.uni(0, 2) == 0) {
      const KvLayout layout = rnd.uni(0, 1) ? KvLayout::paged_hnd : KvLayout::paged_nhd;
      pg = std::make_unique<Paged>(make_paged(d, layout, 16 << rnd.uni(0, 4), rnd.bits()));
      what += std::string(layout == KvLayout::paged_hnd ? " HND" : " NHD") + " page " + std::to_string(pg->page_size);
    }
    DecodeConfig cfg;
    const int plan_by = rnd.uni(0, 5);  // the heuristic for this device, for fewer SMs, or a split count
    if (plan_by == 0) cfg.num_sms = rnd.log_uni(4, sms);
    if (plan_by == 1) cfg.num_splits = rnd.uni(1, kMaxSplits);
    std::vector<double> o, lse;
    reference(d, starts, lens, o, lse);
    const Result r = run.run(d, starts, lens, pg.get(), cfg, 2);
    what += cfg.num_splits ? std::string(" forced")
                           : " planned for " + std::to_string(cfg.num_sms ? cfg.num_sms : sms) + " SMs,";
    what += " splits=" + std::to_string(r.num_splits) + " " + rnd.where(i);
    std::printf("%s\n", what.c_str());
    SCOPED_TRACE(what);
    expect_matches(d, r, o, lse, what);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace taxfree::flash_decode
