// `taxfree bench flash_decode`: decode attention with every sequence's KV split across the ranks
// (`kv` tokens per rank, in each rank's own cache), the full output on every rank.
//
// Variants: bsp (decode -> ncclAllGather from the symmetric window -> combine), bsp-plain (same,
// plain buffers; NCCL at its best is the faster of the two baselines), fused (one kernel; splits
// merged in a thread-block cluster where the plan allows), fused-global (the same kernel with the
// splits always merged through global memory: FlashDecodeConfig::SplitMerge::global), fused-direct
// (raw split partials to every rank, merged once at the receiver where the shape allows:
// SplitMerge::direct).
// Parts for the tax breakdown: decode-only (bsp's decode kernel alone; its algbw column is the KV
// read rate, to compare with the measured HBM rate) and comm-only (the all-gather alone).
// --shape entries as for `bench decode` (bench_inputs::shapes_of: batch, kv, heads, head_dim,
// splits forcing the plan of every variant and part, ragged=1 for lengths drawn in [1, kv], each
// rank holding that many tokens of each sequence, with host lengths given so the plan sees them;
// page=16..256 and layout=hnd|nhd for a paged cache on every rank, its pages in a shuffled order);
// rank 0 prints the fused plan.
//
// Check: the output of sampled (sequence, KV head) groups against a double-precision reference
// over the whole sequence (each rank regenerates every rank's KV on the host), and the output
// bitwise against rank 0's (gathered with NCCL).
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../../bench/bench_util.cuh"
#include "bench_inputs.h"
#include "reference.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/kernels/attention/params.h"  // kFusedTraceEvents
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::flash_decode {
namespace {

using bench_inputs::Shape;

// One-way flag latency measured on 2xH200, for the floor when the harness has no measurement.
constexpr double kFlagLatencyS = 1.2e-6;
// Problems up to this many (tokens x KV heads x batch x ranks) get every group checked; larger
// ones two groups per rank (different groups on every rank).
constexpr int64_t kFullCheckWork = int64_t(1) << 21;

// Seeds of the inputs: q is the same on every rank, K and V (and a paged cache's page order) are
// per rank.
uint64_t q_seed(uint64_t base) { return base * 31 + 1; }
uint64_t k_seed(uint64_t base, int rank) { return base * 31 + 2 + 2 * uint64_t(rank); }
uint64_t v_seed(uint64_t base, int rank) { return base * 31 + 3 + 2 * uint64_t(rank); }
uint64_t page_order_seed(uint64_t base, int rank) { return ~(base * 31 + uint64_t(rank)); }

class FlashDecodeBench final : public bench::OpBench {
 public:
  ~FlashDecodeBench() override { teardown(); }
  std::string name() const override { return "flash_decode"; }
  std::vector<std::string> variants() const override {
    return {"bsp", "bsp-plain", "fused", "fused-global", "fused-direct"};
  }
  int baseline_count() const override { return 2; }
  // One rank is the degenerate team (tensor parallelism of 1): bsp is the decode, a one-rank
  // all-gather and the combine; fused is the decode with its combine in the same kernel.
  int min_ranks() const override { return 1; }
  std::vector<std::string> parts() const override { return {"decode-only", "comm-only"}; }
  int launches(const std::string& v) const override { return v == "bsp" || v == "bsp-plain" ? 3 : 1; }

  void check_options(const bench::Options& opt) const override { bench_inputs::shapes_of(opt.shapes); }

  std::vector<bench::Case> cases(const bench::Options& opt, const Team& team) const override {
    parse_dtype(opt.dtype, "flash_decode benchmarks");
    std::vector<bench::Case> out;
    for (const Shape& s : bench_inputs::shapes_of(opt.shapes)) {
      bench::Case c = s.to_case(opt.dtype, "/rank");
      c.params["world"] = team.world();
      out.push_back(std::move(c));
    }
    return out;
  }

  void setup(Team& team, const bench::Case& c, const bench::Options& opt) override {
    teardown();
    team_ = &team;
    s_ = Shape::from(c.params);
    dtype_ = parse_dtype(opt.dtype, "flash_decode benchmarks");
    seed_ = opt.seed ^ (uint64_t(s_.batch) << 40) ^ (uint64_t(s_.q_heads) << 32) ^ uint64_t(s_.kv);
    const size_t q_elems = size_t(s_.batch) * s_.q_heads * s_.head_dim;
    TF_CUDA(cudaMalloc(&q_, q_elems * 2));
    TF_CUDA(cudaMalloc(&out_, q_elems * 2));
    TF_CUDA(cudaMalloc(&all_out_, q_elems * 2 * team.world()));
    TF_CUDA(cudaMalloc(&lens_, size_t(s_.batch) * 4));
    lens_h_ = s_.lens();
    TF_CUDA(cudaMemcpy(lens_, lens_h_.data(), lens_h_.size() * 4, cudaMemcpyHostToDevice));
    bench_inputs::fill(dtype_, q_, q_elems, q_seed(seed_), team.stream());
    const int r = team.rank();
    kv_ = std::make_unique<bench_inputs::DeviceKv>(s_, dtype_, k_seed(seed_, r), v_seed(seed_, r),
                                                   page_order_seed(seed_, r), team.stream());

    a_ = {};
    a_.batch = s_.batch, a_.q_heads = s_.q_heads, a_.kv_heads = s_.kv_heads, a_.head_dim = s_.head_dim;
    a_.dtype = dtype_;
    a_.q = q_;
    kv_->describe(a_);
    a_.slice_len = lens_, a_.max_len = *std::max_element(lens_h_.begin(), lens_h_.end());
    a_.host_slice_len = lens_h_;
    a_.out = out_;

    mark_ = team.heap().mark();
    FlashDecodeConfig cfg;
    cfg.max_batch = s_.batch, cfg.max_q_heads = s_.q_heads, cfg.max_kv_heads = s_.kv_heads;
    cfg.max_head_dim = s_.head_dim;
    cfg.num_splits = s_.splits;
    op_ = std::make_unique<FlashDecode>(team, cfg);
    cfg.split_merge = FlashDecodeConfig::SplitMerge::direct;
    direct_ = std::make_unique<FlashDecode>(team, cfg);
    const FusedPlan fp = op_->fused_plan(a_), dp = direct_->fused_plan(a_);
    if (team.rank() == 0)
      std::printf("# plan: %s -> fused splits=%d grid=%d cluster=%d; fused-direct splits=%d grid=%d direct=%d\n",
                  c.label.c_str(), fp.num_splits, fp.grid, fp.cluster, dp.num_splits, dp.grid, int(dp.direct));
    cfg.split_merge = FlashDecodeConfig::SplitMerge::global;
    global_ = std::make_unique<FlashDecode>(team, cfg);
    if (const char* prefix = std::getenv("TAXFREE_FD_TRACE"); prefix != nullptr && *prefix != '\0') {
      const std::string tail = "." + std::to_string(s_.batch) + "x" + std::to_string(s_.kv) + "x" +
                               std::to_string(s_.q_heads) + "-" + std::to_string(s_.kv_heads) + ".rank" +
                               std::to_string(team.rank()) + ".txt";
      traces_[0].start(*op_, fp.grid, prefix + tail);
      traces_[1].start(*direct_, dp.grid, prefix + std::string(".direct") + tail);
      traces_[2].start(*global_, global_->fused_plan(a_).grid, prefix + std::string(".global") + tail);
    }
    cfg.bsp_buffers = BspBuffers::plain;
    plain_ = std::make_unique<FlashDecode>(team, cfg);
    for (FlashDecode* f : {op_.get(), global_.get(), direct_.get()}) f->set_skip_signal(opt.skip_signal_rank == team.rank());
    reference_.clear();
    team.sync(team.stream());
  }

  void poison(cudaStream_t stream) override {
    TF_CUDA(cudaMemsetAsync(out_, 0xFF, size_t(s_.batch) * s_.q_heads * s_.head_dim * 2, stream));
  }

  void run(const std::string& v, cudaStream_t stream) override {
    if (v == "bsp") op_->launch(FlashDecodeVariant::bsp, a_, stream);
    else if (v == "bsp-plain") plain_->launch(FlashDecodeVariant::bsp, a_, stream);
    else if (v == "fused") op_->launch(FlashDecodeVariant::fused, a_, stream);
    else if (v == "fused-global") global_->launch(FlashDecodeVariant::fused, a_, stream);
    else if (v == "fused-direct") direct_->launch(FlashDecodeVariant::fused, a_, stream);
    else if (v == "decode-only") op_->launch_bsp_stage(FlashDecode::Stage::decode, a_, stream);
    else if (v == "comm-only") op_->launch_bsp_stage(FlashDecode::Stage::gather, a_, stream);
    else TF_THROW(Status::InvalidArgument, "flash_decode has no variant or part '" << v << "'");
  }

  int64_t check(const std::string&, cudaStream_t stream) override {
    const int group = s_.q_heads / s_.kv_heads, d = s_.head_dim;
    const size_t n = size_t(s_.batch) * s_.q_heads * d;
    // Bitwise against rank 0: every rank gathers every rank's output (collective).
    {
      const CallDeadline deadline(team_->coordinator(), "ncclAllGather (flash_decode bench check)",
                                  team_->nccl_call_timeout_s());
      TF_NCCL(ncclAllGather(out_, all_out_, n * 2, ncclUint8, team_->comm(), stream));
    }
    team_->sync(stream);  // the deadline and diagnostic of a Team wait, not count_diff16's plain one
    int64_t wrong = bench::count_diff16(static_cast<uint16_t*>(all_out_) + n * team_->rank(), all_out_, n * 2, stream);

    std::vector<uint16_t> out(n);
    TF_CUDA(cudaMemcpy(out.data(), out_, n * 2, cudaMemcpyDeviceToHost));
    const double atol = dtype_ == DType::bf16 ? 6e-3 : 1.5e-3, rtol = dtype_ == DType::bf16 ? 1.2e-2 : 5e-3;
    for (int g : checked_groups()) {
      const std::vector<double>& want = reference(g);
      const size_t row0 = size_t(g) * group;
      for (size_t i = 0; i < size_t(group) * d; ++i) {
        const double got = bits_to_float(dtype_, out[row0 * d + i]);
        if (!(std::fabs(got - want[i]) <= atol + rtol * std::fabs(want[i]))) ++wrong;
      }
    }
    return wrong;
  }

  // Local KV bytes read per second and the local attention's rate.
  bench::Figures figures(const bench::Case& c, double seconds) const override {
    return bench_inputs::figures(c, seconds);
  }

  // The local slice's KV once through HBM at the copy rate measured in this run, plus one flag
  // latency (measured in this run: the exchange that no in-kernel combine avoids).
  bench::Floor floor(const bench::Case& c, const bench::MachineRates& r) const override {
    const double flag = r.flag_latency_s > 0 ? r.flag_latency_s : kFlagLatencyS;
    return {c.params.at("kv_bytes").get<double>() / r.hbm_bytes_per_s + flag, "hbm"};
  }

  // bulk-synchronous: the faster bsp baseline - max(decode-only, comm-only); launch: the two
  // kernels bsp launches beyond fused's one; data locality: the gathered partials (every rank's
  // fp32 O + LSE) written to HBM and read back by the combine.
  bench::Taxes taxes(const bench::Case& c, const std::map<std::string, double>& t,
                     const bench::MachineRates& r) const override {
    bench::Taxes x;
    double bsp = 0;
    for (const char* v : {"bsp", "bsp-plain"})
      if (t.count(v) && (bsp == 0 || t.at(v) < bsp)) bsp = t.at(v);
    if (bsp > 0 && t.count("decode-only") && t.count("comm-only"))
      x.bulk_synchronous = bsp - std::max(t.at("decode-only"), t.at("comm-only"));
    x.launch = (launches("bsp") - launches("fused")) * r.per_launch_s;
    const Shape s = Shape::from(c.params);
    const double partials = c.params.at("world").get<double>() * s.batch * s.q_heads * (s.head_dim + 1) * 4.0;
    x.data_locality = 2 * partials / r.hbm_bytes_per_s;
    return x;
  }

  void teardown() override {
    for (Trace& t : traces_) t.write();
    op_.reset();
    direct_.reset();
    global_.reset();
    plain_.reset();
    if (team_ != nullptr) team_->heap().release(mark_);
    for (void* p : {q_, out_, all_out_, static_cast<void*>(lens_)})
      if (p) cudaFree(p);
    q_ = out_ = all_out_ = nullptr;
    lens_ = nullptr;
    kv_.reset();
    team_ = nullptr;
  }

 private:
  // TAXFREE_FD_TRACE=PREFIX: the last launch's timeline (FusedDecodeParams::trace) of `fused`,
  // `fused-direct` and `fused-global`, one line per CTA: "cta" then the FusedTraceEvent values
  // (%globaltimer ns, 0 = not reached; the SM last), into
  // PREFIX[.direct|.global].<batch>x<kv>x<q_heads>-<kv_heads>.rank<r>.txt.
  struct Trace {
    uint64_t* buf = nullptr;
    int ctas = 0;
    std::string path;
    void start(FlashDecode& op, int grid, std::string to) {
      ctas = grid, path = std::move(to);
      TF_CUDA(cudaMalloc(&buf, size_t(grid) * taxfree::attention::kFusedTraceEvents * 8));
      TF_CUDA(cudaMemset(buf, 0, size_t(grid) * taxfree::attention::kFusedTraceEvents * 8));
      op.set_trace(buf);
    }
    void write() {
      if (buf == nullptr) return;
      const size_t n = size_t(ctas) * taxfree::attention::kFusedTraceEvents;
      std::vector<uint64_t> t(n);
      const bool ok = cudaDeviceSynchronize() == cudaSuccess &&
                      cudaMemcpy(t.data(), buf, n * 8, cudaMemcpyDeviceToHost) == cudaSuccess;
      cudaFree(buf);
      buf = nullptr;
      if (std::FILE* f = ok ? std::fopen(path.c_str(), "w") : nullptr) {
        for (int c = 0; c < ctas; ++c) {
          std::fprintf(f, "%d", c);
          for (int e = 0; e < taxfree::attention::kFusedTraceEvents; ++e)
            std::fprintf(f, " %llu", static_cast<unsigned long long>(t[size_t(c) * taxfree::attention::kFusedTraceEvents + e]));
          std::fprintf(f, "\n");
        }
        std::fclose(f);
      }
    }
  };

  std::vector<int> checked_groups() const {
    const int groups = s_.batch * s_.kv_heads, world = team_->world();
    std::vector<int> g;
    if (int64_t(groups) * s_.kv * world <= kFullCheckWork) {
      for (int i = 0; i < groups; ++i) g.push_back(i);
    } else {
      const int first = int(int64_t(team_->rank()) * groups / world);
      g = {first, groups - 1 - first};
      g.erase(std::unique(g.begin(), g.end()), g.end());
    }
    return g;
  }

  // Output rows of group g (b*kv_heads + kvh) over the whole sequence, in double: each rank's
  // partial over its slice (KV regenerated on the host), merged with the double combine.
  const std::vector<double>& reference(int g) {
    auto it = reference_.find(g);
    if (it != reference_.end()) return it->second;
    const int group = s_.q_heads / s_.kv_heads, d = s_.head_dim, world = team_->world();
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<float> q(size_t(group) * d), k(size_t(s_.kv) * d), v(k.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = bench_inputs::value(q_seed(seed_), size_t(g) * group * d + i);
    std::vector<double> o(size_t(world) * group * d), lse(size_t(world) * group);  // [rank][row][d]
    const int len = lens_h_[size_t(g / s_.kv_heads)];  // this rank's live tokens of the group's sequence
    for (int r = 0; r < world; ++r) {
      const uint64_t kv0 = bench_inputs::kv_index(s_, g / s_.kv_heads, g % s_.kv_heads, 0, 0);
      for (size_t i = 0; i < size_t(len) * d; ++i) {
        k[i] = bench_inputs::value(k_seed(seed_, r), kv0 + i);
        v[i] = bench_inputs::value(v_seed(seed_, r), kv0 + i);
      }
      ref::attend_group(group, d, q.data(), k.data(), v.data(), d, 0, len, scale, o.data() + size_t(r) * group * d,
                        lse.data() + size_t(r) * group);
    }
    std::vector<double> want(size_t(group) * d), po(size_t(world) * d), pl(static_cast<size_t>(world));
    for (int h = 0; h < group; ++h) {
      for (int r = 0; r < world; ++r) {
        std::copy_n(o.data() + (size_t(r) * group + h) * d, d, po.data() + size_t(r) * d);
        pl[size_t(r)] = lse[size_t(r) * group + h];
      }
      ref::combine(world, d, po.data(), pl.data(), want.data() + size_t(h) * d);
    }
    return reference_[g] = std::move(want);
  }

  Team* team_ = nullptr;
  Shape s_{};
  DType dtype_ = DType::bf16;
  uint64_t seed_ = 0, mark_ = 0;
  void *q_ = nullptr, *out_ = nullptr, *all_out_ = nullptr;
  std::unique_ptr<bench_inputs::DeviceKv> kv_;  // this rank's slice of every sequence
  int32_t* lens_ = nullptr;
  std::vector<int32_t> lens_h_;  // this rank's tokens of each sequence (host mirror of lens_)
  DecodeArgs a_;
  std::unique_ptr<FlashDecode> op_, global_, plain_, direct_;
  std::map<int, std::vector<double>> reference_;
  Trace traces_[3];  // TAXFREE_FD_TRACE only: fused, fused-direct, fused-global
};

}  // namespace
}  // namespace taxfree::flash_decode

namespace taxfree::bench {
std::unique_ptr<OpBench> make_flash_decode_bench() {
  return std::make_unique<flash_decode::FlashDecodeBench>();
}
}  // namespace taxfree::bench
