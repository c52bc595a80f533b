// Programmatic dependent launch (PTX griddepcontrol, sm_90): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may have CTAs resident before the grid ahead of
// it on the stream has finished, so its launch and CTA setup overlap that grid's tail.
//
// Contract for a kernel launched that way: call wait_prior_grid() before the first read or write of
// memory that the grid ahead may touch (its outputs, and anything it reads that this kernel
// writes); it returns once that grid has completed and its memory operations are visible. Without
// the launch attribute it returns at once. It cannot time out: the grid ahead finishes on its own
// (it never waits for this one).
// allow_dependent_grid() lets the kernel behind this one on the stream be scheduled early (once
// every CTA of this grid has called it or exited); it does not make this grid's writes visible to
// that kernel, whose own wait_prior_grid() still waits for this grid's completion. Safe anywhere,
// also for kernels that need all their CTAs resident: every CTA of this grid is running before a
// dependent CTA is placed. Not free: dependent CTAs placed early on SMs this grid leaves idle
// slowed a memory-bound grid of one CTA per SM by up to 10% (the fused decode kernel, r137).
#pragma once

namespace taxfree::dev {

__device__ __forceinline__ void wait_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grid() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace taxfree::dev
