// SPDX-License-Identifier: Apache-2.0
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

void* xlogrt_two_lib_b() { return *xlogrt::DeviceRuntime<xlogrt::AsyncCuda<xlogrt::SimDriver>>::try_get(0); }
