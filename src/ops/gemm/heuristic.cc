// choose_gemm_config: ranks the compiled tiles by a coarse time estimate for the shape.
//
// The estimate is the largest of three bounds, each with whole waves of persistent CTAs:
//   compute  waves x tile FLOPs / (per-SM tensor peak x the tile's pipeline efficiency)
//   feed     waves x bytes one CTA pulls per tile / what one SM can keep in flight per latency
//            (this is what sinks small M: B streaming through too few or too shallow CTAs)
//   HBM      unique bytes / bandwidth, derated when too few CTAs stream to saturate it.
// The constants are rough H200 figures; they rank tiles, they do not predict time. Retune them
// from `taxfree bench gemm` on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_tiles.h"

namespace taxfree::gemm {
namespace {

constexpr double kPeakFlopsPerSm = 989e12 / 132;  // dense 16-bit tensor peak per SM
constexpr double kHbmBytesPerSec = 3.3e12;        // sustained HBM bandwidth
constexpr double kSaturatingSmFraction = 0.75;    // SMs that must stream to reach it
constexpr double kLoadLatency = 1.5e-6;           // TMA load latency under load
constexpr double kMaxSmFeed = 120e9;              // L2 -> one SM

// Fraction of the tensor peak a tile sustains with a full pipeline: smaller tiles read more
// shared memory per FLOP and spend relatively more time issuing and synchronising.
double tile_efficiency(const CompiledTile& t) {
  const int area = t.bm * t.bn;
  return area >= 128 * 256 ? 0.85 : area >= 128 * 128 ? 0.75 : area >= 64 * 64 ? 0.45 : 0.30;
}

double estimate_seconds(const CompiledTile& t, int64_t m, int64_t n, int64_t k, int sms) {
  const int64_t tiles = ((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn);
  const double waves = double((tiles + sms - 1) / sms);
  const double active = double(std::min<int64_t>(tiles, sms));
  const double k_pad = double((k + 63) / 64 * 64);
  const double compute = waves * 2.0 * t.bm * t.bn * k_pad / (kPeakFlopsPerSm * tile_efficiency(t));
  // Rows of A past M are zero-filled by TMA and cost no bandwidth.
  const double rows = double(std::min<int64_t>(t.bm, m) + t.bn);
  const double in_flight = t.stages * rows * 128.0;
  const double feed = waves * rows * k_pad * 2.0 / std::min(kMaxSmFeed, in_flight / kLoadLatency);
  const double hbm_share = std::min(1.0, active / (kSaturatingSmFraction * sms));
  const double hbm = double(m * k + n * k + m * n) * 2.0 / (kHbmBytesPerSec * hbm_share);
  return std::max({compute, feed, hbm});
}

// Rasterisation group: the m-blocks per group that minimise the rows of A and B one wave of
// `active` consecutive tiles touches: at least g (and at least active / n_blocks) m-blocks of A,
// active / g n-blocks of B.
int choose_group_m(const CompiledTile& t, int64_t m, int64_t n, int sms) {
  const int64_t m_blocks = (m + t.bm - 1) / t.bm, n_blocks = (n + t.bn - 1) / t.bn;
  const int64_t active = std::min<int64_t>(m_blocks * n_blocks, sms);
  int best = 1;
  int64_t best_rows = INT64_MAX;
  for (int g = 1; g <= 32 && g <= m_blocks; g *= 2) {
    const int64_t m_touched = std::min(m_blocks, std::max<int64_t>(g, (active + n_blocks - 1) / n_blocks));
    const int64_t rows = m_touched * t.bm + std::min(n_blocks, (active + g - 1) / g) * t.bn;
    if (rows < best_rows) best = g, best_rows = rows;
  }
  return best;
}

}  // namespace

GemmConfig choose_gemm_config(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms) {
  (void)dtype;  // bf16 and fp16 run at the same rate
  m = std::max<int64_t>(m, 1), n = std::max<int64_t>(n, 1), k = std::max<int64_t>(k, 1);
  num_sms = std::max(num_sms, 1);
  const CompiledTile* best = nullptr;
  double best_time = 0;
  for (const CompiledTile& t : kCompiledTiles) {  // listed largest first: near-ties keep the larger
    if (b_layout == BLayout::KN && !t.kn) continue;
    if (m <= 64 && t.bm > 64) continue;  // half or more of a 128-row A tile would be zero fill
    const double time = estimate_seconds(t, m, n, k, num_sms);
    if (!best || time < 0.97 * best_time) best = &t, best_time = time;
  }
  GemmConfig cfg;
  cfg.bm = best->bm;
  cfg.bn = best->bn;
  cfg.stages = best->stages;
  cfg.group_m = choose_group_m(*best, m, n, num_sms);
  return cfg;
}

}  // namespace taxfree::gemm
