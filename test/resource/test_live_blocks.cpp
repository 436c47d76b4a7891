// SPDX-License-Identifier: Apache-2.0
// LiveBlocks<Up>: the snapshot lists exactly the blocks live (allocated while recording,
// not yet freed), with their allocation's thread, time, stream and tag; a refused free
// keeps its block; recording off records nothing new but still forgets freed blocks; the
// CSV reads back as a log; exact under 8 threads; on SimDriver, the dump an allocation
// failure asks for.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/live_blocks.hpp>

#include "conformance.hpp"
#include "stack_registry.hpp"
#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {

/// The snapshot's blocks by address.
std::map<std::uint64_t, LogRecord> by_ptr(const LiveBlocksSnapshot& s) {
  std::map<std::uint64_t, LogRecord> m;
  for (const auto& r : s.blocks) m.emplace(r.ptr, r);
  return m;
}

}  // namespace

TEST_CASE("live blocks: the snapshot lists the blocks allocated and not freed, with their origin",
          "[live_blocks]") {
  PlainSpy spy;
  auto st = spy.state();
  LiveBlocks<PlainSpy> lb{std::move(spy)};
  const auto before = detail::now_ns();
  auto a = lb.allocate(100, StreamId{1}, AllocTag{7});
  auto b = lb.allocate(300, StreamId{2}, AllocTag{8});
  auto c = lb.allocate(50, StreamId{3}, AllocTag{7});
  REQUIRE((a && b && c));
  REQUIRE(lb.deallocate(std::move(*b)).has_value());
  const auto after = detail::now_ns();

  const auto snap = lb.snapshot();
  REQUIRE(snap.blocks.size() == 2);
  CHECK(snap.bytes() == 150);
  CHECK(snap.blocks[0].time_ns <= snap.blocks[1].time_ns);  // oldest first
  const auto m = by_ptr(snap);
  REQUIRE(m.count(a->ptr()) == 1);
  REQUIRE(m.count(c->ptr()) == 1);
  const LogRecord& ra = m.at(a->ptr());
  CHECK(ra.action == LogAction::allocate);
  CHECK(ra.bytes == 100);
  CHECK(ra.stream == StreamId{1});
  CHECK(ra.tag == AllocTag{7});
  CHECK(ra.thread == detail::os_thread_id());
  CHECK(ra.time_ns >= before);
  CHECK(ra.time_ns <= after);
  CHECK(m.at(c->ptr()).stream == StreamId{3});
  CHECK_FALSE(snap.last_failure.has_value());
  CHECK(snap.failures == 0);
  CHECK(snap.lost == 0);

  REQUIRE(lb.deallocate(std::move(*a)).has_value());
  REQUIRE(lb.deallocate(std::move(*c)).has_value());
  CHECK(lb.snapshot().blocks.empty());
}

TEST_CASE("live blocks: a refused allocation is the last failure; a refused free keeps its block",
          "[live_blocks]") {
  PlainSpy spy;
  auto st = spy.state();
  LiveBlocks<PlainSpy> lb{std::move(spy)};
  auto a = lb.allocate(64, StreamId{0}, AllocTag{1});
  REQUIRE(a.has_value());
  st->fail_allocate_in = 1;
  REQUIRE_FALSE(lb.allocate(1 << 20, StreamId{2}, AllocTag{9}));
  REQUIRE_FALSE(lb.allocate(0, StreamId{3}, AllocTag{4}));  // zero_bytes: refused too

  st->fail_deallocate_in = 1;
  REQUIRE_FALSE(lb.deallocate(std::move(*a)));
  REQUIRE_FALSE(a->empty());

  const auto snap = lb.snapshot();
  REQUIRE(snap.blocks.size() == 1);
  CHECK(snap.blocks[0].ptr == a->ptr());
  CHECK(snap.failures == 2);
  REQUIRE(snap.last_failure.has_value());
  CHECK(snap.last_failure->action == LogAction::allocate_failure);
  CHECK(snap.last_failure->bytes == 0);
  CHECK(snap.last_failure->stream == StreamId{3});
  CHECK(snap.last_failure->tag == AllocTag{4});

  REQUIRE(lb.deallocate(std::move(*a)).has_value());
  CHECK(lb.snapshot().blocks.empty());
}

namespace {

/// A spy that runs `before_free` at the start of its deallocate, once: a free that arrives
/// while another is inside the upstream, without threads (the order is the test's).
struct InterleavingSpy : Adaptor<PlainSpy> {
  using Adaptor<PlainSpy>::Adaptor;
  std::shared_ptr<std::function<void()>> before_free = std::make_shared<std::function<void()>>();
  result<void> deallocate(DeviceBlock&& b) noexcept {
    if (auto f = std::exchange(*before_free, nullptr)) f();
    return upstream().deallocate(std::move(b));
  }
};

}  // namespace

TEST_CASE("live blocks: a refused forged free that races the owner's free leaves no freed block behind",
          "[live_blocks]") {
  // Issue #28, finding 2: the forged free took the entry out, the owner's free (finding
  // nothing) went through, and the forger's refusal put the entry back: the table then
  // listed a freed block for ever.
  PlainSpy spy;
  InterleavingSpy ispy{std::move(spy)};
  auto hook = ispy.before_free;
  LiveBlocks<InterleavingSpy> lb{std::move(ispy)};
  auto a = lb.allocate(256, StreamId{0}, AllocTag{1});
  auto keep = lb.allocate(128, StreamId{1}, AllocTag{2});
  REQUIRE((a && keep));
  const std::uint64_t pa = a->ptr();
  const BlockId real = a->id();
  DeviceBlock forged{a->ptr(), a->bytes(), a->alloc_stream(), a->device_ordinal(), a->tag(),
                     BlockId{real.owner, real.index, real.generation + 1}};
  // While the forged free is inside the upstream, the owner frees the block for real.
  result<void> owner_free = error{errc::empty_block, "not run"};
  *hook = [&] { owner_free = lb.deallocate(std::move(*a)); };
  auto refused = lb.deallocate(std::move(forged));
  REQUIRE(owner_free.has_value());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code() == errc::double_free);
  CHECK_FALSE(forged.empty());  // the refused block stays with its (forging) caller

  const auto m = by_ptr(lb.snapshot());
  CHECK(m.count(pa) == 0);  // the freed block is gone ...
  CHECK(m.count(keep->ptr()) == 1);
  CHECK(m.size() == 1);  // ... and nothing else appeared
  REQUIRE(lb.deallocate(std::move(*keep)).has_value());
  CHECK(lb.snapshot().blocks.empty());
}

TEST_CASE("live blocks: a refused forged free leaves the owner's entry, which the owner's free then clears",
          "[live_blocks]") {
  PlainSpy spy;
  LiveBlocks<PlainSpy> lb{std::move(spy)};
  auto a = lb.allocate(256, StreamId{0}, AllocTag{1});
  REQUIRE(a.has_value());
  const BlockId real = a->id();
  DeviceBlock forged{a->ptr(), a->bytes(), a->alloc_stream(), a->device_ordinal(), a->tag(),
                     BlockId{real.owner, real.index + 1000, real.generation}};
  REQUIRE_FALSE(lb.deallocate(std::move(forged)));
  REQUIRE(lb.snapshot().blocks.size() == 1);
  REQUIRE(lb.deallocate(std::move(*a)).has_value());
  CHECK(lb.snapshot().blocks.empty());
}

TEST_CASE("live blocks: recording off records nothing new and still forgets freed blocks", "[live_blocks]") {
  PlainSpy spy;
  LiveBlocks<PlainSpy> lb{std::move(spy), LiveBlocksOptions{.recording = false}};
  CHECK_FALSE(lb.recording());
  auto quiet = lb.allocate(10, StreamId{0}, AllocTag{1});
  REQUIRE(quiet.has_value());
  CHECK(lb.snapshot().blocks.empty());

  lb.set_recording(true);
  auto kept = lb.allocate(20, StreamId{0}, AllocTag{2});
  auto freed_later = lb.allocate(30, StreamId{0}, AllocTag{3});
  REQUIRE((kept && freed_later));
  lb.set_recording(false);
  REQUIRE(lb.deallocate(std::move(*freed_later)).has_value());
  auto also_quiet = lb.allocate(40, StreamId{0}, AllocTag{4});
  REQUIRE(also_quiet.has_value());

  const auto snap = lb.snapshot();
  REQUIRE(snap.blocks.size() == 1);
  CHECK(snap.blocks[0].ptr == kept->ptr());
  CHECK(snap.blocks[0].tag == AllocTag{2});
  for (auto* b : {&*quiet, &*kept, &*also_quiet}) REQUIRE(lb.deallocate(std::move(*b)).has_value());
  CHECK(lb.snapshot().blocks.empty());
}

TEST_CASE("live blocks: the CSV is a log, the failure in time order, and save() writes it", "[live_blocks]") {
  PlainSpy spy;
  auto st = spy.state();
  LiveBlocks<PlainSpy> lb{std::move(spy)};
  auto a = lb.allocate(4096, StreamId{5}, AllocTag{11});
  st->fail_allocate_in = 1;
  REQUIRE_FALSE(lb.allocate(1 << 30, StreamId{6}, AllocTag{12}));
  auto b = lb.allocate(512, StreamId{7}, AllocTag{13});
  REQUIRE((a && b));
  const auto snap = lb.snapshot();

  std::istringstream in(snap.csv());
  std::string header;
  std::getline(in, header);
  CHECK(header == LOG_CSV_HEADER);
  in.seekg(0);
  auto parsed = read_log_csv(in);
  REQUIRE(parsed.has_value());
  REQUIRE(parsed->size() == 4);
  CHECK((*parsed)[0].ptr == a->ptr());
  CHECK((*parsed)[1].action == LogAction::allocate_failure);
  CHECK((*parsed)[1].bytes == std::size_t{1} << 30);
  CHECK((*parsed)[2].ptr == b->ptr());
  CHECK((*parsed)[2].tag == AllocTag{13});
  CHECK((*parsed)[2].stream == StreamId{7});
  CHECK((*parsed)[2].thread == detail::os_thread_id());
  // Then what the stack below held: the spy reports its bytes_outstanding() alone.
  REQUIRE(snap.sample.size() == 1);
  CHECK((*parsed)[3].action == LogAction::sample_held);
  CHECK((*parsed)[3].bytes == 4096 + 512);

  const std::string path = "xlogrt_test_snapshot_" + std::to_string(::getpid()) + ".csv";
  REQUIRE(snap.save(path).has_value());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  CHECK(text.str() == snap.csv());
  std::remove(path.c_str());
  auto bad = snap.save("/nonexistent-dir/s.csv");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::sink_failure);
  CHECK_THAT(bad.error().message(), Catch::Contains("/nonexistent-dir/s.csv"));
  for (auto* x : {&*a, &*b}) REQUIRE(lb.deallocate(std::move(*x)).has_value());
}

TEST_CASE("live blocks: exact under 8 threads allocating and freeing at once", "[live_blocks][threads]") {
  PlainSpy spy;
  LiveBlocks<PlainSpy> lb{std::move(spy)};
  constexpr int THREADS = 8, ROUNDS = 2000;
  std::vector<std::vector<DeviceBlock>> kept(THREADS);
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  // A reader takes snapshots while the others work: each must hold no block twice.
  std::thread reader([&] {
    while (!stop) {
      const auto s = lb.snapshot();
      if (by_ptr(s).size() != s.blocks.size()) ++errors;
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; ++t) {
    ts.emplace_back([&, t] {
      std::vector<DeviceBlock> mine;
      for (int i = 0; i < ROUNDS; ++i) {
        auto b = lb.allocate(static_cast<std::size_t>(64 + i % 32), StreamId{static_cast<std::uint32_t>(t)},
                             AllocTag{static_cast<std::uint32_t>(t)});
        if (!b) {
          ++errors;
          continue;
        }
        mine.push_back(std::move(*b));
        if (i % 3 != 0) {  // free one of the held blocks, keeping every third
          const std::size_t k = static_cast<std::size_t>(i * 7919) % mine.size();
          if (!lb.deallocate(std::move(mine[k]))) ++errors;
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      kept[t] = std::move(mine);
    });
  }
  for (auto& th : ts) th.join();
  stop = true;
  reader.join();
  CHECK(errors == 0);

  const auto m = by_ptr(lb.snapshot());
  std::size_t expected = 0;
  for (int t = 0; t < THREADS; ++t) {
    for (const auto& b : kept[t]) {
      ++expected;
      auto it = m.find(b.ptr());
      REQUIRE(it != m.end());
      CHECK(it->second.bytes == b.bytes());
      CHECK(it->second.tag == AllocTag{static_cast<std::uint32_t>(t)});
    }
  }
  CHECK(m.size() == expected);
  for (auto& v : kept) {
    for (auto& b : v) REQUIRE(lb.deallocate(std::move(b)).has_value());
  }
  CHECK(lb.snapshot().blocks.empty());
}

TEST_CASE("live blocks on SimDriver: when the device runs out, the snapshot has what is live and the failure",
          "[sim][live_blocks]") {
  SimDriver sim{SimConfig{.devices = 1, .memory_bytes = std::size_t{1} << 20}};
  Rig<Entry<LiveBlocks<AsyncCuda<SimDriver>>>> rig(sim);
  auto& lb = *rig.stack;
  std::vector<DeviceBlock> held;
  std::size_t bytes = 0;
  for (std::uint32_t i = 0; i < 6; ++i) {
    auto b = lb.allocate(std::size_t{64} << 10, StreamId{i % 4}, AllocTag{i % 3 + 1});
    REQUIRE(b.has_value());
    bytes += b->bytes();
    held.push_back(std::move(*b));
  }
  REQUIRE(lb.deallocate(std::move(held[2])).has_value());  // a block freed on its stream
  bytes -= std::size_t{64} << 10;
  auto failed = lb.allocate(std::size_t{4} << 20, StreamId{1}, AllocTag{9});  // more than the device has
  REQUIRE_FALSE(failed);

  const auto snap = lb.snapshot();
  CHECK(snap.blocks.size() == 5);
  CHECK(snap.bytes() == bytes);
  const auto m = by_ptr(snap);
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i == 2) continue;
    REQUIRE(m.count(held[i].ptr()) == 1);
    CHECK(m.at(held[i].ptr()).stream == held[i].alloc_stream());
    CHECK(m.at(held[i].ptr()).tag == held[i].tag());
  }
  REQUIRE(snap.last_failure.has_value());
  CHECK(snap.last_failure->bytes == std::size_t{4} << 20);
  CHECK(snap.last_failure->tag == AllocTag{9});
  CHECK(snap.last_failure->time_ns >= snap.blocks.back().time_ns);
  for (std::size_t i = 0; i < held.size(); ++i) {
    if (i != 2) REQUIRE(lb.deallocate(std::move(held[i])).has_value());
  }
  REQUIRE(lb.reap_pending().has_value());
  CHECK(lb.snapshot().blocks.empty());
  CHECK(sim.hazards().empty());
}
