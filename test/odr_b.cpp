// SPDX-License-Identifier: Apache-2.0
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

int odr_b_main() {
  xlogrt::result<int> r = 7;
  return r.has_value() && *r == 7 ? 0 : 1;
}
