#include "bench_inputs.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <sstream>

#include "taxfree/bench/harness.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode::bench_inputs {
namespace {

// Element i of the splitmix64 stream `seed`.
__host__ __device__ inline uint64_t hashed(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__host__ __device__ inline float hashed_value(uint64_t seed, uint64_t i) {
  return float(int(hashed(seed, i) >> 55) - 256) * (1.f / 256.f);  // >> 55: [0, 512)
}

template <class T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = T(hashed_value(seed, i));
}

// The paged cache (DeviceKv) element by element: slot (page pg, offset o, head h, element e) holds
// value(seed, kv_index(b, h, p * page + o, e)) where pg is page p of sequence b (owner[pg] = b *
// pages_per_seq + p); slots past kv hold value(seed, contiguous elements + their own offset).
template <class T>
__global__ void fill_pages_kernel(T* p, size_t n, uint64_t seed, const int32_t* owner, int pages_per_seq, int page,
                                  int kv_heads, int d, int kv, bool nhd, uint64_t contiguous) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int e = int(i % d);
    const size_t row = i / d;  // HND: (pg * kv_heads + h) * page + o; NHD: (pg * page + o) * kv_heads + h
    const int64_t pg = int64_t(row / (size_t(page) * kv_heads));
    const int rest = int(row % (size_t(page) * kv_heads));
    const int h = nhd ? rest % kv_heads : rest / page, o = nhd ? rest / kv_heads : rest % page;
    const int b = owner[pg] / pages_per_seq;
    const int64_t t = int64_t(owner[pg] % pages_per_seq) * page + o;
    const uint64_t idx = t < kv ? ((uint64_t(b) * kv_heads + h) * uint64_t(kv) + uint64_t(t)) * d + e : contiguous + i;
    p[i] = T(hashed_value(seed, idx));
  }
}

}  // namespace

std::vector<int32_t> Shape::lens() const {
  std::vector<int32_t> l(size_t(batch), kv);
  if (ragged)
    for (int b = 0; b < batch; ++b)
      l[size_t(b)] = 1 + int32_t(hashed(uint64_t(batch) << 32 | uint32_t(kv), uint64_t(b)) % uint64_t(kv));
  return l;
}

int64_t Shape::kv_bytes() const {
  int64_t tokens = 0;
  for (int32_t n : lens()) tokens += n;
  return 2 * tokens * kv_heads * head_dim * 2;
}

bench::Figures figures(const bench::Case& c, double seconds) {
  const double kv_bytes = c.params.at("kv_bytes").get<double>();  // 4 x kv_heads x head_dim per token
  const double flops = kv_bytes * c.params.at("q_heads").get<double>() / c.params.at("kv_heads").get<double>();
  bench::Figures f;
  f.algbw_gbs = kv_bytes / seconds / 1e9;
  f.tflops = flops / seconds / 1e12;
  return f;
}

bench::Case Shape::to_case(const std::string& dtype, const char* kv_suffix) const {
  bench::Case c;
  std::ostringstream label;
  label << "b=" << batch << " kv=" << kv << kv_suffix << " heads=" << q_heads << "/" << kv_heads << " d=" << head_dim;
  if (splits > 0) label << " splits=" << splits;
  if (page > 0) label << " page=" << page << (nhd ? " nhd" : " hnd");
  if (ragged) label << " ragged";
  c.label = label.str();
  c.count = int64_t(batch) * q_heads * head_dim;
  c.size_bytes = c.count * 2;
  c.type = dtype;
  c.params = params();
  return c;
}

nlohmann::json Shape::params() const {
  return {{"batch", batch},       {"kv", kv},
          {"heads", std::to_string(q_heads) + "/" + std::to_string(kv_heads)},
          {"q_heads", q_heads},   {"kv_heads", kv_heads},
          {"head_dim", head_dim}, {"kv_bytes", kv_bytes()},
          {"splits", splits},     {"page", page},
          {"layout", page == 0 ? "contiguous" : nhd ? "nhd" : "hnd"},
          {"ragged", ragged ? 1 : 0}};
}

Shape Shape::from(const nlohmann::json& p) {
  return {p.at("q_heads").get<int>(), p.at("kv_heads").get<int>(), p.at("head_dim").get<int>(),
          p.at("batch").get<int>(),   p.at("kv").get<int>(),       p.value("splits", 0),
          p.value("page", 0),         p.value("layout", std::string()) == "nhd",
          p.value("ragged", 0) != 0};
}

std::vector<Shape> issue_shapes() {
  std::vector<Shape> s;
  for (int b : {1, 4, 16})
    for (int kv : {8192, 32768, 131072, 524288}) s.push_back({96, 12, 128, b, kv});
  for (int b : {1, 8, 32})
    for (int kv : {4096, 16384, 65536}) s.push_back({64, 8, 128, b, kv});
  return s;
}

namespace {

// K + V cache bytes a named shape allocates (DeviceKv: whole pages when paged), in double: the
// key limits alone allow 2^71, which wrapped the allocation's size_t.
double cache_bytes(const Shape& s) {
  const double capacity = s.page > 0 ? std::ceil(double(s.kv) / s.page) * s.page : double(s.kv);
  return 2.0 * s.batch * s.kv_heads * capacity * s.head_dim * 2;
}

}  // namespace

std::vector<Shape> shapes_of(const std::vector<std::string>& entries) {
  if (entries.empty()) return issue_shapes();
  std::vector<Shape> out;
  for (const std::string& e : entries) {
    // flash_decode.h's limits: batch and kv_heads <= 65535, 2^30 tokens per sequence (per rank
    // here), q_heads <= kMaxGqaRatio per KV head, at most kMaxSplits splits.
    const auto kv = bench::parse_shape_entry(e, {{"batch", {}, 65535},
                                                 {"kv", {}, int64_t(1) << 30},
                                                 {"heads", {"96/12", "64/8"}},
                                                 {"q_heads", {}, int64_t(65535) * kMaxGqaRatio},
                                                 {"kv_heads", {}, 65535},
                                                 {"head_dim", {"64", "128"}},
                                                 {"splits", {}, kMaxSplits},
                                                 {"page", {"16", "32", "64", "128", "256"}},
                                                 {"layout", {"hnd", "nhd"}},
                                                 {"ragged", {"0", "1"}}});
    // Every numeric key is in int range (checked above).
    const auto get = [&](const char* key, int def) { return int(bench::shape_int(kv, key, def)); };
    const std::string heads = kv.count("heads") ? kv.at("heads") : "";
    const int splits = get("splits", 0);
    TF_REQUIRE(!kv.count("heads") || !(kv.count("q_heads") || kv.count("kv_heads")), Status::InvalidArgument,
               "--shape entry '" << e << "': give heads=Q/KV or q_heads and kv_heads, not both");
    TF_REQUIRE(!kv.count("layout") || kv.count("page"), Status::InvalidArgument,
               "--shape entry '" << e << "': layout applies to a paged cache; give page=16..256 too");
    const int page = get("page", 0);
    const bool nhd = kv.count("layout") && kv.at("layout") == "nhd";
    const bool ragged = kv.count("ragged") && kv.at("ragged") == "1";
    // The op's GQA rule (flash_decode.h), before any rank starts, on the head counts an entry gives.
    const auto check_gqa = [&](int q_heads, int kv_heads) {
      TF_REQUIRE(q_heads % kv_heads == 0 && q_heads / kv_heads <= kMaxGqaRatio, Status::InvalidArgument,
                 "--shape entry '" << e << "': q_heads=" << q_heads << " must be a multiple of kv_heads=" << kv_heads
                                   << ", at most " << kMaxGqaRatio << " per KV head");
    };
    if (kv.count("batch") && kv.count("kv")) {
      const bool h64 = heads == "64/8";
      out.push_back({get("q_heads", h64 ? 64 : 96), get("kv_heads", h64 ? 8 : 12), get("head_dim", 128),
                     get("batch", 1), get("kv", 1), splits, page, nhd, ragged});
      check_gqa(out.back().q_heads, out.back().kv_heads);
      TF_REQUIRE(cache_bytes(out.back()) <= double(bench::kMaxBytes), Status::InvalidArgument,
                 "--shape entry '" << e << "': a K + V cache of " << cache_bytes(out.back())
                                   << " bytes is past the 2^50-byte limit of bench sizes");
      continue;
    }
    if (kv.count("q_heads") && kv.count("kv_heads")) check_gqa(get("q_heads", 1), get("kv_heads", 1));
    const size_t before = out.size();
    for (Shape s : issue_shapes()) {
      const bool match = get("batch", s.batch) == s.batch && get("kv", s.kv) == s.kv &&
                         get("head_dim", s.head_dim) == s.head_dim && get("q_heads", s.q_heads) == s.q_heads &&
                         get("kv_heads", s.kv_heads) == s.kv_heads &&
                         (heads.empty() || heads == std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads));
      if (!match) continue;
      s.splits = splits, s.page = page, s.nhd = nhd, s.ragged = ragged;
      out.push_back(s);
    }
    // The default sweep does not depend on the world, so an entry selecting none of it is a typo
    // whatever the job: said here, not by every rank.
    TF_REQUIRE(out.size() > before, Status::InvalidArgument,
               "--shape entry '" << e << "' selects no shape of the default sweep (an entry without both batch "
                                    "and kv filters it; give both to name a shape)");
  }
  return out;
}

float value(uint64_t seed, uint64_t i) { return hashed_value(seed, i); }

void fill(DType dtype, void* dst, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::bf16) fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, seed);
  else fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__half*>(dst), n, seed);
  TF_CUDA(cudaGetLastError());
}

DeviceKv::DeviceKv(const Shape& s, DType dtype, uint64_t k_seed, uint64_t v_seed, uint64_t table_seed,
                   cudaStream_t stream)
    : s_(s) {
  const size_t contiguous = size_t(s.batch) * s.kv_heads * s.kv * s.head_dim;
  const int64_t pages_per_seq = s.page > 0 ? (int64_t(s.kv) + s.page - 1) / s.page : 0;
  const size_t elems = s.page > 0 ? size_t(s.batch) * pages_per_seq * s.page * s.kv_heads * s.head_dim : contiguous;
  TF_CUDA(cudaMalloc(&k_, elems * 2));
  TF_CUDA(cudaMalloc(&v_, elems * 2));
  if (s.page == 0) {
    fill(dtype, k_, elems, k_seed, stream);
    fill(dtype, v_, elems, v_seed, stream);
    return;
  }
  table_.resize(size_t(s.batch) * pages_per_seq);
  for (size_t i = 0; i < table_.size(); ++i) table_[i] = int32_t(i);
  std::shuffle(table_.begin(), table_.end(), std::mt19937_64(table_seed));
  std::vector<int32_t> owner(table_.size());
  for (size_t i = 0; i < table_.size(); ++i) owner[size_t(table_[i])] = int32_t(i);
  int32_t* owner_d = nullptr;
  TF_CUDA(cudaMalloc(&table_d_, table_.size() * 4));
  TF_CUDA(cudaMalloc(&owner_d, owner.size() * 4));
  TF_CUDA(cudaMemcpyAsync(table_d_, table_.data(), table_.size() * 4, cudaMemcpyHostToDevice, stream));
  TF_CUDA(cudaMemcpyAsync(owner_d, owner.data(), owner.size() * 4, cudaMemcpyHostToDevice, stream));
  for (const auto& [dst, seed] : {std::pair{k_, k_seed}, std::pair{v_, v_seed}}) {
    const auto launch = [&]<class T>(T* p) {
      fill_pages_kernel<<<1024, 256, 0, stream>>>(p, elems, seed, owner_d, int(pages_per_seq), s.page, s.kv_heads,
                                                  s.head_dim, s.kv, s.nhd, uint64_t(contiguous));
    };
    if (dtype == DType::bf16) launch(static_cast<__nv_bfloat16*>(dst));
    else launch(static_cast<__half*>(dst));
    TF_CUDA(cudaGetLastError());
  }
  // The host vectors are read by the copies above before this returns.
  TF_CUDA(cudaStreamSynchronize(stream));
  TF_CUDA(cudaFree(owner_d));
}

DeviceKv::~DeviceKv() {
  for (void* p : {k_, v_, static_cast<void*>(table_d_)})
    if (p) cudaFree(p);
}

void DeviceKv::describe(DecodeArgs& a) const {
  a.k = k_, a.v = v_;
  if (s_.page == 0) {
    a.layout = KvLayout::contiguous, a.capacity = s_.kv;
    return;
  }
  a.layout = s_.nhd ? KvLayout::paged_nhd : KvLayout::paged_hnd, a.capacity = 0;
  a.page_size = s_.page, a.num_pages = int(table_.size());
  a.max_pages_per_seq = int(table_.size() / size_t(s_.batch));
  a.block_table = table_d_, a.host_block_table = table_;
}

}  // namespace taxfree::flash_decode::bench_inputs
