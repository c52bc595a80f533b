// choose_gemm_config: ranks (compiled tile, cluster, split-K) candidates by a coarse time estimate.
//
// The estimate replays the kernel's static schedule (unit u runs on cluster u % clusters) with a
// per-unit cost, and takes the larger of that makespan and the HBM time of the unique bytes:
//   k-block   max(tensor time at the tile's efficiency, operand bytes / what one SM streams with
//             its pipeline depth, the fixed issue + barrier cost of a k-block)
//   epilogue  C band through shared memory to global
//   split-K   partial write per unit; the tile's last unit also reads all partials
//   HBM       (A + B + C) bytes / bandwidth, derated when too few SMs stream.
// The constants are rough H200 figures; they rank candidates, they do not predict time. Retune
// them from scripts/gemm_tune.sh (docs/notes/gemm-tuning.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_tiles.h"

namespace taxfree::gemm {
namespace {

constexpr double kPeakFlopsPerSm = 989e12 / 132;  // dense 16-bit tensor peak per SM
constexpr double kHbmBytesPerSec = 4.0e12;        // sustained HBM read bandwidth (H200)
constexpr double kSaturatingSmFraction = 0.6;     // SMs that must stream to reach it
constexpr double kLoadLatency = 2.0e-6;           // TMA load latency with HBM saturated
constexpr double kMaxSmFeed = 120e9;              // L2 -> one SM
constexpr double kKBlockIssue = 0.06e-6;          // wait full + 4 wgmma + commit + release, per k-block
constexpr double kSmStoreRate = 100e9;            // one SM writing C or partials
constexpr double kSmLoadRate = 120e9;             // one SM reading partials from L2
constexpr double kEpilogueFixed = 0.3e-6;         // barriers and address math per band
constexpr size_t kMaxWorkspaceBytes = size_t(64) << 20;
// Bias against complexity: a candidate must beat the incumbent by this factor to replace it, and
// candidates are tried simplest first.
constexpr double kSwitchMargin = 0.97;

// Fraction of the tensor peak a tile sustains with a full pipeline: smaller tiles read more
// shared memory per FLOP and spend relatively more time issuing and synchronising. Multicast
// halves B's L2 -> SM traffic, which the widest tile is closest to saturating.
double tile_efficiency(const CompiledTile& t) {
  const int area = t.bm * t.bn;
  const double e = area >= 128 * 256 ? 0.80 : area >= 128 * 128 ? 0.70 : area >= 64 * 64 ? 0.45 : 0.30;
  return t.cluster > 1 ? e + 0.03 : e;
}

struct Candidate {
  const CompiledTile* tile;
  int splits;
  SplitScope scope;
};

double estimate_seconds(const Candidate& c, int64_t m, int64_t n, int64_t k, int sms) {
  const CompiledTile& t = *c.tile;
  const int64_t clusters = std::max(1, sms / t.cluster);
  const TileGrid grid = make_tile_grid(m, n, t.bm * t.cluster, t.bn, 1);
  WorkPlan plan{grid, int((k + 63) / 64), std::min<int>(c.splits, int((k + 63) / 64)), grid.tiles()};
  if (plan.splits > 1) plan.dp_tiles = c.scope == SplitScope::all ? 0 : tail_dp_tiles(grid.tiles(), clusters);
  if (plan.splits > 1 && plan.split_tiles() == 0) plan.splits = 1;

  // Per CTA and k-block. Rows of A past M are zero-filled by TMA and cost no bandwidth; with
  // multicast each CTA pulls only its share of B from L2.
  const double a_bytes = double(std::min<int64_t>(t.bm, m)) * 128.0, b_bytes = double(t.bn) * 128.0;
  const double in_flight = t.stages * (a_bytes + b_bytes);
  const double feed = (a_bytes + b_bytes / t.cluster) / std::min(kMaxSmFeed, in_flight / kLoadLatency);
  const double compute = 2.0 * t.bm * t.bn * 64 / (kPeakFlopsPerSm * tile_efficiency(t));
  const double per_kb = std::max({compute, feed, kKBlockIssue});
  const double rows = double(std::min<int64_t>(t.bm, m));
  const double epilogue = rows * t.bn * 2 / kSmStoreRate + kEpilogueFixed;
  const double partial = rows * t.bn * 4 / kSmStoreRate;
  const double reduce = plan.splits * rows * t.bn * 4 / kSmLoadRate;

  const int64_t active = std::min<int64_t>(plan.units(), clusters);
  std::vector<double> busy(size_t(active), 0.0);
  for (int64_t u = 0; u < plan.units(); ++u) {
    const WorkUnit w = plan.unit(u);
    double cost = (w.kb_end - w.kb_begin) * per_kb;
    if (w.slot < 0) cost += epilogue;
    else cost += partial + (w.split == plan.splits - 1 ? reduce + epilogue : 0.0);  // the last usually reduces
    busy[size_t(u % active)] += cost;
  }
  const double makespan = *std::max_element(busy.begin(), busy.end());
  const double streaming = std::min(1.0, double(active * t.cluster) / (kSaturatingSmFraction * sms));
  const double hbm = double(m * k + n * k + m * n) * 2.0 / (kHbmBytesPerSec * streaming);
  return std::max(makespan, hbm);
}

// Rasterisation group: the m-blocks per group that minimise the rows of A and B one wave of
// `active` consecutive tiles touches: at least g (and at least active / n_blocks) m-blocks of A,
// active / g n-blocks of B. Counted in cluster tiles of bm_eff rows.
int choose_group_m(int bm_eff, int bn, int64_t m, int64_t n, int64_t active_tiles) {
  const int64_t m_blocks = (m + bm_eff - 1) / bm_eff, n_blocks = (n + bn - 1) / bn;
  const int64_t active = std::min<int64_t>(m_blocks * n_blocks, active_tiles);
  int best = 1;
  int64_t best_rows = INT64_MAX;
  for (int g = 1; g <= 32 && g <= m_blocks; g *= 2) {
    const int64_t m_touched = std::min(m_blocks, std::max<int64_t>(g, (active + n_blocks - 1) / n_blocks));
    const int64_t rows = m_touched * bm_eff + std::min(n_blocks, (active + g - 1) / g) * bn;
    if (rows < best_rows) best = g, best_rows = rows;
  }
  return best;
}

}  // namespace

GemmConfig choose_gemm_config(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms) {
  (void)dtype;  // bf16 and fp16 run at the same rate
  m = std::max<int64_t>(m, 1), n = std::max<int64_t>(n, 1), k = std::max<int64_t>(k, 1);
  num_sms = std::max(num_sms, 1);
  const int k_blocks = int((k + 63) / 64);
  // Simplest first: whole tiles, then split-K over all tiles, then over the tail wave only.
  std::vector<Candidate> candidates;
  for (const CompiledTile& t : kCompiledTiles) {  // listed largest first: near-ties keep the larger
    if (b_layout == BLayout::KN && !t.kn) continue;
    if (m <= 64 && t.bm > 64) continue;        // half or more of a 128-row A tile would be zero fill
    if (t.cluster > 1 && m <= t.bm) continue;  // the peer CTA would compute only zero rows
    candidates.push_back({&t, 1, SplitScope::all});
  }
  const size_t whole = candidates.size();
  for (size_t i = 0; i < whole; ++i)
    for (int s : {2, 3, 4, 6, 8, 12, 16})
      if (s <= k_blocks) candidates.push_back({candidates[i].tile, s, SplitScope::all});
  for (size_t i = 0; i < whole; ++i)
    for (int s : {2, 3, 4})
      if (s <= k_blocks) candidates.push_back({candidates[i].tile, s, SplitScope::tail});

  const Candidate* best = nullptr;
  double best_time = 0;
  for (const Candidate& c : candidates) {
    const CompiledTile& t = *c.tile;
    if (c.splits > 1) {
      const TileGrid grid = make_tile_grid(m, n, t.bm * t.cluster, t.bn, 1);
      const int64_t clusters = std::max(1, num_sms / t.cluster);
      const int64_t split_tiles =
          c.scope == SplitScope::all ? grid.tiles() : grid.tiles() - tail_dp_tiles(grid.tiles(), clusters);
      if (split_tiles == 0) continue;  // nothing to split: the same as splits = 1
      const double bytes = double(split_tiles) * t.cluster * c.splits * t.bm * t.bn * 4.0;
      if (bytes > double(kMaxWorkspaceBytes)) continue;
    }
    const double time = estimate_seconds(c, m, n, k, num_sms);
    if (!best || time < kSwitchMargin * best_time) best = &c, best_time = time;
  }
  const CompiledTile& t = *best->tile;
  GemmConfig cfg;
  cfg.bm = t.bm;
  cfg.bn = t.bn;
  cfg.stages = t.stages;
  cfg.cluster_m = t.cluster;
  cfg.splits = best->splits;
  cfg.split_scope = best->scope;
  cfg.group_m = choose_group_m(t.bm * t.cluster, t.bn, m, n, num_sms / t.cluster);
  return cfg;
}

}  // namespace taxfree::gemm
