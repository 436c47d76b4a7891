// SPDX-License-Identifier: Apache-2.0
// Budget<Up>: one byte budget per ordinal, charged at allocate, credited when a free is
// known complete, exact under threads. Each test uses its own ordinal: the budget table
// is process-wide.

#include <atomic>
#include <catch2/catch.hpp>

#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {
std::size_t in_use(std::uint32_t ordinal) { return device_budget(ordinal)->in_use; }
}  // namespace

TEST_CASE("budget charges at allocate and credits a synchronous free at once", "[budget]") {
  constexpr std::uint32_t ord = 1;
  SyncSpy spy(ord);
  auto st = spy.state();
  Budget<SyncSpy> b{std::move(spy), BudgetOptions{.limit_bytes = 4096}};
  STATIC_REQUIRE(Budget<SyncSpy>::frees_synchronously);
  CHECK(device_budget(ord)->limit == 4096);

  auto x = b.allocate(1000, StreamId{0}, AllocTag{1});
  REQUIRE(x.has_value());
  CHECK(in_use(ord) == 1000);
  CHECK(b.bytes_outstanding() == 1000);
  REQUIRE(b.deallocate(std::move(*x)).has_value());
  CHECK(in_use(ord) == 0);
  CHECK(st->reaps == 0);
}

TEST_CASE("budget rolls back its charge when the upstream fails", "[budget]") {
  constexpr std::uint32_t ord = 2;
  PlainSpy spy(ord);
  auto st = spy.state();
  Budget<PlainSpy> b{std::move(spy), BudgetOptions{.limit_bytes = 1 << 20}};

  st->fail_allocate_in = 1;
  auto x = b.allocate(4096, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(x);
  CHECK(x.error().code() == errc::out_of_memory);
  CHECK(in_use(ord) == 0);

  auto zero = b.allocate(0, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(zero);
  CHECK(zero.error().code() == errc::zero_bytes);
  CHECK(in_use(ord) == 0);

  auto y = b.allocate(4096, StreamId{0}, AllocTag{});
  REQUIRE(y.has_value());
  CHECK(in_use(ord) == 4096);

  // A refused free credits nothing, and the block stays with the caller.
  st->fail_deallocate_in = 1;
  REQUIRE_FALSE(b.deallocate(std::move(*y)));
  CHECK_FALSE(y->empty());
  CHECK(in_use(ord) == 4096);
  CHECK(b.pending_credit() == 0);

  DeviceBlock forged{y->ptr(), y->bytes(), y->alloc_stream(), y->device_ordinal(), y->tag(), y->id()};
  REQUIRE(b.deallocate(std::move(*y)).has_value());
  auto twice = b.deallocate(std::move(forged));
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code() == errc::double_free);
  CHECK(b.pending_credit() == 4096);
  REQUIRE(b.reap_pending().has_value());
  CHECK(in_use(ord) == 0);

  // A failed reap puts the pending credit back.
  auto z = b.allocate(100, StreamId{0}, AllocTag{});
  REQUIRE(z.has_value());
  REQUIRE(b.deallocate(std::move(*z)).has_value());
  st->fail_reap_in = 1;
  REQUIRE_FALSE(b.reap_pending());
  CHECK(b.pending_credit() == 100);
  CHECK(in_use(ord) == 100);
  REQUIRE(b.reap_pending().has_value());
  CHECK(in_use(ord) == 0);
}

TEST_CASE("a queued free still counts; pressure reaps once and retries", "[budget]") {
  constexpr std::uint32_t ord = 3;
  PlainSpy spy(ord);
  auto st = spy.state();
  Budget<PlainSpy> b{std::move(spy), BudgetOptions{.limit_bytes = 1000}};

  auto x = b.allocate(600, StreamId{0}, AllocTag{});
  REQUIRE(x.has_value());
  REQUIRE(b.deallocate(std::move(*x)).has_value());
  // The spy has only queued the free: the device still holds the 600 bytes.
  CHECK(st->held == 600);
  CHECK(in_use(ord) == 600);
  CHECK(b.pending_credit() == 600);

  auto y = b.allocate(600, StreamId{1}, AllocTag{});
  REQUIRE(y.has_value());
  CHECK(st->reaps == 1);
  CHECK(in_use(ord) == 600);
  CHECK(st->max_held <= 1000);

  // Reaping frees nothing now: the request fails, naming what a person needs.
  auto z = b.allocate(500, StreamId{2}, AllocTag{7});
  REQUIRE_FALSE(z);
  CHECK(z.error().code() == errc::out_of_budget);
  CHECK(st->reaps == 2);
  const auto& m = z.error().message();
  CHECK_THAT(m, Catch::Contains("ordinal 3"));
  CHECK_THAT(m, Catch::Contains("500 bytes"));
  CHECK_THAT(m, Catch::Contains("budget of 1000 bytes"));
  CHECK_THAT(m, Catch::Contains("600 bytes in use"));
  CHECK(in_use(ord) == 600);

  // A reap that fails under pressure is reported in the budget error.
  REQUIRE(b.deallocate(std::move(*y)).has_value());
  st->fail_reap_in = 1;
  auto w = b.allocate(600, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(w);
  CHECK(w.error().code() == errc::out_of_budget);
  CHECK_THAT(w.error().message(), Catch::Contains("reaping queued frees failed"));
  REQUIRE(b.reap_pending().has_value());
  CHECK(in_use(ord) == 0);
}

TEST_CASE("stacks on one ordinal share its budget; other ordinals are apart", "[budget]") {
  constexpr std::uint32_t ord = 4;
  REQUIRE(set_device_budget(ord, 1000).has_value());
  Budget<SyncSpy> a{SyncSpy(ord)};
  Budget<SyncSpy> b{SyncSpy(ord)};
  Budget<SyncSpy> other{SyncSpy(ord + 1)};
  auto x = a.allocate(700, StreamId{0}, AllocTag{});
  REQUIRE(x.has_value());
  auto y = b.allocate(400, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(y);
  CHECK(y.error().code() == errc::out_of_budget);
  auto z = other.allocate(400, StreamId{0}, AllocTag{});
  REQUIRE(z.has_value());
  // Lowering the limit revokes nothing, refuses what no longer fits.
  REQUIRE(set_device_budget(ord, 500).has_value());
  CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));
  REQUIRE(a.deallocate(std::move(*x)).has_value());
  auto w = b.allocate(400, StreamId{0}, AllocTag{});
  REQUIRE(w.has_value());
  REQUIRE(b.deallocate(std::move(*w)).has_value());
  REQUIRE(other.deallocate(std::move(*z)).has_value());
  CHECK(in_use(ord) == 0);
  CHECK(in_use(ord + 1) == 0);
  REQUIRE(clear_device_budget(ord).has_value());
}

TEST_CASE("an ordinal outside the table is a named error", "[budget]") {
  CHECK(set_device_budget(BUDGET_ORDINALS, 1).error().code() == errc::invalid_ordinal);
  CHECK(device_budget(99).error().code() == errc::invalid_ordinal);
  Budget<PlainSpy> b{PlainSpy(40)};
  auto x = b.allocate(64, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(x);
  CHECK(x.error().code() == errc::invalid_ordinal);
  CHECK_THAT(x.error().message(), Catch::Contains("40"));
}

TEST_CASE("budget forwards tracking only when the upstream tracks", "[budget]") {
  STATIC_REQUIRE_FALSE(TrackingResource<Budget<PlainSpy>>);
  STATIC_REQUIRE_FALSE(HasRecordBlockUse<Budget<PlainSpy>>);
  STATIC_REQUIRE(HasRecordBlockUse<Budget<TrackingSpy>>);
  STATIC_REQUIRE(TrackingResource<Budget<TrackingSpy>>);
  TrackingSpy spy(6);
  auto st = spy.state();
  Budget<TrackingSpy> b{std::move(spy)};
  auto x = b.allocate(64, StreamId{0}, AllocTag{});
  REQUIRE(x.has_value());
  REQUIRE(b.record_block_use(*x, StreamId{1}).has_value());
  REQUIRE(b.prepare_block_use(x->id(), StreamId{1}, Access::Read).has_value());
  REQUIRE(b.finish_block_use(x->id(), StreamId{1}, Access::Read).has_value());
  CHECK(st->records == 1);
  CHECK(st->prepares == 1);
  CHECK(st->finishes == 1);
  REQUIRE(b.deallocate(std::move(*x)).has_value());
  CHECK(b.prepare_block_use(x->id(), StreamId{1}, Access::Read).error().code() == errc::stale_block);
  REQUIRE(b.reap_pending().has_value());
}

TEST_CASE("16 threads hammering one ordinal: the device never holds more than the budget",
          "[budget][threads]") {
  constexpr std::uint32_t ord = 7;
  constexpr std::size_t limit = 64 * 1024;
  PlainSpy spy(ord);  // frees queue until a reap, as AsyncCuda's do
  auto st = spy.state();
  Budget<PlainSpy> b{std::move(spy), BudgetOptions{.limit_bytes = limit}};
  std::atomic<std::uint64_t> ok_count{0}, refused{0}, other_errors{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::uniform_int_distribution<std::size_t> size(64, 8192);
      std::vector<DeviceBlock> mine;
      for (int i = 0; i < 2000; ++i) {
        auto x = b.allocate(size(rng), StreamId{t % 4}, AllocTag{t});
        if (x) {
          ++ok_count;
          mine.push_back(std::move(*x));
        } else if (x.error().code() == errc::out_of_budget) {
          ++refused;
        } else {
          ++other_errors;
        }
        if (mine.size() > 2 || (!x && !mine.empty())) {
          if (!b.deallocate(std::move(mine.front()))) ++other_errors;
          mine.erase(mine.begin());
        }
        if (i % 97 == 0 && !b.reap_pending()) ++other_errors;
      }
      for (auto& x : mine) {
        if (!b.deallocate(std::move(x))) ++other_errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(other_errors == 0);
  CHECK(ok_count > 0);
  CHECK(refused > 0);  // the budget was under pressure
  INFO("max held " << st->max_held.load());
  CHECK(st->max_held <= limit);
  CHECK(in_use(ord) >= st->held);  // queued frees are still charged
  REQUIRE(b.reap_pending().has_value());
  CHECK(st->held == 0);
  CHECK(in_use(ord) == 0);
  CHECK(b.pending_credit() == 0);
}

// ---- striped credit: the fast path charges the thread's stripe; a refill hands it the
// request plus a chunk (limit/256) from the ordinal; a refused refill reclaims first ----

namespace {
std::size_t reserved(std::uint32_t ordinal) { return detail::budget_slot(ordinal)->reserved_bytes(); }
std::uint32_t my_stripe() { return detail::thread_stripe(detail::BUDGET_STRIPES); }
}  // namespace

TEST_CASE("credit stranded in another thread's stripe is reclaimed before a refusal",
          "[budget][threads]") {
  constexpr std::uint32_t ord = 8;
  constexpr std::size_t limit = 1 << 20;  // chunk: 4096 bytes
  Budget<SyncSpy> b{SyncSpy(ord), BudgetOptions{.limit_bytes = limit}};
  const std::uint32_t main_stripe = my_stripe();

  // Thread A charges 1000 bytes, keeps the block and waits (holding its ticket, so that
  // B gets another stripe): its stripe still holds the chunk it was handed beyond the
  // 1000. It exits once B is done.
  std::optional<DeviceBlock> a_block;
  std::uint32_t a_stripe = 0;
  std::atomic<bool> a_charged{false}, b_done{false};
  std::thread a_thread([&] {
    a_stripe = my_stripe();
    auto x = b.allocate(1000, StreamId{0}, AllocTag{});
    if (x) a_block = std::move(*x);
    a_charged.store(true);
    while (!b_done.load()) std::this_thread::yield();
  });
  while (!a_charged.load()) std::this_thread::yield();
  REQUIRE(a_block.has_value());
  REQUIRE(a_stripe != main_stripe);  // else the test would show nothing
  CHECK(in_use(ord) == 1000);
  CHECK(reserved(ord) > in_use(ord));  // charged != reserved: credit is stranded

  // Thread B (another stripe) asks for exactly the free budget: it fits, so it succeeds.
  bool b_ok = false;
  std::uint32_t b_stripe = 0;
  std::thread([&] {
    b_stripe = my_stripe();
    auto y = b.allocate(limit - 1000, StreamId{1}, AllocTag{});
    b_ok = y.has_value();
    if (y) b_ok = b.deallocate(std::move(*y)).has_value();
  }).join();
  b_done.store(true);
  a_thread.join();
  REQUIRE(b_stripe != a_stripe);
  CHECK(b_ok);
  CHECK(in_use(ord) == 1000);
  CHECK(reserved(ord) <= limit);

  // The same from the main thread while A's block is live; then one byte more is refused.
  auto z = b.allocate(limit - 1000, StreamId{0}, AllocTag{});
  REQUIRE(z.has_value());
  CHECK(in_use(ord) == limit);
  auto over = b.allocate(1, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(over);
  CHECK(over.error().code() == errc::out_of_budget);
  REQUIRE(b.deallocate(std::move(*z)).has_value());
  REQUIRE(b.deallocate(std::move(*a_block)).has_value());
  CHECK(in_use(ord) == 0);
  REQUIRE(clear_device_budget(ord).has_value());
}

TEST_CASE("lowering the limit revokes cached credit; raising or clearing it applies at once", "[budget]") {
  constexpr std::uint32_t ord = 9;
  Budget<SyncSpy> b{SyncSpy(ord)};
  // Charged while unlimited, then limited: what is charged counts against the new limit.
  auto pre = b.allocate(3000, StreamId{0}, AllocTag{});
  REQUIRE(pre.has_value());
  REQUIRE(set_device_budget(ord, 1 << 20).has_value());
  CHECK(in_use(ord) == 3000);
  CHECK(reserved(ord) == 3000);
  auto x = b.allocate(1000, StreamId{0}, AllocTag{});  // the stripe now caches a chunk
  REQUIRE(x.has_value());
  CHECK(reserved(ord) > 4000);

  // Lowered to exactly what fits one more 1000: the cached chunk must not stretch it.
  REQUIRE(set_device_budget(ord, 5000).has_value());
  CHECK(reserved(ord) == 4000);
  auto y = b.allocate(1000, StreamId{0}, AllocTag{});
  REQUIRE(y.has_value());
  CHECK(in_use(ord) == 5000);
  CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));
  CHECK(reserved(ord) <= 5000);

  // Lowered below what is in use: nothing is revoked, everything is refused until enough
  // is freed.
  REQUIRE(set_device_budget(ord, 2500).has_value());
  CHECK(in_use(ord) == 5000);
  REQUIRE(b.deallocate(std::move(*x)).has_value());
  CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));
  REQUIRE(b.deallocate(std::move(*y)).has_value());
  CHECK(in_use(ord) == 3000);
  CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));
  REQUIRE(b.deallocate(std::move(*pre)).has_value());
  CHECK(in_use(ord) == 0);
  auto w = b.allocate(2500, StreamId{0}, AllocTag{});
  REQUIRE(w.has_value());
  CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));

  // Raised: at once. Cleared: anything goes, and the stripes reserve nothing.
  REQUIRE(set_device_budget(ord, 2600).has_value());
  auto v = b.allocate(100, StreamId{0}, AllocTag{});
  REQUIRE(v.has_value());
  REQUIRE(clear_device_budget(ord).has_value());
  auto big = b.allocate(std::size_t{1} << 30, StreamId{0}, AllocTag{});
  REQUIRE(big.has_value());
  CHECK(in_use(ord) == 2600 + (std::size_t{1} << 30));
  CHECK(reserved(ord) == 0);
  for (auto* blk : {&*w, &*v, &*big}) REQUIRE(b.deallocate(std::move(*blk)).has_value());
  CHECK(in_use(ord) == 0);
}

TEST_CASE("stripes sum exactly as threads charge, hand over their blocks and exit", "[budget][threads]") {
  constexpr std::uint32_t ord = 10;
  constexpr std::size_t limit = 8 << 20;
  PlainSpy spy(ord);  // queued frees: this stack's pending count is striped too
  auto st = spy.state();
  Budget<PlainSpy> b{std::move(spy), BudgetOptions{.limit_bytes = limit}};
  constexpr unsigned THREADS = 12;
  std::mutex mu;
  std::vector<DeviceBlock> handed;
  std::atomic<int> errors{0};
  std::size_t expect = 0;
  for (unsigned t = 0; t < THREADS; ++t) {
    for (int i = 0; i < 50; ++i) expect += 100 + t * 7 + static_cast<std::size_t>(i);
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < THREADS; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto x = b.allocate(100 + t * 7 + static_cast<std::size_t>(i), StreamId{t % 4}, AllocTag{t});
        if (!x) {
          ++errors;
          continue;
        }
        std::lock_guard lock(mu);
        handed.push_back(std::move(*x));
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(errors == 0);
  CHECK(in_use(ord) == expect);
  CHECK(reserved(ord) <= limit);

  // Freed by other threads than the ones that charged them (their stripes go below
  // zero), half of them by threads that then exit with frees still pending.
  threads.clear();
  const std::size_t half = handed.size() / 2;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < half; i += 4) {
        if (!b.deallocate(std::move(handed[i]))) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t i = half; i < handed.size(); ++i) REQUIRE(b.deallocate(std::move(handed[i])).has_value());
  REQUIRE(errors == 0);
  CHECK(in_use(ord) == expect);  // queued frees stay charged
  CHECK(b.pending_credit() == expect);
  REQUIRE(b.reap_pending().has_value());
  CHECK(b.pending_credit() == 0);
  CHECK(in_use(ord) == 0);
  CHECK(st->held == 0);

  // Every stripe's credit, negative ones included, comes back: the whole limit fits.
  auto all = b.allocate(limit, StreamId{0}, AllocTag{});
  REQUIRE(all.has_value());
  CHECK(in_use(ord) == limit);
  REQUIRE(b.deallocate(std::move(*all)).has_value());
  REQUIRE(b.reap_pending().has_value());
  CHECK(in_use(ord) == 0);
  REQUIRE(clear_device_budget(ord).has_value());
}

TEST_CASE("8 threads asking for exactly the limit between them are all granted", "[budget][threads]") {
  constexpr std::uint32_t ord = 12;
  constexpr unsigned THREADS = 8, EACH = 64;
  constexpr std::size_t piece = 3000;
  constexpr std::size_t limit = THREADS * EACH * piece;  // no refusal is justified
  Budget<SyncSpy> b{SyncSpy(ord), BudgetOptions{.limit_bytes = limit}};
  std::vector<std::vector<DeviceBlock>> held(THREADS);
  std::atomic<int> refused{0}, errors{0};
  for (int round = 0; round < 20; ++round) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < THREADS; ++t) {
      threads.emplace_back([&, t] {
        for (unsigned i = 0; i < EACH; ++i) {
          auto x = b.allocate(piece, StreamId{t % 4}, AllocTag{});
          if (x) {
            held[t].push_back(std::move(*x));
          } else if (x.error().code() == errc::out_of_budget) {
            ++refused;
          } else {
            ++errors;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    if (round == 0) {
      CHECK(in_use(ord) == limit);
      CHECK_FALSE(b.allocate(1, StreamId{0}, AllocTag{}));
    }
    // Freed by the next thread over, so credit lands in other stripes than it came from.
    threads.clear();
    for (unsigned t = 0; t < THREADS; ++t) {
      threads.emplace_back([&, t] {
        for (auto& x : held[(t + 1) % THREADS]) {
          if (!b.deallocate(std::move(x))) ++errors;
        }
        held[(t + 1) % THREADS].clear();
      });
    }
    for (auto& th : threads) th.join();
  }
  CHECK(errors == 0);
  CHECK(refused == 0);
  CHECK(in_use(ord) == 0);
  REQUIRE(clear_device_budget(ord).has_value());
}

TEST_CASE("a request too big for the budget on a stream the device lacks is unknown_stream", "[budget]") {
  // Bad input is named before the size is: the caller's mistake is the stream.
  constexpr int ord = 13;
  SimDriver sim{SimConfig{.devices = ord + 1}};
  auto pool = StreamPool<SimDriver>::open(sim, ord, 2);
  REQUIRE(pool.has_value());
  auto base = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(base.has_value());
  Budget<AsyncCuda<SimDriver>> b{std::move(*base), BudgetOptions{.limit_bytes = 4096}};
  auto big = b.allocate(8192, StreamId{7}, AllocTag{});
  REQUIRE_FALSE(big);
  CHECK(big.error().code() == errc::unknown_stream);
  auto fits = b.allocate(4096, StreamId{7}, AllocTag{});
  REQUIRE_FALSE(fits);
  CHECK(fits.error().code() == errc::unknown_stream);
  CHECK(device_budget(sim, ord)->in_use == 0);
  auto over = b.allocate(8192, StreamId{1}, AllocTag{});
  REQUIRE_FALSE(over);
  CHECK(over.error().code() == errc::out_of_budget);
  CHECK(device_budget(sim, ord)->in_use == 0);
}

TEST_CASE("destroying a stack gives back what it charged: its live blocks and its queued frees", "[budget]") {
  // Issue #28, finding 6: a stack destroyed with blocks live left their charge on the
  // ordinal for ever, a budget no later stack of the process could get back.
  constexpr std::uint32_t ord = 14;
  REQUIRE(set_device_budget(ord, 10000).has_value());
  PlainSpy spy(ord);  // frees are queued: reaped later
  auto st = spy.state();
  Budget<SyncSpy> survivor{SyncSpy(ord)};
  auto kept = survivor.allocate(1000, StreamId{0}, AllocTag{});
  REQUIRE(kept.has_value());
  {
    Budget<PlainSpy> doomed{std::move(spy)};
    auto a = doomed.allocate(3000, StreamId{0}, AllocTag{});
    auto b = doomed.allocate(2000, StreamId{1}, AllocTag{});
    auto c = doomed.allocate(500, StreamId{0}, AllocTag{});
    REQUIRE((a && b && c));
    REQUIRE(doomed.deallocate(std::move(*c)).has_value());  // queued: still charged
    CHECK(in_use(ord) == 6500);
    CHECK(doomed.charged_bytes() == 5500);
    st->fail_reap_in = 1;  // the destructor's reap fails: the queued free is given back all the same
    // a and b stay live: their holder never frees them before the stack goes.
  }
  CHECK(in_use(ord) == 1000);  // the survivor's block alone
  auto big = survivor.allocate(9000, StreamId{0}, AllocTag{});  // the whole rest of the budget
  REQUIRE(big.has_value());
  REQUIRE(survivor.deallocate(std::move(*big)).has_value());
  REQUIRE(survivor.deallocate(std::move(*kept)).has_value());
  CHECK(survivor.charged_bytes() == 0);
  CHECK(in_use(ord) == 0);
  REQUIRE(clear_device_budget(ord).has_value());
}
