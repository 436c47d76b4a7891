// SPDX-License-Identifier: Apache-2.0
// SimDriver in threaded mode: executor threads, many host threads, and flags written
// "by the device" into mapped host memory while the host spins on them. Run under TSan
// in CI.

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;
using simtest::expect_ok;
using simtest::Sim;
using simtest::value;

namespace {

SimConfig threaded(unsigned workers = 2) {
  SimConfig c;
  c.executor = SimExecutor::threaded;
  c.worker_threads = workers;
  c.memory_bytes = std::size_t{8} << 20;
  return c;
}

void wait_for(std::atomic<bool>* go) {
  while (!go->load(std::memory_order_acquire)) std::this_thread::yield();
}

bool spin_until(const std::uint32_t* word, std::uint32_t v) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::atomic_ref<const std::uint32_t> a(*word);
  while (a.load(std::memory_order_acquire) != v) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

TEST_CASE("a write-value lands in mapped host memory, in stream order", "[sim][threaded]") {
  Sim sim(threaded());
  auto s = sim.stream();
  auto* flags = static_cast<std::uint32_t*>(value(sim.d.mem_host_alloc_mapped(64)));
  for (int i = 0; i < 16; ++i) std::atomic_ref<std::uint32_t>(flags[i]).store(0);
  auto dflags = value(sim.d.mem_host_device_pointer(flags));
  auto buf = sim.alloc(256, s);

  std::atomic<bool> go{false};
  expect_ok(sim.d.launch_host_func(
      s, [](void* g) { wait_for(static_cast<std::atomic<bool>*>(g)); }, &go));
  sim.fill(buf, 0x5A, 256, s);
  expect_ok(sim.d.stream_write_value32(s, dflags + 4, 7));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(std::atomic_ref<std::uint32_t>(flags[1]).load(std::memory_order_acquire) == 0);  // gated
  CHECK_FALSE(value(sim.d.stream_query(s)));
  go.store(true, std::memory_order_release);
  REQUIRE(spin_until(&flags[1], 7));
  // The memset before the flag is visible once the flag is.
  auto view = value(sim.d.host_view(buf, 256));
  CHECK(std::to_integer<int>(view[255]) == 0x5A);
  CHECK(std::atomic_ref<std::uint32_t>(flags[0]).load() == 0);
  expect_ok(sim.d.stream_synchronize(s));
  expect_ok(sim.d.mem_free_async(buf, s));
  expect_ok(sim.d.stream_synchronize(s));
  expect_ok(sim.d.mem_host_free(flags));
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("many flags from many streams while the host polls", "[sim][threaded]") {
  Sim sim(threaded(3));
  constexpr int streams = 6;
  constexpr std::uint32_t rounds = 200;
  auto* flags = static_cast<std::uint32_t*>(value(sim.d.mem_host_alloc_mapped(streams * 4)));
  auto dflags = value(sim.d.mem_host_device_pointer(flags));
  std::vector<SimDriver::stream_t> ss;
  for (int i = 0; i < streams; ++i) {
    ss.push_back(sim.stream());
    std::atomic_ref<std::uint32_t>(flags[i]).store(0);
  }
  for (std::uint32_t r = 1; r <= rounds; ++r) {
    for (int i = 0; i < streams; ++i) {
      expect_ok(sim.d.stream_write_value32(ss[static_cast<std::size_t>(i)],
                                           dflags + 4u * static_cast<unsigned>(i), r));
    }
  }
  for (int i = 0; i < streams; ++i) CHECK(spin_until(&flags[i], rounds));
  sim.d.run_until_idle();
  CHECK(sim.d.pending_ops() == 0);
  expect_ok(sim.d.mem_host_free(flags));
}

TEST_CASE("several host threads drive their own streams concurrently", "[sim][threaded]") {
  Sim sim(threaded());
  constexpr int threads = 4;
  constexpr int iterations = 150;
  std::vector<SimDriver::event_t> events;
  for (int t = 0; t < threads; ++t) events.push_back(sim.event());
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto& d = sim.d;
      if (!d.ctx_make_current(sim.ctx)) {
        ++failures;
        return;
      }
      auto sr = d.stream_create();
      if (!sr) {
        ++failures;
        return;
      }
      auto s = *sr;
      std::vector<std::uint8_t> in(512), out(512);
      for (int i = 0; i < iterations; ++i) {
        for (std::size_t k = 0; k < in.size(); ++k)
          in[k] = static_cast<std::uint8_t>(t * 31 + i + k);
        auto a = d.mem_alloc_async(512, sim.pool, s);
        auto b = d.mem_alloc_async(512, sim.pool, s);
        if (!a || !b) {
          ++failures;
          return;
        }
        bool okay = d.memcpy_htod_async(*a, in.data(), 512, s).has_value();
        okay = okay &&
               d.launch_kernel(s, {{*a, 512, Access::Read}, {*b, 512, Access::Write}},
                               [](std::span<std::byte* const> p) { std::memcpy(p[1], p[0], 512); })
                   .has_value();
        okay = okay && d.memcpy_dtoh_async(out.data(), *b, 512, s).has_value();
        // Order this stream after a neighbour's latest recorded point now and then:
        // events recorded and waited on from different threads.
        okay = okay && d.event_record(events[static_cast<std::size_t>(t)], s).has_value();
        okay =
            okay &&
            d.stream_wait_event(s, events[static_cast<std::size_t>((t + 1) % threads)]).has_value();
        okay = okay && d.mem_free_async(*a, s).has_value() && d.mem_free_async(*b, s).has_value();
        okay = okay && d.stream_synchronize(s).has_value();
        if (!okay || out != in) {
          ++failures;
          return;
        }
      }
      if (!d.stream_destroy(s)) ++failures;
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  sim.d.run_until_idle();
  CHECK(value(sim.d.bytes_reserved(0)) == 0);
  CHECK(sim.d.calls("cuMemAllocAsync") == 2 * threads * iterations);
  INFO((sim.d.hazards().empty() ? std::string() : to_string(sim.d.hazards()[0])));
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("a race between two host threads' streams is found whatever the interleaving",
          "[sim][threaded]") {
  for (int round = 0; round < 10; ++round) {
    Sim sim(threaded());
    auto p = value(sim.d.mem_alloc(1024));
    std::barrier sync_point(2);
    std::atomic<int> failures{0};
    // Catch2's assertions are not thread-safe: the threads only count failures.
    auto body = [&](std::uint8_t v) {
      bool okay = sim.d.ctx_make_current(sim.ctx).has_value();
      auto s = sim.d.stream_create();
      okay = okay && s && sim.d.memset_d8_async(p, v, 1024, *s).has_value();
      sync_point.arrive_and_wait();  // both enqueued before either synchronises
      okay = okay && sim.d.stream_synchronize(*s).has_value();
      if (!okay) ++failures;
    };
    std::thread a(body, std::uint8_t{1});
    std::thread b(body, std::uint8_t{2});
    a.join();
    b.join();
    CHECK(failures.load() == 0);
    auto hs = sim.d.hazards();
    REQUIRE(hs.size() == 1);
    CHECK(hs[0].kind == SimHazardKind::race);
  }
}

TEST_CASE("host functions run on executor threads and may enqueue more work", "[sim][threaded]") {
  Sim sim(threaded());
  auto a = sim.stream();
  auto b = sim.stream();
  auto p = sim.alloc(64, a);
  expect_ok(sim.d.stream_synchronize(a));
  struct Ctx {
    SimDriver* d;
    SimDriver::stream_t b;
    std::uint64_t p;
    std::atomic<bool> ran{false};
    std::thread::id where;
  } ctx{&sim.d, b, p, {}, {}};
  expect_ok(sim.d.launch_host_func(
      a,
      [](void* v) {
        auto* c = static_cast<Ctx*>(v);
        c->where = std::this_thread::get_id();
        (void)c->d->memset_d8_async(c->p, 3, 64, c->b);
        c->ran.store(true, std::memory_order_release);
      },
      &ctx));
  expect_ok(sim.d.stream_synchronize(a));
  REQUIRE(ctx.ran.load(std::memory_order_acquire));
  CHECK(ctx.where != std::this_thread::get_id());
  expect_ok(sim.d.stream_synchronize(b));
  CHECK(sim.read(p, 64, b) == std::vector<std::uint8_t>(64, 3));
  CHECK(sim.d.hazards().empty());
}

TEST_CASE("the process-wide simulator works from several threads", "[sim][threaded]") {
  SimDriver* d = value(SimDriver::open());
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      auto ctx = d->primary_ctx_retain(t % 2);
      if (!ctx || !d->ctx_make_current(*ctx)) {
        ++failures;
        return;
      }
      auto s = d->stream_create();
      auto pool = d->device_default_mempool(t % 2);
      if (!s || !pool) {
        ++failures;
        return;
      }
      for (int i = 0; i < 50; ++i) {
        auto p = d->mem_alloc_async(1 << 16, *pool, *s);
        std::uint8_t byte = 0;
        if (!p || !d->memset_d8_async(*p, static_cast<std::uint8_t>(i), 1 << 16, *s) ||
            !d->memcpy_dtoh_async(&byte, *p + 100, 1, *s) || !d->mem_free_async(*p, *s) ||
            !d->stream_synchronize(*s) || byte != i) {
          ++failures;
          return;
        }
      }
      if (!d->stream_destroy(*s) || !d->primary_ctx_release(t % 2)) ++failures;
    });
  }
  for (auto& t : ts) t.join();
  CHECK(failures.load() == 0);
}
