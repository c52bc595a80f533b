// Scoped loads, stores, atomics and fences (PTX memory model, sm_70+).
//
// Every cross-GPU synchronization in taxfree goes through these, with the semantics and scope
// written at the call site: `load<Sem::acquire, Scope::sys>(flag)`.
//
//  Sem      relaxed: atomic, no ordering.  acquire: later accesses of this thread stay after it.
//           release: earlier accesses of this thread (and, cumulatively, what this thread has
//           observed, e.g. through __syncthreads) become visible before it.  acq_rel: both.
//  Scope    cta: threads of one block.  gpu: all threads of this GPU.  sys: every GPU and the
//           host, i.e. the scope needed for peer memory over NVLink and for host-mapped memory.
//
// Loads take relaxed/acquire, stores relaxed/release, read-modify-writes any Sem (red_add, which
// returns nothing: relaxed/release); other combinations do not compile. Pointers must be naturally aligned (4 or 8 bytes) and point to
// global memory (local heap, a peer's heap through SymmetricView::peer, or host-mapped memory).
#pragma once

#include <cstdint>

namespace taxfree::dev {

enum class Sem { relaxed, acquire, release, acq_rel };
enum class Scope { cta, gpu, sys };

namespace detail {
template <class T>
inline constexpr bool is_word = sizeof(T) == 4 || sizeof(T) == 8;
}

// Expands BODY(sem_string, scope_string) for the (S, Sc) pair chosen at compile time.
#define TF_SCOPED_DISPATCH(S, Sc, SEMS, BODY)                         \
  if constexpr (Sc == Scope::cta) { SEMS(S, BODY, "cta") }            \
  else if constexpr (Sc == Scope::gpu) { SEMS(S, BODY, "gpu") }       \
  else { SEMS(S, BODY, "sys") }
#define TF_SEMS_LOAD(S, BODY, SC)                                            \
  static_assert(S == Sem::relaxed || S == Sem::acquire, "loads are relaxed or acquire"); \
  if constexpr (S == Sem::relaxed) { BODY("relaxed", SC) } else { BODY("acquire", SC) }
#define TF_SEMS_STORE(S, BODY, SC)                                           \
  static_assert(S == Sem::relaxed || S == Sem::release, "stores are relaxed or release"); \
  if constexpr (S == Sem::relaxed) { BODY("relaxed", SC) } else { BODY("release", SC) }
#define TF_SEMS_RMW(S, BODY, SC)                                             \
  if constexpr (S == Sem::relaxed) { BODY("relaxed", SC) }                   \
  else if constexpr (S == Sem::acquire) { BODY("acquire", SC) }             \
  else if constexpr (S == Sem::release) { BODY("release", SC) }             \
  else { BODY("acq_rel", SC) }
#define TF_SEMS_RED(S, BODY, SC)                                             \
  static_assert(S == Sem::relaxed || S == Sem::release, "reductions are relaxed or release"); \
  if constexpr (S == Sem::relaxed) { BODY("relaxed", SC) } else { BODY("release", SC) }

template <Sem S, Scope Sc, class T>
__device__ __forceinline__ T load(const T* p) {
  static_assert(detail::is_word<T>, "4- or 8-byte words only");
  T v;
  if constexpr (sizeof(T) == 8) {
    uint64_t r;
#define TF_BODY(SEM, SC) asm volatile("ld." SEM "." SC ".global.b64 %0, [%1];" : "=l"(r) : "l"(p) : "memory");
    TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_LOAD, TF_BODY)
#undef TF_BODY
    __builtin_memcpy(&v, &r, 8);
  } else {
    uint32_t r;
#define TF_BODY(SEM, SC) asm volatile("ld." SEM "." SC ".global.b32 %0, [%1];" : "=r"(r) : "l"(p) : "memory");
    TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_LOAD, TF_BODY)
#undef TF_BODY
    __builtin_memcpy(&v, &r, 4);
  }
  return v;
}

template <Sem S, Scope Sc, class T>
__device__ __forceinline__ void store(T* p, T v) {
  static_assert(detail::is_word<T>, "4- or 8-byte words only");
  if constexpr (sizeof(T) == 8) {
    uint64_t r;
    __builtin_memcpy(&r, &v, 8);
#define TF_BODY(SEM, SC) asm volatile("st." SEM "." SC ".global.b64 [%0], %1;" ::"l"(p), "l"(r) : "memory");
    TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_STORE, TF_BODY)
#undef TF_BODY
  } else {
    uint32_t r;
    __builtin_memcpy(&r, &v, 4);
#define TF_BODY(SEM, SC) asm volatile("st." SEM "." SC ".global.b32 [%0], %1;" ::"l"(p), "r"(r) : "memory");
    TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_STORE, TF_BODY)
#undef TF_BODY
  }
}

// Returns the old value.
template <Sem S, Scope Sc>
__device__ __forceinline__ uint64_t fetch_add(uint64_t* p, uint64_t v) {
  uint64_t old;
#define TF_BODY(SEM, SC) asm volatile("atom." SEM "." SC ".global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RMW, TF_BODY)
#undef TF_BODY
  return old;
}
template <Sem S, Scope Sc>
__device__ __forceinline__ uint32_t fetch_add(uint32_t* p, uint32_t v) {
  uint32_t old;
#define TF_BODY(SEM, SC) asm volatile("atom." SEM "." SC ".global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RMW, TF_BODY)
#undef TF_BODY
  return old;
}

// Add without a return value (`red`): the producer side of a counter flag.
template <Sem S, Scope Sc>
__device__ __forceinline__ void red_add(uint64_t* p, uint64_t v) {
#define TF_BODY(SEM, SC) asm volatile("red." SEM "." SC ".global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RED, TF_BODY)
#undef TF_BODY
}
template <Sem S, Scope Sc>
__device__ __forceinline__ void red_add(uint32_t* p, uint32_t v) {
#define TF_BODY(SEM, SC) asm volatile("red." SEM "." SC ".global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RED, TF_BODY)
#undef TF_BODY
}

// Compare-and-swap; returns the old value (the swap happened iff old == expected).
template <Sem S, Scope Sc>
__device__ __forceinline__ uint64_t cas(uint64_t* p, uint64_t expected, uint64_t desired) {
  uint64_t old;
#define TF_BODY(SEM, SC) asm volatile("atom." SEM "." SC ".global.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(p), "l"(expected), "l"(desired) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RMW, TF_BODY)
#undef TF_BODY
  return old;
}
template <Sem S, Scope Sc>
__device__ __forceinline__ uint32_t cas(uint32_t* p, uint32_t expected, uint32_t desired) {
  uint32_t old;
#define TF_BODY(SEM, SC) asm volatile("atom." SEM "." SC ".global.cas.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(expected), "r"(desired) : "memory");
  TF_SCOPED_DISPATCH(S, Sc, TF_SEMS_RMW, TF_BODY)
#undef TF_BODY
  return old;
}

#undef TF_SCOPED_DISPATCH
#undef TF_SEMS_LOAD
#undef TF_SEMS_STORE
#undef TF_SEMS_RMW
#undef TF_SEMS_RED

// fence.acq_rel.<scope>: orders this thread's earlier and later accesses at that scope.
template <Scope Sc>
__device__ __forceinline__ void fence_acq_rel() {
  if constexpr (Sc == Scope::cta) asm volatile("fence.acq_rel.cta;" ::: "memory");
  else if constexpr (Sc == Scope::gpu) asm volatile("fence.acq_rel.gpu;" ::: "memory");
  else asm volatile("fence.acq_rel.sys;" ::: "memory");
}

// Orders generic-proxy accesses against async-proxy (TMA / cp.async.bulk) accesses to global
// memory: after acquiring a flag and before TMA reads the data it guards; after a bulk store has
// completed (cp.async.bulk.wait_group 0) and before releasing a flag that publishes it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
// Same for shared memory written by ordinary stores and then read by TMA stores or wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Nanoseconds of the GPU's global timer (coarse, ~1 us ticks on some parts): for deadlines only.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Sleeps about `ns` nanoseconds (fault injection and tests: never on a fast path).
__device__ __forceinline__ void sleep_for_ns(uint64_t ns) {
  for (const uint64_t start = global_timer_ns(); global_timer_ns() - start < ns;) __nanosleep(1000);
}

// The SM this thread runs on (diagnostics: where a scheduler placed a CTA).
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

}  // namespace taxfree::dev
