// flash_decode across ranks, host logic without a GPU: variant names, the gather-buffer layout,
// buffer sizes, and the checks FlashDecode makes before it allocates or launches anything.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "taxfree/kernels/attention/config.h"
#include "taxfree/ops/flash_decode.h"
#include "taxfree/runtime/error.h"

namespace taxfree::flash_decode {
namespace {

constexpr uint64_t kAlign = 256;  // bytes: gather blocks, workspace sections
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// The largest split workspace any launch within cfg's maxima can need (plan_decode's sizes).
uint64_t max_workspace_bytes(const FlashDecodeConfig& c, int num_sms) {
  if (c.num_splits == 1) return 0;
  if (c.num_splits > 1)  // sizes only grow with each argument
    return decode_workspace_bytes(c.max_batch, c.max_q_heads, c.max_kv_heads, c.max_head_dim, c.num_splits);
  // Heuristic: more than one split only while splits x batch x kv_heads <= kMaxSplitWaves x
  // kCtasPerSm x num_sms (choose_splits), so a plan holds at most that many groups' partials.
  const int64_t group = std::min(kMaxGqaRatio, c.max_q_heads);
  const int64_t ctas = int64_t(kMaxSplitWaves) * attention::kCtasPerSm * num_sms;
  const int64_t parts = std::min(ctas * group, int64_t(c.max_batch) * c.max_q_heads * kMaxSplits);
  return round_up(uint64_t(c.max_batch) * c.max_kv_heads * sizeof(int), kAlign) +
         round_up(uint64_t(parts) * sizeof(float), kAlign) +
         round_up(uint64_t(parts) * c.max_head_dim * sizeof(float), kAlign);
}

}  // namespace

FlashDecodeVariant parse_flash_decode_variant(const std::string& name) {
  if (name == "bsp") return FlashDecodeVariant::bsp;
  if (name == "fused") return FlashDecodeVariant::fused;
  TF_THROW(Status::InvalidArgument, "unknown flash_decode variant '" << name << "' (known: bsp, fused)");
}

const char* variant_name(FlashDecodeVariant v) {
  return v == FlashDecodeVariant::bsp ? "bsp" : v == FlashDecodeVariant::fused ? "fused" : "?";
}

GatherLayout gather_layout(int batch, int q_heads, int head_dim) {
  TF_REQUIRE(batch >= 0 && q_heads >= 0 && head_dim >= 0, Status::InvalidArgument,
             "gather_layout(batch=" << batch << ", q_heads=" << q_heads << ", head_dim=" << head_dim
                                    << "): sizes must be >= 0");
  GatherLayout l;
  l.rows = int64_t(batch) * q_heads;
  l.lse_offset = l.rows * head_dim;
  l.block_floats = int64_t(round_up(uint64_t(l.lse_offset + l.rows) * sizeof(float), kAlign) / sizeof(float));
  return l;
}

FlashDecodeBuffers flash_decode_buffers(const FlashDecodeConfig& cfg, int world, int num_sms) {
  validate_flash_decode_config(cfg, world);
  TF_REQUIRE(num_sms >= 1, Status::InvalidArgument, "num_sms=" << num_sms << " must be >= 1");
  const uint64_t block = uint64_t(gather_layout(cfg.max_batch, cfg.max_q_heads, cfg.max_head_dim).block_floats) * 4;
  const uint64_t rows = uint64_t(cfg.max_batch) * cfg.max_q_heads;
  FlashDecodeBuffers b;
  // Each parity holds the largest launch's lines; a smaller launch uses the start of its parity
  // (and of the direct region, which follows).
  const uint64_t row_lines = uint64_t(attention::ll_lines_per_row(cfg.max_head_dim));
  b.fused_direct_begin = world * rows * row_lines;
  if (cfg.split_merge == FlashDecodeConfig::SplitMerge::direct) {
    b.fused_direct_rows = std::min<uint64_t>(rows, attention::kDirectMaxRows);
    b.fused_direct_sender_lines = attention::kMaxDirectSplits * b.fused_direct_rows * row_lines;
  }
  b.fused_parity_lines = b.fused_direct_begin + world * b.fused_direct_sender_lines;
  b.fused_inbox_bytes = 2 * b.fused_parity_lines * 16;
  b.bsp_gather_bytes = uint64_t(world) * block;
  b.workspace_bytes = max_workspace_bytes(cfg, num_sms);
  return b;
}

bool direct_merge_applies(const FlashDecodeBuffers& b, int world, int num_sms, int batch, int q_heads, int kv_heads,
                          int head_dim) {
  const int64_t rows = int64_t(batch) * q_heads, groups = int64_t(batch) * kv_heads;
  return b.fused_direct_rows > 0 && rows <= int64_t(b.fused_direct_rows) && groups <= num_sms &&
         world <= attention::kDirectMaxWorld &&
         int64_t(world) * (q_heads / kv_heads) <= attention::direct_stage_rows(head_dim);
}

void validate_flash_decode_config(const FlashDecodeConfig& c, int world) {
  using S = Status;
  TF_REQUIRE(world >= 1 && world <= kMaxWorld, S::InvalidArgument,
             "world=" << world << " must be in [1, " << kMaxWorld << "] (ranks combined per output row)");
  TF_REQUIRE(c.max_batch >= 1 && c.max_batch <= 65535, S::InvalidArgument,
             "max_batch=" << c.max_batch << " must be in [1, 65535]");
  TF_REQUIRE(c.max_kv_heads >= 1 && c.max_kv_heads <= 65535, S::InvalidArgument,
             "max_kv_heads=" << c.max_kv_heads << " must be in [1, 65535]");
  TF_REQUIRE(c.max_q_heads >= c.max_kv_heads, S::InvalidArgument,
             "max_q_heads=" << c.max_q_heads << " must be >= max_kv_heads=" << c.max_kv_heads);
  TF_REQUIRE(c.max_head_dim == 64 || c.max_head_dim == 128, S::InvalidArgument,
             "max_head_dim=" << c.max_head_dim << " must be 64 or 128");
  TF_REQUIRE(c.num_splits >= 0 && c.num_splits <= kMaxSplits, S::InvalidArgument,
             "num_splits=" << c.num_splits << " must be 0 (auto) or in [1, " << kMaxSplits << "]");
  TF_REQUIRE(c.bsp_buffers == BspBuffers::symmetric || c.bsp_buffers == BspBuffers::plain, S::InvalidArgument,
             "bsp_buffers=" << int(c.bsp_buffers) << " is not a BspBuffers value");
  using M = FlashDecodeConfig::SplitMerge;
  TF_REQUIRE(c.split_merge == M::cluster || c.split_merge == M::global || c.split_merge == M::direct,
             S::InvalidArgument, "split_merge=" << int(c.split_merge) << " is not a SplitMerge value");
  // Fused work items (splits x batch x kv_heads) are int32.
  TF_REQUIRE(int64_t(c.max_batch) * c.max_kv_heads <= INT32_MAX / kMaxSplits, S::InvalidArgument,
             "max_batch*max_kv_heads=" << int64_t(c.max_batch) * c.max_kv_heads << " must be <= "
                                       << INT32_MAX / kMaxSplits);
}

void validate_flash_decode_args(const DecodeArgs& a, const FlashDecodeConfig& c) {
  using S = Status;
  TF_REQUIRE(a.out != nullptr, S::InvalidArgument, "out is null: FlashDecode writes the full attention output there");
  TF_REQUIRE(a.o_part == nullptr, S::InvalidArgument,
             "o_part=" << static_cast<const void*>(a.o_part) << " must be null: FlashDecode keeps the partials itself");
  TF_REQUIRE(a.lse_part == nullptr, S::InvalidArgument,
             "lse_part=" << static_cast<const void*>(a.lse_part) << " must be null: FlashDecode keeps the partials itself");
  // The op's limits first: a shape beyond them must be named, not seen as overlapping buffers
  // sized for a smaller one.
  TF_REQUIRE(a.batch <= c.max_batch, S::InvalidArgument,
             "batch=" << a.batch << " exceeds this FlashDecode's max_batch=" << c.max_batch);
  TF_REQUIRE(a.q_heads <= c.max_q_heads, S::InvalidArgument,
             "q_heads=" << a.q_heads << " exceeds this FlashDecode's max_q_heads=" << c.max_q_heads);
  TF_REQUIRE(a.kv_heads <= c.max_kv_heads, S::InvalidArgument,
             "kv_heads=" << a.kv_heads << " exceeds this FlashDecode's max_kv_heads=" << c.max_kv_heads);
  TF_REQUIRE(a.head_dim <= c.max_head_dim, S::InvalidArgument,
             "head_dim=" << a.head_dim << " exceeds this FlashDecode's max_head_dim=" << c.max_head_dim);
  validate_decode_args(a);
}

std::string describe_flash_decode_launch(FlashDecodeVariant variant, const DecodeArgs& a, const FlashDecodeConfig& c,
                                        bool direct) {
  const float scale = a.softmax_scale > 0.f ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
  std::ostringstream os;
  os << "flash_decode " << variant_name(variant) << " batch=" << a.batch << " heads=" << a.q_heads << "/"
     << a.kv_heads << " head_dim=" << a.head_dim << " " << dtype_name(a.dtype)
     << " scale=" << std::hexfloat << scale << std::defaultfloat << "; config max_batch=" << c.max_batch
     << " max_heads=" << c.max_q_heads << "/" << c.max_kv_heads << " max_head_dim=" << c.max_head_dim
     << " bsp_buffers=" << (c.bsp_buffers == BspBuffers::symmetric ? "symmetric" : "plain")
     << (c.split_merge == FlashDecodeConfig::SplitMerge::direct ? " split_merge=direct" : "")
     << (direct ? "; merges directly" : "");
  return os.str();
}

}  // namespace taxfree::flash_decode
