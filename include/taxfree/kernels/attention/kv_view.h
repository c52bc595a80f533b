// Where K and V rows live, and which tokens of each sequence a launch attends to.
//
// One POD view covers the contiguous cache and both paged layouts; the kernel is templated on
// `paged` so the contiguous path has no block-table load. Element offsets are int64 (a 512K-token
// cache of 16 x 12 heads is > 2^31 elements); token positions and page ids are int32.
//
//   layout          K/V storage                        stride_page     stride_head  stride_token
//   contiguous      [batch][kv_heads][capacity][D]     kv_heads*cap*D  cap*D        D
//   paged HND       [pages][kv_heads][page_size][D]    kv_heads*P*D    P*D          D
//   paged NHD       [pages][page_size][kv_heads][D]    P*kv_heads*D    D            kv_heads*D
//
// Row (b, h, pos) of K is at k + page*stride_page + h*stride_head + off*stride_token, where for
// contiguous caches page = b, off = pos, and for paged caches page = block_table[b][pos >> shift],
// off = pos & (page_size - 1). K and V share strides and the block table.
//
// Contract (checked on the host by launch functions when host mirrors are given): k, v 16-byte
// aligned; strides multiples of 8 elements; 0 <= slice_start[b], 0 <= slice_len[b],
// slice_start[b] + slice_len[b] <= capacity; block-table entries covering a slice in [0, pages).
// On the device, out-of-contract starts/lengths are clamped to [0, capacity], and a block-table
// entry outside [0, pages) (a slice_len past the pages filled in, say) reads page 0, so nothing
// outside the cache is read (the result is then unspecified, but never an out-of-bounds access).
#pragma once

#include <cstdint>

#include "taxfree/kernels/attention/config.h"

namespace taxfree::attention {

struct KvView {
  const void* k;
  const void* v;
  int64_t stride_page;
  int64_t stride_head;
  int64_t stride_token;
  const int32_t* block_table;  // paged: [batch][max_pages]; contiguous: unused (may be null)
  int32_t max_pages;           // paged: row length of block_table
  int32_t num_pages;           // paged: pages in k (and in v)
  int32_t page_shift;          // paged: log2(page_size)
  int32_t capacity;            // tokens addressable per sequence (contiguous: the seq dim;
                               // paged: max_pages << page_shift)
  const int32_t* slice_start;  // [batch] first token of this launch's slice; null = all 0
  const int32_t* slice_len;    // [batch] tokens in the slice (0 = empty)
};

// Half-open token range [begin, end) of one sequence.
struct TokenRange {
  int begin;
  int end;
};

// Clamp a (start, len) pair to [0, capacity]; see the contract above.
TF_HD inline TokenRange clamp_slice(int64_t start, int64_t len, int capacity) {
  int64_t b = start < 0 ? 0 : (start > capacity ? capacity : start);
  int64_t e = start + (len < 0 ? 0 : len);
  e = e < b ? b : (e > capacity ? capacity : e);
  return {int(b), int(e)};
}

// The tiles one split of a sequence covers. A sequence's tiles are those overlapping its slice,
// [floor(begin/16), ceil(end/16)); they are dealt to splits in contiguous runs of `per_split`
// tiles (at least kMinTilesPerSplit), so every split below `splits` is non-empty and every tile
// is in exactly one split. An empty slice has one (empty) split, so it still yields a partial
// (lse = -inf, o = 0). Splits >= `splits` get an empty range and must not take part in the
// combine (the arrival count is `splits`).
struct SplitRange {
  int tile_begin;  // absolute tile index (token position / kTileTokens)
  int tile_end;
  int splits;      // effective split count of this sequence, 1..num_splits
};

TF_HD inline SplitRange split_range(TokenRange slice, int num_splits, int split) {
  if (slice.end <= slice.begin) return {0, 0, 1};
  const int first = slice.begin >> kTileShift;
  const int last = (slice.end + kTileTokens - 1) >> kTileShift;
  const int n = last - first;
  int per_split = (n + num_splits - 1) / num_splits;
  if (per_split < kMinTilesPerSplit) per_split = kMinTilesPerSplit;
  const int splits = (n + per_split - 1) / per_split;
  const int64_t tb = int64_t(first) + int64_t(split) * per_split;
  const int begin = tb > last ? last : int(tb);
  const int end = begin + per_split > last ? last : begin + per_split;
  return {begin, end, splits};
}

#if defined(__CUDACC__)
// This launch's slice of sequence b.
__device__ inline TokenRange slice_of(const KvView& kv, int b) {
  const int start = kv.slice_start ? __ldg(kv.slice_start + b) : 0;
  return clamp_slice(start, __ldg(kv.slice_len + b), kv.capacity);
}

// Element offset of the first element of token `pos`, head h, sequence b. For paged caches the
// caller passes the page (block_table entry) of `pos`; tiles never straddle pages, so one lookup
// serves the 16 rows of a tile (rows follow at stride_token).
template <bool kPaged>
__device__ inline int64_t row_offset(const KvView& kv, int b, int h, int pos, int page) {
  if constexpr (kPaged) {
    return int64_t(page) * kv.stride_page + int64_t(h) * kv.stride_head +
           int64_t(pos & ((1 << kv.page_shift) - 1)) * kv.stride_token;
  } else {
    (void)page;
    return int64_t(b) * kv.stride_page + int64_t(h) * kv.stride_head + int64_t(pos) * kv.stride_token;
  }
}

// Page of token `pos` of sequence b (paged caches); an entry outside [0, num_pages) gives page 0.
__device__ inline int page_of(const KvView& kv, int b, int pos) {
  const int page = __ldg(kv.block_table + int64_t(b) * kv.max_pages + (pos >> kv.page_shift));
  return unsigned(page) < unsigned(kv.num_pages) ? page : 0;
}
#endif

}  // namespace taxfree::attention
