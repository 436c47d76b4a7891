// SPDX-License-Identifier: Apache-2.0
// A user's program, built by the consumer projects (Meson subproject, CMake package,
// pkg-config). Opening the driver compiles and links the dlopen and thread code; without
// a driver it must fail with a named error, not crash.
#include <xlogrt/runtime.hpp>

#include <cstdio>

int main() {
  xlogrt::DeviceBlock empty;
  std::printf("xlogrt consumer: empty block %s\n", empty.empty() ? "is empty" : "is not empty");
  auto drv = xlogrt::CudaDriver::open();
  std::printf("xlogrt consumer: CudaDriver::open: %s\n", drv ? "a driver" : drv.error().what().c_str());
  return empty.empty() ? 0 : 1;
}
