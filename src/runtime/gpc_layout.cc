#include "taxfree/runtime/gpc_layout.h"

namespace taxfree {

int GpcLayout::holding(int cluster) const {
  if (!known || cluster < 1 || cluster > kMaxSms) return 0;
  int n = 0;
  for (int s = cluster; s <= kMaxSms; ++s) n += gpcs_of_size[s];
  return n;
}

GpcLayout infer_gpc_layout(std::span<const int> max_clusters) {
  constexpr int kMax = GpcLayout::kMaxSms;
  GpcLayout layout;
  if (int(max_clusters.size()) < GpcLayout::kMaxCluster || max_clusters[0] < 1) return layout;
  auto f = [&](int c) { return max_clusters[size_t(c - 1)]; };
  // at_least[x]: GPCs with >= x SMs. A GPC of S SMs holds floor(S / c) clusters of c, so
  // f(c) = sum over k >= 1 of at_least[k c], solved from the largest x down. Sizes past 16 cannot
  // be asked for: f(9) counts a GPC of 10-16 SMs once and one of 18 twice, f(10) every GPC of
  // 10-18 once, and no GPC has exactly 9 (S even), so f(9) - f(10) GPCs have 18 (none has 17).
  std::array<int, kMax + 2> at_least{};
  at_least[kMax] = at_least[kMax - 1] = f(9) - f(10);
  for (int x = GpcLayout::kMaxCluster; x >= 1; --x) {
    int more = 0;
    for (int k = 2; k * x <= kMax; ++k) more += at_least[size_t(k * x)];
    at_least[size_t(x)] = f(x) - more;
  }
  for (int s = 1; s <= kMax; ++s) {
    layout.gpcs_of_size[size_t(s)] = at_least[size_t(s)] - at_least[size_t(s + 1)];
    if (layout.gpcs_of_size[size_t(s)] < 0 || (s % 2 == 1 && layout.gpcs_of_size[size_t(s)] != 0)) return GpcLayout{};
  }
  for (int c = 1; c <= GpcLayout::kMaxCluster; ++c) {  // the layout must give back every count
    int n = 0;
    for (int s = 1; s <= kMax; ++s) n += layout.gpcs_of_size[size_t(s)] * (s / c);
    if (n != f(c)) return GpcLayout{};
  }
  layout.known = true;
  return layout;
}

}  // namespace taxfree
