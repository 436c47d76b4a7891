// SPDX-License-Identifier: Apache-2.0
// The completion reactor end to end on SimDriver, whose executor threads perform the flag
// writes and run the host functions as a GPU's would.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "scenarios.hpp"
#include "xlogrt/sim/sim_driver.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/pinned_flags.hpp"

using namespace xlogrt;
using namespace reactor_rt;
using namespace std::chrono_literals;

static_assert(SlotFlags<PinnedFlags<SimDriver>, StdAtomics>);

namespace {

SimConfig sim_config(bool mem_ops = true) {
  SimConfig c;
  c.devices = 1;
  c.memory_bytes = std::size_t{64} << 20;
  c.worker_threads = 4;
  c.stream_mem_ops_supported = mem_ops;
  return c;
}

ReactorOptions options(std::size_t slots = 1024) {
  ReactorOptions o;
  o.slots = slots;
  o.probe_every = 2ms;
  return o;
}

// Sizes: thousands of waits in total, small enough for TSan on two cores.
constexpr unsigned THREADS = 8;
constexpr unsigned PER_THREAD = 1000;

}  // namespace

TEST_CASE("PinnedFlags: mapped words start at 0, carry device addresses, and a stream "
          "write lands in them", "[reactor][pinned_flags]") {
  SimDriver sim(sim_config());
  auto dev = Device<SimDriver>::open(sim, 0);
  REQUIRE(dev);
  REQUIRE((*dev)->make_current());
  auto pool = StreamPool<SimDriver>::create(*dev, 1);
  REQUIRE(pool);

  auto none = PinnedFlags<SimDriver>::create(sim, 0);
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == errc::invalid_argument);

  auto flags = PinnedFlags<SimDriver>::create(sim, 100);
  REQUIRE(flags);
  CHECK(flags->size() == 100);
  for (std::size_t i = 0; i < 100; ++i) CHECK(flags->word(i) == 0u);
  CHECK(flags->device_address(7) == flags->device_address(0) + 28);
  CHECK(flags->device_address(0) % 4 == 0);

  auto s = *(*pool)->get(StreamId{0});
  REQUIRE(sim.stream_write_value32(s, flags->device_address(42), 1));
  REQUIRE(sim.stream_synchronize(s));
  CHECK(StdAtomics::load_flag(flags->word(42), std::memory_order_acquire) == 1u);
  CHECK(StdAtomics::load_flag(flags->word(41), std::memory_order_acquire) == 0u);

  // A move hands the memory over; the moved-from object frees nothing.
  PinnedFlags<SimDriver> moved(std::move(*flags));
  CHECK(moved.size() == 100);
  CHECK(flags->size() == 0);

  // The driver's failure comes back named.
  REQUIRE(sim.fail_nth("cuMemHostAlloc", 1, status::out_of_memory));
  auto failed = PinnedFlags<SimDriver>::create(sim, 8);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code() == errc::out_of_memory);
  CHECK(failed.error().message().find("8 pinned completion flags") != std::string::npos);
}

TEST_CASE("every waiter completes exactly once: 8 threads on 4 streams",
          "[reactor][stress]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  REQUIRE(rig.reactor->uses_flag_writes());
  many_waiters(rig, THREADS, PER_THREAD);
  CHECK(sim.hazards().empty());
}

TEST_CASE("every waiter completes exactly once with 4 slots (exhaustion falls back)",
          "[reactor][stress][fallback]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options(4));
  REQUIRE(rig.reactor->slots() == 4);
  many_waiters(rig, THREADS, PER_THREAD);
  const ReactorCounters c = rig.reactor->counters();
  CHECK(c.fallbacks > 0);
  CHECK(c.fallbacks < c.armed);
}

TEST_CASE("every waiter completes exactly once on a device without stream memory ops",
          "[reactor][stress][fallback]") {
  SimDriver sim(sim_config(/*mem_ops=*/false));
  Rig<SimDriver> rig(sim, options());
  REQUIRE_FALSE(rig.reactor->uses_flag_writes());
  CHECK(rig.reactor->slots() == 0);
  many_waiters(rig, THREADS, PER_THREAD / 2);
  const ReactorCounters c = rig.reactor->counters();
  CHECK(c.fallbacks == c.armed);
  CHECK(sim.calls("cuStreamWriteValue32") == 0);
}

TEST_CASE("destroying the reactor cancels every wait in flight, once",
          "[reactor][shutdown]") {
  SECTION("flag writes, slots to spare") {
    SimDriver sim(sim_config());
    Rig<SimDriver> rig(sim, options());
    shutdown_in_flight(rig, 300);
  }
  SECTION("flag writes and host functions (8 slots)") {
    SimDriver sim(sim_config());
    Rig<SimDriver> rig(sim, options(8));
    shutdown_in_flight(rig, 300);
  }
  SECTION("host functions only") {
    SimDriver sim(sim_config(false));
    Rig<SimDriver> rig(sim, options());
    shutdown_in_flight(rig, 300);
  }
}

TEST_CASE("a wait that completed before destruction completes with success",
          "[reactor][shutdown]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  REQUIRE(rig.device->make_current());
  // Park the scanner, so that the flag is written while nobody polls.
  REQUIRE(eventually([&] { return rig.reactor->counters().parks >= 1; }, 10s));
  std::atomic<int> outcome{-1};
  // A wait whose flag write has run by the time the reactor is destroyed.
  REQUIRE(rig.work(0, 1));
  REQUIRE(rig.reactor->on_done(StreamId{0}, [&](result<void> r) {
    outcome.store(r ? 0 : static_cast<int>(r.error().code()));
  }));
  REQUIRE(sim.stream_synchronize(rig.stream(0)));
  rig.reactor.reset();
  CHECK(outcome.load() == 0);
}

TEST_CASE("an injected stream fault reaches its waiters as stream_fault",
          "[reactor][fault]") {
  // The faulted stream's pending host functions never run (the reactor frees their
  // tickets when it is destroyed: see detail/reactor_fallback.hpp); the simulators, whose
  // queues still hold them, are kept alive, and reachable, to the end of the process.
  const bool mem_ops = GENERATE(true, false);
  const std::size_t slots = GENERATE(1024u, 2u);
  static auto* const keep = new std::vector<std::unique_ptr<SimDriver>>();
  keep->push_back(std::make_unique<SimDriver>(sim_config(mem_ops)));
  SimDriver& sim = *keep->back();
  Rig<SimDriver> rig(sim, options(slots));
  REQUIRE(rig.device->make_current());
  Reactor<SimDriver>& reactor = *rig.reactor;

  static Gate gate;
  gate.open.store(false);
  REQUIRE(sim.launch_host_func(rig.stream(1), &Gate::hold, &gate));
  constexpr unsigned N = 40;
  Tally faulty(N);
  Tally healthy(N);
  std::vector<std::future<void>> futures;
  for (unsigned i = 0; i < N; ++i) {
    REQUIRE(rig.work(1, 1));
    REQUIRE(reactor.on_done(StreamId{1}, [&faulty, i](result<void> r) { faulty.record(i, r, true); }));
    REQUIRE(rig.work(2, 2));
    REQUIRE(reactor.on_done(StreamId{2}, [&healthy, i](result<void> r) { healthy.record(i, r, true); }));
  }
  auto f = reactor.when_done_future(StreamId{1});
  REQUIRE(f);
  REQUIRE(sim.fault_stream(rig.stream(1), status::illegal_address));
  gate.open.store(true, std::memory_order_release);

  REQUIRE(eventually([&] { return faulty.done.load() == N && healthy.done.load() == N; }, 20s));
  CHECK(faulty.wrong_counts() == 0);
  CHECK(faulty.errors.load() == N);
  CHECK(faulty.last_code.load() == static_cast<int>(errc::stream_fault));
  CHECK(healthy.wrong_counts() == 0);
  CHECK(healthy.ok.load() == N);
  try {
    f->get();
    FAIL("the future of a faulted stream must not become ready with success");
  } catch (const FutureError& e) {
    CHECK(e.error().code() == errc::stream_fault);
    CHECK(e.error().driver_status() == status::illegal_address);
    CHECK(e.error().message().find("stream 1") != std::string::npos);
  }
  CHECK(reactor.counters().faulted == N + 1);

  // Later waits on the faulted stream fail at once; other streams still work.
  auto again = reactor.when_done_future(StreamId{1});
  REQUIRE_FALSE(again);
  CHECK(again.error().code() == errc::stream_fault);
  REQUIRE(rig.work(3, 3));
  auto fine = reactor.when_done_future(StreamId{3});
  REQUIRE(fine);
  fine->get();
  // The rig's teardown synchronises every stream: leave the faulted one out.
  rig.reactor.reset();
  rig.n_streams = 1;
}

TEST_CASE("the host-function tickets of a faulted stream are freed with the reactor",
          "[reactor][fault][fallback]") {
  // Issue #28, finding 3: the fault probe ended the waits and unlinked their tickets, but
  // only the trampoline freed a ticket, and a faulted context never runs it: three
  // tickets and, through them, the hub were lost for ever (LeakSanitizer: 256 B).
  const std::size_t alive_before = detail::FallbackHub::tickets_alive();
  {
    SimDriver sim(sim_config(false));  // no flag writes: every wait is a host function
    Rig<SimDriver> rig(sim, options());
    REQUIRE(rig.device->make_current());
    static Gate gate;
    gate.close();
    REQUIRE(sim.launch_host_func(rig.stream(1), &Gate::hold, &gate));
    constexpr unsigned N = 3;
    Tally faulty(N);
    for (unsigned i = 0; i < N; ++i) {
      REQUIRE(rig.reactor->on_done(StreamId{1}, [&faulty, i](result<void> r) { faulty.record(i, r, true); }));
    }
    CHECK(rig.reactor->counters().fallbacks == N);
    CHECK(detail::FallbackHub::tickets_alive() == alive_before + N);
    REQUIRE(sim.fault_stream(rig.stream(1), status::illegal_address));
    gate.open.store(true, std::memory_order_release);
    REQUIRE(eventually([&] { return faulty.done.load() == N; }, 20s));
    CHECK(faulty.errors.load() == N);
    CHECK(faulty.last_code.load() == static_cast<int>(errc::stream_fault));
    rig.reactor.reset();
    CHECK(detail::FallbackHub::tickets_alive() == alive_before);
    rig.n_streams = 1;  // the rig's teardown synchronises its streams: leave the faulted one out
  }
  CHECK(detail::FallbackHub::tickets_alive() == alive_before);
}

TEST_CASE("arming errors are reported and leave nothing behind", "[reactor][errors]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options(2));
  REQUIRE(rig.device->make_current());
  Reactor<SimDriver>& reactor = *rig.reactor;
  std::atomic<int> called{0};
  auto count = [&called](result<void>) { called.fetch_add(1); };

  auto unknown = reactor.on_done(StreamId{17}, count);
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == errc::unknown_stream);

  REQUIRE(sim.fail_nth("cuStreamWriteValue32", 1, status::invalid_value));
  auto bad_write = reactor.on_done(StreamId{0}, count);
  REQUIRE_FALSE(bad_write);
  CHECK(bad_write.error().driver_status() == status::invalid_value);
  CHECK(bad_write.error().message().find("stream 0") != std::string::npos);

  // The slot of the failed arm went back: both slots still arm with flag writes.
  REQUIRE(reactor.on_done(StreamId{0}, count));
  REQUIRE(reactor.on_done(StreamId{1}, count));
  CHECK(reactor.counters().fallbacks == 0);
  REQUIRE(eventually([&] { return called.load() == 2; }));

  // Hold stream 2 and take both slots with waits on it: the next wait must be a host
  // function, and its launch failure is reported too.
  static Gate gate;
  gate.open.store(false);
  REQUIRE(sim.launch_host_func(rig.stream(2), &Gate::hold, &gate));
  REQUIRE(reactor.on_done(StreamId{2}, count));
  REQUIRE(reactor.on_done(StreamId{2}, count));
  CHECK(reactor.counters().fallbacks == 0);
  const auto armed = reactor.counters().armed;
  REQUIRE(sim.fail_nth("cuLaunchHostFunc", 1, status::invalid_value));
  auto bad_host = reactor.on_done(StreamId{3}, count);
  REQUIRE_FALSE(bad_host);
  CHECK(bad_host.error().driver_status() == status::invalid_value);
  CHECK(reactor.counters().armed == armed);
  CHECK(reactor.counters().fallbacks == 0);
  // The next one succeeds on the same path.
  REQUIRE(reactor.on_done(StreamId{3}, count));
  CHECK(reactor.counters().fallbacks == 1);
  gate.open.store(true);
  REQUIRE(eventually([&] { return called.load() == 5; }));
  CHECK(reactor.counters().completed == 5);
  CHECK(sim.hazards().empty());
}

TEST_CASE("the scanner parks when nothing is armed and a registration wakes it",
          "[reactor][park]") {
  SECTION("flag writes") {
    SimDriver sim(sim_config());
    Rig<SimDriver> rig(sim, options());
    parks_when_idle_and_wakes(rig);
  }
  SECTION("host functions") {
    SimDriver sim(sim_config(false));
    Rig<SimDriver> rig(sim, options());
    parks_when_idle_and_wakes(rig);
  }
}

TEST_CASE("coroutines resume on the scanner, or on the executor named",
          "[reactor][coroutine]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  coroutines_resume_where_asked(rig);
}

TEST_CASE("ping-pong: the host awaits, then enqueues the next operation", "[reactor][pingpong]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  ping_pong(rig, 2000);
}

TEST_CASE("Reactor::create validates its options", "[reactor][errors]") {
  SimDriver sim(sim_config());
  auto pool = StreamPool<SimDriver>::open(sim, 0, 1);
  REQUIRE(pool);
  ReactorOptions o;
  o.slots = 0;
  auto r = Reactor<SimDriver>::create(*pool, o);
  REQUIRE_FALSE(r);
  CHECK(r.error().code() == errc::invalid_argument);
  o = ReactorOptions{};
  o.probe_every = 0ms;
  CHECK_FALSE(Reactor<SimDriver>::create(*pool, o));
  CHECK_FALSE(Reactor<SimDriver>::create(nullptr));
  REQUIRE(sim.fail_nth("cuMemHostAlloc", 1, status::out_of_memory));
  auto no_flags = Reactor<SimDriver>::create(*pool);
  REQUIRE_FALSE(no_flags);
  CHECK(no_flags.error().code() == errc::out_of_memory);
}

// ---- StreamPoint ----------------------------------------------------------------------

TEST_CASE("a point: waiters attached from many threads while it fires complete once each",
          "[reactor][point][stress]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  point_many_attachers(rig, 40, 4, 48);
  CHECK(rig.reactor->counters().fallbacks == 0);
  CHECK(sim.hazards().empty());
}

TEST_CASE("a point: waiters attached after it fired complete at once",
          "[reactor][point]") {
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  point_attach_after_fire(rig);
}

TEST_CASE("a point: one armed completion serves every waiter attached before it fires",
          "[reactor][point]") {
  // Deterministic: the stream is held until every waiter is attached.
  SimDriver sim(sim_config());
  Rig<SimDriver> rig(sim, options());
  REQUIRE(rig.device->make_current());
  Reactor<SimDriver>& reactor = *rig.reactor;
  static Gate gate;
  gate.open.store(false);
  REQUIRE(sim.launch_host_func(rig.stream(3), &Gate::hold, &gate));
  REQUIRE(rig.work(3, 1));
  const auto writes0 = sim.calls("cuStreamWriteValue32");
  const ReactorCounters c0 = reactor.counters();
  auto marked = reactor.mark(StreamId{3});
  REQUIRE(marked);
  constexpr unsigned N = 64;
  Tally tally(N);
  std::vector<std::pair<std::future<void>, std::size_t>> futures;
  ThreadExecutor exec;
  for (unsigned i = 0; i < N; ++i) {
    REQUIRE(attach_one(*marked, i, exec, tally, i, nullptr, 0, futures));
  }
  CHECK(tally.done.load() == 0);
  gate.open.store(true, std::memory_order_release);
  collect_futures(futures, tally, nullptr, 0);
  REQUIRE(eventually([&] { return tally.done.load(std::memory_order_acquire) == N; }));
  CHECK(tally.wrong_counts() == 0);
  CHECK(tally.ok.load() == N);
  const ReactorCounters c = reactor.counters();
  CHECK(c.armed - c0.armed == 1);
  CHECK(c.completed - c0.completed == 1);
  CHECK(c.coalesced - c0.coalesced == N);
  CHECK(sim.calls("cuStreamWriteValue32") - writes0 == 1);
}

TEST_CASE("a point on the host-function path (slots exhausted, or no stream memory ops)",
          "[reactor][point][fallback]") {
  SECTION("slots exhausted") {
    SimDriver sim(sim_config());
    Rig<SimDriver> rig(sim, options(4));
    point_on_fallback_path(rig, 20, 4, 32);
  }
  SECTION("no stream memory ops") {
    SimDriver sim(sim_config(/*mem_ops=*/false));
    Rig<SimDriver> rig(sim, options());
    REQUIRE_FALSE(rig.reactor->uses_flag_writes());
    point_on_fallback_path(rig, 20, 4, 32);
  }
}

TEST_CASE("destroying the reactor cancels the waiters of an armed point",
          "[reactor][point][shutdown]") {
  SECTION("flag write") {
    SimDriver sim(sim_config());
    Rig<SimDriver> rig(sim, options());
    point_cancelled_by_shutdown(rig, 200);
  }
  SECTION("host function") {
    SimDriver sim(sim_config(false));
    Rig<SimDriver> rig(sim, options());
    point_cancelled_by_shutdown(rig, 200);
  }
}

TEST_CASE("a stream fault reaches every waiter of a point, and later ones at once",
          "[reactor][point][fault]") {
  // As in the fault test above: the simulators outlive the process's tests.
  const bool mem_ops = GENERATE(true, false);
  static auto* const keep = new std::vector<std::unique_ptr<SimDriver>>();
  keep->push_back(std::make_unique<SimDriver>(sim_config(mem_ops)));
  SimDriver& sim = *keep->back();
  Rig<SimDriver> rig(sim, options());
  REQUIRE(rig.device->make_current());
  Reactor<SimDriver>& reactor = *rig.reactor;
  static Gate gate;
  gate.open.store(false);
  REQUIRE(sim.launch_host_func(rig.stream(1), &Gate::hold, &gate));
  REQUIRE(rig.work(1, 1));
  auto marked = reactor.mark(StreamId{1});
  REQUIRE(marked);
  const StreamPoint point = std::move(*marked);
  constexpr unsigned N = 60;
  static_assert((N - 1) % 4 != 1, "the last waiter attached must not be a future: see below");
  Tally tally(N);
  std::vector<std::pair<std::future<void>, std::size_t>> futures;
  ThreadExecutor exec;
  for (unsigned i = 0; i < N; ++i) {
    REQUIRE(attach_one(point, i, exec, tally, i, nullptr, 0, futures));
  }
  REQUIRE(sim.fault_stream(rig.stream(1), status::illegal_address));
  gate.open.store(true, std::memory_order_release);
  // The futures are collected only once the waiters attached after them have run: the
  // point completes its waiters in attach order, so the scanner has then destroyed every
  // promise. (Otherwise the scanner may drop the last reference to a FutureError that
  // this thread caught, ordered only by libstdc++'s exception_ptr count, which TSan does
  // not see: a false report.)
  const std::size_t n_futures = futures.size();
  REQUIRE(eventually(
      [&] { return tally.done.load(std::memory_order_acquire) == N - n_futures; }, 20s));
  collect_futures(futures, tally, nullptr, 0);
  REQUIRE(tally.done.load() == N);
  CHECK(tally.wrong_counts() == 0);
  CHECK(tally.errors.load() == N);
  CHECK(tally.last_code.load() == static_cast<int>(errc::stream_fault));
  CHECK(reactor.counters().faulted == 1);  // the point's one completion
  CHECK(reactor.counters().coalesced == N);
  CHECK(point.done());
  int code = 0;
  REQUIRE(point.on_done(
      [&code](result<void> r) { code = r ? 0 : static_cast<int>(r.error().code()); }));
  CHECK(code == static_cast<int>(errc::stream_fault));
  auto again = reactor.mark(StreamId{1});
  REQUIRE_FALSE(again);
  CHECK(again.error().code() == errc::stream_fault);
  rig.reactor.reset();
  rig.n_streams = 1;
}

TEST_CASE("weak spot: a failed stream query that is not sticky does not fault the stream; a sticky one does",
          "[reactor][fault]") {
  // As in the fault test above: the simulators outlive the process's tests (the faulted
  // case leaves host functions in the simulator's queues).
  static auto* const keep = new std::vector<std::unique_ptr<SimDriver>>();
  keep->push_back(std::make_unique<SimDriver>(sim_config()));
  SimDriver& sim = *keep->back();
  Rig<SimDriver> rig(sim, options());
  REQUIRE(rig.device->make_current());
  Reactor<SimDriver>& reactor = *rig.reactor;
  static Gate gate;

  // Hold stream 1 so its waits stay armed while the scanner probes it, and make its
  // queries fail; returns the wait and the query count before the failure.
  const auto arm_and_fail = [&](int fail_status, bool always) {
    gate.open.store(false);
    REQUIRE(sim.launch_host_func(rig.stream(1), &Gate::hold, &gate));
    auto f = reactor.when_done_future(StreamId{1});
    REQUIRE(f);
    const auto queries = sim.calls("cuStreamQuery");
    if (always) {
      REQUIRE(sim.fail_always("cuStreamQuery", fail_status));
    } else {
      REQUIRE(sim.fail_nth("cuStreamQuery", 1, fail_status));
    }
    return std::pair{std::move(*f), queries};
  };
  const auto release = [&] {
    sim.clear_failures();
    gate.open.store(true, std::memory_order_release);
  };

  SECTION("a transient failure: the wait completes with success, and later waits work") {
    auto [f, queries] = arm_and_fail(status::unknown, false);
    // The failed probe, and two more while the wait stays armed.
    REQUIRE(eventually([&, q = queries] { return sim.calls("cuStreamQuery") >= q + 3; }, 20s));
    release();
    CHECK_NOTHROW(f.get());
    auto again = reactor.when_done_future(StreamId{1});
    REQUIRE(again);
    again->get();
    CHECK(reactor.counters().faulted == 0);
  }
  SECTION("a sticky status (illegal address): the stream is faulted for good") {
    auto [f, queries] = arm_and_fail(status::illegal_address, false);
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    release();
    CHECK_THROWS_AS(f.get(), FutureError);
    auto again = reactor.when_done_future(StreamId{1});
    REQUIRE_FALSE(again);
    CHECK(again.error().code() == errc::stream_fault);
  }
  SECTION("a stream that cannot be queried at all faults after repeated failures") {
    auto [f, queries] = arm_and_fail(status::invalid_handle, true);
    REQUIRE(f.wait_for(20s) == std::future_status::ready);
    CHECK(sim.calls("cuStreamQuery") >= queries + Reactor<SimDriver>::QUERY_FAILURES_TO_FAULT);
    release();
    CHECK_THROWS_AS(f.get(), FutureError);
  }
  REQUIRE(sim.stream_synchronize(rig.stream(1)));
}
