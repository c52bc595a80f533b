#include "taxfree/runtime/symmetric_heap.h"

#include <nccl_device.h>

#include <sstream>

#include "taxfree/runtime/coordinator.h"
#include "taxfree/runtime/error.h"

namespace taxfree {

namespace {
std::string bytes_text(uint64_t b) {
  std::ostringstream os;
  os << b << " B";
  if (b >= (1ull << 20)) os << " (" << double(b) / double(1ull << 20) << " MiB)";
  return os.str();
}

// NCCL's window handle is device memory; its flat LSA addresses are read on the device.
__global__ void lsa_bases_kernel(ncclWindow_t win, int world, uintptr_t* out) {
  for (int p = threadIdx.x; p < world; p += blockDim.x)
    out[p] = reinterpret_cast<uintptr_t>(ncclGetLsaPointer(win, 0, p));
}
}  // namespace

uint64_t heap_place(uint64_t used, uint64_t capacity, uint64_t bytes, uint64_t align, const std::string& tag) {
  TF_REQUIRE(bytes > 0, Status::InvalidArgument, "symmetric heap allocation '" << tag << "' of 0 bytes");
  TF_REQUIRE(align >= 16 && (align & (align - 1)) == 0, Status::InvalidArgument,
             "symmetric heap alignment " << align << " for '" << tag << "' must be a power of two >= 16");
  const uint64_t offset = (used + align - 1) / align * align;
  TF_REQUIRE(offset <= capacity && bytes <= capacity - offset, Status::OutOfMemory,
             "symmetric heap exhausted: '" << tag << "' asked for " << bytes_text(bytes) << " (aligned to " << align
                                           << "), " << bytes_text(offset <= capacity ? capacity - offset : 0)
                                           << " free of " << bytes_text(capacity)
                                           << "; raise it with --heap or TAXFREE_HEAP_BYTES");
  return offset;
}

SymmetricHeap::SymmetricHeap(ncclComm_t comm, CoordinatorClient& coord, int rank, int world, uint64_t bytes,
                             bool check)
    : comm_(comm), coord_(&coord), check_(check), check_key_(check ? coord.next_key("heap-call") : "") {
  TF_REQUIRE(bytes > 0, Status::InvalidArgument, "symmetric heap size must be > 0");
  ncclTeam_t lsa = ncclTeamLsa(comm);
  TF_REQUIRE(lsa.nRanks == world, Status::NotSupported,
             "only " << lsa.nRanks << " of " << world
                     << " ranks can load/store each other's memory (one NVLink domain); taxfree's symmetric heap "
                        "needs all ranks in it");
  // The view indexes peers by communicator rank (bases[rank] below): the LSA team must number them so.
  TF_REQUIRE(lsa.rank == rank, Status::NotSupported,
             "rank " << rank << " is rank " << lsa.rank << " of NCCL's load/store team; taxfree's symmetric heap "
                     "needs the two numberings to agree");
  TF_NCCL(ncclMemAlloc(&registered_, bytes));
  try {
    TF_NCCL(ncclCommWindowRegister(comm, registered_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC));
    uintptr_t* d_bases = nullptr;
    TF_CUDA(cudaMalloc(&d_bases, sizeof(uintptr_t) * size_t(world)));
    lsa_bases_kernel<<<1, 128>>>(window_, world, d_bases);
    std::vector<uintptr_t> bases(static_cast<size_t>(world));
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpy(bases.data(), d_bases, sizeof(uintptr_t) * size_t(world), cudaMemcpyDeviceToHost);
    cudaFree(d_bases);
    TF_CUDA(e);
    const int64_t stride = world > 1 ? int64_t(bases[1] - bases[0]) : 0;
    for (int p = 1; p < world; ++p)
      TF_REQUIRE(int64_t(bases[size_t(p)] - bases[size_t(p - 1)]) == stride, Status::NotSupported,
                 "NCCL's window layout is not flat (rank " << p << " at stride "
                                                            << int64_t(bases[size_t(p)] - bases[size_t(p - 1)])
                                                            << ", rank 1 at " << stride << ")");
    view_.local_base = reinterpret_cast<char*>(bases[size_t(rank)]);
    view_.stride = stride;
    view_.size = bytes;
    view_.rank = rank;
    view_.world = world;
  } catch (...) {
    if (window_) ncclCommWindowDeregister(comm_, window_);
    ncclMemFree(registered_);
    throw;
  }
}

SymmetricHeap::SymmetricHeap(const dev::SymmetricView& view) : check_(false), view_(view) {
  TF_REQUIRE(view.local_base != nullptr && view.size > 0 && view.world >= 1 && view.rank >= 0 && view.rank < view.world,
             Status::InvalidArgument,
             "symmetric heap over caller memory: base " << static_cast<void*>(view.local_base) << ", " << view.size
                                                        << " B, rank " << view.rank << " of " << view.world);
}

SymmetricHeap::~SymmetricHeap() {
  if (window_) ncclCommWindowDeregister(comm_, window_);
  if (registered_) ncclMemFree(registered_);
}

void SymmetricHeap::check_collective(const std::string& what) {
  if (check_) require_same_call(*coord_, check_key_, "symmetric heap call", calls_, what, 60);
}

void* SymmetricHeap::allocate(uint64_t bytes, uint64_t align, const std::string& tag) {
  const uint64_t offset = heap_place(used_, view_.size, bytes, align, tag);
  std::ostringstream what;
  what << "allocate('" << tag << "', " << bytes << " B, align " << align << ") at offset " << offset;
  check_collective(what.str());
  ++calls_;
  used_ = offset + bytes;
  allocations_.push_back({offset, bytes, tag});
  return view_.local_base + offset;
}

dev::LaunchSequence SymmetricHeap::allocate_sequence(const std::string& tag) {
  // The whole 128-byte line, so no later allocation (of any alignment) shares it with the atomics.
  auto* words = static_cast<uint64_t*>(allocate(kSequenceBytes, kSequenceBytes, tag));
  // The legacy stream, synchronised: the zeroes land after any earlier user of these bytes (whose
  // work the release contract has finished) and before anything enqueued after this returns.
  TF_CUDA(cudaMemsetAsync(words, 0, 2 * sizeof(uint64_t), cudaStreamLegacy));
  TF_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
  return {words, reinterpret_cast<uint32_t*>(words + 1)};
}

uint64_t SymmetricHeap::array_bytes(uint64_t n, uint64_t elem, const std::string& tag) {
  TF_REQUIRE(n <= UINT64_MAX / elem, Status::InvalidArgument,
             "symmetric heap allocate_array('" << tag << "'): " << n << " elements of " << elem
                                               << " B overflow 64 bits");
  return n * elem;
}

void SymmetricHeap::release(uint64_t mark) {
  TF_REQUIRE(mark <= used_, Status::InvalidArgument,
             "symmetric heap release to mark " << mark << " above the used size " << used_);
  for (auto a = allocations_.rbegin(); a != allocations_.rend(); ++a)
    if (a->offset < mark) {  // the last allocation that stays must end at or before the mark
      TF_REQUIRE(mark - a->offset >= a->bytes, Status::InvalidArgument,
                 "symmetric heap release to mark " << mark << " inside the live allocation '" << a->tag << "' ["
                                                   << a->offset << ", " << a->offset + a->bytes
                                                   << "): a mark is a value mark() returned");
      break;
    }
  check_collective("release(" + std::to_string(mark) + ")");
  ++calls_;
  used_ = mark;
  while (!allocations_.empty() && allocations_.back().offset >= mark) allocations_.pop_back();
}

std::string SymmetricHeap::describe_offset(uint64_t offset) const {
  for (const Allocation& a : allocations_)
    if (offset >= a.offset && offset - a.offset < a.bytes)
      return "'" + a.tag + "' + " + std::to_string(offset - a.offset) + " B of a " + std::to_string(a.bytes) +
             "-byte allocation";
  return {};
}

void* SymmetricHeap::nccl_address(const void* flat) const {
  TF_REQUIRE(window_ != nullptr, Status::NotSupported,
             "symmetric heap over caller memory (simulated ranks) has no NCCL window");
  TF_REQUIRE(view_.contains(flat, 1), Status::InvalidArgument, "pointer " << flat << " is not in the symmetric heap");
  return static_cast<char*>(registered_) + view_.offset_of(flat);
}

}  // namespace taxfree
