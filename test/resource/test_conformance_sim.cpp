// SPDX-License-Identifier: Apache-2.0
// The conformance suite over the base resources, on SimDriver.

#include "conformance.hpp"
#include "stacks.hpp"

#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;
using namespace xlogrt::testing;

using BaseStacks = std::tuple<AsyncStack<SimDriver>, DirectStack<SimDriver>, CachedStack<SimDriver>,
                              DefaultStackFactory<SimDriver>>;

TEMPLATE_LIST_TEST_CASE("resource conformance on SimDriver", "[conformance]", BaseStacks) {
  SimDriver sim{SimConfig{}};
  conformance_suite<TestType>(sim);
}

TEMPLATE_LIST_TEST_CASE("a driver failure is returned, named, and changes no accounting",
                        "[conformance]", BaseStacks) {
  SimDriver sim{SimConfig{}};
  Rig<TestType> rig(sim);
  auto& r = *rig.stack;
  sim.fail_nth(TestType::alloc_call, 1, status::out_of_memory);
  auto failed = r.allocate(4096, StreamId{1}, AllocTag::UNTAGGED);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code() == errc::out_of_memory);
  CHECK(failed.error().driver_status() == status::out_of_memory);
  CHECK(failed.error().message().find(TestType::alloc_call) != std::string::npos);
  CHECK(r.bytes_outstanding() == 0);

  auto b = r.allocate(4096, StreamId{1}, AllocTag::UNTAGGED);
  REQUIRE(b.has_value());
  const char* free_call = TestType::free_call;
  if constexpr (TestType::caches) {  // the free that reaches the driver: stream 1 waits for stream 2
    REQUIRE(r.record_block_use(*b, StreamId{2}).has_value());
    free_call = "cuStreamWaitEvent";
  }
  sim.fail_nth(free_call, 1, status::unknown);
  auto e = r.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  CHECK_FALSE(b->empty());  // still the caller's, still live
  CHECK(r.bytes_outstanding() == 4096);
  REQUIRE(r.deallocate(std::move(*b)).has_value());
  REQUIRE(r.reap_pending().has_value());
  CHECK(r.bytes_outstanding() == 0);
}
