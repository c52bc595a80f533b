#include <CLI/CLI.hpp>

#include <iostream>

#include "taxfree/runtime/error.h"

int main(int argc, char** argv) {
  CLI::App app{"taxfree: fused multi-GPU LLM kernels"};
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);
  std::cout << app.help();
  return 0;
}
