// SPDX-License-Identifier: Apache-2.0
#pragma once

// The main of a GPU test executable: opens CudaDriver, exits 77 (Meson's SKIP) when the
// machine has no driver or fewer devices than the test needs, fails when a driver is present but unusable (too
// old, broken), and otherwise runs the Catch2 session. A GPU test never passes without
// running.

#include <catch2/catch.hpp>

#include <cstdio>

#include <xlogrt/driver/cuda_driver.hpp>

namespace xlogrt::testing {

inline int run_gpu_tests(int argc, char** argv, CudaDriver*& driver, int min_devices = 1) {
  auto d = CudaDriver::open();
  if (!d) {
    std::printf("%s\n", d.error().what().c_str());
    const errc c = d.error().code();
    if (c == errc::no_driver || c == errc::no_device) return std::printf("SKIP: no CUDA driver or device\n"), 77;
    return 1;
  }
  auto n = (*d)->device_count();
  if (!n || *n == 0) return std::printf("SKIP: no CUDA device\n"), 77;
  if (*n < min_devices) return std::printf("SKIP: %d CUDA device(s); this test needs %d\n", *n, min_devices), 77;
  driver = *d;
  return Catch::Session().run(argc, argv);
}

}  // namespace xlogrt::testing
