// Warpgroup MMA (wgmma) for the Hopper GEMM: shared-memory descriptors and m64nNk16 wrappers with
// fp32 accumulators and bf16/fp16 operands (sm_90a, device only).
//
// Operand tiles in shared memory are written by TMA with 128-byte swizzle into buffers aligned to
// 1024 bytes (the swizzle pattern repeats every 8 rows of 128 B; the descriptor's base-offset field
// stays 0 only at that alignment). Two layouts occur:
//   K-major  (A, and B stored [N, K]): rows of 64 K-elements (128 B), one row per M/N index.
//            8-row groups are 1024 B apart (SBO); LBO is unused with swizzling (encoded as 1). A
//            k16 step is +32 B inside the 128 B row: the hardware applies the XOR to the address.
//   MN-major (B stored [K, N]): TMA boxes of 64 N-elements (128 B) x 64 K-rows (8 KiB each), one
//            box per 64 columns of N. 8-K-row groups are 1024 B apart (SBO); the next 64 columns
//            of N are one box (8 KiB) further (LBO). A k16 step is 16 K-rows = +2048 B.
// Swap-AB kernels use B as wgmma's A operand (64 N-rows: one K-major row block or one MN-major
// box, so LBO is never reached) with the transpose-A bit for MN-major, and A as the K-major B.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace taxfree::gemm::device {

enum class Major { K, MN };

// Descriptor layout (PTX ISA "matrix descriptor"): [13:0] start >> 4, [29:16] LBO >> 4,
// [45:32] SBO >> 4, [51:49] base offset (0: 1024-aligned atoms), [63:62] swizzle (1 = 128 B).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

template <Major kMajor>
struct SwizzledOperand {
  static constexpr uint32_t kLbo = kMajor == Major::K ? 16 : 64 * 128;
  static constexpr uint32_t kSbo = 1024;
  static constexpr uint32_t kK16StepBytes = kMajor == Major::K ? 32 : 16 * 128;
  // Descriptor of the k16 slice `k16` of the operand tile starting at `tile` (a 1024-aligned
  // shared address).
  __device__ static __forceinline__ uint64_t desc(uint32_t tile, int k16) {
    return smem_desc(tile + k16 * kK16StepBytes, kLbo, kSbo);
  }
};

// Orders prior register writes (and the generic-proxy view of shared memory) before the next
// wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most `kPending` committed wgmma groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Pins the accumulators at this point of the program: without it the compiler may move their
// reads or writes into the window where an asynchronous wgmma owns them (ptxas then serialises
// the wgmma chain, warning C7515).
template <int kRegs>
__device__ __forceinline__ void fence_accumulators(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define TF_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define TF_WG_R1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TF_WG_R2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define TF_WG_R3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define TF_WG_R4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define TF_WG_R5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define TF_WG_R6 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define TF_WG_R7 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define TF_WG_F4(i) "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3])
#define TF_WG_F8(i) TF_WG_F4(i), TF_WG_F4((i) + 4)
#define TF_WG_F16(i) TF_WG_F8(i), TF_WG_F8((i) + 8)
// One wgmma with D += A * B (scale-d != 0) or D = A * B (scale-d == 0); A and B from descriptors.
// IA, IB, IS, ITA, ITB: operand numbers of the A descriptor, B descriptor, scale-d, transpose-A and
// transpose-B.
#define TF_WG_ASM(N, TY, DREGS, IA, IB, IS, ITA, ITB)                                                  \
  "{\n .reg .pred p;\n setp.ne.b32 p, " IS ", 0;\n wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY \
  "." TY " {" DREGS "}, " IA ", " IB ", p, 1, 1, " ITA ", " ITB ";\n}\n"
#define TF_WG_CALL(N, DREGS, IA, IB, IS, ITA, ITB, ...)                                                  \
  if constexpr (kBf16)                                                                                  \
    asm volatile(TF_WG_ASM(N, "bf16", DREGS, IA, IB, IS, ITA, ITB)                                     \
                 : __VA_ARGS__                                                                          \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB));                \
  else                                                                                                  \
    asm volatile(TF_WG_ASM(N, "f16", DREGS, IA, IB, IS, ITA, ITB)                                      \
                 : __VA_ARGS__                                                                          \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d), "n"(kTransA), "n"(kTransB))

// d (N/2 fp32 per thread, the m64nNk16 accumulator fragment) = A(64x16) * B(16xN) [+ d].
// Each operand is K-major or MN-major (transpose bit). T is __nv_bfloat16 or __half.
template <int N, class T, Major kMajorA, Major kMajorB>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], uint64_t a_desc, uint64_t b_desc,
                                             uint32_t scale_d) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or fp16 operands");
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr int kTransA = kMajorA == Major::MN ? 1 : 0;
  constexpr int kTransB = kMajorB == Major::MN ? 1 : 0;
  if constexpr (N == 256) {
    TF_WG_CALL(256, TF_WG_R0 ", " TF_WG_R1 ", " TF_WG_R2 ", " TF_WG_R3 ", " TF_WG_R4 ", " TF_WG_R5 ", " TF_WG_R6
                        ", " TF_WG_R7,
               "%128", "%129", "%130", "%131", "%132", TF_WG_F16(0), TF_WG_F16(16), TF_WG_F16(32), TF_WG_F16(48),
               TF_WG_F16(64), TF_WG_F16(80), TF_WG_F16(96), TF_WG_F16(112));
  } else if constexpr (N == 224) {
    TF_WG_CALL(224, TF_WG_R0 ", " TF_WG_R1 ", " TF_WG_R2 ", " TF_WG_R3 ", " TF_WG_R4 ", " TF_WG_R5 ", " TF_WG_R6,
               "%112", "%113", "%114", "%115", "%116", TF_WG_F16(0), TF_WG_F16(16), TF_WG_F16(32), TF_WG_F16(48),
               TF_WG_F16(64), TF_WG_F16(80), TF_WG_F16(96));
  } else if constexpr (N == 192) {
    TF_WG_CALL(192, TF_WG_R0 ", " TF_WG_R1 ", " TF_WG_R2 ", " TF_WG_R3 ", " TF_WG_R4 ", " TF_WG_R5, "%96", "%97",
               "%98", "%99", "%100", TF_WG_F16(0), TF_WG_F16(16), TF_WG_F16(32), TF_WG_F16(48), TF_WG_F16(64),
               TF_WG_F16(80));
  } else if constexpr (N == 168) {
    TF_WG_CALL(168, TF_WG_R0 ", " TF_WG_R1 ", " TF_WG_R2 ", " TF_WG_R3 ", " TF_WG_R4 ", %80, %81, %82, %83", "%84",
               "%85", "%86", "%87", "%88", TF_WG_F16(0), TF_WG_F16(16), TF_WG_F16(32), TF_WG_F16(48), TF_WG_F16(64),
               TF_WG_F4(80));
  } else if constexpr (N == 128) {
    TF_WG_CALL(128, TF_WG_R0 ", " TF_WG_R1 ", " TF_WG_R2 ", " TF_WG_R3, "%64", "%65", "%66", "%67", "%68",
               TF_WG_F16(0), TF_WG_F16(16), TF_WG_F16(32), TF_WG_F16(48));
  } else if constexpr (N == 64) {
    TF_WG_CALL(64, TF_WG_R0 ", " TF_WG_R1, "%32", "%33", "%34", "%35", "%36", TF_WG_F16(0), TF_WG_F16(16));
  } else if constexpr (N == 32) {
    TF_WG_CALL(32, TF_WG_R0, "%16", "%17", "%18", "%19", "%20", TF_WG_F16(0));
  } else {
    static_assert(N == 16, "instantiated wgmma widths: 16, 32, 64, 128, 168, 192, 224, 256");
    TF_WG_CALL(16, "%0, %1, %2, %3, %4, %5, %6, %7", "%8", "%9", "%10", "%11", "%12", TF_WG_F8(0));
  }
}

#undef TF_WG_CALL
#undef TF_WG_ASM
#undef TF_WG_F16
#undef TF_WG_F8
#undef TF_WG_F4
#undef TF_WG_R7
#undef TF_WG_R6
#undef TF_WG_R5
#undef TF_WG_R4
#undef TF_WG_R3
#undef TF_WG_R2
#undef TF_WG_R1
#undef TF_WG_R0

}  // namespace taxfree::gemm::device
