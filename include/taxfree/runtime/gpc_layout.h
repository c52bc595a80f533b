// Where thread-block clusters sit on an sm_90 GPU, inferred on the host from occupancy counts.
// CUDA names no GPC, but every CTA of a cluster runs on one, and the cluster scheduler deals the
// clusters of a launch round-robin over the GPCs, one each before any gets a second
// (tools/gpc_probe, r236). So the first `holding(C)` clusters of C CTAs land one per GPC; more put
// two on some GPCs and one on others, and those finish last when the kernel streams from HBM
// (docs/PERFORMANCE.md, twenty-eighth session).
//
// The input is what cudaOccupancyMaxActiveClusters reports at one CTA per SM for cluster sizes
// 1..16 (16 with the non-portable size opt-in): counts[c - 1] = sum over the GPCs of
// floor(S / c), S being the SMs of that GPC a cluster may use. Those 16 numbers determine S for
// every GPC given two facts of the architecture, which the inference checks rather than trusts:
// SMs come in TPC pairs (S is even) and a GPC holds at most 18 (9 TPCs). An H200 reads
// 132 66 39 30 22 17 15 15 9 7 7 7 7 7 7 7: two GPCs of 18, five of 16, one of 8 and four units of 2.
// Where the counts fit no such layout (another architecture, a share of the SMs, other work
// resident), the layout is unknown and says so. Host only; infer_gpc_layout makes no CUDA calls.
#pragma once

#include <array>
#include <span>
#include <string>
#include <vector>

namespace taxfree {

struct GpcLayout {
  static constexpr int kMaxSms = 18;      // SMs of one GPC (sm_90: 9 TPCs)
  static constexpr int kMaxCluster = 16;  // the largest cluster sm_90 launches (non-portable)
  bool known = false;
  std::array<int, kMaxSms + 1> gpcs_of_size{};  // [S]: GPCs with S cluster-usable SMs

  // GPCs that hold at least one cluster of `cluster` CTAs (0 where unknown or cluster > kMaxSms):
  // how many such clusters a launch places one per GPC.
  int holding(int cluster) const;
};

// The layout whose counts are `max_clusters` (size c at index c - 1, c = 1..16). Unknown with
// fewer entries, with no cluster of one resident, or unless the layout gives back every count.
GpcLayout infer_gpc_layout(std::span<const int> max_clusters);

// The counts of `device` (sizes 1..16 at one CTA per SM with the whole shared memory, asked of a
// kernel of its own; empty where the device launches no clusters), cached per device, thread-safe.
// A function attribute and occupancy queries only: no launch, no allocation, no stream work
// (the current device is restored). Throws only where the device cannot be selected.
std::vector<int> device_cluster_counts(int device);
// infer_gpc_layout(device_cluster_counts(device)).
GpcLayout device_gpc_layout(int device);

// "COUNTxSMS ..." by size, largest first (an H200: "2x18 5x16 1x8 4x2"), or "unknown".
std::string to_string(const GpcLayout& layout);

}  // namespace taxfree
