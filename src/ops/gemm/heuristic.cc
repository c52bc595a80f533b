// choose_gemm_config: ranks (compiled tile, cluster, split-K) candidates by a coarse time estimate.
//
// The estimate replays the kernel's static schedule (unit u runs on cluster u % clusters) with a
// per-segment cost, and takes the larger of that makespan and the HBM time of the unique bytes:
//   k-block   max(tensor time at the tile's efficiency, operand bytes / what one SM streams with
//             its pipeline depth at the loaded latency, the fixed issue + barrier cost of a k-block)
//   epilogue  C band through shared memory to global
//   split-K   partial write per part of a cut tile; its last part also reads all partials
//   K cluster each CTA runs 1/S of the k-blocks and writes 1/S of the band after exchanging
//             (S - 1)/S of its accumulators in shared memory (swap-AB: CTA 0 receives the S - 1
//             others' and writes the band); candidates only where every tile's cluster is
//             resident at once (k_clusters_fit); clusters of 4 pack into the GPCs less densely
//             than single CTAs
//   HBM       (A + B + C) bytes / bandwidth, derated when too few SMs stream; A rows past M that
//             TMA zero-fills count as streamed bytes (r11: M = 1 and 16 on 64-row tiles ran at
//             about half the B-only HBM rate). A single-CTA tile with 16-bit outputs and M >= its
//             rows has none: its last m-block loads the last rows of A instead (overlapped, below;
//             r335 -> r337: M = 136-176 N = 7168-8192 K = 2048, 128 x 128 whole tiles 22-25 -> 17-20 µs,
//             ahead of the 192-row swap-AB tile's 24). Cluster tiles keep the charge: their pairs'
//             pace did not change (r336: 128 x 224 pairs 1.006x).
//             A partial last m-block without multicast is charged B once more when B is over the
//             L2 (over 60% of it when K >= 8192) and a column's m-blocks (8 or fewer) run in one
//             wave: its CTAs have fewer rows, run ahead of the full ones, and stop sharing B's
//             k-blocks with them (r169: M = 192 N = 7168-8192, 128 x 128 whole tiles 1.3-1.4x the
//             pair tile's time). A stand-in for the cost, not HBM traffic: ncu read B from HBM
//             once on such shapes (r332); the loss is between L2 and the SMs. With 16-bit outputs
//             the kernel overlaps the last m-block with the one before it, so every CTA loads
//             whole A tiles (kernels/gemm/tile_scheduler.cuh: overlapped_row0) and whole tiles no
//             longer drift (r336, 1x H100: 128 x 128 over a last m-block of 32-64 rows 0.68-0.76x
//             their time before at N = 3584-6144). The charge stays on split-K candidates, which
//             the re-timed tables rank better with it (r337-r338: 1.011x the best measured over
//             975 shapes, 1.018x without), and on fp32 outputs, which the kernel does not overlap.
//   clocks    SMs left idle give the busy ones clock headroom under the power cap: the tensor rate
//             gains 30% of the idle fraction (the gain that fits r163-r169's measurements best).
//   time      the larger of makespan and HBM plus a quarter of the smaller, plus a fixed launch
//             and pipeline fill, the same for every candidate.
// Swap-AB tiles (M as wgmma's N: 16, 32, 64, 192 rows) are ranked by the same replay; at M <= 16 they
// win on zero fill (16 A rows per tile instead of 64), at M = 129-192 on the second 128-row
// m-block's zero rows.
// The constants are rough H200 figures; they rank candidates, they do not predict time. Retune
// them from scripts/gemm_tune.sh (docs/notes/gemm-tuning.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "taxfree/kernels/gemm/tile_scheduler.cuh"
#include "taxfree/ops/gemm.h"
#include "taxfree/ops/gemm_detail.h"
#include "taxfree/ops/gemm_tiles.h"
#include "taxfree/runtime/error.h"

namespace taxfree::gemm {
namespace {

constexpr double kPeakFlopsPerSm = 989e12 / 132;  // dense 16-bit tensor peak per SM
constexpr double kHbmBytesPerSec = 4.0e12;        // sustained HBM read bandwidth (H200)
constexpr double kSaturatingSmFraction = 0.6;     // SMs that must stream to reach it
constexpr double kLoadLatency = 2.0e-6;           // TMA load latency with HBM saturated
constexpr double kSmemRate = 225e9;               // shared-memory operand reads of one SM's wgmmas
constexpr double kFixed = 3.0e-6;                 // launch + pipeline fill
constexpr double kMaxSmFeed = 120e9;              // L2 -> one SM
constexpr double kKBlockIssue = 0.06e-6;          // wait full + 4 wgmma + commit + release, per k-block
constexpr double kSmStoreRate = 50e9;             // one SM writing C or partials
constexpr double kSmLoadRate = 60e9;              // one SM reading partials from L2
constexpr double kDsmemRate = 100e9;              // one SM sending accumulators to its cluster's CTAs
constexpr double kClusterMeet = 0.5e-6;           // the two cluster barriers of a K-cluster exchange
constexpr double kEpilogueFixed = 0.3e-6;         // barriers and address math per band
constexpr double kBoundOverlap = 0.25;           // share of the smaller bound that shows in the time
constexpr double kIdleClockGain = 0.3;           // tensor rate gain per idle fraction of the SMs
constexpr double kL2Bytes = 50e6;                 // L2 capacity (H200)
constexpr int64_t kDriftMaxMBlocks = 8;           // a column's m-blocks in one wave (see B re-read above)
constexpr int64_t kTile168MaxMBlocks = 12;        // 128 x 168 over a partial last m-block (rank_candidates)
constexpr double kDriftL2Share = 0.6;             // with a long k-loop, B over this share of the L2 drifts
constexpr int kDriftMinKBlocks = 128;             // a long k-loop: K >= 8192 (see estimate_seconds)
constexpr double kDriftSlowdown = 1.35;           // k-block time, short last m-block (see estimate_seconds)
constexpr size_t kMaxWorkspaceBytes = size_t(64) << 20;
constexpr int kMaxTailSplitsOverRounds = 3;       // tail splits of more parts keep to one round (rank_candidates)
constexpr int64_t kMaxSwapM = 192;                // swap-AB candidates up to this M (SwapAB::choose)
constexpr int kMaxNarrowSwapM = 64;               // swap-AB tiles up to this bm: the decode tiles
// Bias against complexity: a candidate must beat the incumbent by this factor to replace it, and
// candidates are tried simplest first.
constexpr double kSwitchMargin = 0.97;

// Fraction of the tensor peak a tile sustains with a full pipeline: smaller tiles read more
// shared memory per FLOP and spend relatively more time issuing and synchronising. Clusters get
// no bonus: multicast showed none in the H200 sweep (r12).
double tile_efficiency(const CompiledTile& t) {
  if (t.swap) return 0.8;  // the operand reads below bound narrow wgmmas, not this
  const int area = t.bm * t.bn;
  return area >= 128 * 256 ? 0.80 : area >= 128 * 224 ? 0.78 : area >= 128 * 168 ? 0.76 : area >= 128 * 128 ? 0.74
         : area >= 64 * 64 ? 0.45 : 0.30;
}

struct Candidate {
  const CompiledTile* tile;
  int splits;
  SplitScope scope;
  GemmConfig config() const {
    GemmConfig c;
    c.bm = tile->bm, c.bn = tile->bn, c.stages = tile->stages, c.cluster_m = tile->cluster;
    c.splits = splits, c.split_scope = scope, c.group_m = 1, c.swap_ab = tile->swap, c.cluster_k = tile->cluster_k;
    return c;
  }
};

// Clusters of `size` CTAs (one per SM) resident at once: a cluster sits in one GPC, and clusters
// of 4 leave some of a GPC's SMs unused (H200, 128 x 128 s6: 132 single CTAs, 66 pairs, 30
// clusters of 4, r145).
int64_t resident_clusters_estimate(int sms, int size) { return std::max(1, size <= 2 ? sms / size : sms * 10 / 11 / size); }

// Where K clusters are candidates. They cut K (like split-K) and need a k-block per CTA; each
// cluster takes one tile (r149, H200: with more tiles than clusters, every next tile waits for the
// exchange and a refilled ring: 1.2-1.3x split-K's time at M = 384-2048, 192 tiles); and they lost to
// split-K 2 when 64 tiles of 8 or fewer n-blocks filled 128 SMs (M = 1024 N = 1024, M = 2048 N = 512:
// 1.04-1.10x; r153: whole clusters' k-loops streamed up to 35% slower than split-K's same K ranges,
// a placement effect not understood), while winning with 16-64 n-blocks or on
// three quarters of the SMs or fewer (96 of 132; 0.87-0.96x).
bool k_clusters_fit(const CompiledTile& t, int64_t m, int64_t n, int k_blocks, int sms, KCuts cuts) {
  const int64_t n_blocks = (n + t.bn - 1) / t.bn, tiles = (m + t.bm - 1) / t.bm * n_blocks;
  return cuts == KCuts::split_or_cluster && k_blocks >= t.cluster_k && tiles <= resident_clusters_estimate(sms, t.cluster_k) &&
         (n_blocks >= 16 || tiles * t.cluster_k * 4 <= int64_t(sms) * 3);
}

double estimate_seconds(const Candidate& c, const WorkPlan& plan, int64_t m, int64_t n, int64_t k, int64_t clusters,
                        int sms, EpilogueOutput out) {
  const CompiledTile& t = *c.tile;
  const int ck = t.cluster_k;
  // Per CTA and k-block. Rows of A past M are zero-filled by TMA and cost no bandwidth; with
  // multicast each CTA pulls only its share of B from L2.
  const double a_bytes = double(std::min<int64_t>(t.bm, m)) * 128.0, b_bytes = double(t.bn) * 128.0;
  const double in_flight = t.stages * (a_bytes + b_bytes);
  const double feed = (a_bytes + b_bytes / t.cluster) / std::min(kMaxSmFeed, in_flight / kLoadLatency);
  // Each consumer's wgmmas read its own 64 rows and the whole shared operand (acc_n rows).
  const int consumers = (t.swap ? t.bn : t.bm) / 64, acc_n = t.swap ? t.bm : t.bn;
  const double operand_reads = consumers * (64.0 + acc_n) * 128.0;
  const int64_t active = std::min<int64_t>(plan.units(), clusters);
  const double idle = std::max(0.0, 1.0 - double(active * t.cluster * ck) / sms);
  const double tensor_rate = kPeakFlopsPerSm * tile_efficiency(t) * (1.0 + kIdleClockGain * idle);
  const double compute = std::max(2.0 * t.bm * t.bn * 64 / tensor_rate,
                                  operand_reads / kSmemRate);
  // B re-read (above): split-K candidates, or any with fp32 outputs, over a partial last m-block
  // without multicast, 8 or fewer m-blocks, B over the L2, or over 60% of it with a long k-loop
  // (r328, 1x H200, K = 8192: B 34 MB drifts, 25 MB does not). With a long k-loop and fp32 outputs
  // (no overlapped m-block), 128 x 128 whole tiles of single CTAs whose last m-block is half a tile
  // or less also slow every k-block of the wave (r328: M = 416-960, N = 2048-4096 ran 60-71 µs where
  // a 96-row last m-block ran 46-47), which the re-read bytes do not show where the makespan bounds
  // the estimate. Only that tile: applied to 128 x 256 and K clusters too, the rule moved them to
  // split-K that lost up to 1.42x (r329, 1x H100). Only long k-loops: at K = 2048 / 4096 both terms
  // cost 1.06x / 1.02x (r330, 1x H200, 83 shapes), at K = 16384 they gained 0.89x (20 shapes).
  const bool long_k_loop = plan.k_blocks >= kDriftMinKBlocks;
  const bool drifting_m_block = (out == EpilogueOutput::fp32 || c.splits > 1) && t.cluster == 1 && !t.swap &&
                                m % t.bm != 0 && plan.grid.m_blocks > 1 && plan.grid.m_blocks <= kDriftMaxMBlocks &&
                                double(n) * double(k) * 2.0 > kL2Bytes * (long_k_loop ? kDriftL2Share : 1.0);
  const bool short_last_m_block = long_k_loop && drifting_m_block && c.splits == 1 && ck == 1 && t.bm == 128 &&
                                  t.bn == 128 && m % t.bm <= t.bm / 2;
  const double per_kb = std::max({compute, feed, kKBlockIssue}) * (short_last_m_block ? kDriftSlowdown : 1.0);
  const double rows = double(std::min<int64_t>(t.bm, m));
  const double epilogue = rows * t.bn * 2 / kSmStoreRate + kEpilogueFixed;
  const double partial = rows * t.bn * 4 / kSmStoreRate;
  const double part_read = rows * t.bn * 4 / kSmLoadRate;
  // K clusters: each CTA sends (S - 1) / S of its accumulators and writes 1 / S of the band; with
  // swap-AB CTA 0 receives the other CTAs' whole (small) accumulators and writes the band alone.
  const double exchange = ck == 1  ? 0.0
                          : t.swap ? (ck - 1.0) * t.bm * t.bn * 4 / kDsmemRate + kClusterMeet
                                   : (ck - 1.0) / ck * rows * t.bn * 4 / kDsmemRate + kClusterMeet;
  const double band_share = t.swap ? 1.0 : 1.0 / ck;

  // Replays the static schedule: cluster i walks units i, i + active, ...; whole tiles come first
  // and are counted, the split units after them are walked.
  double makespan = 0;
  for (int64_t i = 0; i < active; ++i) {
    const int64_t whole = i < plan.dp_tiles ? (plan.dp_tiles - i + active - 1) / active : 0;
    double busy = double(whole) * (double(plan.k_blocks / ck) * per_kb + epilogue * band_share + exchange);
    const int64_t first_split = plan.dp_tiles + ((i - plan.dp_tiles) % active + active) % active;
    for (SegmentWalk walk(plan, first_split, active); !walk.done();) {
      const WorkSegment w = walk.get();
      walk.next(w);
      busy += (w.kb_end - w.kb_begin) * per_kb;
      if (w.parts == 1) busy += epilogue;
      else busy += partial + (w.part == w.parts - 1 ? w.parts * part_read + epilogue : 0.0);  // the last usually reduces
    }
    makespan = std::max(makespan, busy);
  }
  const double streaming = std::min(1.0, double(active * t.cluster * ck) / (kSaturatingSmFraction * sms));
  // Zero fill (above: none for single CTAs over an overlapped last m-block), in double: int products
  // overflow on the largest shapes validation accepts (M, N, K < 2^31).
  const bool charge_zero_fill = out == EpilogueOutput::fp32 || m < t.bm || t.cluster > 1;
  const double zero_fill = charge_zero_fill
                               ? (double(plan.grid.m_blocks) * t.bm * t.cluster - double(m)) * double(k) * plan.grid.n_blocks
                               : 0.0;
  const double b_reread = drifting_m_block ? double(n) * double(k) : 0.0;
  const double hbm = (double(m) * double(k) + double(n) * double(k) + double(m) * double(n) + zero_fill + b_reread) *
                     2.0 / (kHbmBytesPerSec * streaming);
  // Neither bound hides the other completely; the overlap term also ranks the candidates that
  // tie at the HBM bound (small M) by their schedules.
  return std::max(makespan, hbm) + kBoundOverlap * std::min(makespan, hbm) + kFixed;
}

// The swap-AB tile for M: the narrowest whose bm covers M (one m-block: B crosses L2 -> SM once per
// column of tiles), or beyond the widest, the widest (the fewest m-blocks).
const CompiledTile* swap_tile_for(int64_t m, BLayout b_layout) {
  // A tile that covers M beats one that does not; among covering tiles the narrower, else the wider.
  const auto better = [m](const CompiledTile& a, const CompiledTile& b) {
    return (a.bm >= m) != (b.bm >= m) ? a.bm >= m : a.bm >= m ? a.bm < b.bm : a.bm > b.bm;
  };
  const CompiledTile* best = nullptr;
  for (const CompiledTile& t : kCompiledTiles)
    if (t.swap && (t.kn || b_layout == BLayout::nk) && (!best || better(t, *best))) best = &t;
  return best;
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

GemmRanking rank_candidates(int64_t m, int64_t n, int64_t k, BLayout b_layout, int num_sms, KCuts cuts, SwapAB swap,
                            EpilogueOutput out) {
  const bool allow_split_k = cuts != KCuts::none;
  m = std::max<int64_t>(m, 1), n = std::max<int64_t>(n, 1), k = std::max<int64_t>(k, 1);
  num_sms = std::max(num_sms, 1);
  const int k_blocks = int((k + 63) / 64);
  // Simplest first: whole tiles, then split-K over all tiles, then over the tail wave.
  // Swap-AB last (near-ties keep the plain kernel), on the narrowest swap-AB tile that covers M,
  // and only up to 192 rows: 64-row swap-AB tiles over several m-blocks streamed B through L2 once
  // per m-block (H200 sweep: 0.5-0.8x the plain tiles at M = 128 and 256), and a 256-row one (r333,
  // 1x H100) ran 1.3-1.5x the plain tiles' time at M = 224-256 where no plain row is zero fill.
  const CompiledTile* swap_tile = swap == SwapAB::never || (swap == SwapAB::choose && m > kMaxSwapM)
                                      ? nullptr
                                      : swap_tile_for(m, b_layout);
  std::vector<Candidate> candidates;
  for (const CompiledTile& t : kCompiledTiles) {  // listed largest first: near-ties keep the larger
    // The swap-AB tile for M, with or without K clusters.
    if (t.swap ? !swap_tile || t.bm != swap_tile->bm || t.bn != swap_tile->bn : swap == SwapAB::always) continue;
    if (b_layout == BLayout::kn && !t.kn) continue;
    if (out == EpilogueOutput::fp32 && !fp32_epilogue_compiled(t)) continue;
    // Tiles marked whole_m_blocks (128 x 168): r298 (1x H200, 168 shapes where it was chosen,
    // against the previous choice): whole tiles with M a multiple of 128 0.89x (68 shapes, none
    // above 1.04x); with a partial last m-block 0.98x but up to 1.15x (its CTAs drift apart on B,
    // as the estimate's B re-read term says for other tiles); split-K 1.07-1.10x (up to 1.23x).
    // At M = 128 (B streamed from HBM once, where bytes in flight decide: 5 stages of 37 KB against
    // 128 x 128's 6 of 32) 1.02-1.04x in r298 and r299. Since the overlapped last m-block, also over
    // a partial last m-block of up to 12 m-blocks: r342 (1x H100, the 401 shapes where allowing it
    // everywhere changed the choice, against that choice) 0.85-0.89x at 2-7 m-blocks, 0.92-0.97x at
    // 9-13 (against tail splits, mostly), 0.99-1.08x at 14-16. At first kept to 8 (a column's
    // m-blocks in one wave); 9-12 then moved 93 grid choices, 0.941x in r342's timings (5 slower,
    // at most 1.06x).
    const int64_t m_blocks = (m + t.bm - 1) / t.bm;
    if (t.whole_m_blocks && (m < 2 * t.bm || (m % t.bm != 0 && m_blocks > kTile168MaxMBlocks))) continue;
    if (!t.swap && m <= 64 && t.bm > 64) continue;  // half or more of a 128-row A tile would be zero fill
    if (t.cluster > 1 && m <= t.bm) continue;       // the peer CTA would compute only zero rows
    if (t.cluster * t.cluster_k > num_sms) continue;  // a cluster's CTAs run at once, one per SM
    // Above M = 128, 64-row plain tiles only where 128 x 128 tiles would be 8 or fewer (even K
    // clusters of 4 would leave three quarters of the SMs idle): elsewhere the estimate overrates
    // them (r164: 1.35-1.44x the best measured at M = 192 / 320; r167: without them 0.68-0.97 of
    // before on 25 shapes, but 1.29-1.35 at M = 256 N = 512, 8 such tiles).
    if (!t.swap && t.bm == 64 && m > 128 && (m + 127) / 128 * ((n + 127) / 128) * 16 > num_sms) continue;
    if (t.cluster_k > 1 && !k_clusters_fit(t, m, n, k_blocks, num_sms, cuts)) continue;
    candidates.push_back({&t, 1, SplitScope::all});
  }
  const size_t whole = allow_split_k ? candidates.size() : 0;
  const auto splits = [&](const CompiledTile& t, int s) { return t.cluster_k == 1 && !t.whole_m_blocks && s <= k_blocks; };
  for (size_t i = 0; i < whole; ++i)
    for (int s : {2, 3, 4, 6, 8, 12, 16})
      if (splits(*candidates[i].tile, s)) candidates.push_back({candidates[i].tile, s, SplitScope::all});
  // Stream-K is not a candidate: its clusters work at different K offsets of their tiles, so the
  // A and B panels a wave shares are no longer read at the same time and L2 reuse collapses; on
  // the H200 sweep it lost to whole tiles or the tail split on every shape with M >= 128 (up to
  // 1.29x slower, tests/data/gemm_tune_h200.csv). It stays available as an explicit config.
  for (size_t i = 0; i < whole; ++i)
    for (int s : {2, 3, 4})
      if (splits(*candidates[i].tile, s)) candidates.push_back({candidates[i].tile, s, SplitScope::tail});

  GemmArgs shape;
  shape.m = m, shape.n = n, shape.k = k;
  GemmRanking ranking;
  for (const Candidate& c : candidates) {
    GemmConfig cfg = c.config();
    const int64_t clusters = resident_clusters_estimate(num_sms, c.tile->cluster * c.tile->cluster_k);
    // Splitting many waves of tiles only adds traffic: skipped before planning them (a tail split
    // cuts at most 4 x clusters ranges).
    const int64_t tiles = make_tile_grid(m, n, cfg.bm * cfg.cluster_m, cfg.bn, cfg.group_m).tiles();
    if (c.splits > 1 && c.scope == SplitScope::all && tiles * c.splits > 16 * clusters) continue;
    // The 192-row swap-AB tile's K ranges in one wave only: over two (M = 136-192 N = 10240 K = 8192
    // sk3) they ran 1.06-1.12x the plain tiles' time where one wave ran 0.94x (r334, 1x H100).
    if (c.tile->swap && c.tile->bm > kMaxNarrowSwapM && c.splits > 1 && tiles * c.splits > clusters) continue;
    const WorkPlan plan = detail::make_work_plan(shape, cfg, clusters);
    // A tail split of 4 parts only where its ranges fit one round of the grid: over more (K = 16384
    // only, on the grid) 128 x 256 sk4t ran 1.09x the same tile whole (r345, 1x H100; M = 896 N = 8192
    // kn 1.48x), and keeping it to one round moved 27 grid choices, 0.927x (r347, none slower). Not
    // for 2 or 3 parts: keeping those to one round too moved 184 choices, 0.996x, 65 slower (r347).
    if (c.scope == SplitScope::tail && c.splits > kMaxTailSplitsOverRounds && plan.sk_units > clusters) continue;
    if (cfg.splits_k() && plan.split_tiles() == 0) continue;  // nothing to split: the same as whole tiles
    if (detail::workspace_need(plan, cfg).partial_bytes > kMaxWorkspaceBytes) continue;
    const double time = estimate_seconds(c, plan, m, n, k, clusters, num_sms, out);
    std::vector<GemmCandidate>& all = ranking.candidates;
    if (!all.empty() && time < kSwitchMargin * all[ranking.chosen].estimate_s) ranking.chosen = all.size();
    cfg.group_m = choose_group_m(cfg.bm * cfg.cluster_m, cfg.bn, m, n, num_sms / cfg.cluster_m);
    all.push_back({cfg, time});
  }
  TF_REQUIRE(!ranking.candidates.empty(), Status::NotSupported,
             "no compiled GEMM tile for M=" << m << " N=" << n << " K=" << k << " with these limits (swap-AB "
                                            << (swap == SwapAB::always ? "always" : "allowed") << ", "
                                            << (out == EpilogueOutput::fp32 ? "fp32" : "16-bit") << " output)");
  return ranking;
}

// Ranking replays every candidate's schedule: tens of microseconds of host time, paid by every
// launch that asks (the plain GEMM without a config, all_gather_matmul's launches on our GEMM),
// more than the GPU time of small shapes (r309: 96-279 us on the GPU machine's host). A serving
// loop asks for the same few shapes every step, so the answers are kept. Bounded: emptied when
// full (a sweep over thousands of shapes ranks again).
using MemoKey = std::tuple<int64_t, int64_t, int64_t, int, int, int, int, int>;
constexpr size_t kMemoCapacity = 4096;
std::mutex g_memo_mutex;
std::map<MemoKey, GemmConfig> g_memo;

}  // namespace

GemmConfig choose_gemm_config(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms,
                              KCuts cuts, SwapAB swap, EpilogueOutput out) {
  (void)dtype;  // bf16 and fp16 run at the same rate
  const MemoKey key{m, n, k, int(b_layout), num_sms, int(cuts), int(swap), int(out)};
  {
    std::lock_guard<std::mutex> lock(g_memo_mutex);
    const auto it = g_memo.find(key);
    if (it != g_memo.end()) return it->second;
  }
  const GemmRanking ranking = rank_candidates(m, n, k, b_layout, num_sms, cuts, swap, out);  // throws: nothing kept
  const GemmConfig cfg = ranking.candidates[ranking.chosen].config;
  std::lock_guard<std::mutex> lock(g_memo_mutex);
  if (g_memo.size() >= kMemoCapacity) g_memo.clear();
  g_memo.emplace(key, cfg);
  return cfg;
}

GemmRanking rank_gemm_configs(int64_t m, int64_t n, int64_t k, DType dtype, BLayout b_layout, int num_sms, KCuts cuts,
                              SwapAB swap, EpilogueOutput out) {
  (void)dtype;
  return rank_candidates(m, n, k, b_layout, num_sms, cuts, swap, out);
}

namespace detail {
void forget_chosen_gemm_configs() {
  std::lock_guard<std::mutex> lock(g_memo_mutex);
  g_memo.clear();
}
}  // namespace detail

}  // namespace taxfree::gemm
