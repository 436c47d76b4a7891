// SPDX-License-Identifier: Apache-2.0
// Device, StreamPool and EventPool on SimDriver.

#include <catch2/catch.hpp>

#include <set>

#include <xlogrt/device/device.hpp>
#include <xlogrt/device/event_pool.hpp>
#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/sim/sim_driver.hpp>

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

TEST_CASE("weak spot: StreamPool::adopt refuses a stream of another device or another driver", "[device]") {
  SimDriver sim{SimConfig{}};
  SimDriver other{SimConfig{}};
  auto dev0 = Device<SimDriver>::open(sim, 0);
  auto dev1 = Device<SimDriver>::open(sim, 1);
  REQUIRE(dev0.has_value());
  REQUIRE(dev1.has_value());
  auto pool = StreamPool<SimDriver>::create(*dev0, 2);
  REQUIRE(pool.has_value());
  REQUIRE((*dev1)->make_current().has_value());
  auto on1 = sim.stream_create();  // a stream of ordinal 1
  REQUIRE(on1.has_value());
  auto e = (*pool)->adopt(*on1);
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::foreign_block);
  CHECK_THAT(e.error().message(), Catch::Contains("another device") && Catch::Contains("ordinal 0"));
  CHECK((*pool)->size() == 2);
  // A stream of another SimDriver: the driver does not know the handle.
  auto odev = Device<SimDriver>::open(other, 0);
  REQUIRE(odev.has_value());
  REQUIRE((*odev)->make_current().has_value());
  auto foreign = other.stream_create();
  REQUIRE(foreign.has_value());
  auto f = (*pool)->adopt(*foreign);
  REQUIRE_FALSE(f);
  CHECK(f.error().driver_status() == status::invalid_handle);
  CHECK((*pool)->size() == 2);
  REQUIRE(other.stream_destroy(*foreign).has_value());
  REQUIRE((*dev1)->make_current().has_value());
  REQUIRE(sim.stream_destroy(*on1).has_value());
}

TEST_CASE("weak spot: a destroyed stream's handle reused for a new stream is known as a new stream",
          "[device]") {
  SimDriver sim{SimConfig{.reuse_stream_handles = true}};
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  auto& p = **pool;
  auto first = sim.stream_create();
  REQUIRE(first.has_value());
  auto a = p.adopt(*first);
  REQUIRE(a.has_value());
  CHECK(*a == StreamId{2});
  const auto first_id = sim.stream_get_id(*first);
  REQUIRE(first_id.has_value());
  REQUIRE(sim.stream_synchronize(*first).has_value());
  REQUIRE(sim.stream_destroy(*first).has_value());
  auto second = sim.stream_create();  // the simulator hands the same handle out again
  REQUIRE(second.has_value());
  REQUIRE(*second == *first);
  const auto second_id = sim.stream_get_id(*second);
  REQUIRE(second_id.has_value());
  CHECK(*second_id != *first_id);
  // Known by its stream id, not its handle: the old stream is gone, so the new one
  // takes its id, after a synchronisation of the device.
  const auto syncs = sim.calls("cuCtxSynchronize");
  auto b = p.adopt(*second);
  REQUIRE(b.has_value());
  CHECK(*b == StreamId{2});
  CHECK(sim.calls("cuCtxSynchronize") == syncs + 1);
  CHECK(p.recycled() == 1);
  CHECK(*p.adopt(*second) == StreamId{2});  // found by its key from now on: no second sync
  CHECK(sim.calls("cuCtxSynchronize") == syncs + 1);
  CHECK(p.size() == 3);
  REQUIRE(sim.stream_destroy(*second).has_value());
}

TEST_CASE("StreamPool::forget recycles an adopted stream's id and refuses what it cannot forget", "[device]") {
  SimDriver sim{SimConfig{}};
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  auto& p = **pool;
  auto a = sim.stream_create();
  auto b = sim.stream_create();
  REQUIRE((a.has_value() && b.has_value()));
  CHECK(*p.adopt(*a) == StreamId{2});
  REQUIRE(sim.stream_destroy(*a).has_value());
  const auto syncs = sim.calls("cuCtxSynchronize");
  const auto calls_before = sim.calls("cuStreamGetId");
  REQUIRE(p.forget(*a).has_value());  // found by handle: no call on the destroyed stream
  CHECK(sim.calls("cuStreamGetId") == calls_before);
  CHECK(sim.calls("cuCtxSynchronize") == syncs + 1);
  CHECK(*p.get(StreamId{2}) == *p.get(StreamId{0}));  // late frees go to the pool's first stream

  auto again = p.forget(*a);
  REQUIRE_FALSE(again);
  CHECK(again.error().code() == errc::unknown_stream);
  auto own = p.forget(*p.get(StreamId{1}));
  REQUIRE_FALSE(own);
  CHECK(own.error().code() == errc::stream_misuse);
  detail::capture_window_count().fetch_add(1);
  auto in_window = p.forget(*p.get(StreamId{1}));
  detail::capture_window_count().fetch_sub(1);
  REQUIRE_FALSE(in_window);
  CHECK(in_window.error().code() == errc::stream_misuse);

  CHECK(*p.adopt(*b) == StreamId{2});  // the next new stream takes the forgotten id
  CHECK(*p.get(StreamId{2}) == *b);
  CHECK(p.recycled() == 1);
  CHECK(p.size() == 3);
  REQUIRE(sim.stream_destroy(*b).has_value());
}

TEST_CASE("StreamPool: a handle reused while a capture window is open gets another id", "[device]") {
  SimDriver sim{SimConfig{.reuse_stream_handles = true}};
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  auto& p = **pool;
  auto first = sim.stream_create();
  REQUIRE(first.has_value());
  CHECK(*p.adopt(*first) == StreamId{2});
  REQUIRE(sim.stream_synchronize(*first).has_value());
  REQUIRE(sim.stream_destroy(*first).has_value());
  auto second = sim.stream_create();
  REQUIRE((second.has_value() && *second == *first));
  // The handle is found in the pool with no call on it (a window's rule); adopting it
  // outside a window recycles its id: neither leaves two ids on one live handle keyed.
  const auto syncs = sim.calls("cuCtxSynchronize");
  detail::capture_window_count().fetch_add(1);
  auto in_window = p.adopt(*second);
  detail::capture_window_count().fetch_sub(1);
  REQUIRE(in_window.has_value());
  CHECK(*in_window == StreamId{2});
  CHECK(sim.calls("cuCtxSynchronize") == syncs);
  CHECK(*p.adopt(*second) == StreamId{2});
  CHECK(sim.calls("cuCtxSynchronize") == syncs + 1);
  CHECK(p.recycled() == 1);
  REQUIRE(sim.stream_destroy(*second).has_value());
}
