// What a device wait does when it cannot finish: the team-wide abort flag and the diagnostic
// record. Shared by host and device (plain PODs); both live in host-mapped pinned memory so the
// host can raise the abort flag while a kernel runs, and can read the record after a kernel has
// given up (even if the CUDA context is no longer usable).
#pragma once

#include <cstdint>

namespace taxfree::dev {

// Which wait gave up. Stable numbers: they are printed by the host (wait_site_name()); 8 is retired
// (flash_decode's fused kernel has no "buffer free" wait).
enum class WaitSite : uint32_t {
  none = 0,
  test_signal = 1,        // tests
  barrier = 2,            // device-side cross-rank barrier
  all_gather_ready = 3,   // all_gather push: peer's buffer is free for this launch
  all_gather_data = 4,    // all_gather push: peer's shard has arrived
  ping_pong = 5,          // signal latency benchmark
  gemm_a_ready = 6,       // fused GEMM: an A tile has arrived
  decode_partial = 7,     // flash_decode fused: a peer's partial has arrived
  ksplit_partial = 9,     // all_gather_matmul ksplit: a peer's partial slice arrived
  nsplit_block = 10,      // all_gather_matmul nsplit: a peer's column block of C arrived
  ksplit_sum = 11,        // all_gather_matmul ksplit: the owner's summed slice of C arrived
  decode_cluster_rows = 12,  // flash_decode fused: the cluster's splits' rows reached this CTA
  ksplit_a_lines = 13,    // all_gather_matmul ksplit (skinny): a peer's A_shard lines arrived
};

// Filled once per team by the first wait that expires; later ones only raise the abort flag.
struct WaitRecord {
  uint32_t claimed;      // 0 = empty; the reporter takes it with a CAS
  uint32_t complete;     // set last: the host trusts the fields only when complete == 1
  uint32_t site;         // WaitSite
  int32_t rank;          // the rank that waited
  int32_t peer;          // the rank it waited for (-1 when not one peer)
  uint32_t block, thread;
  uint64_t flag_offset;  // byte offset of the flag in the symmetric heap (~0 when not in the heap)
  uint64_t expected;     // wait condition: flag >= expected
  uint64_t observed;     // last value read
  uint64_t waited_ns;
};

// Passed to kernels by value.
struct FaultContext {
  uint32_t* abort = nullptr;     // host-mapped; nonzero: every wait of this rank gives up
  WaitRecord* record = nullptr;  // host-mapped
  const char* heap_base = nullptr;
  uint64_t timeout_ns = 10'000'000'000ull;
  int rank = 0;
};

}  // namespace taxfree::dev
