// SPDX-License-Identifier: Apache-2.0
// AsyncCudaOptions::small_pool_bytes: small requests from a pool of their own, the rest
// from the device's default pool; the default stack's XLOGRT_CACHE=small_pool_bytes.
// On SimDriver.

#include <catch2/catch.hpp>

#include <cstdlib>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;

namespace {

std::shared_ptr<StreamPool<SimDriver>> pool_of(SimDriver& sim) {
  auto dev = Device<SimDriver>::open(sim, 0);
  REQUIRE(dev.has_value());
  auto pool = StreamPool<SimDriver>::create(*dev, 2);
  REQUIRE(pool.has_value());
  return *pool;
}

}  // namespace

TEST_CASE("small requests come from a pool of their own, the rest from the default pool", "[small_pool]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  auto a = AsyncCuda<SimDriver>::create(streams, {.small_pool_bytes = 4096});
  REQUIRE(a.has_value());
  CHECK(sim.calls("cuMemPoolCreate") == 1);
  REQUIRE(a->small_pool() != a->pool());
  CHECK(sim.release_threshold(a->small_pool()).value() == sim.release_threshold(a->pool()).value());
  // Which pool serves which size: with the small pool gone behind the resource's back, a
  // small request fails and a large one does not.
  REQUIRE(sim.mempool_destroy(a->small_pool()).has_value());
  auto small = a->allocate(4096, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(small);
  CHECK(small.error().driver_status() == status::invalid_value);
  auto large = a->allocate(4097, StreamId{0}, AllocTag{});
  REQUIRE(large.has_value());
  REQUIRE(a->deallocate(std::move(*large)).has_value());
  REQUIRE(a->reap_pending().has_value());
}

TEST_CASE("without small_pool_bytes there is one pool; a failed pool creation fails create()", "[small_pool]") {
  SimDriver sim;
  auto streams = pool_of(sim);
  auto one = AsyncCuda<SimDriver>::create(streams);
  REQUIRE(one.has_value());
  CHECK(one->small_pool() == one->pool());
  CHECK(sim.calls("cuMemPoolCreate") == 0);
  sim.fail_nth("cuMemPoolCreate", 1, status::out_of_memory);
  auto refused = AsyncCuda<SimDriver>::create(streams, {.small_pool_bytes = 1 << 20});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().driver_status() == status::out_of_memory);
}

TEST_CASE("the default stack has one pool unless XLOGRT_CACHE names small_pool_bytes", "[small_pool]") {
  const auto split = [](const char* cache) {
    SimDriver sim;
    auto streams = pool_of(sim);
    if (cache != nullptr) {
      REQUIRE(setenv("XLOGRT_CACHE", cache, 1) == 0);
    } else {
      REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
    }
    auto stack = StackBuilder<DefaultStackOn<SimDriver>>::build(streams);
    REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
    REQUIRE(stack.has_value());
    const auto& base = find_layer<Budget>(*stack)->upstream();
    return base.small_pool() != base.pool();
  };
  CHECK_FALSE(split(nullptr));
  CHECK_FALSE(split("on,small_pool_bytes=0"));
  CHECK(split("on,small_pool_bytes=1M"));
  CHECK(split("0,small_pool_bytes=64K"));
}
