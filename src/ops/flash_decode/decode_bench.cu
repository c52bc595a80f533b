// `taxfree bench decode`: the single-GPU split-KV decode kernel on the issue's shapes, with the
// KV length per rank as the local length (contiguous cache, every sequence full length).
//
// --shape entries (bench_inputs::shapes_of) name shapes or select issue shapes, and may force the
// split count, e.g.
//   --shape batch=1,kv=32768,heads=96/12            an issue shape, the heuristic's plan
//   --shape batch=1,kv=12345,splits=7               any KV length, forced plan
//   --shape kv=8192,splits=11                       every issue shape with 8K tokens, 11 splits
//   --shape batch=4,kv=8192,page=16,layout=nhd     a paged cache (pages dealt to the sequences
//                                                   in a shuffled order), HND unless layout=nhd
//   --shape batch=16,kv=65536,ragged=1              lengths drawn in [1, 65536] (a serving batch)
// Rank 0 prints each case's plan ("# plan: ..."). -b/-e do not apply (the size column is the
// output bytes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_inputs.h"
#include "reference.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/team.h"

namespace taxfree::flash_decode {
namespace {

// Problems whose whole output the check recomputes on the CPU (KV tokens x KV heads x batch).
constexpr int64_t kFullCheckTokens = int64_t(1) << 20;

using bench_inputs::Shape;

class DecodeBench final : public bench::OpBench {
 public:
  ~DecodeBench() override { teardown(); }
  std::string name() const override { return "decode"; }
  std::vector<std::string> variants() const override { return {"split-kv"}; }

  void check_options(const bench::Options& opt) const override { bench_inputs::shapes_of(opt.shapes); }

  std::vector<bench::Case> cases(const bench::Options& opt, const Team&) const override {
    parse_dtype(opt.dtype, "decode benchmarks");
    std::vector<bench::Case> out;
    for (const Shape& s : bench_inputs::shapes_of(opt.shapes)) out.push_back(s.to_case(opt.dtype, ""));
    return out;
  }

  void setup(Team& team, const bench::Case& c, const bench::Options& opt) override {
    teardown();
    s_ = Shape::from(c.params);
    dtype_ = parse_dtype(opt.dtype, "decode benchmarks");
    const size_t q_elems = size_t(s_.batch) * s_.q_heads * s_.head_dim;
    TF_CUDA(cudaMalloc(&q_, q_elems * 2));
    TF_CUDA(cudaMalloc(&out_, q_elems * 2));
    TF_CUDA(cudaMalloc(&lse_, size_t(s_.batch) * s_.q_heads * 4));
    TF_CUDA(cudaMalloc(&lens_, size_t(s_.batch) * 4));
    lens_h_ = s_.lens();
    TF_CUDA(cudaMemcpy(lens_, lens_h_.data(), lens_h_.size() * 4, cudaMemcpyHostToDevice));
    seed_ = opt.seed ^ (uint64_t(s_.batch) << 40) ^ uint64_t(s_.kv);
    bench_inputs::fill(dtype_, q_, q_elems, seed_ + 1, nullptr);
    kv_ = std::make_unique<bench_inputs::DeviceKv>(s_, dtype_, seed_ + 2, seed_ + 3, seed_ + 4, nullptr);

    a_ = {};
    a_.batch = s_.batch, a_.q_heads = s_.q_heads, a_.kv_heads = s_.kv_heads, a_.head_dim = s_.head_dim;
    a_.dtype = dtype_;
    a_.q = q_;
    kv_->describe(a_);
    a_.slice_len = lens_, a_.max_len = *std::max_element(lens_h_.begin(), lens_h_.end());
    a_.host_slice_len = lens_h_;
    a_.out = out_, a_.lse_part = lse_;
    DecodeConfig cfg;
    cfg.num_splits = s_.splits;
    plan_ = plan_decode(a_, cfg);
    if (team.rank() == 0) std::printf("# plan: %s -> splits=%d\n", c.label.c_str(), plan_.num_splits);
    if (plan_.workspace_bytes) {
      TF_CUDA(cudaMalloc(&ws_, plan_.workspace_bytes));
      init_decode_workspace(ws_, plan_.workspace_bytes, nullptr);
    }
    TF_CUDA(cudaDeviceSynchronize());
  }

  void poison(cudaStream_t stream) override {
    TF_CUDA(cudaMemsetAsync(out_, 0xFF, size_t(s_.batch) * s_.q_heads * s_.head_dim * 2, stream));
    TF_CUDA(cudaMemsetAsync(lse_, 0xFF, size_t(s_.batch) * s_.q_heads * 4, stream));
  }

  void run(const std::string& variant, cudaStream_t stream) override {
    TF_REQUIRE(variant == "split-kv", Status::InvalidArgument, "decode has no variant '" << variant << "'");
    launch_decode_partial(a_, plan_, ws_, plan_.workspace_bytes, stream);
  }

  int64_t check(const std::string&, cudaStream_t stream) override {
    TF_CUDA(cudaStreamSynchronize(stream));
    const int group = s_.q_heads / s_.kv_heads, d = s_.head_dim;
    std::vector<uint16_t> out(size_t(s_.batch) * s_.q_heads * d);
    std::vector<float> lse(size_t(s_.batch) * s_.q_heads);
    TF_CUDA(cudaMemcpy(out.data(), out_, out.size() * 2, cudaMemcpyDeviceToHost));
    TF_CUDA(cudaMemcpy(lse.data(), lse_, lse.size() * 4, cudaMemcpyDeviceToHost));

    // Every (batch, kv_head) group for small problems, else the first, a middle and the last.
    std::vector<std::pair<int, int>> groups;
    if (int64_t(s_.batch) * s_.kv_heads * s_.kv <= kFullCheckTokens) {
      for (int b = 0; b < s_.batch; ++b)
        for (int h = 0; h < s_.kv_heads; ++h) groups.emplace_back(b, h);
    } else {
      groups = {{0, 0}, {s_.batch / 2, s_.kv_heads / 2}, {s_.batch - 1, s_.kv_heads - 1}};
      groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    }
    const double atol = dtype_ == DType::bf16 ? 6e-3 : 1.5e-3, rtol = dtype_ == DType::bf16 ? 1.2e-2 : 5e-3;
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<uint16_t> qb(size_t(group) * d);
    std::vector<float> qf(qb.size()), kf(size_t(s_.kv) * d), vf(kf.size());
    std::vector<double> ro(size_t(group) * d), rl(static_cast<size_t>(group));
    int64_t wrong = 0;
    for (auto [b, h] : groups) {
      const size_t row0 = size_t(b) * s_.q_heads + size_t(h) * group;
      TF_CUDA(cudaMemcpy(qb.data(), static_cast<uint16_t*>(q_) + row0 * d, qb.size() * 2, cudaMemcpyDeviceToHost));
      const int len = lens_h_[size_t(b)];
      for (size_t i = 0; i < qb.size(); ++i) qf[i] = bits_to_float(dtype_, qb[i]);
      // K and V regenerated (DeviceKv: the same values in either layout), so a kernel reading the
      // wrong page or row shows up here.
      const uint64_t kv0 = bench_inputs::kv_index(s_, b, h, 0, 0);
      for (size_t i = 0; i < size_t(len) * d; ++i)
        kf[i] = bench_inputs::value(seed_ + 2, kv0 + i), vf[i] = bench_inputs::value(seed_ + 3, kv0 + i);
      ref::attend_group(group, d, qf.data(), kf.data(), vf.data(), d, 0, len, scale, ro.data(), rl.data());
      for (int g = 0; g < group; ++g) {
        for (int e = 0; e < d; ++e) {
          const double got = bits_to_float(dtype_, out[(row0 + g) * d + e]), want = ro[size_t(g) * d + e];
          if (!(std::fabs(got - want) <= atol + rtol * std::fabs(want))) ++wrong;
        }
        if (!(std::fabs(lse[row0 + g] - rl[size_t(g)]) <= 1e-3 + 1e-5 * std::fabs(rl[size_t(g)]))) ++wrong;
      }
    }
    return wrong;
  }

  bench::Figures figures(const bench::Case& c, double seconds) const override {
    return bench_inputs::figures(c, seconds);
  }

  // KV bytes once through HBM at the copy bandwidth measured in this run (bytes read + written per
  // second: a pure read stream is bounded by the same figure).
  bench::Floor floor(const bench::Case& c, const bench::MachineRates& r) const override {
    return {c.params.at("kv_bytes").get<double>() / r.hbm_bytes_per_s, "hbm"};
  }

  int launches(const std::string&) const override { return 1; }

  void teardown() override {
    for (void* p : {q_, out_, static_cast<void*>(lse_), static_cast<void*>(lens_), ws_})
      if (p) cudaFree(p);
    q_ = out_ = ws_ = nullptr;
    lse_ = nullptr;
    lens_ = nullptr;
    kv_.reset();
  }

 private:
  Shape s_{};
  DType dtype_ = DType::bf16;
  uint64_t seed_ = 0;
  void *q_ = nullptr, *out_ = nullptr, *ws_ = nullptr;
  float* lse_ = nullptr;
  int32_t* lens_ = nullptr;
  std::unique_ptr<bench_inputs::DeviceKv> kv_;
  std::vector<int32_t> lens_h_;  // tokens of each sequence (host mirror of lens_)
  DecodeArgs a_;
  DecodePlan plan_;
};

}  // namespace
}  // namespace taxfree::flash_decode

namespace taxfree::bench {
std::unique_ptr<OpBench> make_decode_bench() {
  return std::make_unique<flash_decode::DecodeBench>();
}
}  // namespace taxfree::bench
