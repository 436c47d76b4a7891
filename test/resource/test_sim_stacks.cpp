// SPDX-License-Identifier: Apache-2.0
// The decorators on SimDriver-backed stacks (the conformance suite runs every stack of
// the registry in test_conformance_sim.cpp): AnyResource refusing tracking over a
// non-tracking stack, DebugGuard catching a simulated kernel's out-of-bounds write, and
// Budget exact over AsyncCuda under threads, Logging's samples of what the stack holds.

#include "conformance.hpp"
#include "stack_registry.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <span>
#include <atomic>
#include <thread>
#include <optional>
#include <tuple>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;
using namespace xlogrt::testing;

TEST_CASE("AnyResource over DirectCuda refuses tracking with stream_misuse", "[sim][any_resource]") {
  SimDriver sim{SimConfig{}};
  Rig<Entry<Any<DirectCuda<SimDriver>>>> rig(sim);
  auto& any = *rig.stack;
  CHECK_FALSE(any.tracks_block_uses());
  auto b = any.allocate(256, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());
  auto e = any.record_block_use(*b, StreamId{1});
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::stream_misuse);
  CHECK_THAT(e.error().message(), Catch::Contains("unsupported"));
  REQUIRE(any.deallocate(std::move(*b)).has_value());
}

TEST_CASE("DebugGuard on SimDriver: a kernel writing past the end on another stream is caught",
          "[sim][debug_guard]") {
  SimDriver sim{SimConfig{}};
  Rig<Entry<DebugGuard<AsyncCuda<SimDriver>>>> rig(sim);
  auto& g = *rig.stack;
  auto s1 = rig.streams->get(StreamId{1});
  REQUIRE(s1.has_value());

  SECTION("an in-bounds kernel: the block is freed with no report and no hazard") {
    auto b = g.allocate(1024, StreamId{0}, AllocTag{3});
    REQUIRE(b.has_value());
    REQUIRE(g.prepare_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    REQUIRE(sim.launch_kernel(*s1, {SimAccess{b->ptr(), 1024, Access::Write}},
                              [](std::span<std::byte* const> p) { std::memset(p[0], 1, 1024); }).has_value());
    REQUIRE(g.finish_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    REQUIRE(g.deallocate(std::move(*b)).has_value());
  }
  SECTION("one byte too many: guard_corrupted, and the block is still freed") {
    auto b = g.allocate(1024, StreamId{0}, AllocTag{3});
    REQUIRE(b.has_value());
    const std::string id = b->id().to_string();
    REQUIRE(g.prepare_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    REQUIRE(sim.launch_kernel(*s1, {SimAccess{b->ptr(), 1025, Access::Write}},
                              [](std::span<std::byte* const> p) { std::memset(p[0], 1, 1025); }).has_value());
    REQUIRE(g.finish_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    auto e = g.deallocate(std::move(*b));
    REQUIRE_FALSE(e);
    CHECK(e.error().code() == errc::guard_corrupted);
    CHECK_THAT(e.error().message(), Catch::Contains("block " + id) && Catch::Contains("tag 3") &&
                                        Catch::Contains("back guard overwritten at offset 0"));
    CHECK(b->empty());
  }
  REQUIRE(g.reap_pending().has_value());
  CHECK(g.bytes_outstanding() == 0);
  CHECK(g.live_blocks() == 0);
  sim.run_until_idle();
  const auto hazards = sim.hazards();
  for (const auto& h : hazards) INFO(to_string(h.kind));
  CHECK(hazards.empty());
}

TEST_CASE("Budget over AsyncCuda on SimDriver: 8 threads never make the device hold more than the budget",
          "[sim][budget][threads]") {
  constexpr std::uint32_t ordinal = 1;
  constexpr std::size_t limit = 256 * 1024;
  SimDriver sim{SimConfig{}};
  Rig<Entry<Budget<AsyncCuda<SimDriver>>>> rig(sim, ordinal);
  auto& b = *rig.stack;
  REQUIRE(set_device_budget(sim, ordinal, limit).has_value());
  auto dev = sim.device_get(static_cast<int>(ordinal));
  REQUIRE(dev.has_value());

  std::atomic<bool> done{false};
  std::atomic<std::size_t> max_reserved{0};
  std::thread monitor([&] {
    while (!done) {
      auto r = sim.bytes_reserved(*dev);
      if (r && *r > max_reserved) max_reserved = *r;
      std::this_thread::yield();
    }
  });
  std::atomic<int> errors{0}, refused{0}, granted{0};
  std::vector<std::thread> threads;
  for (std::uint32_t t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<DeviceBlock> mine;
      for (int i = 0; i < 300; ++i) {
        auto x = b.allocate(256 * (1 + (i * 7 + t) % 64), StreamId{t % 4}, AllocTag{t});
        if (x) {
          ++granted;
          mine.push_back(std::move(*x));
        } else if (x.error().code() == errc::out_of_budget) {
          ++refused;
        } else {
          ++errors;
        }
        if (mine.size() > 3 || (!x && !mine.empty())) {
          if (!b.deallocate(std::move(mine.front()))) ++errors;
          mine.erase(mine.begin());
        }
      }
      for (auto& x : mine) {
        if (!b.deallocate(std::move(x))) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  monitor.join();
  CHECK(errors == 0);
  CHECK(granted > 0);
  CHECK(refused > 0);
  INFO("max bytes reserved on the device: " << max_reserved.load());
  CHECK(max_reserved <= limit);
  REQUIRE(b.reap_pending().has_value());
  CHECK(b.bytes_outstanding() == 0);
  CHECK(device_budget(sim, ordinal)->in_use == 0);
}

TEST_CASE("the default stack with XLOGRT_CACHE=thread_block_bytes=0 keeps no thread bins: blocks go through the depots",
          "[sim][env_config]") {
  // Issue #28, finding 5: the variable refused the 0 that CachedOptions defines.
  SimDriver sim;
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  REQUIRE(::setenv("XLOGRT_CACHE", "thread_block_bytes=0", 1) == 0);
  auto s = StackBuilder<DefaultStackOn<SimDriver>>::build(*pool);
  REQUIRE(::unsetenv("XLOGRT_CACHE") == 0);
  INFO((s ? std::string() : s.error().what()));
  REQUIRE(s.has_value());
  auto* cache = find_layer<Cached>(*s);
  REQUIRE(cache != nullptr);
  CHECK(cache->options().enabled);
  CHECK(cache->options().thread_block_bytes == 0u);
  for (int i = 0; i < 4; ++i) {  // a small block, freed and asked for again: from the depot
    auto b = s->allocate(4096, StreamId{0}, AllocTag{1});
    REQUIRE(b.has_value());
    REQUIRE(s->deallocate(std::move(*b)).has_value());
  }
  const CacheStats st = cache->stats();
  CHECK(st.hits == 0);  // no thread bin held the block ...
  CHECK(st.depot_hits == 3);  // ... its stream's depot did
  CHECK(cache->trim() > 0);
  sim.run_until_idle();
  REQUIRE(s->reap_pending().has_value());
  CHECK(s->bytes_outstanding() == 0);
}

TEST_CASE("the default stack names XLOGRT_LOG_FILE in its errors, escapes the path, and refuses a FIFO",
          "[sim][logging]") {
  // Issue #28, finding 4: the budget's and the cache's errors named their variable and
  // escaped its value; the log file's did neither, and a FIFO made the build wait for ever.
  SimDriver sim;
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  auto build = [&](const std::string& value) {
    REQUIRE(::setenv("XLOGRT_LOG_FILE", value.c_str(), 1) == 0);
    auto s = StackBuilder<DefaultStackOn<SimDriver>>::build(*pool);
    REQUIRE(::unsetenv("XLOGRT_LOG_FILE") == 0);
    return s;
  };
  auto raw = build("/nonexistent-dir/log\n\x1b]0;title\x07.csv");
  REQUIRE_FALSE(raw);
  CHECK(raw.error().code() == errc::sink_failure);
  const std::string m = raw.error().message();
  CHECK_THAT(m, Catch::StartsWith("XLOGRT_LOG_FILE: ") && Catch::Contains("log\\x0a\\x1b]0;title\\x07.csv"));
  CHECK(m.find_first_of("\n\x1b\x07") == std::string::npos);

  const std::string fifo = "xlogrt_test_env_fifo_" + std::to_string(::getpid());
  (void)::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  auto f = std::async(std::launch::async, [&] { return build(fifo); });
  const bool returned = f.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!returned) {  // the old behaviour: give it a reader so that the test ends
    const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    f.wait();
    if (reader >= 0) ::close(reader);
  }
  (void)::unlink(fifo.c_str());
  REQUIRE(returned);
  auto on_fifo = f.get();
  REQUIRE_FALSE(on_fifo);
  CHECK_THAT(on_fifo.error().message(), Catch::StartsWith("XLOGRT_LOG_FILE: ") && Catch::Contains("a FIFO"));
}

TEST_CASE("XLOGRT_LOG_SAMPLES=0 leaves the default stack's log in RMM's layout alone", "[sim][logging]") {
  SimDriver sim;
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  const std::string path = "xlogrt_test_log_samples_" + std::to_string(::getpid()) + ".csv";
  auto log_of = [&](const char* samples) {
    REQUIRE(::setenv("XLOGRT_LOG_FILE", path.c_str(), 1) == 0);
    if (samples != nullptr) REQUIRE(::setenv("XLOGRT_LOG_SAMPLES", samples, 1) == 0);
    {
      auto s = StackBuilder<DefaultStackOn<SimDriver>>::build(*pool);
      REQUIRE(::unsetenv("XLOGRT_LOG_FILE") == 0);
      REQUIRE(::unsetenv("XLOGRT_LOG_SAMPLES") == 0);
      REQUIRE(s.has_value());
      for (int i = 0; i < 4; ++i) {
        auto b = s->allocate(4096, StreamId{0}, AllocTag{1});
        REQUIRE(b.has_value());
        REQUIRE(s->deallocate(std::move(*b)).has_value());
      }
      sim.run_until_idle();
      REQUIRE(s->reap_pending().has_value());
    }  // the sink writes what it holds and closes
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    (void)::unlink(path.c_str());
    return text.str();
  };
  const std::string plain = log_of("0"), with = log_of(nullptr), off = log_of("off");
  CHECK(plain.find("allocate") != std::string::npos);
  CHECK(plain.find("sample") == std::string::npos);
  CHECK(off.find("sample") == std::string::npos);
  CHECK(with.find("sample held") != std::string::npos);  // the default samples at the first record

  REQUIRE(::setenv("XLOGRT_LOG_FILE", path.c_str(), 1) == 0);
  REQUIRE(::setenv("XLOGRT_LOG_SAMPLES", "10s", 1) == 0);
  auto bad = StackBuilder<DefaultStackOn<SimDriver>>::build(*pool);
  REQUIRE(::unsetenv("XLOGRT_LOG_FILE") == 0);
  REQUIRE(::unsetenv("XLOGRT_LOG_SAMPLES") == 0);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK_THAT(bad.error().message(), Catch::StartsWith("XLOGRT_LOG_SAMPLES='10s'"));
}

namespace {

/// What the last sample of a ring holds, and the live bytes its allocate and free lines
/// give up to then (the blocks as granted).
struct LoggedSample {
  std::size_t live = 0;
  std::optional<std::size_t> held, cached, queued, pool_reserved, pool_used;
};

LoggedSample last_sample(const RingSink& ring) {
  LoggedSample out;
  for (const auto& r : ring.records()) {
    switch (r.action) {
      case LogAction::allocate: out.live += r.bytes; break;
      case LogAction::free: out.live -= r.bytes; break;
      case LogAction::sample_held:  // a sample starts with its held line: forget the last one's
        out.held = r.bytes;
        out.cached = out.queued = out.pool_reserved = out.pool_used = std::nullopt;
        break;
      case LogAction::sample_cached: out.cached = r.bytes; break;
      case LogAction::sample_queued: out.queued = r.bytes; break;
      case LogAction::sample_pool_reserved: out.pool_reserved = r.bytes; break;
      case LogAction::sample_pool_used: out.pool_used = r.bytes; break;
      default: break;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("Logging over the cache samples held = live + cached + queued at a quiet point, by layer",
          "[sim][logging]") {
  // Manual executor: a queued free stays queued until reap_pending.
  SimDriver sim{SimConfig{.executor = SimExecutor::manual}};
  Rig<Entry<Logging<Cached<AsyncCuda<SimDriver>>, RingSink>>> rig(sim);
  auto& log = *rig.stack;
  auto& cache = *find_layer<Cached>(log);
  auto& base = *find_layer<AsyncCuda>(log);
  std::vector<DeviceBlock> held;
  // Thread-bin sizes, shared-class sizes and one above max_block_bytes (1 MiB), which
  // bypasses the cache: its free is queued at the base.
  for (std::size_t bytes : {1000, 5000, 70'000, 300'000, 3 << 20}) {
    for (std::uint32_t s = 0; s < 2; ++s) {
      for (int k = 0; k < 2; ++k) {
        auto b = log.allocate(bytes, StreamId{s}, AllocTag{7});
        REQUIRE(b.has_value());
        held.push_back(std::move(*b));
      }
    }
  }
  for (std::size_t i = 0; i < held.size(); i += 2) REQUIRE(log.deallocate(std::move(held[i])).has_value());

  log.sample();
  auto s = last_sample(log.sink());
  REQUIRE(s.held.has_value());
  REQUIRE(s.cached.has_value());
  REQUIRE(s.queued.has_value());
  CHECK_FALSE(s.pool_reserved.has_value());  // SimDriver reports no pool counters
  CHECK_FALSE(s.pool_used.has_value());
  INFO("live " << s.live << ", held " << *s.held << ", cached " << *s.cached << ", queued " << *s.queued);
  CHECK(s.live > 0);
  CHECK(*s.cached == cache.stats().cached_bytes);
  CHECK(*s.cached > 0);
  CHECK(*s.queued == base.queued_free_bytes());
  CHECK(*s.queued >= (std::size_t{3} << 20) * 2);  // the two bypassed blocks freed
  CHECK(*s.held == base.bytes_outstanding());
  CHECK(*s.held >= s.live);
  CHECK(*s.held == s.live + *s.cached + *s.queued);

  // Reaped: nothing queued. Trimmed: the cache's blocks become queued frees, then go.
  REQUIRE(log.reap_pending().has_value());
  log.sample();
  s = last_sample(log.sink());
  CHECK(*s.queued == 0);
  CHECK(*s.held == s.live + *s.cached);
  const std::size_t was_cached = *s.cached;
  CHECK(cache.trim() == was_cached);
  log.sample();
  s = last_sample(log.sink());
  CHECK(*s.cached == 0);
  CHECK(*s.queued == was_cached);
  CHECK(*s.held == s.live + was_cached);

  for (auto& b : held) {
    if (!b.empty()) REQUIRE(log.deallocate(std::move(b)).has_value());
  }
  (void)cache.trim();
  REQUIRE(log.reap_pending().has_value());
  log.sample();
  s = last_sample(log.sink());
  CHECK(s.live == 0);
  CHECK(*s.held == 0);
  CHECK(*s.cached == 0);
  CHECK(*s.queued == 0);
}

TEST_CASE("Logging over a stack without a cache samples what it has: held and queued, or held alone",
          "[sim][logging]") {
  SimDriver sim{SimConfig{.executor = SimExecutor::manual}};
  SECTION("AsyncCuda: held and queued, no cached line") {
    Rig<Entry<Logging<AsyncCuda<SimDriver>, RingSink>>> rig(sim);
    auto& log = *rig.stack;
    auto a = log.allocate(4096, StreamId{0}, AllocTag{1});
    auto b = log.allocate(8192, StreamId{1}, AllocTag{1});
    REQUIRE((a && b));
    REQUIRE(log.deallocate(std::move(*a)).has_value());
    log.sample();
    const auto s = last_sample(log.sink());
    CHECK(s.live == 8192);
    CHECK(s.held == std::optional<std::size_t>{8192 + 4096});
    CHECK(s.queued == std::optional<std::size_t>{4096});
    CHECK_FALSE(s.cached.has_value());
    REQUIRE(log.deallocate(std::move(*b)).has_value());
  }
  SECTION("DirectCuda: held alone") {
    Rig<Entry<Logging<DirectCuda<SimDriver>, RingSink>>> rig(sim);
    auto& log = *rig.stack;
    auto a = log.allocate(4096, StreamId{0}, AllocTag{1});
    REQUIRE(a.has_value());
    log.sample();
    const auto s = last_sample(log.sink());
    CHECK(s.held == std::optional<std::size_t>{4096});
    CHECK_FALSE(s.queued.has_value());
    CHECK_FALSE(s.cached.has_value());
    REQUIRE(log.deallocate(std::move(*a)).has_value());
  }
}
