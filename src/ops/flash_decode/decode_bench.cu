// `taxfree bench decode`: the single-GPU split-KV decode kernel on the issue's shapes, with the
// KV length per rank as the local length (contiguous cache, every sequence full length).
//
// --shape filters (any entry may match; an entry matches when all its keys do), e.g.
//   --shape batch=1,kv=32768,heads=96/12      keys: batch, kv, heads (q/kv), head_dim
// The sweep is the shape list below; -b/-e do not apply (the size column is the output bytes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "reference.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::ops::flash_decode {
namespace {


// Problems whose whole output the check recomputes on the CPU (KV tokens x KV heads x batch).
constexpr int64_t kFullCheckTokens = int64_t(1) << 20;

struct Shape {
  int q_heads, kv_heads, head_dim, batch, kv;
  int64_t kv_bytes() const { return 2 * int64_t(batch) * kv_heads * kv * head_dim * 2; }
};

std::vector<Shape> issue_shapes() {
  std::vector<Shape> s;
  for (int b : {1, 4, 16})
    for (int kv : {8192, 32768, 131072, 524288}) s.push_back({96, 12, 128, b, kv});
  for (int b : {1, 8, 32})
    for (int kv : {4096, 16384, 65536}) s.push_back({64, 8, 128, b, kv});
  return s;
}

bool matches(const Shape& s, const std::string& filter) {
  std::stringstream ss(filter);
  std::string kv;
  while (std::getline(ss, kv, ',')) {
    if (kv.empty()) continue;
    const auto eq = kv.find('=');
    TF_REQUIRE(eq != std::string::npos, Status::InvalidArgument,
               "--shape entry '" << kv << "' must be key=value (keys: batch, kv, heads, head_dim)");
    const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    if (key == "heads") {
      const auto slash = val.find('/');
      TF_REQUIRE(slash != std::string::npos, Status::InvalidArgument,
                 "--shape heads=" << val << " must be Q/KV, e.g. heads=96/12");
      if (std::stoi(val.substr(0, slash)) != s.q_heads || std::stoi(val.substr(slash + 1)) != s.kv_heads)
        return false;
    } else if (key == "batch") {
      if (std::stoi(val) != s.batch) return false;
    } else if (key == "kv") {
      if (std::stoi(val) != s.kv) return false;
    } else if (key == "head_dim") {
      if (std::stoi(val) != s.head_dim) return false;
    } else {
      TF_THROW(Status::InvalidArgument, "unknown --shape key '" << key << "' (keys: batch, kv, heads, head_dim)");
    }
  }
  return true;
}

DType parse_dtype(const std::string& t) {
  if (t == "bf16") return DType::BF16;
  if (t == "fp16" || t == "f16" || t == "half") return DType::FP16;
  TF_THROW(Status::InvalidArgument, "decode: dtype '" << t << "' must be bf16 or fp16");
}

// Uniform [-1, 1) from a hash of (seed, index): device-side fill of tens of GB in milliseconds.
__device__ inline float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(z >> 40) * (2.f / 16777216.f) - 1.f;
}
template <class T>
__global__ void fill_uniform(T* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = T(hash_uniform(seed, i));
}

float to_float(DType t, uint16_t u) {
  if (t == DType::BF16) {
    __nv_bfloat16 h;
    std::memcpy(&h, &u, 2);
    return __bfloat162float(h);
  }
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}

class DecodeBench final : public bench::OpBench {
 public:
  ~DecodeBench() override { teardown(); }
  std::string name() const override { return "decode"; }
  std::vector<std::string> variants() const override { return {"split-kv"}; }

  std::vector<bench::Case> cases(const bench::Options& opt, const Team&) const override {
    parse_dtype(opt.dtype);
    std::vector<bench::Case> out;
    for (const Shape& s : issue_shapes()) {
      bool keep = opt.shapes.empty();
      for (const auto& f : opt.shapes) keep = keep || matches(s, f);
      if (!keep) continue;
      bench::Case c;
      std::ostringstream label;
      label << "b=" << s.batch << " kv=" << s.kv << " heads=" << s.q_heads << "/" << s.kv_heads
            << " d=" << s.head_dim;
      c.label = label.str();
      c.count = int64_t(s.batch) * s.q_heads * s.head_dim;
      c.size_bytes = c.count * 2;
      c.type = opt.dtype;
      c.params = {{"batch", s.batch},       {"kv", s.kv},           {"q_heads", s.q_heads},
                  {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"kv_bytes", s.kv_bytes()}};
      out.push_back(std::move(c));
    }
    return out;
  }

  void setup(Team&, const bench::Case& c, const bench::Options& opt) override {
    teardown();
    s_ = {c.params.at("q_heads").get<int>(), c.params.at("kv_heads").get<int>(),
          c.params.at("head_dim").get<int>(), c.params.at("batch").get<int>(), c.params.at("kv").get<int>()};
    dtype_ = parse_dtype(opt.dtype);
    const size_t q_elems = size_t(s_.batch) * s_.q_heads * s_.head_dim;
    const size_t kv_elems = size_t(s_.batch) * s_.kv_heads * s_.kv * s_.head_dim;
    TF_CUDA(cudaMalloc(&q_, q_elems * 2));
    TF_CUDA(cudaMalloc(&k_, kv_elems * 2));
    TF_CUDA(cudaMalloc(&v_, kv_elems * 2));
    TF_CUDA(cudaMalloc(&out_, q_elems * 2));
    TF_CUDA(cudaMalloc(&lse_, size_t(s_.batch) * s_.q_heads * 4));
    TF_CUDA(cudaMalloc(&lens_, size_t(s_.batch) * 4));
    const std::vector<int32_t> lens(size_t(s_.batch), s_.kv);
    TF_CUDA(cudaMemcpy(lens_, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    const uint64_t seed = opt.seed ^ (uint64_t(s_.batch) << 40) ^ uint64_t(s_.kv);
    fill(q_, q_elems, seed + 1), fill(k_, kv_elems, seed + 2), fill(v_, kv_elems, seed + 3);

    a_ = {};
    a_.batch = s_.batch, a_.q_heads = s_.q_heads, a_.kv_heads = s_.kv_heads, a_.head_dim = s_.head_dim;
    a_.dtype = dtype_;
    a_.q = q_, a_.k = k_, a_.v = v_, a_.layout = KvLayout::Contiguous, a_.capacity = s_.kv;
    a_.slice_len = lens_, a_.max_len = s_.kv;
    a_.out = out_, a_.lse_part = lse_;
    plan_ = plan_decode(a_);
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
    const double atol = dtype_ == DType::BF16 ? 6e-3 : 1.5e-3, rtol = dtype_ == DType::BF16 ? 1.2e-2 : 5e-3;
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<uint16_t> qb(size_t(group) * d), kb(size_t(s_.kv) * d), vb(kb.size());
    std::vector<float> qf(qb.size()), kf(kb.size()), vf(kb.size());
    std::vector<double> ro(size_t(group) * d), rl(static_cast<size_t>(group));
    int64_t wrong = 0;
    for (auto [b, h] : groups) {
      const size_t row0 = size_t(b) * s_.q_heads + size_t(h) * group;
      const size_t kv0 = (size_t(b) * s_.kv_heads + h) * size_t(s_.kv) * d;
      TF_CUDA(cudaMemcpy(qb.data(), static_cast<uint16_t*>(q_) + row0 * d, qb.size() * 2, cudaMemcpyDeviceToHost));
      TF_CUDA(cudaMemcpy(kb.data(), static_cast<uint16_t*>(k_) + kv0, kb.size() * 2, cudaMemcpyDeviceToHost));
      TF_CUDA(cudaMemcpy(vb.data(), static_cast<uint16_t*>(v_) + kv0, vb.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < qb.size(); ++i) qf[i] = to_float(dtype_, qb[i]);
      for (size_t i = 0; i < kb.size(); ++i) kf[i] = to_float(dtype_, kb[i]), vf[i] = to_float(dtype_, vb[i]);
      ref::attend_group(group, d, qf.data(), kf.data(), vf.data(), d, 0, s_.kv, scale, ro.data(), rl.data());
      for (int g = 0; g < group; ++g) {
        for (int e = 0; e < d; ++e) {
          const double got = to_float(dtype_, out[(row0 + g) * d + e]), want = ro[size_t(g) * d + e];
          if (!(std::fabs(got - want) <= atol + rtol * std::fabs(want))) ++wrong;
        }
        if (!(std::fabs(lse[row0 + g] - rl[size_t(g)]) <= 1e-3 + 1e-5 * std::fabs(rl[size_t(g)]))) ++wrong;
      }
    }
    return wrong;
  }

  bench::Figures figures(const bench::Case& c, double seconds) const override {
    const double kv_bytes = c.params.at("kv_bytes").get<double>();
    const double flops = 4.0 * c.params.at("batch").get<double>() * c.params.at("q_heads").get<double>() *
                         c.params.at("kv").get<double>() * c.params.at("head_dim").get<double>();
    bench::Figures f;
    f.algbw_gbs = kv_bytes / seconds / 1e9;  // KV bytes read per second
    f.tflops = flops / seconds / 1e12;
    return f;
  }

  // KV bytes once through HBM at the copy bandwidth measured in this run (bytes read + written per
  // second: a pure read stream is bounded by the same figure).
  bench::Floor floor(const bench::Case& c, const bench::MachineRates& r) const override {
    return {c.params.at("kv_bytes").get<double>() / r.hbm_bytes_per_s, "hbm"};
  }

  int launches(const std::string&) const override { return 1; }

  void teardown() override {
    for (void* p : {q_, k_, v_, out_, static_cast<void*>(lse_), static_cast<void*>(lens_), ws_})
      if (p) cudaFree(p);
    q_ = k_ = v_ = out_ = ws_ = nullptr;
    lse_ = nullptr;
    lens_ = nullptr;
  }

 private:
  void fill(void* p, size_t n, uint64_t seed) {
    if (dtype_ == DType::BF16) fill_uniform<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
    else fill_uniform<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
    TF_CUDA(cudaGetLastError());
  }

  Shape s_{};
  DType dtype_ = DType::BF16;
  void *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *out_ = nullptr, *ws_ = nullptr;
  float* lse_ = nullptr;
  int32_t* lens_ = nullptr;
  DecodeArgs a_;
  DecodePlan plan_;
};

}  // namespace
}  // namespace taxfree::ops::flash_decode

namespace taxfree::bench {
std::unique_ptr<OpBench> make_decode_bench() {
  return std::make_unique<ops::flash_decode::DecodeBench>();
}
}  // namespace taxfree::bench
