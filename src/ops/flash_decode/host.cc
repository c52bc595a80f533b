// flash_decode host side: validation, split heuristic, workspace, partition, dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "kernels.h"
#include "taxfree/kernels/attention/config.h"
#include "taxfree/kernels/attention/params.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/byte_range.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

constexpr size_t kWsAlign = 256;
// Token positions are int32 and tile ends are rounded up to 16: stay well inside int32.
constexpr int64_t kMaxCapacity = int64_t(1) << 30;
constexpr int kMinSplitTokens = 256;  // heuristic: at least 16 tiles (4 per warp) per split
// Heuristic past one CTA per SM: the fewest splits whose waves are this full (of kMaxSplitWaves),
// each split at least kMinWaveSplitTokens long: there every CTA's fixed cost (first bytes, its
// partial, the merge) comes once per wave (r200, b=16 96/12: 4 splits 1.27x one split's time at
// 1024 tokens, 1.07x at 2048, equal at 4096, 0.95x at 8192).
constexpr double kMinWaveFill = 0.9;
constexpr int kMinWaveSplitTokens = 1024;
// Lengths of a batch are ragged when the longest is more than this times the mean (choose_splits
// with lengths).
constexpr double kRaggedRatio = 1.2;

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }
int log2_of(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}
size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
bool paged(KvLayout l) { return l == KvLayout::paged_hnd || l == KvLayout::paged_nhd; }

// Capacity in tokens per sequence, per layout (validated before use).
int64_t capacity_of(const DecodeArgs& a) {
  return paged(a.layout) ? int64_t(a.max_pages_per_seq) * a.page_size : a.capacity;
}

using NamedRange = std::pair<const char*, ByteRange>;

// No output overlaps an input or another output (the kernels read inputs while writing outputs, and
// write the outputs from different CTAs without ordering between them).
void require_apart(std::span<const NamedRange> inputs, std::span<const NamedRange> outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [name, range] = outputs[i];
    for (const auto& [in_name, in_range] : inputs)
      TF_REQUIRE(!overlap(range, in_range), Status::InvalidArgument,
                 "output " << name << " overlaps input " << in_name);
    for (size_t j = i + 1; j < outputs.size(); ++j)
      TF_REQUIRE(!overlap(range, outputs[j].second), Status::InvalidArgument,
                 "output " << name << " overlaps output " << outputs[j].first);
  }
}

void require_outputs_apart(const DecodeArgs& a) {
  const int64_t rows = int64_t(a.batch) * a.q_heads;
  const NamedRange outputs[] = {{"o_part", byte_range(a.o_part, rows * a.head_dim * 4)},
                                {"lse_part", byte_range(a.lse_part, rows * 4)},
                                {"out", byte_range(a.out, rows * a.head_dim * 2)}};
  require_apart(detail::decode_input_ranges(a), outputs);
}

}  // namespace

void validate_decode_args(const DecodeArgs& a) {
  using S = Status;
  TF_REQUIRE(a.batch >= 1 && a.batch <= 65535, S::InvalidArgument,
             "batch=" << a.batch << " must be in [1, 65535]");
  TF_REQUIRE(a.head_dim == 64 || a.head_dim == 128, S::InvalidArgument,
             "head_dim=" << a.head_dim << " must be 64 or 128");
  TF_REQUIRE(a.kv_heads >= 1 && a.kv_heads <= 65535, S::InvalidArgument,
             "kv_heads=" << a.kv_heads << " must be in [1, 65535]");
  TF_REQUIRE(a.q_heads >= 1, S::InvalidArgument, "q_heads=" << a.q_heads << " must be >= 1");
  TF_REQUIRE(a.q_heads % a.kv_heads == 0, S::InvalidArgument,
             "q_heads=" << a.q_heads << " must be a multiple of kv_heads=" << a.kv_heads);
  TF_REQUIRE(a.q_heads / a.kv_heads <= kMaxGqaRatio, S::InvalidArgument,
             "GQA ratio q_heads/kv_heads=" << a.q_heads / a.kv_heads << " must be <= " << kMaxGqaRatio);
  TF_REQUIRE(valid_dtype(a.dtype), S::InvalidArgument,
             "dtype=" << int(a.dtype) << " must be bf16 or fp16");
  TF_REQUIRE(std::isfinite(a.softmax_scale) && a.softmax_scale >= 0.f, S::InvalidArgument,
             "softmax_scale=" << a.softmax_scale << " must be finite and > 0 (0 = 1/sqrt(head_dim))");

  TF_REQUIRE(a.q != nullptr, S::InvalidArgument, "q is null");
  TF_REQUIRE(a.k != nullptr, S::InvalidArgument, "k is null");
  TF_REQUIRE(a.v != nullptr, S::InvalidArgument, "v is null");
  TF_REQUIRE(a.slice_len != nullptr, S::InvalidArgument, "slice_len is null");
  TF_REQUIRE(aligned(a.q, 16), S::InvalidArgument, "q=" << a.q << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.k, 16), S::InvalidArgument, "k=" << a.k << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.v, 16), S::InvalidArgument, "v=" << a.v << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.slice_len, 4), S::InvalidArgument,
             "slice_len=" << a.slice_len << " must be 4-byte aligned");
  TF_REQUIRE(aligned(a.slice_start, 4), S::InvalidArgument,
             "slice_start=" << a.slice_start << " must be 4-byte aligned");

  TF_REQUIRE(a.o_part != nullptr || a.lse_part != nullptr || a.out != nullptr, S::InvalidArgument,
             "no output: o_part, lse_part and out are all null");
  TF_REQUIRE(aligned(a.o_part, 16), S::InvalidArgument,
             "o_part=" << a.o_part << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.lse_part, 4), S::InvalidArgument,
             "lse_part=" << a.lse_part << " must be 4-byte aligned");
  TF_REQUIRE(aligned(a.out, 16), S::InvalidArgument, "out=" << a.out << " must be 16-byte aligned");

  TF_REQUIRE(a.max_len >= 0, S::InvalidArgument, "max_len=" << a.max_len << " must be >= 0");
  if (paged(a.layout)) {
    TF_REQUIRE(is_pow2(a.page_size) && a.page_size >= kMinPageSize && a.page_size <= kMaxPageSize,
               S::InvalidArgument,
               "page_size=" << a.page_size << " must be a power of two in [" << kMinPageSize << ", "
                            << kMaxPageSize << "]");
    TF_REQUIRE(a.num_pages >= 1, S::InvalidArgument, "num_pages=" << a.num_pages << " must be >= 1");
    TF_REQUIRE(a.max_pages_per_seq >= 1, S::InvalidArgument,
               "max_pages_per_seq=" << a.max_pages_per_seq << " must be >= 1");
    TF_REQUIRE(a.block_table != nullptr, S::InvalidArgument, "block_table is null (paged layout)");
    TF_REQUIRE(aligned(a.block_table, 4), S::InvalidArgument,
               "block_table=" << a.block_table << " must be 4-byte aligned");
    TF_REQUIRE(capacity_of(a) <= kMaxCapacity, S::InvalidArgument,
               "max_pages_per_seq*page_size=" << capacity_of(a) << " must be <= " << kMaxCapacity);
  } else {
    TF_REQUIRE(a.layout == KvLayout::contiguous, S::InvalidArgument,
               "layout=" << int(a.layout) << " is not a KvLayout");
    TF_REQUIRE(a.capacity >= 0 && a.capacity <= kMaxCapacity, S::InvalidArgument,
               "capacity=" << a.capacity << " must be in [0, " << kMaxCapacity << "]");
  }
  const int64_t cap = capacity_of(a);
  TF_REQUIRE(a.max_len <= cap, S::InvalidArgument,
             "max_len=" << a.max_len << " exceeds the cache capacity of " << cap << " tokens");

  // Host mirrors of the device arrays.
  const auto& hl = a.host_slice_len;
  const auto& hs = a.host_slice_start;
  if (!hl.empty()) {
    TF_REQUIRE(int64_t(hl.size()) == a.batch, S::InvalidArgument,
               "host_slice_len has " << hl.size() << " entries, batch=" << a.batch);
    for (int b = 0; b < a.batch; ++b) {
      TF_REQUIRE(hl[b] >= 0, S::InvalidArgument, "slice_len[" << b << "]=" << hl[b] << " must be >= 0");
      TF_REQUIRE(hl[b] <= a.max_len, S::InvalidArgument,
                 "slice_len[" << b << "]=" << hl[b] << " exceeds max_len=" << a.max_len);
    }
  }
  if (!hs.empty()) {
    TF_REQUIRE(a.slice_start != nullptr, S::InvalidArgument,
               "host_slice_start is given but the device slice_start is null");
    TF_REQUIRE(int64_t(hs.size()) == a.batch, S::InvalidArgument,
               "host_slice_start has " << hs.size() << " entries, batch=" << a.batch);
    for (int b = 0; b < a.batch; ++b) {
      TF_REQUIRE(hs[b] >= 0, S::InvalidArgument,
                 "slice_start[" << b << "]=" << hs[b] << " must be >= 0");
      const int64_t end = int64_t(hs[b]) + (hl.empty() ? 0 : hl[b]);
      TF_REQUIRE(end <= cap, S::InvalidArgument,
                 "slice [" << hs[b] << ", " << end << ") of sequence " << b
                           << " ends beyond the cache capacity of " << cap << " tokens");
    }
  }
  require_outputs_apart(a);
  if (paged(a.layout) && !a.host_block_table.empty()) {
    const auto& bt = a.host_block_table;
    TF_REQUIRE(int64_t(bt.size()) == int64_t(a.batch) * a.max_pages_per_seq, S::InvalidArgument,
               "host_block_table has " << bt.size() << " entries, batch*max_pages_per_seq="
                                       << int64_t(a.batch) * a.max_pages_per_seq);
    // Only the pages that the slices touch must be valid (others may hold -1 and the like); which
    // those are is known from the lengths and, where the device has starts, their host copy.
    if (!hl.empty() && (a.slice_start == nullptr || !hs.empty())) {
      for (int b = 0; b < a.batch; ++b) {
        if (hl[b] == 0) continue;
        const int64_t s = hs.empty() ? 0 : hs[b];
        for (int64_t pg = s / a.page_size; pg <= (s + hl[b] - 1) / a.page_size; ++pg) {
          const int32_t e = bt[size_t(b) * a.max_pages_per_seq + pg];
          TF_REQUIRE(e >= 0 && e < a.num_pages, S::InvalidArgument,
                     "block_table[" << b << "][" << pg << "]=" << e << " must be in [0, num_pages="
                                    << a.num_pages << ")");
        }
      }
    }
  }
}

int choose_splits(int batch, int kv_heads, int max_len, int num_sms, int waves) {
  TF_REQUIRE(batch >= 1 && kv_heads >= 1 && num_sms >= 1 && waves >= 1, Status::InvalidArgument,
             "choose_splits(batch=" << batch << ", kv_heads=" << kv_heads << ", num_sms=" << num_sms
                                    << ", waves=" << waves << "): all must be >= 1");
  if (max_len <= 0) return 1;
  const int64_t groups = int64_t(batch) * kv_heads;
  const int64_t by_len = std::min<int64_t>((int64_t(max_len) + kMinSplitTokens - 1) / kMinSplitTokens, kMaxSplits);
  if (groups <= int64_t(num_sms) * waves)  // about one CTA per SM (flash_decode.h)
    return int(std::max<int64_t>(std::min<int64_t>(int64_t(num_sms) * waves / groups, by_len), 1));
  // More groups than SMs: CTAs fill waves of kCtasPerSm x num_sms slots, and a partly filled last
  // wave leaves SMs with one CTA beside SMs with two (measured: 192 CTAs 6-7% slower than 768).
  const int64_t slots = int64_t(attention::kCtasPerSm) * num_sms;
  const int64_t by_wave_len = std::min<int64_t>(max_len / kMinWaveSplitTokens, kMaxSplits);
  const auto fill = [&](int64_t s) {
    const int64_t ctas = groups * s;
    return double(ctas) / double((ctas + slots - 1) / slots * slots);
  };
  int64_t best = 1;
  for (int64_t s = 1; s <= by_wave_len && groups * s <= kMaxSplitWaves * slots; ++s) {
    if (fill(s) >= kMinWaveFill) return int(s);
    if (fill(s) > fill(best)) best = s;
  }
  return int(best);
}

int choose_splits(int kv_heads, std::span<const int32_t> lens, int num_sms, int waves) {
  TF_REQUIRE(!lens.empty(), Status::InvalidArgument, "choose_splits: no sequence lengths");
  int64_t total = 0;
  int32_t max_len = 0;
  for (int32_t n : lens) total += std::max<int32_t>(n, 0), max_len = std::max(max_len, n);
  const int batch = int(lens.size());
  const int base = choose_splits(batch, kv_heads, max_len, num_sms, waves);
  // Uniform enough: the CTAs of one split count are about equally long.
  if (double(max_len) * batch <= kRaggedRatio * double(total)) return base;
  // Ragged: CTAs as long as their sequences' splits, so enough of them that the short ones
  // backfill slots while the longest run (kMaxSplitWaves waves), each split >= kMinWaveSplitTokens.
  const int64_t groups = int64_t(batch) * kv_heads;
  const int64_t by_waves = int64_t(kMaxSplitWaves) * attention::kCtasPerSm * num_sms / groups;
  const int64_t by_len = std::min<int64_t>(max_len / kMinWaveSplitTokens, kMaxSplits);
  return int(std::max<int64_t>(base, std::min(by_waves, by_len)));
}

std::vector<int> longest_first(std::span<const int32_t> lens) {
  if (lens.size() > size_t(attention::kMaxOrderedBatch) || std::is_sorted(lens.begin(), lens.end(), std::greater<>()))
    return {};
  std::vector<int> order(lens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return lens[size_t(x)] > lens[size_t(y)]; });
  return order;
}

size_t decode_workspace_bytes(int batch, int q_heads, int kv_heads, int head_dim, int num_splits) {
  TF_REQUIRE(batch >= 0 && q_heads >= 0 && kv_heads >= 0 && head_dim >= 0 && num_splits >= 0,
             Status::InvalidArgument, "decode_workspace_bytes: negative size");
  if (num_splits <= 1) return 0;
  const size_t parts = size_t(batch) * q_heads * num_splits;  // [batch][kv_heads][splits][group]
  return round_up(size_t(batch) * kv_heads * sizeof(int), kWsAlign) +
         round_up(parts * sizeof(float), kWsAlign) + round_up(parts * head_dim * sizeof(float), kWsAlign);
}

void init_decode_workspace(void* workspace, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  TF_REQUIRE(workspace != nullptr, Status::InvalidArgument, "workspace is null, bytes=" << bytes);
  TF_CUDA(cudaMemsetAsync(workspace, 0, bytes, stream));
}

DecodePlan plan_decode(const DecodeArgs& a, const DecodeConfig& cfg) {
  validate_decode_args(a);
  return detail::plan_validated(a, cfg);
}

void launch_decode_partial(const DecodeArgs& a, const DecodePlan& plan, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream) {
  validate_decode_args(a);
  detail::launch_validated(a, plan, workspace, workspace_bytes, stream);
}

namespace detail {
std::array<std::pair<const char*, ByteRange>, 6> decode_input_ranges(const DecodeArgs& a) {
  const int64_t e = 2;  // bytes of bf16 / fp16
  const int64_t rows = int64_t(a.batch) * a.q_heads;
  const int64_t kv = paged(a.layout) ? int64_t(a.num_pages) * a.kv_heads * a.page_size * a.head_dim
                                     : int64_t(a.batch) * a.kv_heads * a.capacity * a.head_dim;
  return {{{"q", byte_range(a.q, rows * a.head_dim * e)},
           {"k", byte_range(a.k, kv * e)},
           {"v", byte_range(a.v, kv * e)},
           {"slice_len", byte_range(a.slice_len, int64_t(a.batch) * 4)},
           {"slice_start", byte_range(a.slice_start, int64_t(a.batch) * 4)},
           {"block_table", paged(a.layout) ? byte_range(a.block_table, int64_t(a.batch) * a.max_pages_per_seq * 4)
                                           : ByteRange{}}}};
}

DecodePlan plan_validated(const DecodeArgs& a, const DecodeConfig& cfg) {
  TF_REQUIRE(cfg.num_splits >= 0 && cfg.num_splits <= kMaxSplits, Status::InvalidArgument,
             "num_splits=" << cfg.num_splits << " must be 0 (auto) or in [1, " << kMaxSplits << "]");
  TF_REQUIRE(cfg.num_sms >= 0, Status::InvalidArgument, "num_sms=" << cfg.num_sms << " must be >= 0");
  TF_REQUIRE(cfg.waves >= 1 && cfg.waves <= 64, Status::InvalidArgument,
             "waves=" << cfg.waves << " must be in [1, 64]");
  int splits = cfg.num_splits;
  if (splits == 0) {
    int sms = cfg.num_sms;
    if (sms == 0) {
      int dev = 0;
      TF_CUDA(cudaGetDevice(&dev));
      TF_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    splits = a.host_slice_len.empty() ? choose_splits(a.batch, a.kv_heads, a.max_len, sms, cfg.waves)
                                      : choose_splits(a.kv_heads, a.host_slice_len, sms, cfg.waves);
  }
  return {splits, decode_workspace_bytes(a.batch, a.q_heads, a.kv_heads, a.head_dim, splits)};
}

void launch_validated(const DecodeArgs& a, const DecodePlan& plan, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  TF_REQUIRE(plan.num_splits >= 1 && plan.num_splits <= kMaxSplits, Status::InvalidArgument,
             "plan.num_splits=" << plan.num_splits << " must be in [1, " << kMaxSplits << "]");
  const size_t need = decode_workspace_bytes(a.batch, a.q_heads, a.kv_heads, a.head_dim, plan.num_splits);
  if (need > 0) {
    TF_REQUIRE(workspace != nullptr, Status::InvalidArgument,
               "workspace is null; num_splits=" << plan.num_splits << " needs " << need << " bytes");
    TF_REQUIRE(aligned(workspace, kWsAlign), Status::InvalidArgument,
               "workspace=" << workspace << " must be " << kWsAlign << "-byte aligned");
    TF_REQUIRE(workspace_bytes >= need, Status::InvalidArgument,
               "workspace_bytes=" << workspace_bytes << " is below the " << need
                                  << " bytes num_splits=" << plan.num_splits << " needs");
  }

  const attention::DecodeParams p = detail::make_decode_params(a, plan.num_splits, workspace, true);
  const dim3 grid(unsigned(plan.num_splits), unsigned(a.kv_heads), unsigned(a.batch));
  detail::dispatch(a.dtype, a.head_dim, [&]<class T, int D>() {
    detail::launch_decode_t<T, D>(paged(a.layout), p, grid, stream);
  });
}

attention::DecodeParams make_decode_params(const DecodeArgs& a, int num_splits, void* workspace, bool ordered) {
  attention::DecodeParams p{};
  attention::KvView& kv = p.kv;
  const int64_t d = a.head_dim;
  kv.k = a.k;
  kv.v = a.v;
  switch (a.layout) {
    case KvLayout::contiguous:
      kv.stride_token = d;
      kv.stride_head = int64_t(a.capacity) * d;
      kv.stride_page = int64_t(a.kv_heads) * a.capacity * d;
      break;
    case KvLayout::paged_hnd:
      kv.stride_token = d;
      kv.stride_head = int64_t(a.page_size) * d;
      kv.stride_page = int64_t(a.kv_heads) * a.page_size * d;
      break;
    case KvLayout::paged_nhd:
      kv.stride_token = int64_t(a.kv_heads) * d;
      kv.stride_head = d;
      kv.stride_page = int64_t(a.page_size) * a.kv_heads * d;
      break;
  }
  const bool is_paged = paged(a.layout);
  kv.block_table = is_paged ? a.block_table : nullptr;
  kv.max_pages = is_paged ? a.max_pages_per_seq : 0;
  kv.num_pages = is_paged ? a.num_pages : 0;
  kv.page_shift = is_paged ? log2_of(a.page_size) : 0;
  kv.capacity = int32_t(capacity_of(a));
  kv.slice_start = a.slice_start;
  kv.slice_len = a.slice_len;

  p.q = a.q;
  p.batch = a.batch;
  p.q_heads = a.q_heads;
  p.kv_heads = a.kv_heads;
  p.group = a.q_heads / a.kv_heads;
  p.num_splits = num_splits;
  const std::vector<int> order = ordered ? longest_first(a.host_slice_len) : std::vector<int>{};
  p.batch_ordered = order.empty() ? 0 : 1;
  for (size_t z = 0; z < order.size(); ++z) p.batch_order[z] = uint8_t(order[z]);
  const float scale = a.softmax_scale > 0.f ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
  p.scale_log2 = scale * 1.44269504088896340736f;
  if (num_splits > 1) {  // sections as decode_workspace_bytes sizes them
    const size_t parts = size_t(a.batch) * a.q_heads * num_splits;
    auto* base = static_cast<unsigned char*>(workspace);
    p.ws_count = reinterpret_cast<int*>(base);
    base += round_up(size_t(a.batch) * a.kv_heads * sizeof(int), kWsAlign);
    p.ws_lse = reinterpret_cast<float*>(base);
    base += round_up(parts * sizeof(float), kWsAlign);
    p.ws_o = reinterpret_cast<float*>(base);
  }
  p.o_part = a.o_part;
  p.lse_part = a.lse_part;
  p.out = a.out;
  return p;
}
}  // namespace detail

void validate_combine_args(const CombineArgs& a) {
  using S = Status;
  TF_REQUIRE(a.world >= 1 && a.world <= kMaxWorld, S::InvalidArgument,
             "world=" << a.world << " must be in [1, " << kMaxWorld << "]");
  TF_REQUIRE(a.batch >= 1, S::InvalidArgument, "batch=" << a.batch << " must be >= 1");
  TF_REQUIRE(a.q_heads >= 1, S::InvalidArgument, "q_heads=" << a.q_heads << " must be >= 1");
  TF_REQUIRE(a.head_dim == 64 || a.head_dim == 128, S::InvalidArgument,
             "head_dim=" << a.head_dim << " must be 64 or 128");
  TF_REQUIRE(valid_dtype(a.dtype), S::InvalidArgument,
             "dtype=" << int(a.dtype) << " must be bf16 or fp16");
  TF_REQUIRE(a.o_parts != nullptr, S::InvalidArgument, "o_parts is null");
  TF_REQUIRE(a.lse_parts != nullptr, S::InvalidArgument, "lse_parts is null");
  TF_REQUIRE(aligned(a.o_parts, 16), S::InvalidArgument,
             "o_parts=" << a.o_parts << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.lse_parts, 4), S::InvalidArgument,
             "lse_parts=" << a.lse_parts << " must be 4-byte aligned");
  const int64_t rows = int64_t(a.batch) * a.q_heads;
  TF_REQUIRE((rows + attention::kCombineRows - 1) / attention::kCombineRows < (int64_t(1) << 31),
             S::InvalidArgument, "batch*q_heads=" << rows << " is too large for one combine launch");
  const int64_t orow = rows * a.head_dim;  // < 2^40 by the check above
  // Every rank's partials must lie in 64-bit byte offsets (the overlap checks below compute them).
  const int64_t ranks_after_first = std::max(a.world - 1, 1);
  TF_REQUIRE(a.o_rank_stride <= (INT64_MAX / 4 - orow) / ranks_after_first &&
                 a.lse_rank_stride <= (INT64_MAX / 4 - rows) / ranks_after_first,
             S::InvalidArgument,
             "o_rank_stride=" << a.o_rank_stride << " or lse_rank_stride=" << a.lse_rank_stride << " puts world="
                              << a.world << " partials past 64-bit byte offsets");
  TF_REQUIRE(a.o_rank_stride == 0 || (a.o_rank_stride % 4 == 0 && (a.world == 1 || a.o_rank_stride >= orow)),
             S::InvalidArgument,
             "o_rank_stride=" << a.o_rank_stride << " must be 0 (dense) or a multiple of 4 that is >= "
                              << "batch*q_heads*head_dim=" << orow);
  TF_REQUIRE(a.lse_rank_stride == 0 || (a.lse_rank_stride > 0 && (a.world == 1 || a.lse_rank_stride >= rows)),
             S::InvalidArgument,
             "lse_rank_stride=" << a.lse_rank_stride << " must be 0 (dense) or >= batch*q_heads=" << rows);
  TF_REQUIRE(a.out != nullptr || a.o_out != nullptr || a.lse_out != nullptr, S::InvalidArgument,
             "no output: out, o_out and lse_out are all null");
  TF_REQUIRE(aligned(a.out, 16), S::InvalidArgument, "out=" << a.out << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.o_out, 16), S::InvalidArgument, "o_out=" << a.o_out << " must be 16-byte aligned");
  TF_REQUIRE(aligned(a.lse_out, 4), S::InvalidArgument,
             "lse_out=" << a.lse_out << " must be 4-byte aligned");
  // Every rank's partials, from the first to the end of the last rank's (strides as the kernel reads).
  const int64_t o_stride = a.o_rank_stride ? a.o_rank_stride : orow, l_stride = a.lse_rank_stride ? a.lse_rank_stride : rows;
  const NamedRange inputs[] = {{"o_parts", byte_range(a.o_parts, ((a.world - 1) * o_stride + orow) * 4)},
                               {"lse_parts", byte_range(a.lse_parts, ((a.world - 1) * l_stride + rows) * 4)}};
  const NamedRange outputs[] = {{"out", byte_range(a.out, orow * 2)},
                                {"o_out", byte_range(a.o_out, orow * 4)},
                                {"lse_out", byte_range(a.lse_out, rows * 4)}};
  require_apart(inputs, outputs);
}

void launch_combine(const CombineArgs& a, cudaStream_t stream) {
  validate_combine_args(a);
  attention::CombineParams p{};
  const int64_t rows = int64_t(a.batch) * a.q_heads;
  p.o_parts = a.o_parts;
  p.o_rank_stride = a.o_rank_stride ? a.o_rank_stride : rows * a.head_dim;
  p.lse_parts = a.lse_parts;
  p.lse_rank_stride = a.lse_rank_stride ? a.lse_rank_stride : rows;
  p.world = a.world;
  p.rows = rows;
  p.out = a.out;
  p.o_out = a.o_out;
  p.lse_out = a.lse_out;
  detail::dispatch(a.dtype, a.head_dim, [&]<class T, int D>() { detail::launch_combine_t<T, D>(p, stream); });
}

Slice partition_slice(int64_t len, int world, int rank, int align) {
  TF_REQUIRE(world >= 1, Status::InvalidArgument, "world=" << world << " must be >= 1");
  TF_REQUIRE(rank >= 0 && rank < world, Status::InvalidArgument,
             "rank=" << rank << " must be in [0, world=" << world << ")");
  TF_REQUIRE(len >= 0 && len <= INT32_MAX, Status::InvalidArgument,
             "len=" << len << " must be in [0, 2^31)");
  TF_REQUIRE(align >= 1, Status::InvalidArgument, "align=" << align << " must be >= 1");
  const int64_t units = (len + align - 1) / align;
  const int64_t base = units / world, rem = units % world;
  const int64_t u0 = rank * base + std::min<int64_t>(rank, rem);
  const int64_t u1 = u0 + base + (rank < rem ? 1 : 0);
  return {int32_t(std::min(u0 * align, len)), int32_t(std::min(u1 * align, len))};
}

std::vector<std::vector<Slice>> partition(std::span<const int32_t> lens, int world, int align) {
  TF_REQUIRE(world >= 1, Status::InvalidArgument, "world=" << world << " must be >= 1");
  std::vector<std::vector<Slice>> out(size_t(world), std::vector<Slice>(lens.size()));
  for (size_t b = 0; b < lens.size(); ++b) {
    TF_REQUIRE(lens[b] >= 0, Status::InvalidArgument, "lens[" << b << "]=" << lens[b] << " must be >= 0");
    for (int r = 0; r < world; ++r) out[size_t(r)][b] = partition_slice(lens[b], world, r, align);
  }
  return out;
}

}  // namespace taxfree::flash_decode
