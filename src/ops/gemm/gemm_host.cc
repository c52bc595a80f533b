// Host side of the GEMM op that needs no kernel: names, validation, tensor maps, device queries.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

#include "taxfree/kernels/gemm/policies.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/driver_api.h"
#include "taxfree/runtime/error.h"
#include "taxfree/runtime/stream_release.h"

namespace taxfree::gemm {

const char* layout_name(BLayout l) { return l == BLayout::nk ? "nk" : l == BLayout::kn ? "kn" : "unknown"; }

BLayout parse_layout(std::string_view name, std::string_view what) {
  if (name == "nk") return BLayout::nk;
  if (name == "kn") return BLayout::kn;
  TF_THROW(Status::InvalidArgument, what << ": B layout '" << name << "' must be nk or kn");
}

std::string GemmConfig::name() const {
  std::ostringstream os;
  os << bm << "x" << bn << "x" << bk << " s" << stages << " g" << group_m;
  if (cluster_m != 1) os << " c" << cluster_m;
  if (swap_ab) os << " swap";
  if (cluster_k != 1) os << " ck" << cluster_k;
  if (split_scope == SplitScope::stream) os << " stk";
  else if (splits != 1) os << " sk" << splits << (split_scope == SplitScope::tail ? "t" : "");
  if (max_ctas > 0) os << " ctas" << max_ctas;
  return os.str();
}

std::vector<GemmConfig> compiled_configs() {
  std::vector<GemmConfig> out;
  for (const CompiledTile& t : kCompiledTiles) {
    GemmConfig c;
    c.bm = t.bm;
    c.bn = t.bn;
    c.stages = t.stages;
    c.cluster_m = t.cluster;
    c.swap_ab = t.swap;
    c.cluster_k = t.cluster_k;
    out.push_back(c);
  }
  return out;
}

namespace {

constexpr int64_t kElemBytes = 2;
constexpr int64_t kMaxTmaStrideBytes = int64_t(1) << 40;

// `rows` rows of `ld` elements: the stride bounds come first, so that no product below overflows.
void check_operand(const char* name, const void* p, int64_t rows, const char* ld_name, int64_t ld, int64_t min_ld,
                   const char* min_name) {
  TF_REQUIRE(p != nullptr, Status::InvalidArgument, "GEMM operand " << name << " is null");
  TF_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, Status::InvalidArgument,
             "GEMM operand " << name << " at " << p << " must be 16-byte aligned (TMA)");
  TF_REQUIRE(ld >= min_ld, Status::InvalidArgument,
             "GEMM row stride " << ld_name << "=" << ld << " must be >= " << min_name << "=" << min_ld);
  TF_REQUIRE(ld < kMaxTmaStrideBytes / kElemBytes, Status::InvalidArgument,
             "GEMM row stride " << ld_name << "=" << ld << " elements exceeds the TMA limit of 2^40 bytes");
  TF_REQUIRE(ld * kElemBytes % 16 == 0, Status::InvalidArgument,
             "GEMM row stride " << ld_name << "=" << ld << " elements (" << ld * kElemBytes
                                  << " bytes) must be a multiple of 16 bytes (TMA)");
  TF_REQUIRE(ld <= detail::kMaxMatrixBytes / kElemBytes / rows, Status::InvalidArgument,
             "GEMM operand " << name << ": " << rows << " rows of " << ld_name << "=" << ld
                             << " elements span more than 2^56 bytes");
}

// For the error that names an unknown tile only: every launch validates, and building this list
// cost more host time than the rest of validation together.
std::string compiled_tile_names() {
  std::ostringstream known;
  for (const CompiledTile& t : kCompiledTiles)
    known << (known.tellp() > 0 ? ", " : "") << t.bm << "x" << t.bn << " s" << t.stages << " c" << t.cluster
          << (t.swap ? " swap" : "") << (t.cluster_k > 1 ? " ck" + std::to_string(t.cluster_k) : "");
  return known.str();
}

ByteRange span(const void* p, int64_t rows, int64_t cols, int64_t ld) {
  return matrix_range(p, rows, cols, ld, kElemBytes);
}

}  // namespace

void validate_inputs(const GemmArgs& a, const GemmConfig& cfg) {
  TF_REQUIRE(valid_dtype(a.dtype), Status::InvalidArgument,
             "GEMM dtype " << int(a.dtype) << " is not bf16 or fp16");
  TF_REQUIRE(a.b_layout == BLayout::nk || a.b_layout == BLayout::kn, Status::InvalidArgument,
             "GEMM B layout " << int(a.b_layout) << " is not nk or kn");
  TF_REQUIRE(a.m >= 1 && a.n >= 1 && a.k >= 1, Status::InvalidArgument,
             "GEMM sizes must be >= 1: M=" << a.m << " N=" << a.n << " K=" << a.k);
  TF_REQUIRE(a.m <= INT_MAX && a.n <= INT_MAX && a.k <= INT_MAX, Status::InvalidArgument,
             "GEMM sizes must be < 2^31 (TMA coordinates): M=" << a.m << " N=" << a.n << " K=" << a.k);
  check_operand("A", a.a, a.m, "lda", a.lda, a.k, "K");
  if (a.b_layout == BLayout::nk)
    check_operand("B", a.b, a.n, "ldb", a.ldb, a.k, "K");
  else
    check_operand("B", a.b, a.k, "ldb", a.ldb, a.n, "N");

  TF_REQUIRE(cfg.bm >= 1 && cfg.bn >= 1 && cfg.stages >= 1 && cfg.cluster_m >= 1 && cfg.cluster_k >= 1,
             Status::InvalidArgument, "GEMM config " << cfg.name() << ": bm, bn, stages, cluster_m and cluster_k must be >= 1");
  TF_REQUIRE(cfg.bk == 64, Status::NotSupported, "GEMM config bk=" << cfg.bk << ": only bk=64 is compiled");
  TF_REQUIRE(cfg.group_m >= 1, Status::InvalidArgument, "GEMM config group_m=" << cfg.group_m << " must be >= 1");
  TF_REQUIRE(cfg.max_ctas >= 0, Status::InvalidArgument, "GEMM config max_ctas=" << cfg.max_ctas << " must be >= 0");
  TF_REQUIRE(cfg.max_ctas == 0 || cfg.max_ctas >= cfg.cluster_m * cfg.cluster_k, Status::InvalidArgument,
             "GEMM config " << cfg.name() << ": max_ctas=" << cfg.max_ctas << " is fewer than one cluster of "
                            << cfg.cluster_m * cfg.cluster_k << " CTAs (cluster_m x cluster_k)");
  TF_REQUIRE(cfg.splits >= 1 && cfg.splits <= kMaxSplits, Status::InvalidArgument,
             "GEMM config splits=" << cfg.splits << " must be in [1, " << kMaxSplits << "]");
  TF_REQUIRE(cfg.split_scope == SplitScope::all || cfg.split_scope == SplitScope::tail ||
                 cfg.split_scope == SplitScope::stream,
             Status::InvalidArgument, "GEMM config split_scope " << int(cfg.split_scope) << " is not all, tail or stream");
  // Swap-AB kernels have no clusters: the operand a cluster would share (A, along N) is small.
  TF_REQUIRE(!cfg.swap_ab || cfg.cluster_m == 1, Status::NotSupported,
             "GEMM config " << cfg.name() << ": swap-AB runs without clusters (cluster_m=1)");
  const CompiledTile* tile = nullptr;
  for (const CompiledTile& t : kCompiledTiles)
    if (t.bm == cfg.bm && t.bn == cfg.bn && t.stages == cfg.stages && t.cluster == cfg.cluster_m &&
        t.swap == cfg.swap_ab && t.cluster_k == cfg.cluster_k)
      tile = &t;
  TF_REQUIRE(tile != nullptr, Status::NotSupported,
             "GEMM tile " << cfg.bm << "x" << cfg.bn << " s" << cfg.stages << " cluster_m=" << cfg.cluster_m
                          << (cfg.cluster_k != 1 ? " cluster_k=" + std::to_string(cfg.cluster_k) : "")
                          << (cfg.swap_ab ? " swap-AB" : "") << " is not compiled (have: " << compiled_tile_names()
                          << ")");
  // A K cluster already cuts K; each of its CTAs needs a k-block.
  TF_REQUIRE(cfg.cluster_k == 1 || !cfg.splits_k(), Status::NotSupported,
             "GEMM config " << cfg.name() << ": K clusters (cluster_k=" << cfg.cluster_k
                            << ") split K themselves; split-K on top is not supported (splits=1, scope all)");
  TF_REQUIRE((a.k + 63) / 64 >= cfg.cluster_k, Status::InvalidArgument,
             "GEMM config " << cfg.name() << ": K=" << a.k << " has " << (a.k + 63) / 64
                            << " k-blocks of 64, fewer than the cluster_k=" << cfg.cluster_k << " CTAs that split it");
  TF_REQUIRE(tile->kn || a.b_layout == BLayout::nk, Status::NotSupported,
             "GEMM tile " << cfg.bm << "x" << cfg.bn << " needs B as [N, K] (layout nk); B [K, N] needs bn % 64 == 0");
}

void validate(const GemmArgs& a, const GemmConfig& cfg) {
  validate_inputs(a, cfg);
  StoreTo::check({a.c, a.ldc}, a.m, a.n, int(kElemBytes));
  const auto c = span(a.c, a.m, a.n, a.ldc);
  TF_REQUIRE(!overlap(c, span(a.a, a.m, a.k, a.lda)), Status::InvalidArgument, "GEMM output C overlaps input A");
  const auto b = a.b_layout == BLayout::nk ? span(a.b, a.n, a.k, a.ldb) : span(a.b, a.k, a.n, a.ldb);
  TF_REQUIRE(!overlap(c, b), Status::InvalidArgument, "GEMM output C overlaps input B");
}

int device_sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_REQUIRE(dev >= 0 && dev < int(cache.size()), Status::NotSupported, "device ordinal " << dev << " >= 64");
  int n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    TF_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

namespace detail {

CUtensorMap make_tensor_map(const void* base, DType dtype, int64_t inner, int64_t outer, int64_t ld,
                            uint32_t box_inner, uint32_t box_outer) {
  using Encode = decltype(&cuTensorMapEncodeTiled);
  static const Encode encode = driver::get<Encode>("cuTensorMapEncodeTiled");
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(ld * kElemBytes)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  TF_CU(encode(&map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
               const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device)
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, dev})) return;
  TF_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.insert({kernel, dev});
}


int resident_clusters(const void* kernel, int threads, int smem_bytes, int cluster) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;  // (kernel, device) -> clusters
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find({kernel, dev});
  if (it != cache.end()) return it->second;
  int n = 0;
  if (cluster == 1) {
    int per_sm = 0;
    TF_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, size_t(smem_bytes)));
    n = per_sm * device_sm_count();
  } else {
    // Clusters are placed inside one GPC; the driver knows how many fit.
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(cluster));
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = size_t(smem_bytes);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = unsigned(cluster);
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    TF_CUDA(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  }
  TF_REQUIRE(n > 0, Status::NotSupported,
             "GEMM kernel does not fit on this device (" << threads << " threads, " << smem_bytes << " B shared memory, "
                                                         << cluster << "-CTA clusters)");
  cache[{kernel, dev}] = n;
  return n;
}

WorkPlan make_work_plan(const GemmArgs& a, const GemmConfig& cfg, int64_t clusters) {
  WorkPlan plan{};
  plan.grid = make_tile_grid(a.m, a.n, cfg.bm * cfg.cluster_m, cfg.bn, cfg.group_m);
  plan.k_blocks = int((a.k + 63) / 64);
  const int64_t tiles = plan.grid.tiles(), tail = tiles % std::max<int64_t>(clusters, 1);
  const int64_t splits = std::min<int64_t>(cfg.splits, plan.k_blocks);  // no K range without a k-block
  plan.dp_tiles = tiles;
  plan.sk_units = 0;
  if (cfg.split_scope == SplitScope::all && splits > 1) {
    plan.dp_tiles = 0, plan.sk_units = tiles * splits;
  } else if (cfg.split_scope == SplitScope::tail && splits > 1 && tail > 0) {
    plan.dp_tiles = tiles - tail, plan.sk_units = tail * splits;
  } else if (cfg.split_scope == SplitScope::stream && tail > 0) {
    // One range per cluster over the tail plus one full wave, so every range covers more than a
    // tile's worth of k-blocks (few parts per tile); under one wave, over all tiles.
    plan.dp_tiles = tiles < clusters ? 0 : tiles - tail - clusters;
    plan.dp_tiles = std::max<int64_t>(plan.dp_tiles, 0);
    plan.sk_units = std::min<int64_t>(clusters, plan.split_tiles() * plan.k_blocks);
  }
  if (plan.sk_units == 0) plan.dp_tiles = tiles;
  // The scheduler places ranges with products of the two (tile_scheduler.cuh: sk_begin).
  TF_REQUIRE(plan.sk_units == 0 || plan.sk_length() <= INT64_MAX / plan.sk_units, Status::InvalidArgument,
             "GEMM config " << cfg.name() << ": split-K of " << plan.split_tiles() << " tiles x " << plan.k_blocks
                            << " k-blocks into " << plan.sk_units << " ranges exceeds the scheduler's 64-bit arithmetic");
  plan.max_parts = 1;
  // Under SplitScope::all every tile starts at a multiple of the ranges' length (tile t at
  // t * splits ranges), so every tile is cut like the first: one slot says it, where walking them
  // all took seconds on grids of 2^30 tiles. The other scopes split fewer tiles than two waves.
  const int64_t slots = cfg.split_scope == SplitScope::all ? std::min<int64_t>(plan.split_tiles(), 1) : plan.split_tiles();
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t pos = slot * plan.k_blocks;
    const int64_t parts = plan.sk_range_of(pos + plan.k_blocks - 1) - plan.sk_range_of(pos) + 1;
    plan.max_parts = std::max<int>(plan.max_parts, int(parts));
  }
  return plan;
}

WorkspaceNeed workspace_need(const WorkPlan& plan, const GemmConfig& cfg) {
  WorkspaceNeed need;
  if (plan.split_tiles() == 0) return need;
  const size_t ctas = size_t(plan.split_tiles()) * size_t(cfg.cluster_m);
  need.partial_bytes = ctas * size_t(plan.max_parts) * size_t(cfg.bm) * size_t(cfg.bn) * sizeof(float);
  need.counters = ctas * size_t(cfg.consumers());
  return need;
}

namespace {
struct StreamBuffer {
  void* partials = nullptr;
  size_t partial_bytes = 0;
  uint32_t* counters = nullptr;
  size_t counters_len = 0;
};
struct StreamBuffers {
  std::mutex mu;
  std::map<std::pair<int, cudaStream_t>, StreamBuffer> by_stream;  // (device, stream)
};
StreamBuffers& stream_buffers() {
  static StreamBuffers b;
  return b;
}
int current_device() {
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  return dev;
}
}  // namespace

Workspace stream_workspace(cudaStream_t stream, const WorkspaceNeed& need) {
  const int dev = current_device();
  StreamBuffers& all = stream_buffers();
  std::lock_guard<std::mutex> lock(all.mu);
  // A stream the runtime owns (Team's) gives its workspace back before it is destroyed.
  static const bool hooked = (add_stream_release_hook(&release_stream_workspace), true);
  (void)hooked;
  StreamBuffer& b = all.by_stream[{dev, stream}];
  // Grown, never shrunk; rounded up so a sweep of shapes reallocates a few times at most.
  // Stream-ordered: the old buffer is freed after the kernels already queued on `stream` that use
  // it, and nothing waits for the device (a host wait here could deadlock behind a kernel that
  // waits for the host, e.g. the benchmark's gate).
  if (b.partial_bytes < need.partial_bytes) {
    if (b.partials) TF_CUDA(cudaFreeAsync(b.partials, stream));
    b.partials = nullptr, b.partial_bytes = 0;
    const size_t bytes = std::max(need.partial_bytes * 3 / 2, size_t(8) << 20);
    TF_CUDA(cudaMallocAsync(&b.partials, bytes, stream));
    b.partial_bytes = bytes;
  }
  if (b.counters_len < need.counters) {
    if (b.counters) TF_CUDA(cudaFreeAsync(b.counters, stream));
    b.counters = nullptr, b.counters_len = 0;
    const size_t len = std::max(need.counters * 3 / 2, size_t(16384));
    TF_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&b.counters), len * sizeof(uint32_t), stream));
    TF_CUDA(cudaMemsetAsync(b.counters, 0, len * sizeof(uint32_t), stream));
    b.counters_len = len;
  }
  return {b.partials, b.counters};
}

}  // namespace detail

void release_stream_workspace(cudaStream_t stream) {
  const int dev = detail::current_device();
  detail::StreamBuffers& all = detail::stream_buffers();
  std::lock_guard<std::mutex> lock(all.mu);
  const auto it = all.by_stream.find({dev, stream});
  if (it == all.by_stream.end()) return;
  const detail::StreamBuffer b = it->second;
  all.by_stream.erase(it);
  if (b.partials) TF_CUDA(cudaFreeAsync(b.partials, stream));
  if (b.counters) TF_CUDA(cudaFreeAsync(b.counters, stream));
}

}  // namespace taxfree::gemm
