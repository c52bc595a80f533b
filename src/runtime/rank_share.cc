#include "taxfree/runtime/rank_share.h"

#include "taxfree/runtime/call_deadline.h"
#include "taxfree/runtime/error.h"

namespace taxfree {

void check_rank_share(const RankShare& s, const char* op) {
  TF_REQUIRE(s.heap != nullptr && s.world >= 1 && s.rank >= 0 && s.rank < s.world && s.sm_count >= 1,
             Status::InvalidArgument,
             op << ": rank share of rank " << s.rank << " of " << s.world << " with " << s.sm_count << " SMs, "
                << (s.heap ? "a heap" : "no heap") << " (needs a heap, 0 <= rank < world and SMs >= 1)");
  // Every bounded device wait polls the abort flag and records into the wait record.
  TF_REQUIRE(s.fault.abort != nullptr && s.fault.record != nullptr && s.fault.timeout_ns > 0 && s.fault.rank == s.rank,
             Status::InvalidArgument,
             op << ": rank share of rank " << s.rank << " has no fault state (abort flag "
                << static_cast<const void*>(s.fault.abort) << ", wait record " << static_cast<const void*>(s.fault.record)
                << ", timeout " << s.fault.timeout_ns << " ns, rank " << s.fault.rank
                << "; Team::share() gives a rank's)");
  const dev::SymmetricView& v = s.heap->view();
  TF_REQUIRE(v.rank == s.rank && v.world == s.world, Status::InvalidArgument,
             op << ": rank share of rank " << s.rank << " of " << s.world << ", but its heap is rank " << v.rank
                << " of " << v.world);
  // Checked here, at the op's construction, with CallDeadline's own rule (not at a launch).
  TF_REQUIRE(s.coordinator == nullptr || (s.nccl_call_limit_s > 0 && s.nccl_call_limit_s <= kCallDeadlineMaxS),
             Status::InvalidArgument,
             op << ": rank share of rank " << s.rank << " has a coordinator and an NCCL call limit of "
                << s.nccl_call_limit_s << " s (needs (0, " << kCallDeadlineMaxS << "] s)");
}

}  // namespace taxfree
