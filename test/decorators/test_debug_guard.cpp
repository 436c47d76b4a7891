// SPDX-License-Identifier: Apache-2.0
// DebugGuard<Up> over a spy whose "driver" works on host memory at once: guards written
// on the block's stream, a clean block passes, a corrupted guard is caught (and the block
// still freed), freed memory poisoned, a failed check frees nothing.

#include <catch2/catch.hpp>

#include <algorithm>

#include <xlogrt/resource/debug_guard.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {
std::uint8_t* bytes_at(std::uint64_t p) { return reinterpret_cast<std::uint8_t*>(p); }
}  // namespace

TEST_CASE("guards are written around the block on its stream; a clean block is not flagged",
          "[debug_guard]") {
  DriverSpy spy;
  auto st = spy.state();
  DebugGuard<DriverSpy> g{std::move(spy), DebugGuardOptions{.guard_bytes = 64, .pattern = 0xA5, .poison = 0xDD}};
  STATIC_REQUIRE(TrackingResource<DebugGuard<DriverSpy>>);
  STATIC_REQUIRE(DriverResource<DebugGuard<DriverSpy>>);

  auto b = g.allocate(100, StreamId{3}, AllocTag{4});
  REQUIRE(b.has_value());
  CHECK(b->bytes() == 100);
  CHECK(b->tag() == AllocTag{4});
  CHECK(st->driver.last_stream == 103);  // stream_handle(StreamId{3})
  CHECK(g.bytes_outstanding() == 100);  // guard bytes are not the caller's
  CHECK(st->outstanding == 100 + 2 * 64);
  CHECK(g.live_blocks() == 1);
  const std::uint8_t* front = bytes_at(b->ptr() - 64);
  const std::uint8_t* back = bytes_at(b->ptr() + 100);
  CHECK(std::all_of(front, front + 64, [](std::uint8_t v) { return v == 0xA5; }));
  CHECK(std::all_of(back, back + 64, [](std::uint8_t v) { return v == 0xA5; }));

  // The whole block is the caller's to write.
  std::fill(bytes_at(b->ptr()), bytes_at(b->ptr()) + 100, std::uint8_t{0});
  REQUIRE(g.prepare_block_use(b->id(), StreamId{1}, Access::Write).has_value());
  REQUIRE(g.finish_block_use(b->id(), StreamId{1}, Access::Write).has_value());
  REQUIRE(g.record_block_use(*b, StreamId{2}).has_value());  // the upstream sees its own block
  const auto prepares = st->prepares.load();
  const std::uint64_t upstream_ptr = b->ptr() - 64;
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  CHECK(b->empty());
  CHECK(st->prepares == prepares + 1);  // waited for uses on other streams before reading
  CHECK(st->driver.syncs >= 1);
  CHECK(g.live_blocks() == 0);
  // Freed memory is poisoned, guards included.
  const std::uint8_t* freed = bytes_at(upstream_ptr);
  CHECK(std::all_of(freed, freed + 228, [](std::uint8_t v) { return v == 0xDD; }));
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
}

TEST_CASE("a corrupted guard is guard_corrupted, names the block, and the block is freed",
          "[debug_guard]") {
  DriverSpy spy;
  auto st = spy.state();
  using Stack = Statistics<DebugGuard<DriverSpy>>;
  Stack s{DebugGuard<DriverSpy>{std::move(spy)}};  // default: 256-byte guards

  SECTION("one byte past the end") {
    auto b = s.allocate(1000, StreamId{1}, AllocTag{42});
    REQUIRE(b.has_value());
    const std::string id = b->id().to_string();
    bytes_at(b->ptr())[1000] = 0;  // off by one
    auto e = s.deallocate(std::move(*b));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::guard_corrupted);
    const auto& m = e.error().message();
    CHECK_THAT(m, Catch::Contains("block " + id));
    CHECK_THAT(m, Catch::Contains("tag 42"));
    CHECK_THAT(m, Catch::Contains("back guard"));
    CHECK_THAT(m, Catch::Contains("offset 0 of 256"));
    CHECK_THAT(m, Catch::Contains("found 0x00, expected 0xa5"));
    CHECK(b->empty());  // consumed: the block was freed
  }
  SECTION("a byte before the start") {
    auto b = s.allocate(64, StreamId{0}, AllocTag{7});
    REQUIRE(b.has_value());
    bytes_at(b->ptr())[-3] = 0x11;
    auto e = s.deallocate(std::move(*b));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::guard_corrupted);
    CHECK_THAT(e.error().message(), Catch::Contains("front guard") && Catch::Contains("offset 253") &&
                                        Catch::Contains("3 bytes before the block"));
  }
  // Either way the accounting is exact: nothing live, nothing leaked.
  CHECK(s.upstream().live_blocks() == 0);
  REQUIRE(s.reap_pending().has_value());
  CHECK(s.bytes_outstanding() == 0);
  CHECK(st->live.empty());
  const auto snap = s.snapshot();
  CHECK(snap.total.current_count == 0);
  CHECK(snap.total.frees == 1);
}

TEST_CASE("a failed guard check frees nothing; bad blocks go to the upstream", "[debug_guard]") {
  PlainDriverSpy spy;  // no tracking, synchronous frees
  auto st = spy.state();
  DebugGuard<PlainDriverSpy> g{std::move(spy), DebugGuardOptions{.guard_bytes = 16}};
  STATIC_REQUIRE_FALSE(TrackingResource<DebugGuard<PlainDriverSpy>>);
  auto b = g.allocate(32, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());

  st->driver.fail_next = true;  // the copy back fails
  auto e = g.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  CHECK_FALSE(b->empty());
  CHECK(g.live_blocks() == 1);
  CHECK(g.bytes_outstanding() == 32);

  // A forged block with another size is refused as foreign, before any memory is read.
  DeviceBlock wrong{b->ptr(), 33, b->alloc_stream(), b->device_ordinal(), b->tag(), b->id()};
  CHECK(g.deallocate(std::move(wrong)).error().code() == errc::foreign_block);
  CHECK(g.live_blocks() == 1);

  DeviceBlock forged{b->ptr(), b->bytes(), b->alloc_stream(), b->device_ordinal(), b->tag(), b->id()};
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.deallocate(std::move(forged)).error().code() == errc::double_free);  // from the upstream
  CHECK(g.deallocate(DeviceBlock{}).error().code() == errc::empty_block);
  CHECK(g.allocate(0, StreamId{0}, AllocTag{}).error().code() == errc::zero_bytes);

  // Writing a guard fails at allocate: the upstream block is given back.
  st->driver.fail_next = true;
  auto f = g.allocate(32, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(f);
  CHECK(f.error().code() == errc::driver_error);
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.live_blocks() == 0);
}
