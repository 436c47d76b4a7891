// SPDX-License-Identifier: Apache-2.0
// AsyncCudaOptions::small_pool_bytes: small requests from a pool of their own, the rest
// from the device's default pool; the default stack's XLOGRT_CACHE=small_pool_bytes.
// On SimDriver.

#include <catch2/catch.hpp>

#include <cstdlib>
#include <optional>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;

namespace {

std::shared_ptr<StreamPool<SimDriver>> pool_of(SimDriver& sim) {
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
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

namespace {

// The bound of the default stack's small pool, over the pool base (XLOGRT_BACKEND=pool),
// built from XLOGRT_CACHE=cache (unset: nullptr): 0 for one pool, else the largest of a
// few probe sizes that the small pool serves (found as in the first case: with that pool
// destroyed, its sizes fail).
// fail_pool_create: the driver refuses cuMemPoolCreate. nullopt: the build failed.
std::optional<std::size_t> small_pool_bound(const char* cache, bool fail_pool_create = false) {
  SimDriver sim;
  auto streams = pool_of(sim);
  if (fail_pool_create) sim.fail_nth("cuMemPoolCreate", 1, status::not_supported);
  if (cache != nullptr) {
    REQUIRE(setenv("XLOGRT_CACHE", cache, 1) == 0);
  } else {
    REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
  }
  REQUIRE(setenv("XLOGRT_BACKEND", "pool", 1) == 0);
  auto stack = StackBuilder<DefaultStackOn<SimDriver>>::build(streams);
  REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
  REQUIRE(unsetenv("XLOGRT_BACKEND") == 0);
  if (!stack) return std::nullopt;
  auto& base = *find_layer<AsyncCuda>(*stack);
  if (base.small_pool() == base.pool()) return 0;
  REQUIRE(sim.mempool_destroy(base.small_pool()).has_value());
  std::size_t bound = 0;
  for (std::size_t bytes : {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20, (std::size_t{1} << 20) + 1}) {
    auto b = base.allocate(bytes, StreamId{0}, AllocTag{});
    if (!b) {
      bound = bytes;
      continue;
    }
    REQUIRE(base.deallocate(std::move(*b)).has_value());
  }
  REQUIRE(base.reap_pending().has_value());
  return bound;
}

}  // namespace

TEST_CASE("the default stack keeps the cache's sizes in a pool of their own", "[small_pool]") {
  using B = std::optional<std::size_t>;
  CHECK(small_pool_bound(nullptr) == B(1 << 20));  // CachedOptions' max_block_bytes
  CHECK(small_pool_bound("on") == B(1 << 20));
  CHECK(small_pool_bound("on,max_block_bytes=256K") == B(256 << 10));
  CHECK(small_pool_bound("0") == B(0));  // no cache: one pool
  CHECK(small_pool_bound("on,small_pool_bytes=0") == B(0));
  CHECK(small_pool_bound("on,small_pool_bytes=64K") == B(64 << 10));
  CHECK(small_pool_bound("0,small_pool_bytes=64K") == B(64 << 10));
}

TEST_CASE("a device without a second pool gets one pool by default, and an error when one is named",
          "[small_pool]") {
  CHECK(small_pool_bound(nullptr, true) == std::optional<std::size_t>(0));
  CHECK_FALSE(small_pool_bound("on,small_pool_bytes=1M", true).has_value());
}

TEST_CASE("small_pool_bytes sizes the pool base's second pool: named without XLOGRT_BACKEND=pool, it is an error",
          "[small_pool]") {
  for (const char* backend : {static_cast<const char*>(nullptr), "auto", "vmm"}) {
    INFO((backend != nullptr ? backend : "unset"));
    SimDriver sim;
    auto streams = pool_of(sim);
    REQUIRE(setenv("XLOGRT_CACHE", "on,small_pool_bytes=64K", 1) == 0);
    REQUIRE((backend != nullptr ? setenv("XLOGRT_BACKEND", backend, 1) : unsetenv("XLOGRT_BACKEND")) == 0);
    auto stack = StackBuilder<DefaultStackOn<SimDriver>>::build(streams);
    REQUIRE(unsetenv("XLOGRT_CACHE") == 0);
    REQUIRE(unsetenv("XLOGRT_BACKEND") == 0);
    REQUIRE_FALSE(stack);
    CHECK(stack.error().code() == errc::invalid_argument);
    CHECK_THAT(stack.error().message(), Catch::Contains("small_pool_bytes") && Catch::Contains("XLOGRT_BACKEND=pool"));
  }
}
