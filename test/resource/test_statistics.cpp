// SPDX-License-Identifier: Apache-2.0
// Statistics<Up>: per-tag and total counters, exact under threads, consistent snapshots.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

TEST_CASE("statistics count per tag and in total, peaks included", "[statistics]") {
  PlainSpy spy;
  auto st = spy.state();
  Statistics<PlainSpy> s{std::move(spy), StatisticsOptions{.tag_slots = 8}};

  auto a = s.allocate(100, StreamId{0}, AllocTag{1});
  auto b = s.allocate(300, StreamId{0}, AllocTag{1});
  auto c = s.allocate(50, StreamId{1}, AllocTag{2});
  auto big = s.allocate(7, StreamId{1}, AllocTag{1000});  // beyond tag_slots: `other`
  REQUIRE((a && b && c && big));
  REQUIRE(s.deallocate(std::move(*a)).has_value());
  st->fail_allocate_in = 1;
  REQUIRE_FALSE(s.allocate(10, StreamId{0}, AllocTag{2}));

  const auto snap = s.snapshot();
  const auto t1 = snap.of(AllocTag{1});
  CHECK(t1.current_bytes == 300);
  CHECK(t1.peak_bytes == 400);
  CHECK(t1.total_bytes == 400);
  CHECK(t1.freed_bytes == 100);
  CHECK(t1.allocations == 2);
  CHECK(t1.frees == 1);
  CHECK(t1.current_count == 1);
  CHECK(t1.failed == 0);
  const auto t2 = snap.of(AllocTag{2});
  CHECK(t2.current_bytes == 50);
  CHECK(t2.allocations == 1);
  CHECK(t2.failed == 1);
  REQUIRE(snap.other.has_value());
  CHECK(snap.other->current_bytes == 7);
  CHECK(snap.of(AllocTag{3}) == AllocationCounters{});
  CHECK(snap.tags.size() == 2);

  CHECK(snap.total.current_bytes == 357);
  CHECK(snap.total.peak_bytes == 457);
  CHECK(snap.total.total_bytes == 457);
  CHECK(snap.total.allocations == 4);
  CHECK(snap.total.frees == 1);
  CHECK(snap.total.current_count == 3);
  CHECK(snap.total.failed == 1);

  REQUIRE(s.deallocate(std::move(*b)).has_value());
  REQUIRE(s.deallocate(std::move(*c)).has_value());
  REQUIRE(s.deallocate(std::move(*big)).has_value());
  const auto end = s.snapshot();
  CHECK(end.total.current_bytes == 0);
  CHECK(end.total.peak_bytes == 457);
  CHECK(end.total.current_count == 0);
}

TEST_CASE("statistics are unchanged by an operation the upstream refuses", "[statistics]") {
  PlainSpy spy;
  auto st = spy.state();
  Statistics<PlainSpy> s{std::move(spy)};
  auto a = s.allocate(128, StreamId{0}, AllocTag{3});
  REQUIRE(a.has_value());
  const auto before = s.snapshot();
  st->fail_deallocate_in = 1;
  REQUIRE_FALSE(s.deallocate(std::move(*a)));
  DeviceBlock empty;
  REQUIRE_FALSE(s.deallocate(std::move(empty)));
  const auto after = s.snapshot();
  CHECK(after.total == before.total);
  CHECK(after.of(AllocTag{3}) == before.of(AllocTag{3}));
  REQUIRE(s.deallocate(std::move(*a)).has_value());
  CHECK(s.snapshot().of(AllocTag{3}).frees == 1);
}

TEST_CASE("statistics are exact under 8 threads, and every snapshot is consistent",
          "[statistics][threads]") {
  TrackingSpy spy;
  Statistics<TrackingSpy> s{std::move(spy)};
  STATIC_REQUIRE(TrackingResource<Statistics<TrackingSpy>>);
  constexpr int THREADS = 8, ROUNDS = 3000;
  std::atomic<bool> done{false};
  std::atomic<int> inconsistent{0}, snapshots{0}, errors{0};
  std::thread reader([&] {
    while (!done.load()) {
      const auto snap = s.snapshot();
      ++snapshots;
      auto sane = [](const AllocationCounters& c) {
        return c.current_bytes == c.total_bytes - c.freed_bytes && c.total_bytes >= c.freed_bytes &&
               c.current_count == c.allocations - c.frees && c.allocations >= c.frees &&
               c.peak_bytes >= c.current_bytes;
      };
      AllocationCounters sum;
      for (const auto& t : snap.tags) {
        if (!sane(t.counters)) ++inconsistent;
        sum.current_bytes += t.counters.current_bytes;
        sum.allocations += t.counters.allocations;
        sum.frees += t.counters.frees;
      }
      if (!sane(snap.total) || sum.current_bytes != snap.total.current_bytes ||
          sum.allocations != snap.total.allocations || sum.frees != snap.total.frees) {
        ++inconsistent;
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < THREADS; ++t) {
    threads.emplace_back([&, t] {
      // The reader is running before the work starts (on a loaded machine it may
      // otherwise be scheduled only after the work is done).
      while (snapshots.load() == 0) std::this_thread::yield();
      std::vector<DeviceBlock> mine;
      for (int i = 0; i < ROUNDS; ++i) {
        auto b = s.allocate(static_cast<std::size_t>(t + 1), StreamId{0}, AllocTag{static_cast<std::uint32_t>(t % 4)});
        if (!b) {
          ++errors;  // Catch2's assertions are not thread-safe: count, check after join
          continue;
        }
        mine.push_back(std::move(*b));
        if (mine.size() == 3) {
          if (!s.deallocate(std::move(mine.front()))) ++errors;
          mine.erase(mine.begin());
        }
      }
      for (auto& b : mine) {
        if (!s.deallocate(std::move(b))) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  CHECK(errors == 0);
  CHECK(inconsistent == 0);
  CHECK(snapshots > 0);

  const auto snap = s.snapshot();
  CHECK(snap.total.allocations == THREADS * ROUNDS);
  CHECK(snap.total.frees == THREADS * ROUNDS);
  CHECK(snap.total.current_bytes == 0);
  std::size_t total = 0;
  for (int t = 0; t < THREADS; ++t) total += static_cast<std::size_t>(t + 1) * ROUNDS;
  CHECK(snap.total.total_bytes == total);
  for (std::uint32_t tag = 0; tag < 4; ++tag) {
    const auto c = snap.of(AllocTag{tag});
    // threads tag and tag+4 share the tag; each holds at most 3 blocks of its size
    CHECK(c.allocations == 2 * ROUNDS);
    CHECK(c.total_bytes == (tag + 1 + tag + 5) * std::size_t{ROUNDS});
    CHECK(c.peak_bytes <= 3 * (tag + 1 + tag + 5));
    CHECK(c.peak_bytes >= 3 * (tag + 5));
  }
  CHECK(snap.total.peak_bytes >= 3 * 8);
  CHECK(snap.total.peak_bytes <= 3 * total / ROUNDS);
}

namespace {

/// Blocks that worker threads leave live for the main thread to free, and the
/// operations that failed.
struct Leftovers {
  std::mutex mu;
  std::vector<DeviceBlock> left;
  std::atomic<int> errors{0};
};

/// Allocates `ops` blocks of `bytes` with `tag` and frees each at once, except every
/// `keep_every`-th, which it leaves live in `out.left`.
template <class S>
void churn(S& s, Leftovers& out, unsigned ops, std::size_t bytes, AllocTag tag, unsigned keep_every) {
  for (unsigned i = 0; i < ops; ++i) {
    auto b = s.allocate(bytes, StreamId{0}, tag);
    if (!b) {
      ++out.errors;
      continue;
    }
    if (i % keep_every == 0) {
      std::lock_guard lock(out.mu);
      out.left.push_back(std::move(*b));
    } else if (!s.deallocate(std::move(*b))) {
      ++out.errors;
    }
  }
}

bool sane(const AllocationCounters& c) {
  return c.current_bytes == c.total_bytes - c.freed_bytes && c.total_bytes >= c.freed_bytes &&
         c.current_count == c.allocations - c.frees && c.allocations >= c.frees && c.peak_bytes >= c.current_bytes;
}
}  // namespace

TEST_CASE("statistics: threads that free what others allocate keep counts exact and the peak bounded",
          "[statistics][threads]") {
  // Producers allocate, a consumer frees: the producers' stripes only rise, the
  // consumer's only falls. A peak built from per-stripe highs that never come down would
  // grow with every allocation; the marks must follow the stripes down.
  PlainSpy spy;
  Statistics<PlainSpy> s{std::move(spy), StatisticsOptions{.tag_slots = 4, .stripes = 8}};
  constexpr int PRODUCERS = 3, EACH = 4000;
  // Live at most: QUEUE in the queue, QUEUE taken by the consumer, one per producer.
  constexpr std::size_t SIZE = 256, QUEUE = 16;
  std::mutex mu;
  std::vector<DeviceBlock> queue;
  std::atomic<int> errors{0}, inconsistent{0}, producers_left{PRODUCERS};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const auto snap = s.snapshot();
      if (!sane(snap.total)) ++inconsistent;
      for (const auto& t : snap.tags) {
        if (!sane(t.counters)) ++inconsistent;
      }
      std::this_thread::yield();
    }
  });
  std::thread consumer([&] {
    for (;;) {
      std::vector<DeviceBlock> take;
      {
        std::lock_guard lock(mu);
        take.swap(queue);
      }
      for (auto& b : take) {
        if (!s.deallocate(std::move(b))) ++errors;
      }
      if (take.empty()) {
        if (producers_left.load() == 0) {
          std::lock_guard lock(mu);
          if (queue.empty()) return;
        }
        std::this_thread::yield();
      }
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < PRODUCERS; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < EACH; ++i) {
        auto b = s.allocate(SIZE, StreamId{0}, AllocTag{static_cast<std::uint32_t>(p % 2)});
        if (!b) {
          ++errors;
          continue;
        }
        for (;;) {
          {
            std::lock_guard lock(mu);
            if (queue.size() < QUEUE) {
              queue.push_back(std::move(*b));
              break;
            }
          }
          std::this_thread::yield();
        }
      }
      --producers_left;
    });
  }
  for (auto& th : producers) th.join();
  consumer.join();
  done = true;
  reader.join();
  CHECK(errors == 0);
  CHECK(inconsistent == 0);
  const auto snap = s.snapshot();
  CHECK(snap.total.allocations == PRODUCERS * EACH);
  CHECK(snap.total.frees == PRODUCERS * EACH);
  CHECK(snap.total.current_bytes == 0);
  CHECK(snap.total.total_bytes == PRODUCERS * EACH * SIZE);
  // At most 2 * QUEUE + PRODUCERS blocks were live at once; the consumer's mark lags its
  // stripe by at most two epochs of frees (see Statistics), so the peak stays within
  // this, far below the PRODUCERS * EACH * SIZE a non-decaying peak would reach.
  const std::size_t bound = (2 * QUEUE + PRODUCERS + 2 * Statistics<PlainSpy>::EPOCH) * SIZE;
  INFO("peak " << snap.total.peak_bytes << ", bound " << bound);
  CHECK(snap.total.peak_bytes >= SIZE);
  CHECK(snap.total.peak_bytes <= bound);
  CHECK(snap.of(AllocTag{0}).peak_bytes <= bound);
}

TEST_CASE("statistics: more threads than stripes, exiting with blocks live, sum exactly",
          "[statistics][threads]") {
  PlainSpy spy;
  Statistics<PlainSpy> s{std::move(spy), StatisticsOptions{.tag_slots = 4, .stripes = 2}};
  constexpr unsigned THREADS = 9;  // several threads share each stripe
  Leftovers kept;
  std::vector<DeviceBlock>& left = kept.left;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < THREADS; ++t) {
    // Tags 4.. fold into `other`; every fifth block stays live.
    threads.emplace_back([&, t] { churn(s, kept, 500, t + 1, AllocTag{t}, 5); });
  }
  for (auto& th : threads) th.join();
  REQUIRE(kept.errors == 0);
  auto snap = s.snapshot();
  std::size_t live = 0, total = 0;
  for (unsigned t = 0; t < THREADS; ++t) {
    live += 100 * (t + 1);
    total += 500 * (t + 1);
  }
  CHECK(snap.total.allocations == THREADS * 500);
  CHECK(snap.total.current_count == THREADS * 100);
  CHECK(snap.total.current_bytes == live);
  CHECK(snap.total.total_bytes == total);
  CHECK(snap.of(AllocTag{2}).current_bytes == 300);
  REQUIRE(snap.other.has_value());
  CHECK(snap.other->allocations == (THREADS - 4) * 500);
  CHECK(snap.total.peak_bytes >= live);
  for (auto& b : left) REQUIRE(s.deallocate(std::move(b)).has_value());  // from the main thread's stripe
  snap = s.snapshot();
  CHECK(snap.total.current_bytes == 0);
  CHECK(snap.total.frees == THREADS * 500);
  CHECK(snap.total.freed_bytes == total);
  CHECK(sane(snap.total));
}

TEST_CASE("thread tickets: live threads hold distinct ones, and an exited thread's is reused",
          "[statistics][threads]") {
  constexpr unsigned THREADS = 12;
  std::vector<std::uint32_t> seen(THREADS);
  std::atomic<unsigned> taken{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < THREADS; ++t) {
    threads.emplace_back([&, t] {
      seen[t] = detail::thread_ticket();
      taken.fetch_add(1);
      while (taken.load() < THREADS) std::this_thread::yield();  // all hold theirs at once
    });
  }
  for (auto& th : threads) th.join();
  std::sort(seen.begin(), seen.end());
  CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  // Those twelve were given back: a new thread takes the smallest of the free ones.
  std::uint32_t next = 0;
  std::thread([&] { next = detail::thread_ticket(); }).join();
  CHECK(next <= seen.front());
}

TEST_CASE("statistics: waves of threads reuse the stripes of exited ones and sum exactly",
          "[statistics][threads]") {
  PlainSpy spy;
  Statistics<PlainSpy> s{std::move(spy), StatisticsOptions{.tag_slots = 4, .stripes = 8}};
  constexpr unsigned WAVES = 4, THREADS = 6, OPS = 400;
  Leftovers kept;  // every tenth block stays live, freed later by the main thread
  std::vector<DeviceBlock>& left = kept.left;
  for (unsigned w = 0; w < WAVES; ++w) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < THREADS; ++t) {
      threads.emplace_back([&, t] { churn(s, kept, OPS, 64, AllocTag{t % 4}, 10); });
    }
    for (auto& th : threads) th.join();
  }
  REQUIRE(kept.errors == 0);
  auto snap = s.snapshot();
  CHECK(snap.total.allocations == WAVES * THREADS * OPS);
  CHECK(snap.total.current_count == left.size());
  CHECK(snap.total.current_bytes == 64 * left.size());
  CHECK(snap.total.total_bytes == 64u * WAVES * THREADS * OPS);
  for (auto& b : left) REQUIRE(s.deallocate(std::move(b)).has_value());
  snap = s.snapshot();
  CHECK(snap.total.current_bytes == 0);
  CHECK(snap.total.frees == WAVES * THREADS * OPS);
}

TEST_CASE("weak spot: tag_slots or stripes out of range are refused by create and clamped by the constructor",
          "[statistics]") {
  for (auto bad : {StatisticsOptions{.tag_slots = 0xffffffffu}, StatisticsOptions{.tag_slots = 4097},
                   StatisticsOptions{.stripes = 257}}) {
    auto s = Statistics<PlainSpy>::create(PlainSpy{}, bad);
    REQUIRE_FALSE(s);
    CHECK(s.error().code() == errc::invalid_argument);
    CHECK_THAT(s.error().message(), Catch::Contains("StatisticsOptions"));
  }
  auto fine = Statistics<PlainSpy>::create(PlainSpy{}, StatisticsOptions{.tag_slots = 4096, .stripes = 4});
  REQUIRE(fine.has_value());
  // The constructor does not throw std::bad_alloc for 2^32 - 1 slots: it counts 4096 one by one.
  Statistics<PlainSpy> s{PlainSpy{}, StatisticsOptions{.tag_slots = 0xffffffffu, .stripes = 1}};
  auto b = s.allocate(64, StreamId{0}, AllocTag{4095});
  REQUIRE(b.has_value());
  auto big = s.allocate(64, StreamId{0}, AllocTag{5000});
  REQUIRE(big.has_value());
  const auto snap = s.snapshot();
  CHECK(snap.of(AllocTag{4095}).current_bytes == 64);
  REQUIRE(snap.other.has_value());
  CHECK(snap.other->current_bytes == 64);
  REQUIRE(s.deallocate(std::move(*b)).has_value());
  REQUIRE(s.deallocate(std::move(*big)).has_value());
}

TEST_CASE("statistics: a thread that frees what another allocated, in large blocks, keeps the peak within the slack",
          "[statistics][threads]") {
  // torch's training step: the forward thread allocates the activations, the autograd
  // thread frees them. The freeing stripe's live bytes fall free by free; its mark must
  // follow within PEAK_SLACK, not two epochs of frees behind (64 MiB and more here).
  using S = Statistics<PlainSpy>;
  PlainSpy spy;
  S s{std::move(spy), StatisticsOptions{.tag_slots = 4}};
  constexpr std::size_t BLOCK = std::size_t{1} << 20;
  constexpr int BLOCKS = 100, STEPS = 5;
  // Both threads live throughout (each holds a stripe of its own), taking turns.
  std::vector<DeviceBlock> activations;
  std::atomic<int> turn{0};  // even: forward's, odd: backward's
  std::thread forward([&] {
    for (int step = 0; step < STEPS; ++step) {
      while (turn.load() != 2 * step) std::this_thread::yield();
      for (int i = 0; i < BLOCKS; ++i) {
        auto b = s.allocate(BLOCK, StreamId{0}, AllocTag{1});
        if (b) activations.push_back(std::move(*b));
      }
      turn.store(2 * step + 1);
    }
  });
  std::thread backward([&] {
    for (int step = 0; step < STEPS; ++step) {
      while (turn.load() != 2 * step + 1) std::this_thread::yield();
      for (auto& b : activations) (void)s.deallocate(std::move(b));
      activations.clear();
      turn.store(2 * step + 2);
    }
  });
  forward.join();
  backward.join();
  const auto snap = s.snapshot();
  CHECK(snap.total.allocations == BLOCKS * STEPS);
  CHECK(snap.total.current_bytes == 0);
  const std::size_t peak = BLOCKS * BLOCK;  // the true one: every step's activations
  const std::size_t bound = peak + 2 * static_cast<std::size_t>(S::PEAK_SLACK);  // two stripes counted
  INFO("peak " << snap.total.peak_bytes << ", bound " << bound);
  CHECK(snap.total.peak_bytes >= peak);
  CHECK(snap.total.peak_bytes <= bound);
  CHECK(snap.of(AllocTag{1}).peak_bytes <= bound);
}
