// `taxfree bench gemm`: our GEMM against cuBLASLt on the same inputs, over the issue's sweep.
//
// Cases: M in {1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384} x N in {3584, 4096, 7168, 8192,
// 14336} x B layout {nk, kn}, K = 8192. Each --shape entry is `key=value,...` with keys M, N, K,
// layout and the tuning keys below: an entry naming M, N and K adds that shape (both layouts unless
// it names one); any other entry filters the sweep (a case is kept if it matches the M, N, K, layout
// keys of some entry). Tuning keys override the heuristic's choice for `ours` in the cases that
// entry selects (the case label then ends with the config's name):
//   swap=0|1       swap-AB off / on (1: the heuristic's best swap-AB config; a tile= picks among
//                  the swap-AB tiles 16x128, 32x128, 64x128)
//   tile=BMxBN     a compiled tile (e.g. 128x128; its stage count comes with it)
//   cluster=C      CTAs per cluster along M (a compiled tile must have it; 128x256 and 128x224 have 1 and 2)
//   clusterk=S     CTAs per cluster splitting each tile's K, summed in shared memory (128x128 has
//                  1, 2 and 4; without it a named tile or a split key takes the tile without)
//   group=G        m-blocks (cluster tiles) per rasterisation group
//   splitk=S       split every tile into S K ranges (1: no split-K)
//   tailsplit=S    split only the tiles of the last, partial wave into S K ranges
//   streamk=1      stream-K: the last partial wave plus one full wave share out their k-blocks
//                  equally over the clusters
// At most one of splitk, tailsplit, streamk per entry.
// -b/-e bound the output size in bytes.
// Check: cuBLASLt's output against a sampled fp32 reference; ours against the same sampled
// reference and element by element against cuBLASLt on the same inputs (cuBLASLt is rerun inside
// check(), untimed), so unwritten (poisoned) or wrong elements anywhere are counted.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../../bench/bench_util.cuh"
#include "../../bench/matrix_check.cuh"
#include "taxfree/bench/harness.h"
#include "taxfree/bench/op_bench.h"
#include "taxfree/ops/cublaslt_gemm.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/error.h"

namespace taxfree::bench {
namespace {

using gemm::BLayout;
using gemm::DType;

// Overrides of the heuristic's config; 0 / "" = the heuristic's.
struct Tuning {
  std::string tile;
  int swap = -1;  // -1: the heuristic's choice
  int cluster = 0, clusterk = 0, group = 0, splitk = 0, tailsplit = 0, streamk = 0;
  bool any() const {
    return !tile.empty() || swap >= 0 || cluster || clusterk || group || splitk || tailsplit || streamk;
  }
  gemm::SwapAB swap_choice() const {
    return swap < 0 ? gemm::SwapAB::choose : swap ? gemm::SwapAB::always : gemm::SwapAB::never;
  }
};

struct Shape {
  int64_t m, n, k;
  BLayout layout;
  Tuning tuning;
};

const char* const kTuningKeys[] = {"tile", "swap", "cluster", "clusterk", "group", "splitk", "tailsplit", "streamk"};
bool is_tuning_key(const std::string& key) {
  for (const char* k : kTuningKeys)
    if (key == k) return true;
  return false;
}

Tuning tuning_of(const std::map<std::string, std::string>& kv) {
  Tuning t;
  auto get = [&](const char* key) { return int(shape_int(kv, key, 0)); };  // int32: checked by parse_entry
  t.tile = kv.count("tile") ? kv.at("tile") : "";
  t.swap = int(shape_int(kv, "swap", -1));
  t.cluster = get("cluster");
  t.clusterk = get("clusterk");
  t.group = get("group");
  t.splitk = get("splitk");
  t.tailsplit = get("tailsplit");
  t.streamk = get("streamk");
  return t;
}

// Parses "M=1,N=2,K=3,layout=nk[,tuning keys]" into key -> value; throws InvalidArgument naming the
// entry. M, N, K up to gemm.h's 2^31 - 1 (ShapeKey's default max): a larger M passed here once and
// overflowed m * lda * 2 at setup.
std::map<std::string, std::string> parse_entry(const std::string& entry) {
  // The compiled tiles and cluster sizes, each once, in the order compiled_configs() lists them.
  std::vector<std::string> tiles, clusters, clusters_k;
  const auto add = [](std::vector<std::string>& to, std::string v) {
    if (std::find(to.begin(), to.end(), v) == to.end()) to.push_back(std::move(v));
  };
  for (const gemm::GemmConfig& cfg : gemm::compiled_configs()) {
    add(tiles, std::to_string(cfg.bm) + "x" + std::to_string(cfg.bn));
    add(clusters, std::to_string(cfg.cluster_m));
    add(clusters_k, std::to_string(cfg.cluster_k));
  }
  auto kv = parse_shape_entry(entry, {{"M", {}}, {"N", {}}, {"K", {}}, {"layout", {"nk", "kn"}}, {"tile", tiles},
                                      {"swap", {"0", "1"}}, {"cluster", clusters}, {"clusterk", clusters_k}, {"group", {}},
                                      {"splitk", {}, gemm::kMaxSplits}, {"tailsplit", {}, gemm::kMaxSplits},
                                      {"streamk", {"1"}}});
  TF_REQUIRE(kv.count("splitk") + kv.count("tailsplit") + kv.count("streamk") <= 1, Status::InvalidArgument,
             "--shape entry '" << entry << "': splitk, tailsplit and streamk exclude each other");
  return kv;
}

bool matches(const Shape& s, const std::map<std::string, std::string>& kv) {
  for (const auto& [key, value] : kv) {
    if (is_tuning_key(key)) continue;
    if (key == "layout" ? value != gemm::layout_name(s.layout)
                        : shape_int(kv, key, 0) != (key == "M" ? s.m : key == "N" ? s.n : s.k))
      return false;
  }
  return true;
}

class GemmBench final : public OpBench {
 public:
  // Builds every case, so a tuning combination that is not compiled fails before any rank starts
  // (for the heuristic's choice at 132 SMs: an entry that keeps its tile is checked again at setup
  // against the device's count).
  void check_options(const Options& opt) const override { cases_of(opt); }
  std::string name() const override { return "gemm"; }
  std::vector<std::string> variants() const override { return {"cublaslt", "ours"}; }

  std::vector<Case> cases(const Options& opt, const Team&) const override { return cases_of(opt); }

  void setup(Team&, const Case& c, const Options& opt) override {
    teardown();
    args_ = {};
    args_.m = c.params.at("m").get<int64_t>();
    args_.n = c.params.at("n").get<int64_t>();
    args_.k = c.params.at("k").get<int64_t>();
    args_.b_layout = gemm::parse_layout(c.params.at("layout").get<std::string>(), "gemm benchmarks");
    args_.dtype = parse_dtype(opt.dtype, "gemm benchmarks");
    args_.lda = args_.k;
    args_.ldb = args_.b_layout == BLayout::nk ? args_.k : args_.n;
    args_.ldc = args_.n;
    const int64_t b_rows = args_.b_layout == BLayout::nk ? args_.n : args_.k;
    const int64_t b_cols = args_.b_layout == BLayout::nk ? args_.k : args_.n;
    TF_CUDA(cudaMalloc(&a_, args_.m * args_.lda * 2));
    TF_CUDA(cudaMalloc(&b_, b_rows * args_.ldb * 2));
    TF_CUDA(cudaMalloc(&c_ours_, args_.m * args_.ldc * 2));
    TF_CUDA(cudaMalloc(&c_ref_, args_.m * args_.ldc * 2));
    seed_ = opt.seed ^ splitmix64(uint64_t(args_.m) * 31 + uint64_t(args_.n) * 7 + uint64_t(args_.k));
    fill_uniform(a_, args_.m, args_.k, args_.lda, seed_, args_.dtype, nullptr);
    fill_uniform(b_, b_rows, b_cols, args_.ldb, splitmix64(seed_), args_.dtype, nullptr);
    TF_CUDA(cudaDeviceSynchronize());
    Tuning t;
    t.tile = c.params.at("tile").get<std::string>();
    t.swap = c.params.at("swap").get<int>();
    t.cluster = c.params.at("cluster").get<int>();
    t.clusterk = c.params.at("clusterk").get<int>();
    t.group = c.params.at("group").get<int>();
    t.splitk = c.params.at("splitk").get<int>();
    t.tailsplit = c.params.at("tailsplit").get<int>();
    t.streamk = c.params.at("streamk").get<int>();
    config_ = with_overrides(gemm::choose_gemm_config(args_.m, args_.n, args_.k, args_.dtype, args_.b_layout,
                                                      gemm::device_sm_count(), gemm::KCuts::split_or_cluster,
                                                      t.swap_choice()),
                             t);
  }

  void poison(cudaStream_t stream) override {
    // 0xFFFF is a NaN in bf16 and fp16: any element a variant leaves unwritten fails the check.
    TF_CUDA(cudaMemsetAsync(c_ours_, 0xFF, args_.m * args_.ldc * 2, stream));
    TF_CUDA(cudaMemsetAsync(c_ref_, 0xFF, args_.m * args_.ldc * 2, stream));
  }

  void run(const std::string& variant, cudaStream_t stream) override {
    if (variant == "cublaslt") {
      gemm::cublaslt_launch(with_c(c_ref_), stream);
    } else {
      TF_REQUIRE(variant == "ours", Status::InvalidArgument, "gemm has no variant '" << variant << "'");
      gemm::launch(with_c(c_ours_), config_, stream);
    }
  }

  // Both variants against sampled fp32 dot products; ours also element by element against cuBLASLt.
  int64_t check(const std::string& variant, cudaStream_t stream) override {
    const bool ours = variant == "ours";
    if (ours) gemm::cublaslt_launch(with_c(c_ref_), stream);
    const Tolerance tol = product_tolerance(args_.k, args_.dtype);
    constexpr int kSamples = 8192;
    int64_t wrong = count_sampled_wrong(with_c(ours ? c_ours_ : c_ref_), kSamples, seed_ ^ 0x5A5A, tol, stream);
    if (ours) wrong += count_outside(c_ours_, args_.ldc, c_ref_, args_.ldc, args_.m, args_.n, tol, args_.dtype, stream);
    return wrong;
  }

  // algbw: the bytes a GEMM must move at least (A, B read once, C written once).
  Figures figures(const Case& c, double seconds) const override {
    const auto [m, n, k] = mnk(c);
    Figures f;
    f.tflops = 2.0 * m * n * k / seconds / 1e12;
    f.algbw_gbs = (m * k + n * k + m * n) * 2 / seconds / 1e9;
    return f;
  }

  Floor floor(const Case& c, const MachineRates& rates) const override {
    const auto [m, n, k] = mnk(c);
    // 989 dense 16-bit TFLOP/s (H100/H200 SXM); HBM at the measured copy rate (read + write).
    const double hbm_rate = rates.hbm_bytes_per_s > 0 ? rates.hbm_bytes_per_s : 4.0e12;
    const double compute = 2.0 * m * n * k / 989e12, hbm = (m * k + n * k + m * n) * 2 / hbm_rate;
    return compute >= hbm ? Floor{compute, "compute"} : Floor{hbm, "hbm"};
  }

  void teardown() override {
    for (void** p : {&a_, &b_, &c_ours_, &c_ref_}) {
      if (*p) cudaFree(*p);
      *p = nullptr;
    }
  }

  ~GemmBench() override { teardown(); }

 private:
  // The cases without a Team: the heuristic's config is taken for 132 SMs here and in setup() for
  // the device's count.
  std::vector<Case> cases_of(const Options& opt) const {
    const DType dtype = parse_dtype(opt.dtype, "gemm benchmarks");
    std::vector<Shape> shapes;
    std::vector<std::map<std::string, std::string>> filters;
    for (const std::string& e : opt.shapes) {
      auto kv = parse_entry(e);
      if (kv.count("M") && kv.count("N") && kv.count("K")) {
        for (BLayout l : {BLayout::nk, BLayout::kn})
          if (!kv.count("layout") || kv["layout"] == gemm::layout_name(l))
            shapes.push_back({shape_int(kv, "M", 0), shape_int(kv, "N", 0), shape_int(kv, "K", 0), l, tuning_of(kv)});
      } else {
        filters.push_back(std::move(kv));
      }
    }
    if (shapes.empty() || !filters.empty()) {
      for (BLayout l : {BLayout::nk, BLayout::kn})
        for (int64_t m : {1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384})
          for (int64_t n : {3584, 4096, 7168, 8192, 14336}) {
            Shape s{m, n, 8192, l, {}};
            const auto f = std::find_if(filters.begin(), filters.end(), [&](auto& kv) { return matches(s, kv); });
            if (!filters.empty() && f == filters.end()) continue;
            if (f != filters.end()) s.tuning = tuning_of(*f);
            shapes.push_back(s);
          }
    }
    std::vector<Case> out;
    for (const Shape& s : shapes) {
      const int64_t bytes = s.m * s.n * 2;
      if (!within_size_bounds(opt, bytes)) continue;
      Case c;
      std::ostringstream label;
      const gemm::GemmConfig cfg = with_overrides(
          gemm::choose_gemm_config(s.m, s.n, s.k, dtype, s.layout, 132, gemm::KCuts::split_or_cluster,
                                   s.tuning.swap_choice()), s.tuning);
      label << "M=" << s.m << " N=" << s.n << " K=" << s.k << " " << gemm::layout_name(s.layout);
      if (s.tuning.any()) label << " [" << cfg.name() << "]";
      c.label = label.str();
      c.size_bytes = bytes;
      c.count = s.m * s.n;
      c.type = gemm::dtype_name(dtype);
      c.params = {{"m", s.m},
                  {"n", s.n},
                  {"k", s.k},
                  {"layout", gemm::layout_name(s.layout)},
                  {"tile", s.tuning.tile},
                  {"swap", s.tuning.swap},
                  {"cluster", s.tuning.cluster},
                  {"clusterk", s.tuning.clusterk},
                  {"group", s.tuning.group},
                  {"splitk", s.tuning.splitk},
                  {"tailsplit", s.tuning.tailsplit},
                  {"streamk", s.tuning.streamk},
                  {"config", cfg.name()}};
      out.push_back(std::move(c));
    }
    return out;
  }

  static std::tuple<double, double, double> mnk(const Case& c) {
    return {double(c.params.at("m").get<int64_t>()), double(c.params.at("n").get<int64_t>()),
            double(c.params.at("k").get<int64_t>())};
  }
  // The heuristic's config (already with the entry's swap choice) with what a --shape entry forces.
  // A tile keeps the heuristic's cluster size when that tile has it compiled, else takes the
  // tile's first compiled one; a swap-AB tile (16x128, ...) brings swap-AB with it. K clusters only
  // when asked for (or the heuristic's, when nothing else is forced).
  static gemm::GemmConfig with_overrides(gemm::GemmConfig cfg, const Tuning& t) {
    const bool forced = !t.tile.empty() || t.cluster > 0 || t.splitk > 0 || t.tailsplit > 0 || t.streamk > 0;
    const int cluster_k = t.clusterk > 0 ? t.clusterk : forced ? 1 : cfg.cluster_k;
    if (!t.tile.empty() || t.cluster > 0 || cluster_k != cfg.cluster_k) {
      const std::string tile = t.tile.empty() ? std::to_string(cfg.bm) + "x" + std::to_string(cfg.bn) : t.tile;
      const int cluster = t.cluster > 0 ? t.cluster : cfg.cluster_m;
      const std::vector<gemm::GemmConfig> compiled = gemm::compiled_configs();
      const gemm::GemmConfig* pick = nullptr;
      for (const gemm::GemmConfig& c : compiled) {
        if (tile != std::to_string(c.bm) + "x" + std::to_string(c.bn)) continue;
        if ((t.swap >= 0 && c.swap_ab != (t.swap == 1)) || c.cluster_k != cluster_k) continue;
        if (c.cluster_m == cluster) pick = &c;
        else if (!pick && t.cluster == 0) pick = &c;
      }
      TF_REQUIRE(pick != nullptr, Status::InvalidArgument,
                 "gemm bench: tile " << tile << " with cluster=" << cluster << " clusterk=" << cluster_k
                                     << (t.swap == 1 ? " and swap=1" : t.swap == 0 ? " and swap=0" : "")
                                     << " is not compiled");
      cfg.bm = pick->bm, cfg.bn = pick->bn, cfg.stages = pick->stages, cfg.cluster_m = pick->cluster_m;
      cfg.swap_ab = pick->swap_ab, cfg.cluster_k = pick->cluster_k;
      if (cfg.cluster_k > 1) cfg.splits = 1, cfg.split_scope = gemm::SplitScope::all;  // K clusters cut K themselves
    }
    if (t.group > 0) cfg.group_m = t.group;
    if (t.splitk > 0) cfg.splits = t.splitk, cfg.split_scope = gemm::SplitScope::all;
    if (t.tailsplit > 0) cfg.splits = t.tailsplit, cfg.split_scope = gemm::SplitScope::tail;
    if (t.streamk > 0) cfg.splits = 1, cfg.split_scope = gemm::SplitScope::stream;
    return cfg;
  }
  gemm::GemmArgs with_c(void* c) const {
    gemm::GemmArgs g = args_;
    g.a = a_;
    g.b = b_;
    g.c = c;
    return g;
  }
  gemm::GemmArgs args_;
  gemm::GemmConfig config_;
  void *a_ = nullptr, *b_ = nullptr, *c_ours_ = nullptr, *c_ref_ = nullptr;
  uint64_t seed_ = 0;
};

}  // namespace

std::unique_ptr<OpBench> make_gemm_bench() { return std::make_unique<GemmBench>(); }

}  // namespace taxfree::bench
