#include "taxfree/ops/cublaslt_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "taxfree/ops/gemm_detail.h"
#include "taxfree/runtime/error.h"

#define TF_CUBLAS(expr)                                                                                  \
  do {                                                                                                   \
    const cublasStatus_t tf_s_ = (expr);                                                                 \
    TF_REQUIRE(tf_s_ == CUBLAS_STATUS_SUCCESS,                                                           \
               tf_s_ == CUBLAS_STATUS_NOT_SUPPORTED ? Status::NotSupported : Status::CudaError,          \
               #expr << " -> " << cublasLtGetStatusName(tf_s_) << " (" << cublasLtGetStatusString(tf_s_) << ")"); \
  } while (0)

namespace taxfree::gemm {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume about a pointer.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 16 && a % al != 0) al /= 2;
  return al;
}

// Row-major C = A * B is column-major C^T = B^T * A^T. In cuBLASLt's column-major terms:
//   its A = our B: [N, K] row-major is a K x N column-major matrix, used transposed (op T);
//                  [K, N] row-major is an N x K column-major matrix, used as is (op N);
//   its B = our A: [M, K] row-major is a K x M column-major matrix (op N);
//   its C = our C: [M, N] row-major is an N x M column-major matrix; (m, n, k) = (N, M, K).
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

using PlanKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, uint32_t, uint32_t, uint32_t>;

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const GemmArgs& g, OutType out, Clusters clusters) {
  auto p = std::make_unique<Plan>();
  const cudaDataType_t type = g.dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const bool nk = g.b_layout == BLayout::nk;
  TF_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = nk ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = CUBLAS_OP_N;
  TF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TF_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  TF_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, type, nk ? g.k : g.n, nk ? g.n : g.k, g.ldb));
  TF_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, type, g.k, g.m, g.lda));
  TF_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, out != OutType::same ? CUDA_R_32F : type, g.n, g.m, g.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  TF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)> guard(
      pref, &cublasLtMatmulPreferenceDestroy);
  const size_t ws = kWorkspaceBytes;
  const uint32_t al_a = alignment(g.b), al_b = alignment(g.a), al_c = alignment(g.c);
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  // Split-K partials are summed in fp32 (in place or in the compute type), never rounded to the
  // 16-bit output type between partial sums: on H200, bf16 M=500..1000 K=1001 shapes otherwise came
  // back 5 ulps off the fp64 reference (r6 in docs/PERFORMANCE.md).
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  TF_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                 sizeof(reduction)));
  constexpr int kCandidates = 32;
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int found = 0;
  TF_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->a, p->b, p->c, p->c, pref,
                                           clusters == Clusters::any ? 1 : kCandidates, results.data(), &found));
  auto shape_text = [&] {
    std::ostringstream o;
    o << "M=" << g.m << " N=" << g.n << " K=" << g.k << " " << dtype_name(g.dtype) << " B " << layout_name(g.b_layout)
      << (out != OutType::same ? " fp32 C" : "");
    return o.str();
  };
  TF_REQUIRE(found > 0, Status::NotSupported, "cuBLASLt has no algorithm for " << shape_text());
  if (clusters == Clusters::any) {
    p->algo = results[0].algo;
    return p;
  }
  for (int i = 0; i < found; ++i) {
    uint16_t shape = 0;
    size_t written = 0;
    TF_CUBLAS(cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &shape,
                                                   sizeof(shape), &written));
    if (cublaslt_small_cluster(shape)) {
      p->algo = results[i].algo;
      return p;
    }
  }
  cublasLtMatmulAlgo_t forced = results[0].algo;
  const uint16_t one = CUBLASLT_CLUSTER_SHAPE_1x1x1;
  TF_CUBLAS(cublasLtMatmulAlgoConfigSetAttribute(&forced, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &one, sizeof(one)));
  cublasLtMatmulHeuristicResult_t checked{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(handle, p->op, p->a, p->b, p->c, p->c, &forced, &checked);
  TF_REQUIRE(st == CUBLAS_STATUS_SUCCESS && checked.workspaceSize <= ws, Status::NotSupported,
             "cuBLASLt has no algorithm with clusters of at most 2 CTAs for " << shape_text() << " (" << found
                                                                               << " candidates)");
  p->algo = forced;
  return p;
}

// validate() for a C of fp32 elements: A and B as usual, C 16-byte aligned with 16-byte rows and
// apart from A and B.
void validate_fp32_c(const GemmArgs& g) {
  validate_inputs(g, GemmConfig{});
  TF_REQUIRE(g.c != nullptr && reinterpret_cast<uintptr_t>(g.c) % 16 == 0, Status::InvalidArgument,
             "cuBLASLt GEMM: fp32 C at " << g.c << " must be non-null and 16-byte aligned");
  TF_REQUIRE(g.ldc >= g.n && g.ldc % 4 == 0, Status::InvalidArgument,
             "cuBLASLt GEMM: fp32 C's ldc=" << g.ldc << " must be >= N=" << g.n << " and a multiple of 4");
  auto span = [](const void* p, int64_t rows, int64_t cols, int64_t ld, int64_t elem) {
    const auto b = reinterpret_cast<uintptr_t>(p);
    return std::pair<uintptr_t, uintptr_t>{b, b + uintptr_t(((rows - 1) * ld + cols) * elem)};
  };
  const auto c = span(g.c, g.m, g.n, g.ldc, 4);
  const auto a = span(g.a, g.m, g.k, g.lda, 2);
  const auto b = g.b_layout == BLayout::nk ? span(g.b, g.n, g.k, g.ldb, 2) : span(g.b, g.k, g.n, g.ldb, 2);
  for (const auto& x : {a, b})
    TF_REQUIRE(std::max(c.first, x.first) >= std::min(c.second, x.second), Status::InvalidArgument,
               "cuBLASLt GEMM: fp32 C overlaps an input");
}

// The cached plan for these arguments (made on first use), with the device's handle.
struct Prepared {
  const DeviceState& device;
  const Plan& plan;
};
Prepared prepare(const GemmArgs& args, OutType out, Clusters clusters) {
  if (out == OutType::same) validate(args, GemmConfig{});
  else validate_fp32_c(args);
  static std::array<DeviceState, 64> devices;
  int dev = 0;
  TF_CUDA(cudaGetDevice(&dev));
  TF_REQUIRE(dev >= 0 && dev < int(devices.size()), Status::NotSupported, "device ordinal " << dev << " >= 64");
  DeviceState& d = devices[dev];
  if (!d.handle) TF_CUBLAS(cublasLtCreate(&d.handle));
  // fp32 and fp32_accumulate share a plan (the same C type; beta is given at launch).
  const PlanKey key{args.m,         args.n,          args.k,
                    args.lda,       args.ldb,        args.ldc,
                    int(args.dtype), int(args.b_layout), int(out != OutType::same), int(clusters),
                    alignment(args.a), alignment(args.b), alignment(args.c)};
  auto it = d.plans.find(key);
  if (it == d.plans.end()) it = d.plans.emplace(key, make_plan(d.handle, args, out, clusters)).first;
  return {d, *it->second};
}

std::mutex& state_mutex() {
  static std::mutex mu;
  return mu;
}

// The stream's own workspace: cuBLASLt's on two streams at once must not share one.
void* workspace_of(cudaStream_t stream) { return detail::stream_workspace(stream, {kWorkspaceBytes, 0}).partials; }

}  // namespace

bool cublaslt_small_cluster(int id) {
  return id == CUBLASLT_CLUSTER_SHAPE_1x1x1 || id == CUBLASLT_CLUSTER_SHAPE_2x1x1 || id == CUBLASLT_CLUSTER_SHAPE_1x2x1;
}

void cublaslt_prepare(const GemmArgs& args, cudaStream_t stream, OutType out, Clusters clusters) {
  std::lock_guard<std::mutex> lock(state_mutex());
  prepare(args, out, clusters);
  workspace_of(stream);
}

void cublaslt_launch(const GemmArgs& args, cudaStream_t stream, OutType out, Clusters clusters) {
  std::lock_guard<std::mutex> lock(state_mutex());
  const Prepared p = prepare(args, out, clusters);
  void* const ws = workspace_of(stream);
  const float alpha = 1.0f, beta = out == OutType::fp32_accumulate ? 1.0f : 0.0f;
  TF_CUBLAS(cublasLtMatmul(p.device.handle, p.plan.op, &alpha, args.b, p.plan.a, args.a, p.plan.b, &beta, args.c,
                           p.plan.c, args.c, p.plan.c, &p.plan.algo, ws, kWorkspaceBytes, stream));
}

}  // namespace taxfree::gemm
