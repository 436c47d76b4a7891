// SPDX-License-Identifier: Apache-2.0
// SimDriver's stream capture: beginning and ending captures, recording instead of
// running, fork and join through events, the rules whose violation invalidates a
// capture (each with the CUDA status and a failed end), capture modes, graph memory
// nodes, and graph replay as the hazard checker sees it. Every case runs in manual mode.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;
using simtest::expect_ok;
using simtest::manual;
using simtest::Sim;
using simtest::value;

namespace {

using Stream = SimDriver::stream_t;

/// The driver status of a failed result; 0 when it succeeded.
template <class T>
int status_of(const result<T>& r) {
  return r ? 0 : r.error().driver_status();
}

CaptureInfo info(Sim& sim, Stream s) { return value(sim.d.stream_capture_info(s)); }

/// Ends the capture on `s`, which must fail with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
/// and leaves `s` out of capture.
void end_fails_invalidated(Sim& sim, Stream s) {
  auto g = sim.d.stream_end_capture(s);
  REQUIRE_FALSE(g);
  CHECK(g.error().driver_status() == status::stream_capture_invalidated);
  CHECK(g.error().message().find("cuStreamEndCapture") == 0);
  CHECK(info(sim, s).status == CaptureStatus::none);
}

void count_call(void* p) { ++*static_cast<int*>(p); }

std::string describe(const std::vector<SimHazard>& hs) {
  std::string s;
  for (const auto& h : hs) s += to_string(h) + "\n";
  return s;
}

}  // namespace

TEST_CASE("the capture vocabulary's static facts", "[sim][capture]") {
  STATIC_REQUIRE(CapturingDriver<SimDriver>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::graph_t>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::graph_exec_t>);
}

TEST_CASE("begin and end capture: status, a unique id, and the driver's refusals",
          "[sim][capture]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  CHECK(info(sim, a).status == CaptureStatus::none);
  CHECK(info(sim, a).id == 0);

  expect_ok(sim.d.stream_begin_capture(a, CaptureMode::global));
  expect_ok(sim.d.stream_begin_capture(b, CaptureMode::per_thread));
  const CaptureInfo ia = info(sim, a);
  const CaptureInfo ib = info(sim, b);
  CHECK(ia.status == CaptureStatus::active);
  CHECK(ib.status == CaptureStatus::active);
  CHECK(ia.id != 0);
  CHECK(ib.id != 0);
  CHECK(ia.id != ib.id);

  // A second begin on a capturing stream, and a capture on the legacy default stream,
  // are refused as the driver refuses them; neither disturbs the capture underway.
  auto again = sim.d.stream_begin_capture(a, CaptureMode::global);
  CHECK(status_of(again) == status::illegal_state);
  auto legacy = sim.d.stream_begin_capture(nullptr, CaptureMode::global);
  CHECK(status_of(legacy) == status::stream_capture_unsupported);
  CHECK(info(sim, a).status == CaptureStatus::active);
  CHECK(info(sim, a).id == ia.id);

  // Ending where no capture runs is refused too.
  auto c = sim.stream();
  CHECK(status_of(sim.d.stream_end_capture(c)) == status::illegal_state);

  auto ga = value(sim.d.stream_end_capture(a));
  auto gb = value(sim.d.stream_end_capture(b));
  CHECK(ga != nullptr);
  CHECK(ga != gb);
  CHECK(info(sim, a).status == CaptureStatus::none);
  CHECK(info(sim, a).id == 0);

  // A new capture on the same stream has a new id.
  expect_ok(sim.d.stream_begin_capture(a, CaptureMode::global));
  CHECK(info(sim, a).id != ia.id);
  CHECK(info(sim, a).id != ib.id);
  auto g2 = value(sim.d.stream_end_capture(a));
  for (auto g : {ga, gb, g2}) expect_ok(sim.d.graph_destroy(g));
  CHECK(status_of(sim.d.graph_destroy(ga)) == status::invalid_value);  // destroyed already

  const SimCaptureStats st = sim.d.capture_stats();
  CHECK(st.captures_begun == 3);
  CHECK(st.captures_ended == 3);
  CHECK(st.captures_failed == 0);
  CHECK(sim.d.calls("cuStreamBeginCapture") == 5);
  CHECK(sim.d.calls("cuStreamEndCapture") == 4);
}

TEST_CASE("a capture not begun in relaxed mode ends on its own thread only", "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::per_thread}) {
    expect_ok(sim.d.stream_begin_capture(s, mode));
    int other = -1;
    std::thread([&] { other = status_of(sim.d.stream_end_capture(s)); }).join();
    CHECK(other == status::stream_capture_wrong_thread);
    CHECK(info(sim, s).status == CaptureStatus::active);  // the capture goes on
    expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(s))));
  }
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::relaxed));
  std::optional<result<SimDriver::graph_t>> ended;
  std::thread([&] { ended = sim.d.stream_end_capture(s); }).join();
  REQUIRE(ended.has_value());
  expect_ok(sim.d.graph_destroy(value(std::move(*ended))));
}

TEST_CASE("work on a capturing stream is recorded, not run; each launch replays it",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  auto launch_stream = sim.stream();
  constexpr std::size_t n = 64;
  const std::uint64_t p = sim.alloc(n, s);
  const std::uint64_t q = sim.alloc(n, s);
  sim.fill(p, 0, n, s);
  sim.fill(q, 0, n, s);
  expect_ok(sim.d.stream_synchronize(s));

  std::vector<std::uint8_t> src(n, 0);
  int host_calls = 0;
  int kernel_runs = 0;
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
  sim.fill(p, 7, n, s);                                          // p = 7
  expect_ok(sim.d.memcpy_htod_async(q, src.data(), n / 2, s));   // q[0, 32) = src
  expect_ok(sim.d.launch_kernel(s, {{p, n, Access::ReadWrite}},  // p += 1
                                [&](std::span<std::byte* const> ptrs) {
                                  ++kernel_runs;
                                  for (std::size_t i = 0; i < n; ++i)
                                    ptrs[0][i] = std::byte(std::to_integer<int>(ptrs[0][i]) + 1);
                                },
                                "increment"));
  expect_ok(sim.d.memcpy_dtod_async(q + n / 2, p, n / 2, s));   // q[32, 64) = p
  expect_ok(sim.d.stream_write_value32(s, q, 0xC0FFEEu));        // q[0, 4) = flag
  expect_ok(sim.d.launch_host_func(s, &count_call, &host_calls));
  auto g = value(sim.d.stream_end_capture(s));

  // Nothing ran: no operation is pending, and the memory is as before.
  CHECK(sim.d.pending_ops() == 0);
  sim.d.run_until_idle();
  CHECK(host_calls == 0);
  CHECK(kernel_runs == 0);
  CHECK(sim.read(p, n, s) == std::vector<std::uint8_t>(n, 0));
  CHECK(sim.read(q, n, s) == std::vector<std::uint8_t>(n, 0));

  auto x = value(sim.d.graph_instantiate(g));
  for (int launch = 1; launch <= 3; ++launch) {
    std::memset(src.data(), 10 * launch, n);  // the copy reads its source when it runs
    expect_ok(sim.d.graph_launch(x, launch_stream));
    CHECK(sim.d.pending_ops() > 0);
    const auto pv = sim.read(p, n, launch_stream);
    const auto qv = sim.read(q, n, launch_stream);
    CHECK(pv == std::vector<std::uint8_t>(n, 8));  // 7, then + 1, every launch
    std::uint32_t flag = 0;
    std::memcpy(&flag, qv.data(), 4);
    CHECK(flag == 0xC0FFEEu);
    CHECK(qv[4] == 10 * launch);
    CHECK(qv[n / 2 - 1] == 10 * launch);
    CHECK(qv[n / 2] == 8);
    CHECK(qv[n - 1] == 8);
    CHECK(host_calls == launch);
    CHECK(kernel_runs == launch);
  }
  CHECK(sim.d.hazards().empty());
  CHECK(sim.d.capture_stats().graph_launches == 3);
  expect_ok(sim.d.graph_exec_destroy(x));
  expect_ok(sim.d.graph_destroy(g));
  CHECK(status_of(sim.d.graph_launch(x, launch_stream)) == status::invalid_value);
}

TEST_CASE("a launch is stream-ordered after the launch stream's earlier work, and checked there",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  auto l1 = sim.stream();
  auto l2 = sim.stream();
  constexpr std::size_t n = 256;
  const std::uint64_t p = value(sim.d.mem_alloc(n));
  const std::uint64_t q = value(sim.d.mem_alloc(n));
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
  expect_ok(sim.d.memcpy_dtod_async(q, p, n, s));  // reads p
  auto x = value(sim.d.graph_instantiate(value(sim.d.stream_end_capture(s))));

  sim.fill(p, 0x42, n, l1);
  expect_ok(sim.d.graph_launch(x, l1));  // after the fill on l1: ordered
  CHECK(sim.read(q, n, l1) == std::vector<std::uint8_t>(n, 0x42));
  CHECK(sim.d.hazards().empty());

  // On l2 the replayed read of p is not ordered after a write to p on l1: a race, named
  // as the copy it replays, on the launch stream.
  sim.fill(p, 0x43, n, l1);
  expect_ok(sim.d.graph_launch(x, l2));
  const auto hs = sim.d.hazards();
  INFO(describe(hs));
  REQUIRE(hs.size() == 1);
  CHECK(hs[0].kind == SimHazardKind::race);
  CHECK(hs[0].second.kind == SimOpKind::memcpy_dtod);
  CHECK(hs[0].second.stream == l2);
  CHECK(hs[0].first.stream == l1);
}

TEST_CASE("launching a graph whose buffer was freed since capture is caught like eager use",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  constexpr std::size_t n = 128;
  const std::uint64_t p = sim.alloc(n, s);
  const std::uint64_t q = sim.alloc(n, s);
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
  sim.fill(p, 1, n, s);                            // writes p
  expect_ok(sim.d.memcpy_dtod_async(q, p, n, s));  // reads p
  auto g = value(sim.d.stream_end_capture(s));
  auto x = value(sim.d.graph_instantiate(g));
  expect_ok(sim.d.graph_launch(x, s));
  CHECK(sim.d.hazards().empty());

  expect_ok(sim.d.mem_free_async(p, s));
  CHECK(sim.d.hazards().empty());  // freeing what the graph uses is legal by itself...
  expect_ok(sim.d.graph_launch(x, s));  // ...launching it afterwards is not
  const auto hs = sim.d.hazards();
  INFO(describe(hs));
  REQUIRE(hs.size() == 2);
  CHECK(hs[0].kind == SimHazardKind::use_after_free);
  CHECK(hs[0].second.kind == SimOpKind::memset);
  CHECK(hs[0].first.kind == SimOpKind::mem_free_async);
  CHECK(hs[0].address == p);
  CHECK(hs[1].kind == SimHazardKind::use_after_free);
  CHECK(hs[1].second.kind == SimOpKind::memcpy_dtod);
  CHECK(hs[1].second.access == Access::Read);
  expect_ok(sim.d.graph_exec_destroy(x));
  expect_ok(sim.d.graph_destroy(g));
}

TEST_CASE("fork and join: a stream waiting on an event of the capture joins it",
          "[sim][capture]") {
  Sim sim;
  auto origin = sim.stream();
  auto side = sim.stream();
  auto fork = sim.event();
  auto join = sim.event();
  constexpr std::size_t n = 64;
  const std::uint64_t p = value(sim.d.mem_alloc(n));
  const std::uint64_t q = value(sim.d.mem_alloc(n));

  SECTION("joined back: the side stream's work is in the graph") {
    expect_ok(sim.d.stream_begin_capture(origin, CaptureMode::global));
    const std::uint64_t id = info(sim, origin).id;
    sim.fill(p, 3, n, origin);
    expect_ok(sim.d.event_record(fork, origin));
    expect_ok(sim.d.stream_wait_event(side, fork));
    CHECK(info(sim, side).status == CaptureStatus::active);
    CHECK(info(sim, side).id == id);
    expect_ok(sim.d.memcpy_dtod_async(q, p, n, side));  // recorded, not run
    CHECK(sim.d.pending_ops() == 0);
    expect_ok(sim.d.event_record(join, side));
    expect_ok(sim.d.stream_wait_event(origin, join));
    auto g = value(sim.d.stream_end_capture(origin));
    CHECK(info(sim, side).status == CaptureStatus::none);  // every member leaves the capture

    auto x = value(sim.d.graph_instantiate(g));
    auto l = sim.stream();
    expect_ok(sim.d.graph_launch(x, l));
    CHECK(sim.read(q, n, l) == std::vector<std::uint8_t>(n, 3));
    CHECK(sim.d.hazards().empty());
    expect_ok(sim.d.graph_exec_destroy(x));
    expect_ok(sim.d.graph_destroy(g));
  }
  SECTION("a forked stream that did work and was not joined fails the end") {
    expect_ok(sim.d.stream_begin_capture(origin, CaptureMode::global));
    expect_ok(sim.d.event_record(fork, origin));
    expect_ok(sim.d.stream_wait_event(side, fork));
    sim.fill(q, 1, n, side);
    auto g = sim.d.stream_end_capture(origin);
    REQUIRE_FALSE(g);
    CHECK(g.error().driver_status() == status::stream_capture_unjoined);
    CHECK(info(sim, origin).status == CaptureStatus::none);
    CHECK(info(sim, side).status == CaptureStatus::none);
    CHECK(sim.d.capture_stats().captures_failed == 1);
  }
  SECTION("a joined stream that did nothing needs no join back") {
    expect_ok(sim.d.stream_begin_capture(origin, CaptureMode::global));
    expect_ok(sim.d.event_record(fork, origin));
    expect_ok(sim.d.stream_wait_event(side, fork));
    expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(origin))));
  }
  SECTION("only the origin ends the capture") {
    expect_ok(sim.d.stream_begin_capture(origin, CaptureMode::global));
    expect_ok(sim.d.event_record(fork, origin));
    expect_ok(sim.d.stream_wait_event(side, fork));
    CHECK(status_of(sim.d.stream_end_capture(side)) == status::stream_capture_unmatched);
    CHECK(info(sim, origin).status == CaptureStatus::invalidated);
    end_fails_invalidated(sim, origin);
  }
}

TEST_CASE("each rule a capture must keep: the call fails with the driver's status, and the "
          "capture is invalidated",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  auto e = sim.event();
  constexpr std::size_t n = 64;
  const std::uint64_t p = value(sim.d.mem_alloc(n));
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
  const std::uint64_t id = info(sim, s).id;

  SECTION("stream_query of a capturing stream") {
    CHECK(status_of(sim.d.stream_query(s)) == status::stream_capture_unsupported);
  }
  SECTION("stream_synchronize of a capturing stream") {
    CHECK(status_of(sim.d.stream_synchronize(s)) == status::stream_capture_unsupported);
  }
  SECTION("event_query of an event recorded in the capture") {
    expect_ok(sim.d.event_record(e, s));
    CHECK(status_of(sim.d.event_query(e)) == status::captured_event);
  }
  SECTION("event_synchronize of an event recorded in the capture") {
    expect_ok(sim.d.event_record(e, s));
    CHECK(status_of(sim.d.event_synchronize(e)) == status::captured_event);
  }
  SECTION("the capturing stream waits on an event recorded outside it") {
    auto other = sim.stream();
    expect_ok(sim.d.event_record(e, other));
    CHECK(status_of(sim.d.stream_wait_event(s, e)) == status::stream_capture_isolation);
  }
  SECTION("the capturing stream waits on an event of another capture") {
    auto other = sim.stream();
    expect_ok(sim.d.stream_begin_capture(other, CaptureMode::global));
    expect_ok(sim.d.event_record(e, other));
    CHECK(status_of(sim.d.stream_wait_event(s, e)) == status::stream_capture_merge);
    CHECK(info(sim, other).status == CaptureStatus::invalidated);  // both are
    end_fails_invalidated(sim, other);
  }
  SECTION("mem_alloc in the thread's own capture") {
    CHECK(status_of(sim.d.mem_alloc(n)) == status::stream_capture_unsupported);
  }
  SECTION("mem_free in the thread's own capture") {
    CHECK(status_of(sim.d.mem_free(p)) == status::stream_capture_unsupported);
  }
  SECTION("mem_host_alloc_mapped in the thread's own capture") {
    CHECK(status_of(sim.d.mem_host_alloc_mapped(n)) == status::stream_capture_unsupported);
  }
  SECTION("mem_host_free in the thread's own capture") {
    auto h = sim.d.mem_host_alloc_mapped(n);  // refused too: nothing to free
    CHECK(status_of(h) == status::stream_capture_unsupported);
    char buf[1];
    CHECK(status_of(sim.d.mem_host_free(buf)) == status::stream_capture_unsupported);
  }
  SECTION("ctx_synchronize in the thread's own capture") {
    CHECK(status_of(sim.d.ctx_synchronize()) == status::stream_capture_unsupported);
  }
  SECTION("synchronising the legacy default stream in the thread's own capture") {
    CHECK(status_of(sim.d.stream_synchronize(nullptr)) == status::stream_capture_unsupported);
  }

  const CaptureInfo after = info(sim, s);
  CHECK(after.status == CaptureStatus::invalidated);
  CHECK(after.id == id);
  // Later work on the stream is refused, and the end fails.
  CHECK(status_of(sim.d.memset_d8_async(p, 0, n, s)) == status::stream_capture_invalidated);
  end_fails_invalidated(sim, s);
  CHECK(sim.d.capture_stats().captures_invalidated >= 1);
  // Outside the capture the same calls are legal again.
  expect_ok(sim.d.ctx_synchronize());
  expect_ok(sim.d.mem_free(value(sim.d.mem_alloc(n))));
}

TEST_CASE("an event recorded in a capture stays unusable to the host after the capture",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  auto e = sim.event();
  expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
  expect_ok(sim.d.event_record(e, s));
  expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(s))));
  CHECK(status_of(sim.d.event_query(e)) == status::captured_event);
  // Recorded again outside a capture, it is an ordinary event.
  expect_ok(sim.d.event_record(e, s));
  expect_ok(sim.d.event_synchronize(e));
  CHECK(value(sim.d.event_query(e)));
}

TEST_CASE("capture modes: relaxed makes an unsafe call legal; per-thread ignores other "
          "threads' captures; global ones forbid it everywhere",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  constexpr std::size_t n = 256;
  auto from_thread = [&](CaptureMode mode) {
    int st = -1;
    std::thread([&] {
      expect_ok(sim.d.ctx_make_current(sim.ctx));
      if (mode != CaptureMode::global) (void)value(sim.d.exchange_capture_mode(mode));
      auto p = sim.d.mem_alloc(n);
      st = status_of(p);
      if (p) expect_ok(sim.d.mem_free(*p));
    }).join();
    return st;
  };

  SECTION("relaxed around the call, in the thread's own global capture") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    CHECK(value(sim.d.exchange_capture_mode(CaptureMode::relaxed)) == CaptureMode::global);
    const std::uint64_t p = value(sim.d.mem_alloc(n));
    expect_ok(sim.d.ctx_synchronize());
    expect_ok(sim.d.mem_free(p));
    CHECK(value(sim.d.exchange_capture_mode(CaptureMode::global)) == CaptureMode::relaxed);
    CHECK(info(sim, s).status == CaptureStatus::active);
    expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(s))));
    // Back in global mode the same call fails again.
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    CHECK(status_of(sim.d.mem_alloc(n)) == status::stream_capture_unsupported);
    end_fails_invalidated(sim, s);
  }
  SECTION("a capture begun in relaxed mode forbids nothing") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::relaxed));
    expect_ok(sim.d.mem_free(value(sim.d.mem_alloc(n))));
    CHECK(from_thread(CaptureMode::global) == 0);
    expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(s))));
  }
  SECTION("another thread in global mode is forbidden by a global capture, and breaks it") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    CHECK(from_thread(CaptureMode::global) == status::stream_capture_unsupported);
    CHECK(info(sim, s).status == CaptureStatus::invalidated);
    end_fails_invalidated(sim, s);
  }
  SECTION("another thread in per-thread or relaxed mode ignores a global capture") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    CHECK(from_thread(CaptureMode::per_thread) == 0);
    CHECK(from_thread(CaptureMode::relaxed) == 0);
    CHECK(info(sim, s).status == CaptureStatus::active);
    expect_ok(sim.d.graph_destroy(value(sim.d.stream_end_capture(s))));
  }
  SECTION("a per-thread capture forbids only its own thread") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::per_thread));
    CHECK(from_thread(CaptureMode::global) == 0);
    CHECK(info(sim, s).status == CaptureStatus::active);
    CHECK(status_of(sim.d.mem_alloc(n)) == status::stream_capture_unsupported);
    end_fails_invalidated(sim, s);
  }
  SECTION("a thread in per-thread mode is forbidden by its own capture") {
    CHECK(value(sim.d.exchange_capture_mode(CaptureMode::per_thread)) == CaptureMode::global);
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    CHECK(status_of(sim.d.ctx_synchronize()) == status::stream_capture_unsupported);
    end_fails_invalidated(sim, s);
    CHECK(value(sim.d.exchange_capture_mode(CaptureMode::global)) == CaptureMode::per_thread);
  }
  // The mode is per thread and per driver: another simulator's thread mode is untouched.
  Sim other;
  CHECK(value(other.d.exchange_capture_mode(CaptureMode::global)) == CaptureMode::global);
  CHECK(value(sim.d.exchange_capture_mode(CaptureMode::global)) == CaptureMode::global);
}

TEST_CASE("graph memory nodes: allocations and frees on a capturing stream are counted",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  constexpr std::size_t n = 512;
  const SimCaptureStats none = sim.d.capture_stats();
  CHECK(none.graph_alloc_nodes == 0);
  CHECK(none.graph_frees_of_outside_memory == 0);

  SECTION("allocated and freed inside the graph: replayed cleanly every launch") {
    const std::size_t live_before = value(sim.d.memory_stats(0)).live_blocks;
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    const std::uint64_t t = sim.alloc(n, s);
    sim.fill(t, 9, n, s);
    expect_ok(sim.d.mem_free_async(t, s));
    auto g = value(sim.d.stream_end_capture(s));
    CHECK(sim.d.capture_stats().graph_alloc_nodes == 1);
    CHECK(sim.d.capture_stats().graph_frees_of_outside_memory == 0);
    // The graph keeps the address reserved: nothing else is handed it.
    CHECK(value(sim.d.memory_stats(0)).graph_reserved == n);
    const std::uint64_t other = sim.alloc(n, s);
    CHECK(other != t);
    auto x = value(sim.d.graph_instantiate(g));
    for (int i = 0; i < 3; ++i) expect_ok(sim.d.graph_launch(x, s));
    expect_ok(sim.d.stream_synchronize(s));
    CHECK(sim.d.hazards().empty());
    CHECK(value(sim.d.memory_stats(0)).live_blocks == live_before + 1);  // `other` only
    // A kernel of the graph's memory after the launch is a use after its free node.
    expect_ok(sim.d.launch_kernel(s, {{t, n, Access::Read}}, {}, "late"));
    REQUIRE(sim.d.hazards().size() == 1);
    CHECK(sim.d.hazards()[0].kind == SimHazardKind::use_after_free);
    expect_ok(sim.d.graph_exec_destroy(x));
    expect_ok(sim.d.graph_destroy(g));
  }
  SECTION("a captured free of memory allocated outside frees it at the first launch") {
    const std::uint64_t outside = sim.alloc(n, s);
    expect_ok(sim.d.stream_synchronize(s));
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    expect_ok(sim.d.mem_free_async(outside, s));
    // A second free of it in the same capture is a double free.
    CHECK(status_of(sim.d.mem_free_async(outside, s)) == status::invalid_value);
    auto g = value(sim.d.stream_end_capture(s));
    CHECK(sim.d.capture_stats().graph_frees_of_outside_memory == 1);
    CHECK(sim.d.capture_stats().graph_alloc_nodes == 0);
    CHECK(value(sim.d.memory_stats(0)).live_blocks == 1);  // still live: nothing ran
    auto x = value(sim.d.graph_instantiate(g));
    expect_ok(sim.d.graph_launch(x, s));
    expect_ok(sim.d.stream_synchronize(s));
    CHECK(value(sim.d.memory_stats(0)).live_blocks == 0);
    CHECK(sim.d.capture_stats().replayed_frees_of_outside_memory == 1);
    // The next launch would free it again: refused before anything is enqueued.
    auto again = sim.d.graph_launch(x, s);
    CHECK(status_of(again) == status::invalid_value);
    CHECK(sim.d.pending_ops() == 0);
    expect_ok(sim.d.graph_exec_destroy(x));
    expect_ok(sim.d.graph_destroy(g));
  }
  SECTION("allocated in the graph and left live: freed outside, then launched again") {
    expect_ok(sim.d.stream_begin_capture(s, CaptureMode::global));
    const std::uint64_t t = sim.alloc(n, s);
    sim.fill(t, 5, n, s);
    auto g = value(sim.d.stream_end_capture(s));
    auto x = value(sim.d.graph_instantiate(g));
    expect_ok(sim.d.graph_launch(x, s));
    CHECK(sim.read(t, n, s) == std::vector<std::uint8_t>(n, 5));
    // Still live from the last launch: a second launch is refused.
    CHECK(status_of(sim.d.graph_launch(x, s)) == status::invalid_value);
    expect_ok(sim.d.mem_free_async(t, s));
    expect_ok(sim.d.graph_launch(x, s));
    CHECK(sim.read(t, n, s) == std::vector<std::uint8_t>(n, 5));
    expect_ok(sim.d.mem_free_async(t, s));
    expect_ok(sim.d.stream_synchronize(s));
    CHECK(sim.d.hazards().empty());
    expect_ok(sim.d.graph_exec_destroy(x));
    expect_ok(sim.d.graph_destroy(g));
  }
  // The reservations went back with the graphs.
  expect_ok(sim.d.stream_synchronize(s));
  CHECK(value(sim.d.memory_stats(0)).graph_reserved == 0);
  const MemInfo mi = value(sim.d.mem_get_info());
  CHECK(mi.free + value(sim.d.bytes_reserved(0)) == mi.total);
}

TEST_CASE("the capture entry points can be made to fail, and count their calls",
          "[sim][capture]") {
  Sim sim;
  auto s = sim.stream();
  REQUIRE(sim.d.fail_nth("cuStreamBeginCapture", 1, status::out_of_memory));
  CHECK(status_of(sim.d.stream_begin_capture(s, CaptureMode::global)) == status::out_of_memory);
  CHECK(info(sim, s).status == CaptureStatus::none);
  REQUIRE(sim.d.fail_nth("cuStreamGetCaptureInfo", 1, status::unknown));
  CHECK(status_of(sim.d.stream_capture_info(s)) == status::unknown);
  for (const char* name : {"cuThreadExchangeStreamCaptureMode", "cuCtxSynchronize",
                           "cuStreamEndCapture", "cuGraphInstantiateWithFlags", "cuGraphLaunch",
                           "cuGraphDestroy", "cuGraphExecDestroy"}) {
    INFO(name);
    CHECK(sim.d.calls(name) == 0);
  }
  CHECK(sim.d.calls("cuStreamBeginCapture") == 1);
}
