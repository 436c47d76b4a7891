// SPDX-License-Identifier: Apache-2.0
// The conformance suite over every stack of the registry (stack_registry.hpp), on
// SimDriver, and a driver failure under each stack.

#include "conformance.hpp"
#include "stack_registry.hpp"

#include <string_view>

#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;
using namespace xlogrt::testing;

// What an entry derives from its type: the name from the layers', the driver calls from
// the base resource, `caches` from a Cached layer anywhere in the stack.
static_assert(std::string_view(Entry<DefaultStackOn<SimDriver>>::name) ==
              "Statistics<GraphPools<Logging<Cached<Budget<PoolOrVirtual>>, FileSink>>>");
static_assert(std::string_view(Entry<Any<DebugGuard<DirectCuda<SimDriver>>>>::name) ==
              "AnyResource{DebugGuard<DirectCuda>}");
static_assert(std::string_view(Entry<Budget<Statistics<DirectCuda<SimDriver>>>>::alloc_call) == "cuMemAlloc");
static_assert(std::string_view(Entry<Logging<AsyncCuda<SimDriver>, RingSink>>::free_call) == "cuMemFreeAsync");
static_assert(Entry<DefaultStackOn<SimDriver>>::caches && Entry<Cached<AsyncCuda<SimDriver>>>::caches);
static_assert(!Entry<Budget<Statistics<Logging<AsyncCuda<SimDriver>, NullSink>>>>::caches);

TEMPLATE_LIST_TEST_CASE("resource conformance on SimDriver", "[conformance]", AllStacks<SimDriver>) {
  SimDriver sim{SimConfig{}};
  conformance_suite<TestType>(sim);
}

TEMPLATE_LIST_TEST_CASE("a driver failure is returned, named, and changes no accounting",
                        "[conformance]", AllStacks<SimDriver>) {
  INFO("stack: " << TestType::name);
  SimDriver sim{SimConfig{}};
  Rig<TestType> rig(sim);
  auto& r = *rig.stack;
  const auto before = device_budget(sim, 0)->in_use;
  REQUIRE(sim.fail_nth(TestType::alloc_call, 1, status::out_of_memory).has_value());
  auto failed = r.allocate(4096, StreamId{1}, AllocTag::UNTAGGED);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code() == errc::out_of_memory);
  CHECK(failed.error().driver_status() == status::out_of_memory);
  CHECK(failed.error().message().find(TestType::alloc_call) != std::string::npos);
  CHECK(r.bytes_outstanding() == 0);
  CHECK(device_budget(sim, 0)->in_use == before);

  auto b = r.allocate(4096, StreamId{1}, AllocTag::UNTAGGED);
  REQUIRE(b.has_value());
  const char* free_call = TestType::free_call;
  if constexpr (TestType::caches) {  // the free that reaches the driver: stream 1 waits for stream 2
    REQUIRE(r.record_block_use(*b, StreamId{2}).has_value());
    free_call = "cuStreamWaitEvent";
  }
  REQUIRE(sim.fail_nth(free_call, 1, status::unknown).has_value());
  auto e = r.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  CHECK_FALSE(b->empty());  // still the caller's, still live
  CHECK(r.bytes_outstanding() == 4096);
  REQUIRE(r.deallocate(std::move(*b)).has_value());
  REQUIRE(r.reap_pending().has_value());
  CHECK(r.bytes_outstanding() == 0);
  // A caching layer keeps the freed block, and a Budget below it still charges it.
  if constexpr (!TestType::caches) CHECK(device_budget(sim, 0)->in_use == before);
}
