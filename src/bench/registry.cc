// The one list of benchmarked ops. `taxfree bench` with no op runs them in this order.
#include "taxfree/bench/op_bench.h"
#include "taxfree/runtime/error.h"

namespace taxfree::bench {

std::unique_ptr<OpBench> make_put_get_bench();
std::unique_ptr<OpBench> make_signal_bench();
std::unique_ptr<OpBench> make_barrier_bench();
std::unique_ptr<OpBench> make_all_gather_bench();
std::unique_ptr<OpBench> make_gemm_bench();
std::unique_ptr<OpBench> make_all_gather_matmul_bench();
std::unique_ptr<OpBench> make_decode_bench();
std::unique_ptr<OpBench> make_flash_decode_bench();

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<OpBench> (*make)();
};

// Each op's bench file defines its factory; add one line here per op.
const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {"put_get", make_put_get_bench},
      {"signal", make_signal_bench},
      {"barrier", make_barrier_bench},
      {"all_gather", make_all_gather_bench},
      {"gemm", make_gemm_bench},
      {"all_gather_matmul", make_all_gather_matmul_bench},
      {"decode", make_decode_bench},
      {"flash_decode", make_flash_decode_bench},
  };
  return kEntries;
}
}  // namespace

std::vector<std::string> bench_names() {
  std::vector<std::string> names;
  for (const auto& e : entries()) names.emplace_back(e.name);
  return names;
}

std::unique_ptr<OpBench> make_bench(const std::string& name) {
  for (const auto& e : entries())
    if (name == e.name) return e.make();
  std::string known;
  for (const auto& e : entries()) known += std::string(known.empty() ? "" : ", ") + e.name;
  TF_THROW(Status::InvalidArgument, "unknown op '" << name << "' (known: " << known << ")");
}

}  // namespace taxfree::bench
