// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: a runtime whose stack does not track cross-stream uses has no usable
// record_block_use. test/runtime/meson.build checks that compiling this fails with the
// sentence of the static_assert.
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

void misuse(xlogrt::DeviceRuntime<xlogrt::DirectCuda<xlogrt::SimDriver>>& rt, const xlogrt::DeviceBlock& b) {
  (void)rt.record_block_use(b, xlogrt::StreamId{1});
}
