// Kernel argument structs of the decode and combine kernels (plain PODs, passed by value as
// __grid_constant__). Includable from host C++: the host launch code fills them.
//
// Layouts (row-major, element strides in brackets are implied by the shapes):
//   q         [batch][q_heads][D]             T (bf16/fp16), 16-byte aligned
//   o_part    [batch][q_heads][D]             fp32, normalised partial of this launch's slices
//   lse_part  [batch][q_heads]                fp32, natural-log LSE of scaled scores
//   out       [batch][q_heads][D]             T, final (normalised) output
//   ws_o      [batch][kv_heads][num_splits][group][D]  fp32 per-split partials
//   ws_lse    [batch][kv_heads][num_splits][group]
//   ws_count  [batch][kv_heads]               int32 arrival counters, 0 between launches
// Query head h uses KV head h / group (group = q_heads / kv_heads, 1..16).
//
// Batch order: CTA position z of the decode grid (blockIdx.z; in the fused kernel's persistent
// schedule, item i's position i / num_splits / kv_heads) attends sequence batch_order[z] when
// batch_ordered, else z.
// Any permutation gives the same results; it decides which CTAs the hardware (or the fused
// kernel's tickets) starts first.
#pragma once

#include <vector_types.h>  // uint4

#include <cstdint>

#include "taxfree/device/fault.cuh"
#include "taxfree/device/launch_sequence.cuh"
#include "taxfree/device/symmetric_view.cuh"
#include "taxfree/kernels/attention/kv_view.h"

namespace taxfree::attention {

struct DecodeParams {
  KvView kv;
  const void* q;
  int batch;
  int q_heads;
  int kv_heads;
  int group;
  int num_splits;    // grid.x; per-sequence effective splits come from split_range
  int batch_ordered; // 0: position z is sequence z; else batch_order[0, batch) is a permutation
  float scale_log2;  // softmax_scale * log2(e)
  float* ws_o;       // only read/written when a sequence has > 1 effective split
  float* ws_lse;
  int* ws_count;
  float* o_part;     // any of the three outputs may be null
  float* lse_part;
  void* out;
  // Last: the fields every CTA reads first share constant-cache lines (batch_ordered among them).
  uint8_t batch_order[kMaxOrderedBatch];
};

// The sequence at position `pos` of the launch's batch order.
TF_HD inline int batch_at(const DecodeParams& p, int pos) {
  return p.batch_ordered ? int(p.batch_order[pos]) : pos;
}

// Cross-rank (BSP) combine: `world` partials laid out with a stride between ranks, so both the
// dense [world][batch][q_heads][D] + [world][batch][q_heads] layout and one interleaved buffer per
// rank ([O block | LSE block], one all-gather) are expressible.
struct CombineParams {
  const float* o_parts;     // rank r, row i: o_parts[r*o_rank_stride + i*D + d]; row i = b*q_heads+h
  int64_t o_rank_stride;    // elements; multiple of 4
  const float* lse_parts;   // lse_parts[r*lse_rank_stride + i]
  int64_t lse_rank_stride;
  int world;
  int64_t rows;             // batch * q_heads
  void* out;                // [rows][D] T, or null
  float* o_out;             // [rows][D] fp32, or null
  float* lse_out;           // [rows] fp32, or null
};

// Fused multi-rank decode (fused_decode_kernel.h). Each rank's inbox of LL lines
// (partial_exchange.h) holds, per parity, one block of rows * ll_lines_per_row(D) lines per
// sending rank: group g = b*kv_heads + kvh of sender r starts at line
// r*rows*ll_lines_per_row(D) + g*group*ll_lines_per_row(D) of the launch's parity.
struct FusedDecodeParams {
  DecodeParams d;           // this rank's slices and split workspace; d.out = the final output
  dev::SymmetricView view;  // rank, world, peer translation
  uint4* ll;                // heap: 2 parities of parity_lines lines; epoch e uses fused_inbox_span(e, ..)
  int64_t parity_lines;     // FlashDecodeBuffers::fused_parity_lines: world x the op's largest rows x
                            // ll_lines_per_row(its largest head_dim), plus the direct region if configured
  int64_t rows;             // batch * q_heads
  dev::LaunchSequence seq;  // epochs
  dev::LaunchSequence work; // persistent schedule: the items' tickets (dev::work_take)
  dev::FaultContext fault;  // deadline, abort flag, wait record
  int items;                // d.num_splits * batch * kv_heads work items (fused_schedule.h)
  // 0: persistent grid, splits merged through global memory (FusedSchedule::persistent), or the
  // direct schedule when `direct`;
  // C >= 2: clustered schedule (FusedSchedule::clustered), grid = items in clusters of
  // C = d.num_splits CTAs, splits merged in distributed shared memory (fused_schedule.h).
  int cluster;
  // Direct schedule (cluster 0, grid = items, all resident; fused_schedule.h): its region of each
  // parity starts direct_begin lines in, senders direct_sender_lines apart (direct_line).
  int direct;
  int64_t direct_begin;
  int64_t direct_sender_lines;
  int skip_signal;          // fault injection: never send partials to peers (tests the timeout path)
  // Fault injection: every CTA sleeps this long between sending its partial and reading its
  // peers' (0: never), so peers run a launch ahead: exposes inbox reuse races.
  uint32_t combine_delay_ns;
  // Diagnostics, normally null: [gridDim.x][kFusedTraceEvents] %globaltimer ns per CTA of its last
  // item (FusedTraceEvent order; 0 = not reached), written by thread 0.
  uint64_t* trace;
};

// Points of the fused kernel's timeline that FusedDecodeParams::trace records, and last the SM the
// CTA ran on (not a time). synced: the group's split partials are all in (cluster barrier, or the
// split counter's last arrival); merged: the group's partial of this rank is ready to send (or, in a
// team of one, to store).
enum FusedTraceEvent { kTraceStart, kTraceAttended, kTraceSynced, kTraceMerged, kTracePushed, kTraceArrived,
                       kTraceCombined, kTraceEnd, kTraceSm, kFusedTraceEvents };

}  // namespace taxfree::attention
