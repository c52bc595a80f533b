// Private: inputs of the flash_decode benchmarks (`decode`, `flash_decode`): the issue's shapes,
// and reproducible values that the host can regenerate bit for bit (so a rank can compute the
// reference over its peers' KV without communication).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "taxfree/bench/op_bench.h"
#include "taxfree/ops/flash_decode.h"

namespace taxfree::flash_decode::bench_inputs {

struct Shape {
  int q_heads, kv_heads, head_dim, batch, kv;  // kv: tokens per sequence (per rank when distributed)
  int splits = 0;  // forced splits per (sequence, KV head); 0: the heuristic's
  int page = 0;    // paged cache: page size (power of two, 16-256), pages in a shuffled block table; 0: contiguous
  bool nhd = false;  // paged: NHD layout ([pages][page][kv_heads][D]) instead of HND
  bool ragged = false;  // sequence lengths drawn in [1, kv] (lens()) instead of all kv
  // Tokens of each sequence: kv, or when ragged a fixed pseudo-random draw in [1, kv] per
  // (batch, kv, sequence), the same on every run and machine.
  std::vector<int32_t> lens() const;
  int64_t kv_bytes() const;  // K + V bytes of the live tokens, 16-bit
  // Case params: batch, kv, heads ("96/12", the --shape form), q_heads, kv_heads, head_dim,
  // kv_bytes, splits, page, layout, ragged; and back.
  nlohmann::json params() const;
  static Shape from(const nlohmann::json& params);
  // The bench row: output elements as count, 16-bit bytes as size; `kv_suffix` follows the KV
  // length in the label ("/rank" when each rank holds that many tokens).
  bench::Case to_case(const std::string& dtype, const char* kv_suffix) const;
};

// A case's KV bytes read per second (algbw) and attention FLOPs per second (4 x q_heads x
// head_dim per live token: QK^T and PV).
bench::Figures figures(const bench::Case& c, double seconds);

// 96/12 heads x batch {1, 4, 16} x KV {8K, 32K, 128K, 512K}; 64/8 x batch {1, 8, 32} x KV {4K,
// 16K, 64K}; head_dim 128.
std::vector<Shape> issue_shapes();

// The shapes of --shape entries "k=v,..." (bench::parse_shape_entry) with keys batch, kv, heads
// (96/12 or 64/8) or q_heads and kv_heads (q_heads a multiple of kv_heads, at most kMaxGqaRatio per
// KV head: the op's rule, checked here), head_dim (64 or 128),
// splits (forced split count), page (paged cache: page size), layout (hnd or nhd, with page;
// hnd unless given) and ragged (1: lengths drawn in [1, kv]). An entry with batch and
// kv names a shape of any KV length (heads 96/12 and head_dim 128 unless given); any other entry
// selects the issue shapes whose batch, kv, heads and head_dim match its keys. splits applies to
// the shapes the entry names or selects. No entries: the issue shapes with the heuristic's
// choices. Numbers within the op's limits (batch, kv_heads <= 65535, kv <= 2^30, q_heads <= 16 x
// 65535, splits <= 64) and a named shape's K + V cache <= 2^50 bytes. Throws InvalidArgument naming
// a malformed entry, or one that selects none of the issue shapes.
std::vector<Shape> shapes_of(const std::vector<std::string>& entries);

// Value i of stream `seed`: k/256 for a hashed k in [-256, 256), exact in bf16 and fp16, so the
// device copy and a host regeneration agree bit for bit.
float value(uint64_t seed, uint64_t i);
// dst[i] = value(seed, i) in `dtype`, for i < n (device memory).
void fill(DType dtype, void* dst, size_t n, uint64_t seed, cudaStream_t stream);

// The index in value()'s stream of element e of token t of sequence b, KV head h: its offset in
// the contiguous cache [batch][kv_heads][kv][head_dim].
inline uint64_t kv_index(const Shape& s, int b, int h, int64_t t, int e) {
  return ((uint64_t(b) * uint64_t(s.kv_heads) + uint64_t(h)) * uint64_t(s.kv) + uint64_t(t)) * uint64_t(s.head_dim) +
         uint64_t(e);
}

// A case's K and V caches on the device: contiguous, or paged (Shape::page) with every sequence
// owning ceil(kv / page) pages dealt in a shuffled order (a sequence's neighbouring pages are not
// neighbours in memory, as in a serving system's pool), HND or NHD. In either layout element e of
// token t of sequence b, head h holds value(seed, kv_index(b, h, t, e)) (K: k_seed, V: v_seed),
// so a host reference regenerates any token without the block table; the slots of a last page
// past kv hold other values of the stream. The fills run on `stream`.
class DeviceKv {
 public:
  DeviceKv(const Shape& s, DType dtype, uint64_t k_seed, uint64_t v_seed, uint64_t table_seed, cudaStream_t stream);
  ~DeviceKv();
  DeviceKv(const DeviceKv&) = delete;
  DeviceKv& operator=(const DeviceKv&) = delete;

  // Sets a's k, v, layout, capacity and, paged, page_size, num_pages, max_pages_per_seq and both
  // block tables (`a` keeps pointers into this object).
  void describe(DecodeArgs& a) const;

 private:
  Shape s_;
  void *k_ = nullptr, *v_ = nullptr;
  int32_t* table_d_ = nullptr;
  std::vector<int32_t> table_;  // paged: [batch][pages per sequence], the block table's host copy
};

}  // namespace taxfree::flash_decode::bench_inputs
