// SPDX-License-Identifier: Apache-2.0
// AnyResource: forwards to the held stack; tracking calls on a non-tracking stack are
// stream_misuse "unsupported", never ok.

#include <catch2/catch.hpp>

#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

TEST_CASE("AnyResource forwards to a tracking stack", "[any_resource]") {
  TrackingSpy spy(0);
  auto st = spy.state();
  AnyResource any{Statistics<TrackingSpy>{std::move(spy)}};
  STATIC_REQUIRE(TrackingResource<AnyResource>);
  CHECK(any.tracks_block_uses());
  CHECK(any.device_ordinal() == 0);

  auto b = any.allocate(512, StreamId{1}, AllocTag{3});
  REQUIRE(b.has_value());
  CHECK(any.bytes_outstanding() == 512);
  REQUIRE(any.record_block_use(*b, StreamId{2}).has_value());
  REQUIRE(any.prepare_block_use(b->id(), StreamId{2}, Access::Read).has_value());
  REQUIRE(any.finish_block_use(b->id(), StreamId{2}, Access::Read).has_value());
  CHECK(st->records == 1);
  CHECK(st->prepares == 1);
  CHECK(st->finishes == 1);

  auto* stats = any.target<Statistics<TrackingSpy>>();
  REQUIRE(stats != nullptr);
  CHECK(stats->snapshot().of(AllocTag{3}).current_bytes == 512);
  CHECK(any.target<TrackingSpy>() == nullptr);

  REQUIRE(any.deallocate(std::move(*b)).has_value());
  REQUIRE(any.reap_pending().has_value());
  CHECK(any.bytes_outstanding() == 0);
  CHECK(st->reaps == 1);
}

TEST_CASE("AnyResource over a non-tracking stack reports stream_misuse, never ok", "[any_resource]") {
  AnyResource any{Budget<Logging<PlainSpy, NullSink>>{Logging<PlainSpy, NullSink>{PlainSpy(9)}}};
  CHECK_FALSE(any.tracks_block_uses());
  auto b = any.allocate(64, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());

  auto r1 = any.record_block_use(*b, StreamId{1});
  auto r2 = any.prepare_block_use(b->id(), StreamId{1}, Access::Write);
  auto r3 = any.finish_block_use(b->id(), StreamId{1}, Access::Write);
  for (const result<void>* r : {&r1, &r2, &r3}) {
    REQUIRE_FALSE(*r);
    CHECK(r->error().code() == errc::stream_misuse);
    CHECK_THAT(r->error().message(), Catch::Contains("unsupported"));
  }
  CHECK_THAT(r1.error().message(), Catch::Contains("record_block_use") && Catch::Contains("stream 1"));
  REQUIRE(any.deallocate(std::move(*b)).has_value());  // the block is still freed normally

  // Moved from: every call is a named error.
  AnyResource moved = std::move(any);
  CHECK(moved);
  CHECK_FALSE(any);  // NOLINT(bugprone-use-after-move): the contract under test
  CHECK(any.allocate(8, StreamId{0}, AllocTag{}).error().code() == errc::invalid_argument);
  CHECK(any.record_block_use(DeviceBlock{}, StreamId{0}).error().code() == errc::invalid_argument);
  CHECK(any.bytes_outstanding() == 0);
  REQUIRE(moved.reap_pending().has_value());
}
