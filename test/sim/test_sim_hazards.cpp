// SPDX-License-Identifier: Apache-2.0
// The stream hazard checker, and the seeded scheduler exploring many legal orders of
// small programs. Every case here runs in manual mode.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "sim_fixture.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;
using simtest::expect_ok;
using simtest::manual;
using simtest::Sim;
using simtest::value;

namespace {

std::string describe(const std::vector<SimHazard>& hs) {
  std::string s;
  for (const auto& h : hs) s += to_string(h) + "\n";
  return s;
}

std::size_t count(const std::vector<SimHazard>& hs, SimHazardKind k) {
  std::size_t n = 0;
  for (const auto& h : hs) n += h.kind == k ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("two unordered streams writing and reading the same bytes race", "[sim][hazard]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto p = value(sim.d.mem_alloc(256));
  expect_ok(sim.d.launch_kernel(a, {{p, 256, Access::Write}}, {}, "producer"));
  expect_ok(sim.d.launch_kernel(b, {{p + 128, 64, Access::Read}}, {}, "consumer"));
  auto hs = sim.d.hazards();
  INFO(describe(hs));
  REQUIRE(hs.size() == 1);
  const SimHazard& h = hs[0];
  CHECK(h.kind == SimHazardKind::race);
  CHECK(h.device == 0);
  CHECK(h.address == p + 128);
  CHECK(h.bytes == 64);
  CHECK(h.first.stream == a);
  CHECK(h.first.label == "producer");
  CHECK(h.first.access == Access::Write);
  CHECK(h.second.stream == b);
  CHECK(h.second.label == "consumer");
  const std::string text = to_string(h);
  CHECK(text.find("race on device 0") == 0);
  CHECK(text.find("kernel 'producer'") != std::string::npos);
  CHECK(text.find("kernel 'consumer'") != std::string::npos);

  // Reads on two streams do not race; a write after them on a third does, with both.
  sim.d.clear_hazards();
  auto q = value(sim.d.mem_alloc(64));
  auto c = sim.stream();
  expect_ok(sim.d.launch_kernel(a, {{q, 64, Access::Read}}));
  expect_ok(sim.d.launch_kernel(b, {{q, 64, Access::Read}}));
  CHECK(sim.d.hazards().empty());
  sim.fill(q, 0, 64, c);
  hs = sim.d.hazards();
  INFO(describe(hs));
  CHECK(count(hs, SimHazardKind::race) == 2);
}

TEST_CASE("an event wait orders the streams and the checker reports nothing", "[sim][hazard]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto e = sim.event();
  auto p = value(sim.d.mem_alloc(256));
  expect_ok(sim.d.launch_kernel(a, {{p, 256, Access::Write}}));
  expect_ok(sim.d.event_record(e, a));
  expect_ok(sim.d.stream_wait_event(b, e));
  expect_ok(sim.d.launch_kernel(b, {{p, 256, Access::ReadWrite}}));
  // And back: a's next write waits for b's read-write.
  expect_ok(sim.d.event_record(e, b));
  expect_ok(sim.d.stream_wait_event(a, e));
  sim.fill(p, 1, 256, a);
  CHECK(sim.d.hazards().empty());
  sim.d.run_until_idle();
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("host synchronisation orders later work after what it waited for", "[sim][hazard]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();
  auto p = value(sim.d.mem_alloc(64));
  sim.fill(p, 1, 64, a);
  expect_ok(sim.d.stream_synchronize(a));
  sim.fill(p, 2, 64, b);
  CHECK(sim.d.hazards().empty());

  // A query that says "done" orders too; a step that ran the work without the host
  // looking does not.
  sim.fill(p, 3, 64, a);  // races with b's fill, which no one has waited for
  CHECK(count(sim.d.hazards(), SimHazardKind::race) == 1);
  sim.d.clear_hazards();
  sim.d.run_until_idle();
  sim.fill(p, 4, 64, b);
  CHECK(count(sim.d.hazards(), SimHazardKind::race) == 1);
  sim.d.clear_hazards();
  sim.d.run_until_idle();
  CHECK(value(sim.d.stream_query(a)));
  CHECK(value(sim.d.stream_query(b)));
  sim.fill(p, 5, 64, a);
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("the cross-stream use-after-free: a free not ordered after a use", "[sim][hazard]") {
  // Allocated on a, read by a kernel on b, freed on a with no event: the bug the
  // tracking layer exists to prevent. Every seed finds it at enqueue, and every seed
  // lets the reader see poison, because a ready free runs before anything else.
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    INFO("seed " << seed);
    SimConfig cfg = manual(seed);
    Sim sim(cfg);
    auto a = sim.stream();
    auto b = sim.stream();
    auto p = sim.alloc(256, a);
    sim.fill(p, 0x42, 256, a);
    expect_ok(sim.d.stream_synchronize(a));
    std::uint8_t seen = 0;
    expect_ok(sim.d.launch_kernel(
        b, {{p, 256, Access::Read}},
        [&seen](std::span<std::byte* const> ptrs) {
          seen = std::to_integer<std::uint8_t>(ptrs[0][17]);
        },
        "reader"));
    expect_ok(sim.d.mem_free_async(p, a));
    auto hs = sim.d.hazards();
    INFO(describe(hs));
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::free_race);
    CHECK(hs[0].first.label == "reader");
    CHECK(hs[0].second.kind == SimOpKind::mem_free_async);
    CHECK(hs[0].second.stream == a);
    sim.d.run_until_idle();
    CHECK(seen == cfg.poison_byte);
  }
}

TEST_CASE("the fixed pattern: the free waits on an event recorded after the use", "[sim][hazard]") {
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    INFO("seed " << seed);
    Sim sim(manual(seed));
    auto a = sim.stream();
    auto b = sim.stream();
    auto e = sim.event();
    auto p = sim.alloc(256, a);
    sim.fill(p, 0x42, 256, a);
    auto ready = sim.event();
    expect_ok(sim.d.event_record(ready, a));
    expect_ok(sim.d.stream_wait_event(b, ready));
    std::uint8_t seen = 0;
    expect_ok(
        sim.d.launch_kernel(b, {{p, 256, Access::Read}}, [&seen](std::span<std::byte* const> ptrs) {
          seen = std::to_integer<std::uint8_t>(ptrs[0][17]);
        }));
    expect_ok(sim.d.event_record(e, b));
    expect_ok(sim.d.stream_wait_event(a, e));
    expect_ok(sim.d.mem_free_async(p, a));
    // Same-stream early reuse is legal here and must not be reported.
    auto q = sim.alloc(256, a);
    CHECK(q == p);
    sim.fill(q, 0, 256, a);
    INFO(describe(sim.d.hazards()));
    CHECK(sim.d.hazards().empty());
    sim.d.run_until_idle();
    CHECK(seen == 0x42);
  }
}

TEST_CASE("accesses to freed, unallocated and not-yet-allocated memory", "[sim][hazard]") {
  Sim sim;
  auto a = sim.stream();
  auto b = sim.stream();

  SECTION("use after free on the same stream") {
    auto p = sim.alloc(128, a);
    expect_ok(sim.d.mem_free_async(p, a));
    std::vector<std::uint8_t> out(128);
    expect_ok(sim.d.memcpy_dtoh_async(out.data(), p, 128, a));
    auto hs = sim.d.hazards();
    INFO(describe(hs));
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::use_after_free);
    CHECK(hs[0].first.kind == SimOpKind::mem_free_async);
    CHECK(hs[0].second.kind == SimOpKind::memcpy_dtoh);
    expect_ok(sim.d.stream_synchronize(a));
    CHECK(out == std::vector<std::uint8_t>(128, sim.d.config().poison_byte));
  }
  SECTION("an access on another stream after a free it is not ordered with") {
    auto p = value(sim.d.mem_alloc(128));
    auto q = value(sim.d.mem_alloc(128));
    expect_ok(sim.d.mem_free(p));
    sim.fill(p, 1, 16, b);  // ordered after mem_free (host): use after free
    expect_ok(sim.d.mem_free_async(sim.alloc(64, a), a));
    (void)q;
    auto hs = sim.d.hazards();
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::use_after_free);
    CHECK(hs[0].first.kind == SimOpKind::mem_free);
    CHECK(hs[0].first.stream_id == 0);
    sim.d.clear_hazards();
    auto r = sim.alloc(64, a);
    expect_ok(sim.d.mem_free_async(r, a));
    sim.fill(r, 1, 16, b);
    hs = sim.d.hazards();
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::free_race);
  }
  SECTION("memory never allocated, and the padding after a block") {
    auto p = value(sim.d.mem_alloc(100));  // 256 reserved, 100 live
    sim.fill(p, 1, 100, a);
    CHECK(sim.d.hazards().empty());
    sim.fill(p + 96, 1, 8, a);
    auto hs = sim.d.hazards();
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::unallocated);
    CHECK(hs[0].address == p + 100);
    CHECK(hs[0].bytes == 4);
    CHECK(hs[0].first.kind == SimOpKind::none);
  }
  SECTION("an access not ordered after the allocation") {
    auto p = sim.alloc(64, a);
    sim.fill(p, 1, 64, b);
    auto hs = sim.d.hazards();
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::unordered_alloc);
    CHECK(hs[0].first.kind == SimOpKind::mem_alloc_async);
  }
}

TEST_CASE("the checker can be switched off, and its reports are capped", "[sim][hazard]") {
  SimConfig off = manual();
  off.check_hazards = false;
  Sim quiet(off);
  auto s = quiet.stream();
  quiet.fill(0x1000, 0, 1, s);
  CHECK(quiet.d.hazards().empty());

  SimConfig capped = manual();
  capped.max_hazards = 3;
  Sim sim(capped);
  auto a = sim.stream();
  auto b = sim.stream();
  auto p = value(sim.d.mem_alloc(64));
  for (int i = 0; i < 5; ++i) {
    sim.fill(p, 1, 64, a);
    sim.fill(p, 2, 64, b);
  }
  CHECK(sim.d.hazards().size() == 3);
  CHECK(sim.d.hazards_dropped() > 0);
  sim.d.clear_hazards();
  CHECK(sim.d.hazards().empty());
  CHECK(sim.d.hazards_dropped() == 0);
}

namespace {

// A small random program over three streams and four buffers. Every access is ordered
// after the previous access of its buffer by an event wait, so the program is race-free
// and its result is the sequential one; which order the scheduler runs it in varies.
struct Program {
  struct Step {
    int kind;  // 0 add, 1 copy, 2 memset, 3 host mark
    int stream;
    int buf;
    int other;
    std::uint8_t v;
  };
  std::vector<Step> steps;
  bool rogue = false;  // the buggy variant: one write from a stream that waits for nothing

  static Program make(std::uint64_t program_seed, int n) {
    std::mt19937_64 rng(program_seed);
    Program p;
    for (int i = 0; i < n; ++i) {
      Step s{};
      s.kind = static_cast<int>(rng() % 4);
      s.stream = static_cast<int>(rng() % 3);
      s.buf = static_cast<int>(rng() % 4);
      s.other = static_cast<int>(rng() % 4);
      if (s.other == s.buf) s.other = (s.buf + 1) % 4;
      s.v = static_cast<std::uint8_t>(rng() % 250 + 1);
      p.steps.push_back(s);
    }
    return p;
  }

  // The sequential meaning of the program.
  std::vector<std::vector<std::uint8_t>> expected(std::size_t bytes) const {
    std::vector<std::vector<std::uint8_t>> b(4, std::vector<std::uint8_t>(bytes, 0));
    for (const Step& s : steps) {
      auto& x = b[static_cast<std::size_t>(s.buf)];
      if (s.kind == 0) {
        for (auto& c : x) c = static_cast<std::uint8_t>(c + s.v);
      } else if (s.kind == 1) {
        b[static_cast<std::size_t>(s.other)] = x;
      } else if (s.kind == 2) {
        std::fill(x.begin(), x.end(), s.v);
      }
    }
    return b;
  }
};

struct Outcome {
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<int> order;  // the steps in the order they ran
  std::vector<SimHazard> hazards;
};

Outcome run_program(const Program& prog, std::uint64_t seed) {
  constexpr std::size_t bytes = 32;
  Sim sim(manual(seed));
  std::vector<SimDriver::stream_t> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(sim.stream());
  auto rogue = sim.stream();
  std::vector<std::uint64_t> bufs;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back(value(sim.d.mem_alloc(bytes)));
    sim.fill(bufs.back(), 0, bytes, streams[0]);
  }
  expect_ok(sim.d.stream_synchronize(streams[0]));
  std::vector<int> last(4, 0);          // the stream that last touched each buffer
  std::vector<bool> touched(4, false);  // by the program, not the synchronised setup
  Outcome out;
  auto order_after = [&](int buf, int stream) {
    const int prev = last[static_cast<std::size_t>(buf)];
    if (prev != stream) {
      auto e = sim.event();
      expect_ok(sim.d.event_record(e, streams[static_cast<std::size_t>(prev)]));
      expect_ok(sim.d.stream_wait_event(streams[static_cast<std::size_t>(stream)], e));
    }
    last[static_cast<std::size_t>(buf)] = stream;
    touched[static_cast<std::size_t>(buf)] = true;
  };
  bool rogue_done = false;
  for (std::size_t i = 0; i < prog.steps.size(); ++i) {
    const auto& st = prog.steps[i];
    auto s = streams[static_cast<std::size_t>(st.stream)];
    const int step_no = static_cast<int>(i);
    const std::uint64_t x = bufs[static_cast<std::size_t>(st.buf)];
    if (prog.rogue && !rogue_done && st.kind != 3 && touched[static_cast<std::size_t>(st.buf)]) {
      // No wait can order this after the program's streams, nor them after it.
      sim.fill(x, 0x77, bytes, rogue);
      rogue_done = true;
    }
    switch (st.kind) {
      case 0:
        order_after(st.buf, st.stream);
        expect_ok(sim.d.launch_kernel(
            s, {{x, bytes, Access::ReadWrite}},
            [&out, step_no, v = st.v](std::span<std::byte* const> p) {
              out.order.push_back(step_no);
              for (std::size_t k = 0; k < bytes; ++k) {
                p[0][k] = static_cast<std::byte>(std::to_integer<int>(p[0][k]) + v);
              }
            },
            "add"));
        break;
      case 1: {
        order_after(st.buf, st.stream);
        order_after(st.other, st.stream);
        const std::uint64_t y = bufs[static_cast<std::size_t>(st.other)];
        expect_ok(sim.d.launch_kernel(
            s, {{x, bytes, Access::Read}, {y, bytes, Access::Write}},
            [&out, step_no](std::span<std::byte* const> p) {
              out.order.push_back(step_no);
              std::memcpy(p[1], p[0], bytes);
            },
            "copy"));
        break;
      }
      case 2:
        order_after(st.buf, st.stream);
        sim.fill(x, st.v, bytes, s);
        break;
      default:
        expect_ok(sim.d.launch_kernel(
            s, {}, [&out, step_no](std::span<std::byte* const>) { out.order.push_back(step_no); }));
        break;
    }
  }
  for (auto s : streams) expect_ok(sim.d.stream_synchronize(s));
  expect_ok(sim.d.stream_synchronize(rogue));
  for (auto b : bufs) out.data.push_back(sim.read(b, bytes, streams[0]));
  out.hazards = sim.d.hazards();
  return out;
}

}  // namespace

TEST_CASE("many seeds of a race-free random program all give the sequential result",
          "[sim][seeds]") {
  for (std::uint64_t program = 1; program <= 6; ++program) {
    const Program prog = Program::make(program, 40);
    const auto want = prog.expected(32);
    std::set<std::vector<int>> orders;
    for (std::uint64_t seed = 1; seed <= 60; ++seed) {
      INFO("program " << program << ", seed " << seed);
      Outcome o = run_program(prog, seed);
      INFO(describe(o.hazards));
      CHECK(o.hazards.empty());
      CHECK(o.data == want);
      orders.insert(o.order);
    }
    INFO("program " << program);
    CHECK(orders.size() > 5);  // the scheduler really explores different orders
  }
}

TEST_CASE("a program with one unordered write is reported for every seed", "[sim][seeds]") {
  for (std::uint64_t program = 1; program <= 6; ++program) {
    Program prog = Program::make(program, 40);
    prog.rogue = true;
    std::size_t first_count = 0;
    for (std::uint64_t seed = 1; seed <= 30; ++seed) {
      INFO("program " << program << ", seed " << seed);
      Outcome o = run_program(prog, seed);
      CHECK_FALSE(o.hazards.empty());
      if (seed == 1) first_count = o.hazards.size();
      CHECK(o.hazards.size() == first_count);  // checked at enqueue: same for every order
    }
  }
}

TEST_CASE("two unordered writers: the seeds see both outcomes", "[sim][seeds]") {
  std::set<int> outcomes;
  for (std::uint64_t seed = 1; seed <= 32; ++seed) {
    Sim sim(manual(seed));
    auto a = sim.stream();
    auto b = sim.stream();
    auto p = value(sim.d.mem_alloc(8));
    sim.fill(p, 1, 8, a);
    sim.fill(p, 2, 8, b);
    CHECK(count(sim.d.hazards(), SimHazardKind::race) == 1);
    sim.d.run_until_idle();
    outcomes.insert(std::to_integer<int>(value(sim.d.host_view(p, 1))[0]));
  }
  CHECK(outcomes == std::set<int>{1, 2});
}

TEST_CASE("the checker keeps up with thousands of operations", "[sim][hazard]") {
  Sim sim(manual(7, std::size_t{16} << 20));
  std::vector<SimDriver::stream_t> streams;
  for (int i = 0; i < 8; ++i) streams.push_back(sim.stream());
  auto e = sim.event();
  for (int round = 0; round < 400; ++round) {
    auto s = streams[static_cast<std::size_t>(round % 8)];
    auto next = streams[static_cast<std::size_t>((round + 1) % 8)];
    auto p = sim.alloc(4096, s);
    sim.fill(p, 1, 4096, s);
    expect_ok(sim.d.launch_kernel(s, {{p, 2048, Access::Read}, {p + 2048, 2048, Access::Write}}));
    expect_ok(sim.d.event_record(e, s));
    expect_ok(sim.d.stream_wait_event(next, e));
    expect_ok(sim.d.launch_kernel(next, {{p, 4096, Access::Read}}));
    expect_ok(sim.d.event_record(e, next));
    expect_ok(sim.d.stream_wait_event(s, e));
    expect_ok(sim.d.mem_free_async(p, s));
    if (round % 50 == 49) sim.d.run_until_idle();
  }
  sim.d.run_until_idle();
  INFO(describe(sim.d.hazards()));
  CHECK(sim.d.hazards().empty());
  CHECK(value(sim.d.bytes_reserved(0)) == 0);
}
