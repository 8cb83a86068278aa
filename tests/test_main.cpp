// tests/test_main.cpp — Catch2 main for the executor-linked test binaries: selects OpenBLAS's fast
// kernels first (see executor/cpu/blas_env.h), exactly as the shipped binaries do.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "executor/cpu/blas_env.h"

int main(int argc, char** argv) {
  shardwise::ensure_fast_blas(argv);
  return Catch::Session().run(argc, argv);
}
