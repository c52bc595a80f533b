// Byte ranges of buffers, for the ops' aliasing checks (host only, no CUDA).
#pragma once

#include <algorithm>
#include <cstdint>

namespace taxfree {

// Bytes [begin, end) of a buffer; empty (begin == end) for a null pointer or no bytes.
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};

inline ByteRange byte_range(const void* p, int64_t bytes) {
  const auto b = reinterpret_cast<uintptr_t>(p);
  return p == nullptr || bytes <= 0 ? ByteRange{} : ByteRange{b, b + uintptr_t(bytes)};
}

// A row-major rows x cols matrix of `elem_bytes` elements with row stride `ld` (elements): from its
// first element to the end of its last row.
inline ByteRange matrix_range(const void* p, int64_t rows, int64_t cols, int64_t ld, int64_t elem_bytes) {
  return rows <= 0 || cols <= 0 ? ByteRange{} : byte_range(p, ((rows - 1) * ld + cols) * elem_bytes);
}

inline bool overlap(ByteRange x, ByteRange y) { return std::max(x.begin, y.begin) < std::min(x.end, y.end); }

}  // namespace taxfree
