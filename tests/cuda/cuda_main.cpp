// Catch2 entry point of cuda_tests (the CUDA backend against the CPU). Without a usable GPU it
// says why on one line and exits 77, which CTest reports as skipped (SKIP_RETURN_CODE 77).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "core/cuda/device.h"
#include "tests/support/hang_watchdog.h"

int main(int argc, char** argv) {
  if (mod::cuda::device_count() == 0) {
    std::printf("cuda_tests: no CUDA device (%s): skipping every GPU test\n",
                mod::cuda::describe_devices().c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
