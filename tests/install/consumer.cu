// Built against an installed taxfree by tests/install/check_install.sh (no GPU needed): the
// installed headers compile, device code included, and the static library links and answers
// (with --subdirectory the script compiles it against the source tree, without linking).
// Prints the heuristic's GEMM choice for the shape on the command line (M N K), for the script to
// compare with the installed CLI's; exit 1 when a check fails, naming it.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "taxfree/device/signal.cuh"
#include "taxfree/ops/all_gather_matmul.h"
#include "taxfree/ops/gemm.h"
#include "taxfree/runtime/error.h"
#include "taxfree/version.h"

__global__ void raise_flag(uint64_t* flag) { taxfree::dev::signal_set(flag, 1); }

int main(int argc, char** argv) {
  if (argc != 4) return std::fprintf(stderr, "usage: consumer M N K\n"), 2;
  int failed = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) std::fprintf(stderr, "FAILED: %s\n", what), ++failed;
  };
  check(std::strcmp(TAXFREE_VERSION_STRING, TAXFREE_FOUND_VERSION) == 0,
        "taxfree/version.h names the version find_package found");
  const taxfree::ShardShape s = taxfree::agmm_shard_shape(12, 100, 0, 3);
  check(s.rows == 4 && s.cols == 100 && s.ld == 104, "12 x 100 over 3 ranks at gather_dim 0: 4 x 100, ld 104");
  try {
    taxfree::agmm_shard_shape(10, 64, 0, 3);
    check(false, "M = 10 over 3 ranks is refused");
  } catch (const taxfree::Error& e) {
    check(e.status() == taxfree::Status::InvalidArgument && std::strstr(e.what(), "divisible"),
          "M = 10 over 3 ranks: InvalidArgument naming \"divisible\"");
  }
  const taxfree::gemm::GemmConfig c = taxfree::gemm::choose_gemm_config(
      std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), taxfree::DType::bf16, taxfree::gemm::BLayout::nk);
  std::printf("%s\n", c.name().c_str());
  return failed ? 1 : 0;
}
