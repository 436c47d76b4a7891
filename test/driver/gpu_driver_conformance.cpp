// SPDX-License-Identifier: Apache-2.0
// The Driver conformance suite over CudaDriver on device 0 of a real GPU. Exits 77
// (Meson's SKIP) when the machine has no driver or no device (gpu_main.hpp), and fails
// when a driver is there but unusable: it never passes without running. Prints one
// line per property ("cuda stream_order: holds").

#define CATCH_CONFIG_RUNNER
#include "../gpu_main.hpp"
#include "driver_conformance.hpp"

using namespace xlogrt;

namespace {
CudaDriver* gpu = nullptr;
}

TEST_CASE("CudaDriver meets the Driver conformance suite", "[gpu][driver][conformance]") {
  REQUIRE(gpu != nullptr);
  drvtest::driver_conformance_suite<CudaDriver>();
}

int main(int argc, char** argv) { return testing::run_gpu_tests(argc, argv, gpu); }
