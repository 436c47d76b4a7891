// SPDX-License-Identifier: Apache-2.0
// Cross-stream use tracking, checked by SimDriver's hazard checker: randomized
// multi-stream alloc / use / free programs report no hazard when every use is wrapped in
// prepare / finish (here through launch()), and the checker does report hazards when
// the program skips finish_block_use or does not track at all — proof that the check can
// fail.

#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include <xlogrt/memory/launch.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

using namespace xlogrt;

namespace {

using Rt = DeviceRuntime<AsyncCuda<SimDriver>>;

enum class Mode { tracked, skip_finish, untracked };

struct Program {
  SimDriver sim;
  std::shared_ptr<StreamPool<SimDriver>> streams;
  std::unique_ptr<Rt> rt;

  explicit Program(std::uint64_t seed)
      : sim(SimConfig{.executor = SimExecutor::manual, .seed = seed}) {
    auto made = Rt::open(sim, 0, 4);  // StackBuilder builds the stack
    REQUIRE(made.has_value());
    streams = made->streams();
    rt = std::make_unique<Rt>(std::move(*made));
  }

  /// A simulated kernel on `s` that touches `b` with `a`.
  result<void> kernel(SimDriver::stream_t s, const DeviceBlock& b, Access a) {
    return sim.launch_kernel(s, {SimAccess{b.ptr(), b.bytes(), a}});
  }

  /// One use of `b` on stream `use`, wrapped as `mode` says.
  void use(const DeviceBlock& b, StreamId use, Access a, Mode mode) {
    auto s = rt->stream(use);
    REQUIRE(s.has_value());
    switch (mode) {
      case Mode::tracked:
        REQUIRE(launch(*rt, use, [&](SimDriver::stream_t cs) { return kernel(cs, b, a); },
                       BufferUse{b.id(), a})
                    .has_value());
        break;
      case Mode::skip_finish:
        REQUIRE(rt->prepare_block_use(b.id(), use, a).has_value());
        REQUIRE(kernel(*s, b, a).has_value());
        break;
      case Mode::untracked:
        REQUIRE(kernel(*s, b, a).has_value());
        break;
    }
  }

  /// A random program: 4 streams, up to 6 live blocks, 120 steps of allocate / use /
  /// free. Returns the number of hazards the simulator reports.
  std::size_t run_random(std::uint64_t seed, Mode mode) {
    std::mt19937_64 rng(seed);
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    std::vector<DeviceBlock> live;
    for (int step = 0; step < 120; ++step) {
      const auto choice = pick(10);
      if (live.empty() || (choice < 3 && live.size() < 6)) {
        auto b = rt->allocate(256 * (1 + pick(8)), StreamId{static_cast<std::uint32_t>(pick(4))});
        REQUIRE(b.has_value());
        // The owner initialises the block on its own stream.
        use(*b, b->alloc_stream(), Access::Write, mode);
        live.push_back(std::move(*b));
      } else if (choice < 8) {
        const auto& b = live[pick(live.size())];
        const Access a = pick(3) == 0 ? Access::Write : (pick(2) ? Access::Read : Access::ReadWrite);
        use(b, StreamId{static_cast<std::uint32_t>(pick(4))}, a, mode);
      } else {
        const auto i = pick(live.size());
        REQUIRE(rt->deallocate(std::move(live[i])).has_value());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    for (auto& b : live) REQUIRE(rt->deallocate(std::move(b)).has_value());
    sim.run_until_idle();
    REQUIRE(rt->reap_pending().has_value());
    CHECK(rt->bytes_outstanding() == 0);
    return sim.hazards().size();
  }
};

}  // namespace

TEST_CASE("randomized multi-stream programs with tracking have no hazard", "[tracking][hazards]") {
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    Program p(seed);
    const auto n = p.run_random(seed, Mode::tracked);
    if (n != 0) {
      for (const auto& h : p.sim.hazards()) UNSCOPED_INFO(to_string(h));
    }
    INFO("seed " << seed);
    REQUIRE(n == 0);
  }
}

TEST_CASE("the hazard checker catches a program that skips finish_block_use", "[tracking][hazards]") {
  std::size_t seeds_with_hazards = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    Program p(seed);
    if (p.run_random(seed, Mode::skip_finish) > 0) ++seeds_with_hazards;
  }
  CHECK(seeds_with_hazards > 30);
}

TEST_CASE("the hazard checker catches a program that does not track", "[tracking][hazards]") {
  std::size_t seeds_with_hazards = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    Program p(seed);
    if (p.run_random(seed, Mode::untracked) > 0) ++seeds_with_hazards;
  }
  CHECK(seeds_with_hazards > 30);
}

TEST_CASE("read on B, free on A: the free waits for B only with tracking", "[tracking][hazards]") {
  for (Mode mode : {Mode::tracked, Mode::skip_finish}) {
    Program p(7);
    auto b = p.rt->allocate(4096, StreamId{0});
    REQUIRE(b.has_value());
    p.use(*b, StreamId{0}, Access::Write, Mode::tracked);  // the owner fills it on A
    p.use(*b, StreamId{1}, Access::Read, mode);            // a reader on B
    REQUIRE(p.rt->deallocate(std::move(*b)).has_value());  // the owner frees it on A
    auto next = p.rt->allocate(4096, StreamId{0});         // A reuses the memory at once
    REQUIRE(next.has_value());
    p.use(*next, StreamId{0}, Access::Write, Mode::tracked);
    p.sim.run_until_idle();
    const auto hazards = p.sim.hazards();
    if (mode == Mode::tracked) {
      for (const auto& h : hazards) UNSCOPED_INFO(to_string(h));
      CHECK(hazards.empty());
    } else {
      REQUIRE_FALSE(hazards.empty());
      CHECK(to_string(hazards.front()).find("stream") != std::string::npos);
    }
    REQUIRE(p.rt->deallocate(std::move(*next)).has_value());
    REQUIRE(p.rt->reap_pending().has_value());
  }
}

TEST_CASE("same-stream use makes no event call; cross-stream use waits once", "[tracking]") {
  Program p(3);
  auto b = p.rt->allocate(1024, StreamId{0});
  REQUIRE(b.has_value());
  const auto records = p.sim.calls("cuEventRecord");
  const auto waits = p.sim.calls("cuStreamWaitEvent");
  for (int i = 0; i < 10; ++i) p.use(*b, StreamId{0}, i % 2 ? Access::Read : Access::Write, Mode::tracked);
  CHECK(p.sim.calls("cuEventRecord") == records);
  CHECK(p.sim.calls("cuStreamWaitEvent") == waits);
  // A reader on stream 1: one event on stream 0 (the last write), one wait on stream 1,
  // and one event on stream 1 recording the read. A second read on 1 waits no more.
  p.use(*b, StreamId{1}, Access::Read, Mode::tracked);
  p.use(*b, StreamId{1}, Access::Read, Mode::tracked);
  CHECK(p.sim.calls("cuStreamWaitEvent") == waits + 1);
  CHECK(p.sim.calls("cuEventRecord") == records + 3);
  REQUIRE(p.rt->deallocate(std::move(*b)).has_value());
  p.sim.run_until_idle();
  CHECK(p.sim.hazards().empty());
  REQUIRE(p.rt->reap_pending().has_value());
}

TEST_CASE("an enqueue failure in launch leaves the block's state right", "[tracking]") {
  Program p(5);
  auto b = p.rt->allocate(1024, StreamId{0});
  REQUIRE(b.has_value());
  p.use(*b, StreamId{0}, Access::Write, Mode::tracked);
  p.sim.fail_nth("cuLaunchKernel", 1, status::launch_failed);
  auto r = launch(*p.rt, StreamId{1}, [&](SimDriver::stream_t s) { return p.kernel(s, *b, Access::Read); },
                  read(*b));
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::stream_fault);
  // The failed launch recorded no use: a retry works and the free still orders right.
  p.use(*b, StreamId{1}, Access::Read, Mode::tracked);
  REQUIRE(p.rt->deallocate(std::move(*b)).has_value());
  p.sim.run_until_idle();
  CHECK(p.sim.hazards().empty());
  REQUIRE(p.rt->reap_pending().has_value());
}

TEST_CASE("device_buffer frees through its runtime and carries its BlockId", "[tracking][buffer]") {
  Program p(9);
  {
    auto buf = device_buffer<float, Rt>::create(*p.rt, 256, StreamId{2}, AllocTag{4});
    REQUIRE(buf.has_value());
    CHECK(buf->size() == 256);
    CHECK(buf->bytes() == 1024);
    CHECK(buf->stream() == StreamId{2});
    CHECK(buf->id() == buf->block().id());
    REQUIRE(buf->prepare_first_use(StreamId{3}, Access::Write).has_value());
    REQUIRE(p.kernel(*p.rt->stream(StreamId{3}), buf->block(), Access::Write).has_value());
    REQUIRE(buf->finish_first_use(StreamId{3}, Access::Write).has_value());
    auto moved = std::move(*buf);
    CHECK(buf->empty());
    CHECK(p.rt->bytes_outstanding() == 1024);
  }  // destroyed: freed on stream 2 after stream 3's write
  p.sim.run_until_idle();
  CHECK(p.sim.hazards().empty());
  REQUIRE(p.rt->reap_pending().has_value());
  CHECK(p.rt->bytes_outstanding() == 0);
  auto zero = device_buffer<float, Rt>::create(*p.rt, 0);
  REQUIRE_FALSE(zero);
  CHECK(zero.error().code() == errc::zero_bytes);
}

// ---- issue 16: blocks rebuilt with other fields, and unchecked streams ---------------

namespace {
/// The error code of a failed result, nothing for a success (reading error() of a
/// success would read whatever an earlier error left there).
template <class R>
std::optional<errc> failure(const R& r) {
  if (r) return std::nullopt;
  return r.error().code();
}

/// Runs `body(stack, program)` on a bare AsyncCuda and on a DirectCuda over a Program's streams.
template <class F>
void on_both_bases(F&& body) {
  {
    Program p(11);
    auto a = AsyncCuda<SimDriver>::create(p.streams);
    REQUIRE(a.has_value());
    INFO("AsyncCuda");
    body(*a, p);
  }
  {
    Program p(12);
    DirectCuda<SimDriver> d(p.streams);
    INFO("DirectCuda");
    body(d, p);
  }
}
}  // namespace

TEST_CASE("bug 2: a block rebuilt with another valid alloc stream is refused, not freed on that stream",
          "[tracking][hazards]") {
  on_both_bases([](auto& r, Program& p) {
    auto b = r.allocate(4096, StreamId{0}, AllocTag{1});
    REQUIRE(b.has_value());
    REQUIRE(p.kernel(*p.streams->get(StreamId{0}), *b, Access::Write).has_value());  // work on its own stream
    DeviceBlock forged{b->ptr(), b->bytes(), StreamId{1}, b->device_ordinal(), b->tag(), b->id()};
    auto e = r.deallocate(std::move(forged));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::foreign_block);
    CHECK_THAT(e.error().message(), Catch::Contains("stream or tag differs"));
    CHECK_FALSE(forged.empty());
    // The block is still live, and its own free is right.
    REQUIRE(r.deallocate(std::move(*b)).has_value());
    p.sim.run_until_idle();
    const auto hz = p.sim.hazards();
    for (const auto& h : hz) UNSCOPED_INFO(to_string(h));
    CHECK(hz.empty());
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == 0);
  });
}

TEST_CASE("bug 3: a block rebuilt with another tag is refused, and Statistics stays exact", "[tracking]") {
  on_both_bases([](auto& base, Program&) {
    using Base = std::remove_cvref_t<decltype(base)>;
    Statistics<Base> s{std::move(base)};
    auto b = s.allocate(1024, StreamId{0}, AllocTag{1});
    REQUIRE(b.has_value());
    DeviceBlock forged{b->ptr(), b->bytes(), b->alloc_stream(), b->device_ordinal(), AllocTag{2}, b->id()};
    auto e = s.deallocate(std::move(forged));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::foreign_block);
    CHECK_FALSE(forged.empty());
    // A use does not depend on the tag (a caching layer hands blocks out under a new
    // one without telling the table), so it may be recorded through it.
    if constexpr (TrackingResource<Base>) {
      DeviceBlock other{b->ptr(), b->bytes(), b->alloc_stream(), b->device_ordinal(), AllocTag{2}, b->id()};
      CHECK(s.record_block_use(other, StreamId{1}).has_value());
    }
    REQUIRE(s.deallocate(std::move(*b)).has_value());
    REQUIRE(s.reap_pending().has_value());
    const auto snap = s.snapshot();
    CHECK(snap.total.current_bytes == 0);
    CHECK(snap.total.current_count == 0);
    CHECK(s.bytes_outstanding() == 0);
  });
}

TEST_CASE("bug 4: finish_block_use on stream 0xFFFFFFFF is unknown_stream, quiet block or not", "[tracking]") {
  Program p(13);
  auto made = AsyncCuda<SimDriver>::create(p.streams);  // the resource itself, not the runtime's checks
  REQUIRE(made.has_value());
  auto& r = *made;
  auto b = r.allocate(1024, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());
  for (std::uint32_t bad : {0xFFFFFFFFu, 0xFFFFFFFEu}) {
    INFO("stream " << bad << ", quiet block");
    CHECK(failure(r.finish_block_use(b->id(), StreamId{bad}, Access::Read)) == errc::unknown_stream);
  }
  REQUIRE(r.prepare_block_use(b->id(), StreamId{1}, Access::Read).has_value());
  REQUIRE(p.kernel(*p.streams->get(StreamId{1}), *b, Access::Read).has_value());
  REQUIRE(r.finish_block_use(b->id(), StreamId{1}, Access::Read).has_value());  // no longer quiet
  for (std::uint32_t bad : {0xFFFFFFFFu, 0xFFFFFFFEu}) {
    INFO("stream " << bad << ", block used on another stream");
    for (Access a : {Access::Read, Access::Write}) {
      CHECK(failure(r.finish_block_use(b->id(), StreamId{bad}, a)) == errc::unknown_stream);
    }
  }
  REQUIRE(r.deallocate(std::move(*b)).has_value());
  p.sim.run_until_idle();
  CHECK(p.sim.hazards().empty());
  REQUIRE(r.reap_pending().has_value());
}

TEST_CASE("generation wrap: AsyncCuda retires a slot in its last generation and recycles such a block into a new slot",
          "[tracking]") {
  Program p(14);
  auto made = AsyncCuda<SimDriver>::create(p.streams);
  REQUIRE(made.has_value());
  auto& r = *made;
  constexpr std::uint32_t LAST = BlockTable<int>::LAST_GENERATION;
  auto first = r.allocate(1024, StreamId{0}, AllocTag{1});
  REQUIRE(first.has_value());
  const BlockId old = first->id();
  // A stale copy of the first block, kept while the slot is reused 2^32 times.
  const auto copy_of = [](const DeviceBlock& b, BlockId id) {
    return DeviceBlock{b.ptr(), b.bytes(), b.alloc_stream(), b.device_ordinal(), b.tag(), id};
  };
  DeviceBlock stale = copy_of(*first, old);
  SECTION("freed in its last generation: the slot is never handed out again") {
    DeviceBlock aged = copy_of(*first, r.set_generation_for_testing(old, LAST));
    DeviceBlock gone = std::move(*first);
    REQUIRE(r.deallocate(std::move(aged)).has_value());
    auto next = r.allocate(1024, StreamId{0}, AllocTag{1});
    REQUIRE(next.has_value());
    CHECK(next->id().index != old.index);
    auto e = r.deallocate(std::move(stale));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::double_free);
    REQUIRE(r.deallocate(std::move(*next)).has_value());
  }
  SECTION("recycled in its last generation: the block moves to a new slot, and the old id goes stale") {
    DeviceBlock aged = copy_of(*first, r.set_generation_for_testing(old, LAST));
    DeviceBlock gone = std::move(*first);
    const BlockId last = aged.id();
    REQUIRE(r.prepare_block_use(last, StreamId{2}, Access::Write).has_value());  // a use on another stream
    REQUIRE(p.kernel(*p.streams->get(StreamId{2}), aged, Access::Write).has_value());
    REQUIRE(r.finish_block_use(last, StreamId{2}, Access::Write).has_value());
    auto moved = r.recycle_block(aged, StreamId{0});
    REQUIRE(moved.has_value());
    CHECK(aged.empty());
    CHECK(moved->id().index != last.index);
    CHECK(moved->ptr() == stale.ptr());
    CHECK(r.live_blocks() == 1);
    CHECK(r.bytes_outstanding() == 1024);
    CHECK(failure(r.prepare_block_use(last, StreamId{1}, Access::Read)) == errc::stale_block);
    // The memory is reused on stream 0: ordered after the use on stream 2.
    REQUIRE(p.kernel(*p.streams->get(StreamId{0}), *moved, Access::Write).has_value());
    auto e = r.deallocate(std::move(stale));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::double_free);
    REQUIRE(r.deallocate(std::move(*moved)).has_value());
  }
  p.sim.run_until_idle();
  const auto hz = p.sim.hazards();
  for (const auto& h : hz) UNSCOPED_INFO(to_string(h));
  CHECK(hz.empty());
  REQUIRE(r.reap_pending().has_value());
  CHECK(r.bytes_outstanding() == 0);
  CHECK(r.live_blocks() == 0);
}

TEST_CASE("weak spot: a finish_block_use whose event cannot be recorded keeps the use, so the free still waits",
          "[tracking][hazards]") {
  for (Access a : {Access::Write, Access::Read}) {
    INFO("access " << static_cast<int>(a));
    Program p(15);
    auto made = AsyncCuda<SimDriver>::create(p.streams);
    REQUIRE(made.has_value());
    auto& r = *made;
    auto s1 = p.streams->get(StreamId{1});
    auto s0 = p.streams->get(StreamId{0});
    auto b = r.allocate(4096, StreamId{0}, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(r.prepare_block_use(b->id(), StreamId{1}, a).has_value());
    REQUIRE(p.kernel(*s1, *b, a).has_value());
    REQUIRE(p.sim.fail_nth("cuEventRecord", 1, status::unknown).has_value());
    auto f = r.finish_block_use(b->id(), StreamId{1}, a);
    REQUIRE_FALSE(f);
    CHECK(f.error().code() == errc::driver_error);
    CHECK_THAT(f.error().message(), Catch::Contains("recorded all the same"));
    // Nothing more to do: the free waits for the use on stream 1, and the memory reused on
    // stream 0 is not touched before that use is done.
    REQUIRE(r.deallocate(std::move(*b)).has_value());
    auto next = r.allocate(4096, StreamId{0}, AllocTag{});
    REQUIRE(next.has_value());
    REQUIRE(p.kernel(*s0, *next, Access::Write).has_value());
    REQUIRE(r.deallocate(std::move(*next)).has_value());
    p.sim.run_until_idle();
    const auto hz = p.sim.hazards();
    for (const auto& h : hz) UNSCOPED_INFO(to_string(h));
    CHECK(hz.empty());
    REQUIRE(r.reap_pending().has_value());
    CHECK(r.bytes_outstanding() == 0);
  }
}
