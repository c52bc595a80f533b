// Low-latency (LL) lines: data and flag travel in the same store, so a receiver needs no separate
// flag and the sender no "buffer free" handshake when lines go to a staging buffer that alternates
// by epoch parity.
//
// A line is 16 bytes {d0, flag, d1, flag}: 8 data bytes and the launch's 32-bit flag (ll_flag of
// its epoch) twice, written and read by one 16-byte access, so a reader that sees the current flag
// in both halves has both data words of this launch. That relies on the hardware keeping each
// aligned 8-byte half of a 16-byte access whole, as NCCL's LL protocol does; the PTX memory model
// itself treats a .v4.u32 access as four 32-bit ones. (Packing each half as a .v2.b64 element
// would make it single-copy atomic in the model too: the same 16-byte loads and stores, but ptxas
// then schedules other instructions around them, so it waits for a GPU to measure.) Lines use
// volatile (relaxed, uncached) accesses; no fence is needed on either side. A wait that gives up
// records the flag, not the epoch, as the value it expected.
//
// Staging-slot reuse (epoch parity e & 1) is safe when every receiver also sends to every sender
// in each launch (all-gather, all-to-all): a sender at epoch e has received the receiver's lines of
// e-1, which the receiver wrote after finishing epoch e-2, the last reader of this slot. The two
// parities' slots must not overlap whatever each launch's size: a sender may write its lines of
// e+1 while the receiver still reads those of e.
#pragma once

#include <cstdint>

#include "taxfree/device/config.cuh"
#if defined(__CUDACC__)
#include "taxfree/device/signal.cuh"
#endif

namespace taxfree::dev {

// The flag the lines of epoch `epoch` carry: never 0, the value of a zeroed (never written) line,
// even once epochs pass 2^32. Flags repeat every 2^32 - 1 epochs: a line left unwritten for a
// multiple of that many launches would pass as current.
TF_HOST_DEVICE constexpr uint32_t ll_flag(uint64_t epoch) { return uint32_t(epoch % 0xffffffffull) + 1u; }

#if defined(__CUDACC__)
__device__ __forceinline__ void ll_store(uint4* line, uint32_t d0, uint32_t d1, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(d0), "r"(flag), "r"(d1),
               "r"(flag)
               : "memory");
}

// One read of `line` (no waiting), for a receiver that issues the reads of many lines before it
// checks any (one memory round trip for all of them); ll_current says whether it is this epoch's.
__device__ __forceinline__ uint4 ll_peek(const uint4* line) {
  uint4 x;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "l"(line)
               : "memory");
  return x;
}
__device__ __forceinline__ bool ll_current(uint4 x, uint32_t flag) { return x.y == flag && x.w == flag; }

// One read of the first 8-byte half of `line`, {d0, flag}: a single-copy-atomic unit of its own,
// so it suffices where a line's two data words are equal (a value sent twice) and halves the
// registers the read occupies. ll_half_current says whether it is this epoch's.
__device__ __forceinline__ uint2 ll_peek_half(const uint4* line) {
  uint2 x;
  asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(x.x), "=r"(x.y) : "l"(line) : "memory");
  return x;
}
__device__ __forceinline__ bool ll_half_current(uint2 x, uint32_t flag) { return x.y == flag; }

// The deadline of a poll loop, shared by ll_load and by callers that poll many lines at once: call
// once after each miss, i = 0, 1, 2, ..., with start 0 before the loop (set at the first call, not
// at i = 0: a wait past 2^32 misses must not restart its clock). Every 128 misses it reads the
// abort flag (host memory: sparingly) and the clock; returns true when the loop must give up:
// abort requested (waited_ns = 0), or fc.timeout_ns passed (waited_ns > 0: the caller reports the
// line it waited for with report_wait_timeout).
__device__ __forceinline__ bool ll_poll_expired(uint32_t i, uint64_t& start, const FaultContext& fc,
                                                uint64_t& waited_ns) {
  waited_ns = 0;
  if (start == 0) start = global_timer_ns();
  if ((i & 127u) != 127u) return false;
  if (abort_requested(fc)) return true;
  const uint64_t waited = global_timer_ns() - start;
  if (waited <= fc.timeout_ns) return false;
  waited_ns = waited;
  return true;
}

// Polls `line` until both halves carry `flag`; returns the data words in `out`. Gives up like
// wait_geq (deadline, abort flag, WaitRecord naming `site` and `peer`). `backoff_ns` > 0 sleeps
// that long (roughly) after each miss: for a long wait by one thread, so its polls take neither
// issue slots nor L2 bandwidth from the other CTA of its SM.
__device__ __forceinline__ bool ll_load(const uint4* line, uint32_t flag, uint2& out, const FaultContext& fc,
                                        WaitSite site, int peer, uint32_t backoff_ns = 0) {
  uint64_t start = 0, waited = 0;
  for (uint32_t i = 0;; ++i) {
    const uint4 x = ll_peek(line);
    if (ll_current(x, flag)) {
      out = make_uint2(x.x, x.z);
      return true;
    }
    if (backoff_ns != 0) __nanosleep(backoff_ns);
    if (ll_poll_expired(i, start, fc, waited)) {
      if (waited != 0) report_wait_timeout(fc, site, peer, line, flag, x.y != flag ? x.y : x.w, waited);
      return false;
    }
  }
}

#endif  // __CUDACC__

}  // namespace taxfree::dev
