// `taxfree bench all_gather_matmul`: the BSP baselines (ncclAllGather + cuBLASLt, NCCL on plain
// buffers and on the symmetric window), bsp-own, decomposed, push, ksplit and nsplit (gather_dim 1
// within the default ksplit capacity only; no row elsewhere) and auto, on the issue's shapes.
//
// Cases: paper   gather_dim 1, M in {1, 2, 4, ..., 1024}, N = 3584, K = 8192;
//        tensor-parallel prefill   gather_dim 0, M in {1024, ..., 16384}, N in {4096, 7168}, K = 8192;
// each with B as [K, N] (kn) and [N, K] (nk). --shape entries are key=value,... with keys M, N, K,
// gather_dim, layout: an entry naming M, N, K and gather_dim adds that shape (both layouts unless it
// names one); any other entry filters the default sweep. -b/-e bound C's bytes per rank.
// decomposed-in-place: decomposed with A_shard already in the op's local_slot() (what a producer
// writing its output there gets: no local copy).
// Parts (timed, not checked; they feed the tax breakdown): gemm-only (our GEMM on an already
// gathered A), cublas-only (cuBLASLt on it), cublas-block (nsplit's GEMM alone: cuBLASLt on it for
// this rank's column block of C; where nsplit runs), comm-only / comm-only-sym (ncclAllGather alone).
// Check: every rank's C against cuBLASLt on the expected gathered A (computed at setup from the
// known inputs of every rank) element by element, plus sampled fp32 dot products; the gathered A
// the variant returns against the expected one bit for bit (so it is identical on every rank).
// Environment: TAXFREE_AGMM_PUSH_CTAS, TAXFREE_AGMM_COL_CHUNK override push's per-shape choices,
// TAXFREE_AGMM_SIDE_CTAS ksplit's side gather width (AgmmConfig::side_gather_ctas).
// --inject skip-signal:R: rank R's ksplit and nsplit launches never raise the peers' flags (the timeout path).
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <map>
#include <memory>
#include <sstream>

#include "../../bench/matrix_check.cuh"
#include "../../bench/rates.h"
#include "taxfree/bench/harness.h"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::bench {

namespace {

using gemm::BLayout;
using gemm::DType;

struct Shape {
  int64_t m, n, k;
  int gather_dim;
  BLayout layout;
};

// M, N < 2^31 and K <= 2^30 - 8 (all_gather_matmul.h's contract), checked here before any rank starts;
// divisibility by the world too when -g gives it (check_options), else in cases().
std::map<std::string, std::string> parse_entry(const std::string& entry) {
  return parse_shape_entry(entry, {{"M", {}, INT32_MAX},
                                   {"N", {}, INT32_MAX},
                                   {"K", {}, (int64_t(1) << 30) - 8},
                                   {"gather_dim", {"0", "1"}},
                                   {"layout", {"nk", "kn"}}});
}

// The benchmark's operands are dense (lda = the shard's columns, as NCCL sends the shard; ldb = K
// or N; ldc = N) and the op's row strides are multiples of 8 elements.
void require_dense_strides(int64_t n, int64_t k) {
  TF_REQUIRE(n % 8 == 0 && k % 8 == 0, Status::InvalidArgument,
             "all_gather_matmul benchmarks: N=" << n << " and K=" << k
                                                << " must be multiples of 8 (the benchmark's operands are dense, and "
                                                   "the op's row strides are multiples of 8 elements; the op itself "
                                                   "takes other sizes with padded strides)");
}

// An entry naming a whole shape adds it; any other entry filters the default sweep.
bool names_shape(const std::map<std::string, std::string>& kv) {
  return kv.count("M") && kv.count("N") && kv.count("K") && kv.count("gather_dim");
}

bool matches(const Shape& s, const std::map<std::string, std::string>& kv) {
  for (const auto& [key, value] : kv) {
    if (key == "layout" && value != gemm::layout_name(s.layout)) return false;
    if (key == "gather_dim" && shape_int(kv, key, 0) != s.gather_dim) return false;
    if ((key == "M" || key == "N" || key == "K") && shape_int(kv, key, 0) != (key == "M" ? s.m : key == "N" ? s.n : s.k))
      return false;
  }
  return true;
}

std::vector<Shape> default_sweep() {
  std::vector<Shape> out;
  for (BLayout l : {BLayout::kn, BLayout::nk})
    for (int64_t m = 1; m <= 1024; m *= 2) out.push_back({m, 3584, 8192, 1, l});
  for (BLayout l : {BLayout::nk, BLayout::kn})
    for (int64_t n : {4096, 7168})
      for (int64_t m : {1024, 2048, 4096, 8192, 16384}) out.push_back({m, n, 8192, 0, l});
  return out;
}

// Push's and ksplit's tuning knobs (AgmmConfig fields, all int-sized); unset or empty: 0, the
// per-shape choice. Read by check_options too, so a bad value fails before any rank starts.
constexpr const char* kPushCtasEnv = "TAXFREE_AGMM_PUSH_CTAS";
constexpr const char* kColChunkEnv = "TAXFREE_AGMM_COL_CHUNK";
constexpr const char* kSideCtasEnv = "TAXFREE_AGMM_SIDE_CTAS";
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  return int(parse_int(name, v, 0, INT_MAX));  // in int range: 4294967300 no longer truncates to 4
}

// The op's config with the knobs above (0 / unset: the per-shape choice), at the default capacity.
AgmmConfig tuned_config() {
  AgmmConfig cfg;
  cfg.push_ctas = env_int(kPushCtasEnv);
  cfg.col_chunk = env_int(kColChunkEnv);
  cfg.side_gather_ctas = env_int(kSideCtasEnv);
  return cfg;
}

struct DeviceBuffer {
  void* p = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset(size_t bytes) {
    release();
    TF_CUDA(cudaMalloc(&p, bytes));
  }
  void release() {
    if (p) cudaFree(p);
    p = nullptr;
  }
  ~DeviceBuffer() { release(); }
};

// cuBLASLt bf16 at M = N = K = 8192 (the compute floor's rate), measured once per process.
double measure_gemm_rate(cudaStream_t s) {
  static double rate = 0;
  if (rate > 0) return rate;
  constexpr int64_t n = 8192;
  DeviceBuffer a, b, c;
  a.reset(n * n * 2), b.reset(n * n * 2), c.reset(n * n * 2);
  fill_uniform(a.p, n, n, n, 1, DType::bf16, s);
  fill_uniform(b.p, n, n, n, 2, DType::bf16, s);
  gemm::GemmArgs g;
  g.a = a.p, g.b = b.p, g.c = c.p, g.lda = g.ldb = g.ldc = n, g.m = g.n = g.k = n;
  // Back to back after a warm-up, as a GEMM runs inside the op: one run at a time with a host sync
  // between measured ~640 TFLOP/s on H200 (clocks drop between runs) where the bench's own 8192^3
  // rows reach 700-730, and the compute floor came out above measured times.
  constexpr int kWarm = 3, kRuns = 10;
  for (int i = 0; i < kWarm; ++i) gemm::cublaslt_launch(g, s);
  Event e0, e1;
  TF_CUDA(cudaEventRecord(e0.e, s));
  for (int i = 0; i < kRuns; ++i) gemm::cublaslt_launch(g, s);
  TF_CUDA(cudaEventRecord(e1.e, s));
  TF_CUDA(cudaStreamSynchronize(s));
  rate = kRuns * 2.0 * double(n) * n * n / elapsed_s(e0, e1);
  return rate;
}

class AgmmBench final : public OpBench {
 public:
  void check_options(const Options& opt) const override {
    for (const std::string& e : opt.shapes) {
      const auto kv = parse_entry(e);
      if (!names_shape(kv)) continue;
      require_dense_strides(shape_int(kv, "N", 0), shape_int(kv, "K", 0));
      // A shape the known world cannot split fails here once, not in every rank ("divisible").
      if (opt.ranks > 0)
        agmm_shard_shape(shape_int(kv, "M", 0), shape_int(kv, "K", 0), int(shape_int(kv, "gather_dim", 0)), opt.ranks);
    }
    const AgmmConfig tuned = tuned_config();  // the knobs' ranges, then the op's rules on them
    try {
      validate_agmm_config(tuned);
    } catch (const Error& e) {  // named by the variables the user set, then the op's rule
      TF_THROW(e.status(), kPushCtasEnv << "=" << tuned.push_ctas << ", " << kColChunkEnv << "=" << tuned.col_chunk
                                        << ", " << kSideCtasEnv << "=" << tuned.side_gather_ctas << ": " << e.what());
    }
    agmm::check_ksplit_knobs();
  }
  std::string name() const override { return "all_gather_matmul"; }
  std::vector<std::string> variants() const override {
    // push and sm-specialized last: their multi-millisecond runs at M >= 2048 heat the GPUs, and the
    // variant timed right after them read 1-8% slow in r25 (auto vs the decomposed it runs).
    return {"bsp",  "bsp-sym", "bsp-own", "decomposed",    "decomposed-in-place", "fused-ce", "ksplit", "nsplit",
            "auto", "pull",    "push",    "sm-specialized"};
  }
  bool applies(const Case& c, const std::string& v) const override {
    if (v == "pull") {  // where every tile reads one rank (make_pull_plan)
      AgmmArgs a;
      a.m = c.params.at("M").get<int64_t>(), a.n = c.params.at("N").get<int64_t>(), a.k = c.params.at("K").get<int64_t>();
      a.gather_dim = c.params.at("gather_dim").get<int>();
      a.dtype = parse_dtype(c.type, "all_gather_matmul benchmarks");
      a.b_layout = gemm::parse_layout(c.params.at("layout").get<std::string>(), "all_gather_matmul benchmarks");
      try {
        make_pull_plan(a, world_, sms_);
        return true;
      } catch (const Error& e) {
        if (e.status() == Status::NotSupported) return false;
        throw;
      }
    }
    if (v != "ksplit" && v != "nsplit" && v != "cublas-block") return true;
    const AgmmConfig cfg;  // the plain op's ksplit capacity
    return c.params.at("gather_dim").get<int>() == 1 && c.params.at("M").get<int64_t>() <= cfg.ksplit_max_m &&
           c.params.at("N").get<int64_t>() <= cfg.ksplit_max_n;
  }
  int baseline_count() const override { return 2; }
  int min_ranks() const override { return 1; }
  std::vector<std::string> parts() const override {
    return {"gemm-only", "cublas-only", "cublas-block", "comm-only", "comm-only-sym"};
  }

  std::vector<Case> cases(const Options& opt, const Team& team) const override {
    const DType dtype = parse_dtype(opt.dtype, "all_gather_matmul benchmarks");
    std::vector<Shape> shapes;
    std::vector<std::map<std::string, std::string>> filters;
    for (const std::string& e : opt.shapes) {
      auto kv = parse_entry(e);
      if (names_shape(kv)) {
        for (BLayout l : {BLayout::kn, BLayout::nk})
          if (!kv.count("layout") || kv["layout"] == gemm::layout_name(l)) {
            shapes.push_back({shape_int(kv, "M", 0), shape_int(kv, "N", 0), shape_int(kv, "K", 0),
                              int(shape_int(kv, "gather_dim", 0)), l});
            require_dense_strides(shapes.back().n, shapes.back().k);
            agmm_shard_shape(shapes.back().m, shapes.back().k, shapes.back().gather_dim, team.world());  // "divisible"
          }
      } else {
        filters.push_back(std::move(kv));
      }
    }
    if (shapes.empty() || !filters.empty())
      for (const Shape& s : default_sweep()) {
        if (!filters.empty() && std::none_of(filters.begin(), filters.end(), [&](auto& kv) { return matches(s, kv); }))
          continue;
        try {  // the sweep leaves out shapes this many ranks cannot split
          agmm_shard_shape(s.m, s.k, s.gather_dim, team.world());
        } catch (const Error&) {
          continue;
        }
        shapes.push_back(s);
      }
    world_ = team.world(), sms_ = team.sm_count();
    std::vector<Case> out;
    for (const Shape& s : shapes) {
      const int64_t bytes = s.m * s.n * 2;
      if (!within_size_bounds(opt, bytes)) continue;
      Case c;
      std::ostringstream label;
      label << "M=" << s.m << " N=" << s.n << " K=" << s.k << " gd" << s.gather_dim << " " << gemm::layout_name(s.layout);
      c.label = label.str();
      c.size_bytes = bytes;
      c.count = s.m * s.n;
      c.type = gemm::dtype_name(dtype);
      c.params = {{"M", s.m}, {"N", s.n}, {"K", s.k}, {"gather_dim", s.gather_dim}, {"layout", gemm::layout_name(s.layout)}};
      max_m_ = std::max(max_m_, s.m);
      max_k_ = std::max(max_k_, s.k);
      out.push_back(std::move(c));
    }
    return out;
  }

  void setup(Team& team, const Case& c, const Options& opt) override {
    team_ = &team;
    cudaStream_t s = team.stream();
    if (!plain_) {  // once: the ops' capacity covers every case of this run
      AgmmConfig cfg = tuned_config();
      cfg.max_m = std::max<int64_t>(max_m_, 1);
      cfg.max_k = std::max<int64_t>(max_k_, 8);
      plain_ = std::make_unique<AllGatherMatmul>(team, cfg);
      plain_->set_skip_signal(opt.skip_signal_rank == team.rank());
      cfg.bsp_symmetric = true;  // auto runs on it for small shards: it may pick ksplit there
      sym_ = std::make_unique<AllGatherMatmul>(team, cfg);
      gemm_rate_ = measure_gemm_rate(s);
    }
    const int w = team.world(), rank = team.rank();
    a_ = {};
    a_.m = c.params.at("M").get<int64_t>();
    a_.n = c.params.at("N").get<int64_t>();
    a_.k = c.params.at("K").get<int64_t>();
    a_.gather_dim = c.params.at("gather_dim").get<int>();
    a_.b_layout = gemm::parse_layout(c.params.at("layout").get<std::string>(), "all_gather_matmul benchmarks");
    a_.dtype = parse_dtype(opt.dtype, "all_gather_matmul benchmarks");
    a_.b_replicated = true;
    shard_ = agmm_shard_shape(a_.m, a_.k, a_.gather_dim, w);
    a_.lda_shard = shard_.cols;  // dense: NCCL can send it as it is
    a_.ldb = a_.b_layout == BLayout::nk ? a_.k : a_.n;
    a_.ldc = a_.n;
    const int64_t shard_bytes = shard_.rows * shard_.cols * 2;
    const int64_t b_rows = a_.b_layout == BLayout::nk ? a_.n : a_.k, b_cols = a_.b_layout == BLayout::nk ? a_.k : a_.n;

    mark_ = team.heap().mark();
    a_heap_ = team.heap().allocate(uint64_t(shard_bytes), 4096, "bench.agmm.a_shard");
    recv_heap_ = team.heap().allocate(uint64_t(shard_bytes) * w, 4096, "bench.agmm.recv");
    a_plain_.reset(size_t(shard_bytes));
    recv_plain_.reset(size_t(shard_bytes) * w);
    b_.reset(size_t(b_rows * a_.ldb * 2));
    c_.reset(size_t(a_.m * a_.ldc * 2));
    c_ref_.reset(size_t(a_.m * a_.ldc * 2));
    a_ref_.reset(size_t(a_.m * a_.k * 2));

    // Shard of rank r: fill_uniform(seed_r); every rank builds the whole expected gathered A.
    seed_ = opt.seed ^ uint64_t(a_.m * 1000003 + a_.n * 1009 + a_.k * 7 + a_.gather_dim);
    fill_uniform(a_heap_, shard_.rows, shard_.cols, shard_.cols, shard_seed(rank), a_.dtype, s);
    TF_CUDA(cudaMemcpyAsync(a_plain_.p, a_heap_, size_t(shard_bytes), cudaMemcpyDeviceToDevice, s));
    for (int r = 0; r < w; ++r) {
      const int64_t off = a_.gather_dim == 0 ? r * shard_.rows * a_.k : r * shard_.cols;
      fill_uniform(static_cast<char*>(a_ref_.p) + off * 2, shard_.rows, shard_.cols, a_.k, shard_seed(r), a_.dtype, s);
    }
    // B the same on every rank (a replicated weight, the paper's setting): ksplit needs it.
    fill_uniform(b_.p, b_rows, b_cols, a_.ldb, seed_ * 31 + 17, a_.dtype, s);
    gemm::cublaslt_launch(gathered_gemm(c_ref_.p), s);
    place_shard_in_slot(s);
    team.sync(s);
  }

  void poison(cudaStream_t s) override {
    TF_CUDA(cudaMemsetAsync(c_.p, 0xFF, size_t(a_.m * a_.ldc * 2), s));
    plain_->fill_buffers(0xFF, s);
    sym_->fill_buffers(0xFF, s);
    place_shard_in_slot(s);
  }

  void run(const std::string& v, cudaStream_t s) override {
    AgmmArgs args = a_;
    args.c = c_.p;
    args.b = b_.p;
    args.a_shard = a_heap_;
    if (v == "bsp") {
      args.a_shard = a_plain_.p;
      last_ = plain_->launch(AgmmVariant::bsp, args, s);
    } else if (v == "bsp-sym") {
      last_ = sym_->launch(AgmmVariant::bsp, args, s);
    } else if (v == "bsp-own" || v == "auto") {
      // NCCL at its best for the size (DESIGN.md: the window wins at small and mid sizes): the op
      // a user tuned for the size would hold, for auto's bsp choices too.
      if (big_shard()) args.a_shard = a_plain_.p;
      last_ = (big_shard() ? plain_ : sym_)->launch(parse_agmm_variant(v), args, s);
    } else if (v == "decomposed-in-place") {  // A_shard already in this rank's slot: no local copy
      const GatheredA slot = plain_->local_slot(a_.m, a_.k, a_.gather_dim);
      args.a_shard = slot.ptr;
      args.lda_shard = slot.ld;
      last_ = plain_->launch(AgmmVariant::decomposed, args, s);
    } else if (v == "decomposed" || v == "pull" || v == "push" || v == "sm-specialized" || v == "fused-ce" ||
               v == "ksplit" || v == "nsplit") {
      last_ = plain_->launch(parse_agmm_variant(v), args, s);
    } else if (v == "gemm-only") {
      gemm::launch(gathered_gemm(c_.p), s);
    } else if (v == "cublas-only") {
      gemm::cublaslt_launch(gathered_gemm(c_.p), s);
    } else if (v == "cublas-block") {  // nsplit's GEMM alone: this rank's column block of C
      const agmm::BlockGatherPlan p = make_nsplit_plan(a_, team_->world(), plain_->config(), team_->sm_count());
      const int64_t c0 = p.blocks.begin(team_->rank());
      gemm::GemmArgs g = gathered_gemm(static_cast<char*>(c_.p) + c0 * 2);
      g.n = p.blocks.cols(team_->rank());
      g.b = static_cast<const char*>(b_.p) + (a_.b_layout == BLayout::kn ? c0 : c0 * a_.ldb) * 2;
      if (g.n > 0) gemm::cublaslt_launch(g, s);
    } else if (v == "comm-only" || v == "comm-only-sym") {
      const bool sym = v == "comm-only-sym";
      auto& heap = team_->heap();
      const void* send = sym ? heap.nccl_address(a_heap_) : a_plain_.p;
      void* recv = sym ? heap.nccl_address(recv_heap_) : recv_plain_.p;
      const CallDeadline deadline(team_->coordinator(), "ncclAllGather (all_gather_matmul " + v + ")",
                                  team_->nccl_call_timeout_s());
      TF_NCCL(ncclAllGather(send, recv, size_t(shard_.rows * shard_.cols * 2), ncclUint8, team_->comm(), s));
    } else {
      TF_THROW(Status::InvalidArgument, "all_gather_matmul has no variant or part '" << v << "'");
    }
  }

  int64_t check(const std::string&, cudaStream_t s) override {
    const Tolerance tol = product_tolerance(a_.k, a_.dtype);
    int64_t wrong = count_outside(c_.p, a_.ldc, c_ref_.p, a_.ldc, a_.m, a_.n, tol, a_.dtype, s);
    wrong += count_sampled_wrong(gathered_gemm(c_.p), 1024, seed_ ^ 0x5A5A, tol, s);
    wrong += count_diff_2d(last_.ptr, last_.ld, a_ref_.p, a_.k, a_.m, a_.k, s);
    return wrong;
  }

  Figures figures(const Case& c, double seconds) const override {
    const auto [m, n, k] = mnk(c);
    Figures f;
    f.tflops = 2.0 * m * n * k / seconds / 1e12;
    f.algbw_gbs = m * k * 2 / seconds / 1e9;  // the gathered A
    f.busbw_gbs = f.algbw_gbs * bus_factor("all_gather", team_->world());
    return f;
  }

  // The largest of: the FLOPs at cuBLASLt's measured 8192^3 rate; the peers' shards over NVLink;
  // and what this rank must move through its HBM whatever the scheme: C written, its own shard
  // read, and its share of B. The bench's B is replicated (b_replicated, the paper's setting), so
  // the ranks may split reading it (ksplit does): K x N / world per rank. At small M that share
  // is the whole floor (29 MB at N = 3584 on 2 ranks, ~7 us).
  Floor floor(const Case& c, const MachineRates& r) const override {
    const auto [m, n, k] = mnk(c);
    const double compute = gemm_rate_ > 0 ? 2.0 * m * n * k / gemm_rate_ : 0;
    const double recv = m * k * 2.0 * (world_ - 1) / world_;
    const double comm = r.nvlink_bytes_per_s > 0 ? recv / r.nvlink_bytes_per_s : 0;
    const double hbm_bytes = (k * n / world_ + m * n + m * k / world_) * 2.0;
    const double hbm = r.hbm_bytes_per_s > 0 ? hbm_bytes / r.hbm_bytes_per_s : 0;
    Floor f{compute, "compute"};
    if (comm > f.seconds) f = {comm, "nvlink"};
    if (hbm >= f.seconds) f = {hbm, "hbm"};
    return f;
  }

  // DESIGN.md: bulk-synchronous = BSP - max(compute-only, comm-only), both at NCCL's / cuBLASLt's
  // best; data locality = the gathered A written by NCCL and read back by the GEMM (plus, for
  // gather_dim 1, the interleave pass) at the measured HBM rate; launch = BSP's kernels x launch cost.
  Taxes taxes(const Case& c, const std::map<std::string, double>& t, const MachineRates& rates) const override {
    auto best = [&](const char* x, const char* y) {
      const bool hx = t.count(x), hy = t.count(y);
      return hx && hy ? std::min(t.at(x), t.at(y)) : hx ? t.at(x) : hy ? t.at(y) : -1.0;
    };
    const auto [m, n, k] = mnk(c);
    (void)n;
    Taxes tx;
    const double bsp = best("bsp", "bsp-sym"), comm = best("comm-only", "comm-only-sym");
    if (bsp > 0 && comm > 0 && t.count("cublas-only")) tx.bulk_synchronous = bsp - std::max(t.at("cublas-only"), comm);
    const bool gd1 = c.params.at("gather_dim").get<int>() == 1;
    if (rates.hbm_bytes_per_s > 0) tx.data_locality = m * k * 2.0 * (gd1 ? 3 : 1) / rates.hbm_bytes_per_s;
    tx.launch = (gd1 ? 3 : 2) * rates.per_launch_s;
    return tx;
  }

  // Stream entries one run enqueues (kernels, copies, event records and waits, on every stream it
  // uses): the harness keeps a gated batch within what the streams queue without blocking the
  // host. bsp and decomposed counted; the other variants bounded from above, auto too (it runs one
  // of them): fused-ce's copy and flag copy per row chunk and peer are the most (about 6 + 8 per
  // peer; all were counted as 2 before, so at 8 ranks a batch could fill the queue behind the gate).
  int launches(const std::string& v) const override {
    const int w = team_ ? team_->world() : 2;
    if (v == "bsp" || v == "bsp-sym" || v == "bsp-own") return a_.gather_dim == 1 ? 3 : 2;
    if (v == "decomposed" || v == "decomposed-in-place")
      return 2 + 3 * (w - 1) + (a_.gather_dim == 0 ? w + w - 1 : 2 + w - 1);
    const std::vector<std::string> ps = parts();
    if (std::find(ps.begin(), ps.end(), v) != ps.end()) return 2;
    return 8 + 2 * kFusedCeRowChunks * (w - 1);
  }

  void teardown() override {
    for (DeviceBuffer* b : {&a_plain_, &recv_plain_, &b_, &c_, &c_ref_, &a_ref_}) b->release();
    if (team_) team_->heap().release(mark_);
  }

 private:
  static std::tuple<double, double, double> mnk(const Case& c) {
    return {double(c.params.at("M").get<int64_t>()), double(c.params.at("N").get<int64_t>()),
            double(c.params.at("K").get<int64_t>())};
  }
  uint64_t shard_seed(int r) const { return seed_ * 0x100000001B3ull + uint64_t(r) + 1; }
  // decomposed-in-place's A_shard: this rank's shard in the plain op's own slot, as a producer
  // writing there leaves it. Every other variant only ever writes the same bits into that slot.
  void place_shard_in_slot(cudaStream_t s) {
    const GatheredA slot = plain_->local_slot(a_.m, a_.k, a_.gather_dim);
    TF_CUDA(cudaMemcpy2DAsync(const_cast<void*>(slot.ptr), size_t(slot.ld * 2), a_heap_, size_t(shard_.cols * 2),
                              size_t(shard_.cols * 2), size_t(shard_.rows), cudaMemcpyDeviceToDevice, s));
  }
  bool big_shard() const { return shard_.rows * shard_.cols * 2 >= (int64_t(32) << 20); }
  gemm::GemmArgs gathered_gemm(void* c) const {
    gemm::GemmArgs g;
    g.a = a_ref_.p, g.lda = a_.k, g.b = b_.p, g.ldb = a_.ldb, g.c = c, g.ldc = a_.ldc;
    g.m = a_.m, g.n = a_.n, g.k = a_.k, g.dtype = a_.dtype, g.b_layout = a_.b_layout;
    return g;
  }

  Team* team_ = nullptr;
  mutable int64_t max_m_ = 0, max_k_ = 0;
  mutable int world_ = 2, sms_ = 132;  // the run's, for applies()
  std::unique_ptr<AllGatherMatmul> plain_, sym_;
  double gemm_rate_ = 0;
  AgmmArgs a_;
  ShardShape shard_{};
  GatheredA last_;
  uint64_t mark_ = 0, seed_ = 0;
  void *a_heap_ = nullptr, *recv_heap_ = nullptr;
  DeviceBuffer a_plain_, recv_plain_, b_, c_, c_ref_, a_ref_;
};

}  // namespace

std::unique_ptr<OpBench> make_all_gather_matmul_bench() { return std::make_unique<AgmmBench>(); }

}  // namespace taxfree::bench
