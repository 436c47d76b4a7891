// SPDX-License-Identifier: Apache-2.0
// Two translation units include the umbrella header (and the simulator) and link into one program: every
// function defined in a header must be inline (or a template), or this fails to link.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

int odr_b_main();

int main() { return odr_b_main(); }
