// SPDX-License-Identifier: Apache-2.0
// Device, StreamPool and EventPool on SimDriver.

#include <catch2/catch.hpp>

#include <set>

#include <xlogrt/device/device.hpp>
#include <xlogrt/device/event_pool.hpp>
#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/driver/sim_driver.hpp>

using namespace xlogrt;

TEST_CASE("Device opens an ordinal, reads its attributes and holds the primary context", "[device]") {
  SimDriver sim{SimConfig{.devices = 2, .memory_bytes = 64 << 20}};
  {
    auto dev = Device<SimDriver>::open(sim, 1);
    REQUIRE(dev.has_value());
    CHECK((*dev)->ordinal() == 1);
    CHECK((*dev)->info().total_bytes == (64u << 20));
    CHECK((*dev)->info().memory_pools);
    CHECK((*dev)->info().stream_mem_ops);
    CHECK((*dev)->info().cc_major == 9);
    CHECK(sim.calls("cuDevicePrimaryCtxRetain") == 1);
  }
  CHECK(sim.calls("cuDevicePrimaryCtxRelease") == 1);  // released with the Device

  auto absent = Device<SimDriver>::open(sim, 2);
  REQUIRE_FALSE(absent);
  CHECK(absent.error().code() == errc::invalid_ordinal);

  sim.fail_nth("cuDevicePrimaryCtxRetain", 1, status::unknown);
  auto failed = Device<SimDriver>::open(sim, 0);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code() == errc::driver_error);
}

TEST_CASE("StreamPool names its streams and adopts a caller's", "[device]") {
  SimDriver sim{SimConfig{}};
  auto dev = Device<SimDriver>::open(sim, 0);
  REQUIRE(dev.has_value());
  REQUIRE_FALSE(StreamPool<SimDriver>::create(*dev, 0));
  auto pool = StreamPool<SimDriver>::create(*dev, 3);
  REQUIRE(pool.has_value());
  auto& p = **pool;
  CHECK(p.size() == 3);
  std::set<SimDriver::stream_t> distinct;
  for (std::uint32_t i = 0; i < 3; ++i) {
    auto s = p.get(StreamId{i});
    REQUIRE(s.has_value());
    distinct.insert(*s);
  }
  CHECK(distinct.size() == 3);
  auto unknown = p.get(StreamId{3});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == errc::unknown_stream);

  auto mine = sim.stream_create();
  REQUIRE(mine.has_value());
  auto id = p.adopt(*mine);
  REQUIRE(id.has_value());
  CHECK(*id == StreamId{3});
  CHECK(*p.get(*id) == *mine);
  CHECK(*p.adopt(*mine) == StreamId{3});  // adopting twice gives the same id
  CHECK(*p.adopt(*p.get(StreamId{1})) == StreamId{1});  // the pool's own stream keeps its id
  CHECK(p.size() == 4);
  auto gone = sim.stream_create();
  REQUIRE(gone.has_value());
  REQUIRE(sim.stream_destroy(*gone).has_value());
  auto refused = p.adopt(*gone);  // a destroyed stream has no id: refused, pool unchanged
  REQUIRE_FALSE(refused);
  CHECK(refused.error().driver_status() == status::invalid_handle);
  CHECK(p.size() == 4);
  const auto destroyed = sim.calls("cuStreamDestroy");
  pool->reset();
  CHECK(sim.calls("cuStreamDestroy") == destroyed + 3);  // not the adopted one
  REQUIRE(sim.stream_destroy(*mine).has_value());
}

TEST_CASE("EventPool reuses events and creates none once warmed", "[device]") {
  SimDriver sim{SimConfig{}};
  auto dev = Device<SimDriver>::open(sim, 0);
  REQUIRE(dev.has_value());
  EventPool<SimDriver> pool(*dev);
  REQUIRE(pool.reserve(4).has_value());
  const auto created = sim.calls("cuEventCreate");
  for (int round = 0; round < 100; ++round) {
    auto a = pool.acquire();
    auto b = pool.acquire();
    REQUIRE(a.has_value());
    REQUIRE(b.has_value());
    CHECK(*a != *b);
    pool.release(*a);
    pool.release(*b);
  }
  CHECK(sim.calls("cuEventCreate") == created);
}
