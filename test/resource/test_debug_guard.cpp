// SPDX-License-Identifier: Apache-2.0
// DebugGuard<Up> over a spy whose "driver" works on host memory at once: guards written
// on the block's stream, a clean block passes, a corrupted guard is caught (and the block
// still freed), freed memory poisoned, a failed check frees nothing.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/debug_guard.hpp>
#include <xlogrt/resource/direct_cuda.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {
std::uint8_t* bytes_at(std::uint64_t p) { return reinterpret_cast<std::uint8_t*>(p); }

/// DebugGuard over AsyncCuda or DirectCuda on a SimDriver, with 4 streams.
template <class Up>
struct SimGuard {
  using Guard = DebugGuard<Up>;
  SimGuard(SimDriver& drv, DebugGuardOptions o) : sim(drv) {
    auto pool = StreamPool<SimDriver>::open(sim, 0, 4);
    REQUIRE(pool.has_value());
    streams = *pool;
    if constexpr (std::is_same_v<Up, AsyncCuda<SimDriver>>) {
      auto a = AsyncCuda<SimDriver>::create(streams);
      REQUIRE(a.has_value());
      g = std::make_unique<Guard>(std::move(*a), o);
    } else {
      g = std::make_unique<Guard>(Up(streams), o);
    }
  }
  SimDriver::stream_t stream(std::uint32_t i) {
    auto s = streams->get(StreamId{i});
    REQUIRE(s.has_value());
    return *s;
  }
  /// The first `n` bytes of `b`, copied back on its stream.
  std::vector<std::uint8_t> read(const DeviceBlock& b, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    REQUIRE(sim.memcpy_dtoh_async(out.data(), b.ptr(), n, stream(b.alloc_stream().value)).has_value());
    REQUIRE(sim.stream_synchronize(stream(b.alloc_stream().value)).has_value());
    return out;
  }
  void no_hazards() {
    sim.run_until_idle();
    const auto hz = sim.hazards();
    for (const auto& h : hz) UNSCOPED_INFO(to_string(h));
    CHECK(hz.empty());
  }
  SimDriver& sim;
  std::shared_ptr<StreamPool<SimDriver>> streams;
  std::unique_ptr<Guard> g;
};
using AsyncGuard = SimGuard<AsyncCuda<SimDriver>>;
using DirectGuard = SimGuard<DirectCuda<SimDriver>>;
constexpr SimConfig manual_sim{.executor = SimExecutor::manual};
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

// ---- issue 16: DebugGuard under driver failure ---------------------------------------

TEST_CASE("bug 1: a failed guard check keeps the host buffer its queued copies still write",
          "[sim][debug_guard]") {
  // Manual executor: the copies queued before the failure run only when the stream is
  // stepped, after deallocate has returned. Under ASan a buffer freed by the check is a
  // heap-use-after-free in the simulator's executor here.
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 256});
  auto& g = *rig.g;
  const char* call = GENERATE("cuStreamSynchronize", "cuMemcpyDtoHAsync");
  const int nth = std::string_view(call) == "cuStreamSynchronize" ? 1 : 2;  // the 2nd copy: the 1st is queued
  INFO(call << " fails on its call " << nth << " in the check");
  auto b = g.allocate(1024, StreamId{1}, AllocTag{5});
  REQUIRE(b.has_value());
  REQUIRE(sim.fail_nth(call, nth, status::unknown).has_value());
  auto e = g.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  CHECK_FALSE(b->empty());
  CHECK(g.parked_buffers() == 1);
  sim.clear_failures();
  sim.run_until_idle();  // the queued copies run now, into the kept buffer
  // The block is intact and its next free is clean; that check's synchronisation of the
  // stream releases the kept buffer.
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  CHECK(g.parked_buffers() == 0);
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("bug 1: reap_pending releases a kept guard buffer once its stream synchronises",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 64});
  auto& g = *rig.g;
  auto b = g.allocate(512, StreamId{2}, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(sim.fail_nth("cuStreamSynchronize", 1, status::unknown).has_value());
  REQUIRE_FALSE(g.deallocate(std::move(*b)));
  CHECK(g.parked_buffers() == 1);
  REQUIRE(sim.fail_always("cuStreamSynchronize", status::unknown).has_value());
  (void)g.reap_pending();
  CHECK(g.parked_buffers() == 1);  // not synchronised: still kept
  sim.clear_failures();
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.parked_buffers() == 0);
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("bug 5: the poison and guard rewrites of a refused free are ordered before the block's later uses",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 256});
  auto& g = *rig.g;
  auto b = g.allocate(1024, StreamId{0}, AllocTag{9});
  REQUIRE(b.has_value());
  // A write on stream 1, tracked.
  REQUIRE(g.prepare_block_use(b->id(), StreamId{1}, Access::Write).has_value());
  REQUIRE(sim.launch_kernel(rig.stream(1), {SimAccess{b->ptr(), 1024, Access::Write}}).has_value());
  REQUIRE(g.finish_block_use(b->id(), StreamId{1}, Access::Write).has_value());
  // The upstream refuses the free after DebugGuard has poisoned the block on stream 0.
  REQUIRE(sim.fail_nth("cuMemFreeAsync", 1, status::unknown).has_value());
  auto e = g.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  REQUIRE_FALSE(b->empty());
  // A read on stream 2, tracked: it must wait for the poison memset on stream 0.
  REQUIRE(g.prepare_block_use(b->id(), StreamId{2}, Access::Read).has_value());
  REQUIRE(sim.launch_kernel(rig.stream(2), {SimAccess{b->ptr(), 1024, Access::Read}}).has_value());
  REQUIRE(g.finish_block_use(b->id(), StreamId{2}, Access::Read).has_value());
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("bug 5: with no guards, the poison waits for uses on other streams", "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 0});
  auto& g = *rig.g;
  auto b = g.allocate(1024, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(g.prepare_block_use(b->id(), StreamId{1}, Access::Read).has_value());
  REQUIRE(sim.launch_kernel(rig.stream(1), {SimAccess{b->ptr(), 1024, Access::Read}}).has_value());
  REQUIRE(g.finish_block_use(b->id(), StreamId{1}, Access::Read).has_value());
  REQUIRE(g.deallocate(std::move(*b)).has_value());  // the poison memset runs on stream 0
  REQUIRE(g.reap_pending().has_value());
  rig.no_hazards();
}

TEST_CASE("bug 6: a guard rewrite that fails after a refused free is reported, and the next free is clean",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 128});
  auto& g = *rig.g;
  auto b = g.allocate(4096, StreamId{1}, AllocTag{3});
  REQUIRE(b.has_value());
  // In deallocate: the 1st memset poisons, the upstream refuses, the 2nd rewrites the front guard.
  REQUIRE(sim.fail_nth("cuMemFreeAsync", 1, status::unknown).has_value());
  REQUIRE(sim.fail_nth("cuMemsetD8Async", 2, status::unknown).has_value());
  auto e = g.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::driver_error);
  CHECK_THAT(e.error().message(), Catch::Contains("guards could not be written again"));
  REQUIRE_FALSE(b->empty());
  sim.clear_failures();
  // Nobody wrote past the block: its next free reports no corruption.
  auto f = g.deallocate(std::move(*b));
  INFO((f ? std::string("ok") : f.error().what()));
  CHECK(f.has_value());
  CHECK(b->empty());
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.live_blocks() == 0);
  rig.no_hazards();
}

TEST_CASE("bug 7: an allocate whose undo fails keeps the upstream block and frees it later",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 256});
  auto& g = *rig.g;
  // Writing the front guard fails, and so does giving the upstream block back.
  REQUIRE(sim.fail_nth("cuMemsetD8Async", 1, status::unknown).has_value());
  REQUIRE(sim.fail_nth("cuMemFreeAsync", 1, status::unknown).has_value());
  auto a = g.allocate(1024, StreamId{1}, AllocTag{2});
  REQUIRE_FALSE(a);
  CHECK(a.error().code() == errc::driver_error);
  CHECK_THAT(a.error().message(), Catch::Contains("giving the upstream block back failed too"));
  CHECK(g.live_blocks() == 0);
  CHECK(g.unfreed_blocks() == 1);
  CHECK(g.bytes_outstanding() == 1024 + 2 * 256);  // the accounting sees the block
  sim.clear_failures();
  REQUIRE(g.reap_pending().has_value());  // frees it again, and reaps that free
  CHECK(g.unfreed_blocks() == 0);
  CHECK(g.upstream().live_blocks() == 0);
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.upstream().bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("a queued free counts its whole upstream block until reaped, after a user's free or an undone allocate",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 256});
  auto& g = *rig.g;
  auto b = g.allocate(1024, StreamId{1}, AllocTag{2});
  REQUIRE(b.has_value());
  CHECK(g.bytes_outstanding() == 1024);  // a live block's guards are not the caller's
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  CHECK(g.upstream().bytes_outstanding() == 1024 + 2 * 256);
  CHECK(g.bytes_outstanding() == 1024 + 2 * 256);
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  // The same block undone by a failed guard write: the same figures.
  REQUIRE(sim.fail_nth("cuMemsetD8Async", 1, status::unknown).has_value());
  auto a = g.allocate(1024, StreamId{1}, AllocTag{2});
  REQUIRE_FALSE(a);
  CHECK(g.bytes_outstanding() == 1024 + 2 * 256);
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.upstream().bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("a reap that fails part way leaves bytes_outstanding at least what the caller holds",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{.guard_bytes = 256});
  auto& g = *rig.g;
  // Frees queued on streams 0 and 1; the reap synchronises stream 0, then fails on 1.
  // The free reaped on stream 0 has more guard bytes than the one left on stream 1 has
  // bytes, so settling its guards only at a reap that succeeds would count less than
  // the caller holds.
  auto kept = g.allocate(4096, StreamId{0}, AllocTag{1});
  auto f0 = g.allocate(1024, StreamId{0}, AllocTag{1});
  auto f1 = g.allocate(8, StreamId{1}, AllocTag{1});
  REQUIRE((kept && f0 && f1));
  REQUIRE(g.deallocate(std::move(*f0)).has_value());
  REQUIRE(g.deallocate(std::move(*f1)).has_value());
  REQUIRE(sim.fail_nth("cuStreamSynchronize", 2, status::unknown).has_value());
  REQUIRE_FALSE(g.reap_pending());
  CHECK(g.bytes_outstanding() >= 4096);
  CHECK(g.bytes_outstanding() <= 4096 + (1024 + 2 * 256) + (8 + 2 * 256));  // at most every queued free
  sim.clear_failures();
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 4096);
  REQUIRE(g.deallocate(std::move(*kept)).has_value());
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  rig.no_hazards();
}

TEST_CASE("bug 8: guard sizes that overflow or break alignment are refused by create and clamped by the constructor",
          "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  AsyncGuard rig(sim, DebugGuardOptions{});
  constexpr std::size_t huge = std::numeric_limits<std::size_t>::max() / 2 + 1;  // 2 * huge wraps to 0
  for (std::size_t bad : {huge, DebugGuardOptions::MAX_GUARD_BYTES + 8, std::size_t{1}, std::size_t{3},
                          std::size_t{100}}) {
    INFO("guard_bytes " << bad);
    auto up = AsyncCuda<SimDriver>::create(rig.streams);
    REQUIRE(up.has_value());
    auto c = DebugGuard<AsyncCuda<SimDriver>>::create(std::move(*up), DebugGuardOptions{.guard_bytes = bad});
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == errc::invalid_argument);
    CHECK_THAT(c.error().message(), Catch::Contains("guard_bytes is " + std::to_string(bad)));
  }
  for (std::size_t fine : {std::size_t{0}, std::size_t{8}, std::size_t{256}}) {
    auto up = AsyncCuda<SimDriver>::create(rig.streams);
    REQUIRE(up.has_value());
    CHECK(DebugGuard<AsyncCuda<SimDriver>>::create(std::move(*up), DebugGuardOptions{.guard_bytes = fine}).has_value());
  }
  SECTION("the constructor clamps a guard whose doubling wraps: the request is too large, not a wild block") {
    auto up = AsyncCuda<SimDriver>::create(rig.streams);
    REQUIRE(up.has_value());
    DebugGuard<AsyncCuda<SimDriver>> g{std::move(*up), DebugGuardOptions{.guard_bytes = huge}};
    CHECK(g.options().guard_bytes == DebugGuardOptions::MAX_GUARD_BYTES);
    auto b = g.allocate(1024, StreamId{0}, AllocTag{});  // 1024 + 2 GiB: more than the device has
    REQUIRE_FALSE(b);
    CHECK(g.bytes_outstanding() == 0);
  }
  SECTION("the constructor rounds a guard of 100 up to 104: the block stays 8-byte aligned") {
    auto up = AsyncCuda<SimDriver>::create(rig.streams);
    REQUIRE(up.has_value());
    DebugGuard<AsyncCuda<SimDriver>> g{std::move(*up), DebugGuardOptions{.guard_bytes = 100}};
    CHECK(g.options().guard_bytes == 104);
    auto b = g.allocate(1000, StreamId{0}, AllocTag{});
    REQUIRE(b.has_value());
    CHECK(b->ptr() % 8 == 0);
    REQUIRE(g.deallocate(std::move(*b)).has_value());
    REQUIRE(g.reap_pending().has_value());
  }
  rig.no_hazards();
}

TEST_CASE("bug 9: a forged block whose owner differs in bits 16-31 is not the live block", "[sim][debug_guard]") {
  SimDriver sim{manual_sim};
  DirectGuard rig(sim, DebugGuardOptions{.guard_bytes = 64});
  auto& g = *rig.g;
  auto b = g.allocate(1024, StreamId{0}, AllocTag{4});
  REQUIRE(b.has_value());
  REQUIRE(sim.memset_d8_async(b->ptr(), 0x11, 1024, rig.stream(0)).has_value());
  for (std::uint32_t bit : {16u, 20u, 31u}) {
    INFO("owner bit " << bit);
    const BlockId id = b->id();
    DeviceBlock forged{b->ptr(), b->bytes(), b->alloc_stream(), b->device_ordinal(), b->tag(),
                       BlockId{id.owner ^ (1u << bit), id.index, id.generation}};
    auto e = g.deallocate(std::move(forged));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::foreign_block);
    CHECK_FALSE(forged.empty());
  }
  // The live block was not poisoned, and its own free is clean.
  const auto bytes = rig.read(*b, 1024);
  CHECK(std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t v) { return v == 0x11; }));
  CHECK(g.live_blocks() == 1);
  REQUIRE(g.deallocate(std::move(*b)).has_value());
  CHECK(g.bytes_outstanding() == 0);
  rig.no_hazards();
}

// A recycled block would skip the poison and the guard check: DebugGuard refuses to be
// recycled through, so a caching layer cannot be stacked above it.
static_assert(TrackingResource<DebugGuard<AsyncCuda<SimDriver>>>);
static_assert(!RecyclingResource<DebugGuard<AsyncCuda<SimDriver>>>);
