// SPDX-License-Identifier: Apache-2.0
//
// SlotTable on the host: the protocol's sequential contract, the shared scenarios of
// slot_scenarios.hpp on real threads, and a many-producer stress with a modelled device.
// Suite 'host': CI also runs it under ASan+UBSan and TSan.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "slot_scenarios.hpp"
#include "xlogrt/core/atomics.hpp"
#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/slot_table.hpp"

using namespace xlogrt;
using namespace std::chrono_literals;

namespace {

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool SANITIZED = true;
#else
constexpr bool SANITIZED = false;
#endif

/// The device's step in the sequential tests: the stream reached the slot's point.
template <class Table>
void complete(Table& t, std::size_t slot) {
  Table::atomics_type::store_flag(t.flags().word(slot), 1, std::memory_order_release);
}

/// Claims until the table says none; returns the slots, sorted.
template <class Table>
std::vector<std::size_t> claim_all(Table& t) {
  std::vector<std::size_t> got;
  while (auto s = t.claim()) {
    got.push_back(*s);
    if (got.size() > t.capacity()) break;  // a table handing out more than it has
  }
  std::sort(got.begin(), got.end());
  return got;
}

std::vector<std::size_t> iota(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

/// The scenarios' Env on the host: failures are collected for the test's thread to
/// report; a parked scanner gives up after 10 s (a lost wake-up, never a hang).
struct HostEnv {
  static void expect(bool ok, const char* what) {
    if (ok) return;
    std::lock_guard lock(mutex());
    failures().emplace_back(what);
  }
  static std::vector<std::string> take_failures() {
    std::lock_guard lock(mutex());
    return std::exchange(failures(), {});
  }
  struct Deadline {
    std::chrono::steady_clock::time_point end = std::chrono::steady_clock::now() + 10s;
    bool passed() const { return std::chrono::steady_clock::now() > end; }
  };

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& failures() {
    static std::vector<std::string> f;
    return f;
  }
};

/// Runs a scenario `reps` times on std::threads, released together from a start gate
/// (the scanner, the last participant, is started first so that it races the others).
template <template <class, class, class> class Scenario>
void run_on_threads(int reps) {
  using S = Scenario<StdAtomics, detail::SlotProtocol, HostEnv>;
  HostEnv::take_failures();
  for (int r = 0; r < reps; ++r) {
    S s;
    std::atomic<unsigned> ready{0};
    std::vector<std::thread> threads;
    for (unsigned i = S::threads; i-- > 0;) {
      threads.emplace_back([&s, &ready, i] {
        ready.fetch_add(1);
        while (ready.load() < S::threads) std::this_thread::yield();
        s.thread(i);
      });
    }
    for (auto& t : threads) t.join();
    s.check();
    const auto failures = HostEnv::take_failures();
    INFO("repetition " << r);
    for (const auto& f : failures) FAIL_CHECK(f);
    if (!failures.empty()) return;
  }
}

/// A payload that counts its live instances, to see that armed payloads are destroyed.
struct Counted {
  explicit Counted(std::atomic<int>& live) : live_(&live) { live_->fetch_add(1); }
  Counted(Counted&& o) noexcept : live_(std::exchange(o.live_, nullptr)) {}
  Counted& operator=(Counted&&) = delete;
  ~Counted() {
    if (live_ != nullptr) live_->fetch_sub(1);
  }
  std::atomic<int>* live_;
};

}  // namespace

// ---- the sequential contract ------------------------------------------------------------

TEST_CASE("claim signals exhaustion, and a retired slot restores capacity", "[reactor][slot]") {
  SlotTable<std::size_t> table(4, HostFlags(4));
  REQUIRE(table.capacity() == 4);
  const auto claimed = claim_all(table);
  REQUIRE(claimed == iota(4));
  CHECK_FALSE(table.claim().has_value());

  const std::size_t slot = claimed[2];
  table.reset_flag(slot);
  CHECK(table.publish(slot, 99));
  complete(table, slot);
  std::vector<std::size_t> woken;
  CHECK_FALSE(table.scan_once(woken));  // nothing left armed after the retire
  CHECK(woken == std::vector<std::size_t>{99});

  const auto again = table.claim();
  REQUIRE(again.has_value());
  CHECK(*again == slot);
  CHECK_FALSE(table.claim().has_value());
}

TEST_CASE("fresh reports each armed slot once while pending, and again once re-armed",
          "[reactor][slot]") {
  SlotTable<std::size_t> table(2, HostFlags(2));
  std::vector<std::size_t> fresh;
  auto note = [&fresh](std::size_t s) noexcept { fresh.push_back(s); };
  std::vector<std::size_t> woken;
  const auto a = table.claim();
  const auto b = table.claim();
  REQUIRE((a && b));
  table.reset_flag(*a);
  table.reset_flag(*b);
  CHECK(table.publish(*a, 1));
  CHECK(table.scan_once(woken, note));  // a pending: fresh
  CHECK_FALSE(table.publish(*b, 2));
  CHECK(table.scan_once(woken, note));  // b pending: fresh; a not again
  CHECK(fresh == std::vector<std::size_t>{*a, *b});

  complete(table, *a);
  CHECK(table.scan_once(woken, note));  // a retired, b still pending and not fresh
  CHECK(woken == std::vector<std::size_t>{1});
  CHECK(fresh.size() == 2);

  const auto again = table.claim();  // the recycled slot, armed again: fresh again
  REQUIRE(again == a);
  table.reset_flag(*again);
  CHECK_FALSE(table.publish(*again, 3));
  CHECK(table.scan_once(woken, note));
  CHECK(fresh == std::vector<std::size_t>{*a, *b, *a});

  complete(table, *a);
  complete(table, *b);
  CHECK_FALSE(table.scan_once(woken, note));  // done at first sight: never fresh
  CHECK(woken == std::vector<std::size_t>{1, 3, 2});  // a word retires in slot order
  CHECK(fresh.size() == 3);
}

TEST_CASE("release gives back an unpublished slot; misuse is refused and changes nothing",
          "[reactor][slot]") {
  SlotTable<int> table(3, HostFlags(3));
  auto claimed = claim_all(table);
  REQUIRE(claimed.size() == 3);

  REQUIRE(table.release(claimed[1]).has_value());
  const auto back = table.claim();
  REQUIRE(back.has_value());
  CHECK(*back == claimed[1]);
  REQUIRE(table.release(claimed[1]).has_value());

  const auto twice = table.release(claimed[1]);
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.error().code() == errc::invalid_argument);
  CHECK(twice.error().message().find("already free") != std::string::npos);

  const auto out = table.release(3);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().code() == errc::invalid_argument);
  CHECK(out.error().message().find("out of range") != std::string::npos);

  table.reset_flag(claimed[0]);
  CHECK(table.publish(claimed[0], 5));
  const auto published = table.release(claimed[0]);
  REQUIRE_FALSE(published.has_value());
  CHECK(published.error().message().find("is published") != std::string::npos);

  // The refusals changed nothing: exactly the released slot is free, the published one
  // is still delivered once its flag is set.
  CHECK(claim_all(table) == std::vector<std::size_t>{claimed[1]});
  complete(table, claimed[0]);
  std::vector<int> woken;
  table.scan_once(woken);
  CHECK(woken == std::vector<int>{5});
}

TEST_CASE("a scan with nothing armed returns false and delivers nothing", "[reactor][slot]") {
  SlotTable<int> table(130, HostFlags(130));
  std::vector<int> woken{42};
  CHECK_FALSE(table.scan_once(woken));
  CHECK(woken == std::vector<int>{42});
  CHECK(table.is_idle());

  // Claimed but unpublished slots are not armed either, even with their flags set.
  const auto s = table.claim();
  REQUIRE(s.has_value());
  complete(table, *s);
  CHECK_FALSE(table.scan_once(woken));
  CHECK(woken == std::vector<int>{42});
}

TEST_CASE("a pending slot stays armed until its flag is set, then is delivered once",
          "[reactor][slot]") {
  SlotTable<int> table(2, HostFlags(2));
  const auto s = table.claim();
  REQUIRE(s.has_value());
  table.reset_flag(*s);
  CHECK(table.publish(*s, 1));
  CHECK_FALSE(table.is_idle());

  std::vector<int> woken;
  for (int pass = 0; pass < 3; ++pass) {
    CHECK(table.scan_once(woken));  // still armed
    CHECK(woken.empty());
    CHECK_FALSE(table.is_idle());
  }
  complete(table, *s);
  CHECK_FALSE(table.scan_once(woken));
  CHECK(woken == std::vector<int>{1});
  CHECK(table.is_idle());
  CHECK_FALSE(table.scan_once(woken));
  CHECK(woken == std::vector<int>{1});
}

TEST_CASE("publish reports the idle-to-active transition once per idle period",
          "[reactor][slot]") {
  SlotTable<int> table(200, HostFlags(200));
  std::vector<std::size_t> slots;
  for (int i = 0; i < 150; ++i) slots.push_back(*table.claim());  // spans three words
  for (auto s : slots) table.reset_flag(s);

  CHECK(table.is_idle());
  CHECK(table.publish(slots[0], 0));
  for (std::size_t i = 1; i < slots.size(); ++i) {
    CHECK_FALSE(table.publish(slots[i], static_cast<int>(i)));
  }
  CHECK_FALSE(table.is_idle());

  // Completing all but one keeps the table active; the last one makes it idle.
  for (std::size_t i = 0; i + 1 < slots.size(); ++i) complete(table, slots[i]);
  std::vector<int> woken;
  CHECK(table.scan_once(woken));
  CHECK(woken.size() == slots.size() - 1);
  CHECK_FALSE(table.is_idle());
  complete(table, slots.back());
  CHECK_FALSE(table.scan_once(woken));
  CHECK(woken.size() == slots.size());
  CHECK(table.is_idle());

  // A new idle period: the first publish reports it again.
  const auto s = table.claim();
  REQUIRE(s.has_value());
  table.reset_flag(*s);
  CHECK(table.publish(*s, 7));
}

TEST_CASE("every slot of odd-sized tables is handed out once", "[reactor][slot]") {
  for (std::size_t n : {1u, 2u, 63u, 64u, 65u, 127u, 128u, 130u, 4097u}) {
    INFO("capacity " << n);
    SlotTable<int> table(n, HostFlags(n));
    CHECK(table.capacity() == n);
    CHECK(claim_all(table) == iota(n));
  }
  SlotTable<int> empty(0, HostFlags(0));
  CHECK(empty.capacity() == 0);
  CHECK_FALSE(empty.claim().has_value());
  std::vector<int> woken;
  CHECK_FALSE(empty.scan_once(woken));
  CHECK(empty.is_idle());
}

TEST_CASE("capacity is bounded by the flags provided", "[reactor][slot]") {
  SlotTable<int> table(100, HostFlags(10));
  CHECK(table.capacity() == 10);
  CHECK(claim_all(table) == iota(10));
  CHECK(table.flags().size() == 10);
}

TEST_CASE("a large table with multi-word summary groups delivers from every word",
          "[reactor][slot]") {
  // 64 * 64 * 3 + 7 slots: 193 words, 4 words per summary group.
  constexpr std::size_t N = 64 * 64 * 3 + 7;
  SlotTable<std::size_t> table(N, HostFlags(N));
  const auto all = claim_all(table);
  REQUIRE(all == iota(N));

  // Arm one slot in every 5th word plus the very last slot; complete half of them.
  std::vector<std::size_t> armed;
  for (std::size_t w = 0; w * 64 < N; w += 5) armed.push_back(w * 64 + (w % 64));
  armed.push_back(N - 1);
  bool first = true;
  for (auto s : armed) {
    table.reset_flag(s);
    CHECK(table.publish(s, s) == first);
    first = false;
  }
  std::set<std::size_t> expect_first;
  for (std::size_t i = 0; i < armed.size(); i += 2) {
    complete(table, armed[i]);
    expect_first.insert(armed[i]);
  }
  std::vector<std::size_t> woken;
  CHECK(table.scan_once(woken));
  CHECK(std::set<std::size_t>(woken.begin(), woken.end()) == expect_first);
  CHECK(woken.size() == expect_first.size());

  for (std::size_t i = 1; i < armed.size(); i += 2) complete(table, armed[i]);
  CHECK_FALSE(table.scan_once(woken));
  CHECK(std::set<std::size_t>(woken.begin(), woken.end()) ==
        std::set<std::size_t>(armed.begin(), armed.end()));
  CHECK(woken.size() == armed.size());
  CHECK(table.is_idle());
  CHECK(claim_all(table).size() == armed.size());  // exactly the retired slots came back
}

TEST_CASE("payloads still armed when the table is destroyed are destroyed with it",
          "[reactor][slot]") {
  std::atomic<int> live{0};
  {
    SlotTable<Counted> table(70, HostFlags(70));
    for (int i = 0; i < 70; ++i) {
      const auto s = table.claim();
      REQUIRE(s.has_value());
      table.reset_flag(*s);
      table.publish(*s, Counted(live));
      if (i % 3 == 0) complete(table, *s);
    }
    CHECK(live.load() == 70);
    std::vector<Counted> woken;
    table.scan_once(woken);
    CHECK(woken.size() == 24);
    CHECK(live.load() == 70);  // 24 moved out to `woken`, 46 still in the table
  }
  CHECK(live.load() == 0);

  // Move-only payloads that own memory (ASan's leak check covers this one).
  SlotTable<std::unique_ptr<int>> owning(4, HostFlags(4));
  const auto s = owning.claim();
  REQUIRE(s.has_value());
  owning.reset_flag(*s);
  owning.publish(*s, std::make_unique<int>(3));
}

TEST_CASE("the policy spreads thread hints as far apart as it can", "[reactor][slot]") {
  CHECK(detail::spread_thread_hint(0) == 0u);
  CHECK(detail::spread_thread_hint(1) == 0x80000000u);
  CHECK(detail::spread_thread_hint(2) == 0x40000000u);
  CHECK(detail::spread_thread_hint(3) == 0xC0000000u);
  // Eight threads over sixteen words land on eight distinct words.
  std::set<std::uint64_t> homes;
  for (std::uint32_t t = 0; t < 8; ++t) {
    homes.insert((static_cast<std::uint64_t>(detail::spread_thread_hint(t)) * 16) >> 32);
  }
  CHECK(homes.size() == 8);
}

// ---- the shared scenarios on threads ---------------------------------------------------

TEST_CASE("threads: one slot handed off while the scanner races flag and publish",
          "[reactor][slot][threads]") {
  run_on_threads<slot_scenarios::Handoff>(SANITIZED ? 1000 : 5000);
}

TEST_CASE("threads: two publishes race the scanner's summary clear", "[reactor][slot][threads]") {
  run_on_threads<slot_scenarios::TwoPublishers>(SANITIZED ? 1000 : 5000);
}

TEST_CASE("threads: three registrants claim two slots", "[reactor][slot][threads]") {
  run_on_threads<slot_scenarios::ClaimRace>(SANITIZED ? 1000 : 5000);
}

TEST_CASE("threads: a registrant claims the slot the scanner recycles",
          "[reactor][slot][threads]") {
  run_on_threads<slot_scenarios::ClaimRecycle>(SANITIZED ? 1000 : 5000);
}

TEST_CASE("threads: registrants claim every slot of a table concurrently, each once",
          "[reactor][slot][threads]") {
  constexpr std::size_t N = 64 * 9 + 3;  // 10 words, the last one partial
  constexpr unsigned THREADS = 6;
  for (int rep = 0; rep < (SANITIZED ? 20 : 200); ++rep) {
    SlotTable<int> table(N, HostFlags(N));
    std::vector<std::vector<std::size_t>> got(THREADS);
    std::atomic<unsigned> ready{0};
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < THREADS; ++t) {
      threads.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < THREADS) std::this_thread::yield();
        while (auto s = table.claim()) got[t].push_back(*s);
      });
    }
    for (auto& th : threads) th.join();
    std::vector<std::size_t> all;
    for (const auto& g : got) all.insert(all.end(), g.begin(), g.end());
    std::sort(all.begin(), all.end());
    REQUIRE(all == iota(N));
  }
}

// ---- stress: many registrants, one scanner, a modelled device ------------------------

namespace {

/// StdAtomics with a nudge to the OS scheduler: before about one atomic operation in 16
/// (a per-thread pseudo-random choice) the thread yields its core. Protocol windows a
/// few instructions wide, which two cores almost never interleave on their own, then open
/// up often enough for the stress to land in them.
struct JitterAtomics : StdAtomics {
  static void jitter() noexcept {
    thread_local std::uint32_t x =
        0x9E3779B9u ^ static_cast<std::uint32_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    if ((x & 15u) == 0) std::this_thread::yield();
  }

  template <class T>
  class atomic {
   public:
    constexpr explicit atomic(T v = T{}) noexcept : a_(v) {}
    T load(std::memory_order o = std::memory_order_seq_cst) const noexcept {
      jitter();
      return a_.load(o);
    }
    void store(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
      jitter();
      a_.store(v, o);
    }
    T exchange(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
      jitter();
      return a_.exchange(v, o);
    }
    T fetch_or(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
      jitter();
      return a_.fetch_or(v, o);
    }
    T fetch_and(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
      jitter();
      return a_.fetch_and(v, o);
    }

   private:
    std::atomic<T> a_;
  };

  static std::uint32_t load_flag(flag_word& w, std::memory_order o) noexcept {
    jitter();
    return StdAtomics::load_flag(w, o);
  }
  static void store_flag(flag_word& w, std::uint32_t v, std::memory_order o) noexcept {
    jitter();
    StdAtomics::store_flag(w, v, o);
  }
};

/// The modelled device: registrants hand it the slots they armed; it completes them in
/// batches, in a shuffled order, as streams finishing out of order would.
class Device {
 public:
  void submit(std::size_t slot) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(slot);
    }
    cv_.notify_one();
  }
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    cv_.notify_one();
  }
  template <class Table>
  void run(Table& table) {
    std::mt19937 rng(12345);
    std::vector<std::size_t> batch;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        batch.assign(queue_.begin(), queue_.end());
        queue_.clear();
      }
      std::shuffle(batch.begin(), batch.end(), rng);
      for (auto s : batch) complete(table, s);
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  bool closed_ = false;
};

struct StressConfig {
  std::size_t slots;
  unsigned registrants;
  std::size_t per_registrant;
  bool parking_scanner;
};

/// Every payload delivered exactly once, no wake-up lost, every slot back in the pool.
template <class A>
void stress(const StressConfig& c) {
  using Flags = BasicHostFlags<typename A::flag_word>;
  SlotTable<std::size_t, Flags, A> table(c.slots, Flags(c.slots));
  const std::size_t total = c.registrants * c.per_registrant;
  slot_scenarios::WakeToken<A, HostEnv> wake;
  Device device;
  std::atomic<std::size_t> idle_transitions{0};

  std::vector<std::uint8_t> seen(total, 0);
  std::size_t out_of_range = 0, duplicates = 0, delivered = 0;
  std::atomic<bool> stalled{false};  // the scanner gave up: registrants stop too
  std::thread scanner([&] {
    std::vector<std::size_t> woken;
    auto last_progress = std::chrono::steady_clock::now();
    while (delivered < total) {
      woken.clear();
      table.scan_once(woken);
      for (auto token : woken) {
        if (token >= total) {
          ++out_of_range;
        } else if (seen[token]++ != 0) {
          ++duplicates;
        }
      }
      delivered += woken.size();
      if (!woken.empty()) {
        last_progress = std::chrono::steady_clock::now();
        continue;
      }
      if (c.parking_scanner && table.is_idle()) {
        if (!wake.park()) {
          stalled = true;  // parked on an idle table and nobody woke it for 10 s
          return;
        }
      } else if (std::chrono::steady_clock::now() - last_progress > 10s) {
        stalled = true;  // armed slots that are never delivered
        return;
      } else {
        std::this_thread::yield();
      }
    }
  });
  std::thread gpu([&] { device.run(table); });

  std::vector<std::thread> registrants;
  for (unsigned t = 0; t < c.registrants; ++t) {
    registrants.emplace_back([&, t] {
      for (std::size_t i = 0; i < c.per_registrant; ++i) {
        std::optional<std::size_t> slot;
        while (!(slot = table.claim())) {
          if (stalled.load()) return;
          std::this_thread::yield();
        }
        table.reset_flag(*slot);
        if (table.publish(*slot, t * c.per_registrant + i)) {
          idle_transitions.fetch_add(1, std::memory_order_relaxed);
          wake.unpark();
        }
        device.submit(*slot);
      }
    });
  }
  for (auto& r : registrants) r.join();
  device.close();
  gpu.join();
  scanner.join();

  REQUIRE_FALSE(stalled.load());
  CHECK(out_of_range == 0);
  CHECK(duplicates == 0);
  CHECK(delivered == total);
  CHECK(std::count(seen.begin(), seen.end(), std::uint8_t{1}) == static_cast<long>(total));
  CHECK(idle_transitions.load() >= 1);
  std::vector<std::size_t> more;
  CHECK_FALSE(table.scan_once(more));
  CHECK(more.empty());
  CHECK(table.is_idle());
  CHECK(claim_all(table) == iota(table.capacity()));  // no slot leaked
}

}  // namespace

TEMPLATE_TEST_CASE("stress: many registrants, one scanner, a modelled device",
                   "[reactor][slot][stress]", StdAtomics, JitterAtomics) {
  const std::size_t per = SANITIZED ? 20000 : 100000;
  SECTION("256 slots, spinning scanner") { stress<TestType>({256, 8, per, false}); }
  SECTION("256 slots, parking scanner") { stress<TestType>({256, 8, per, true}); }
  SECTION("16 slots: registrants wait on exhaustion") { stress<TestType>({16, 4, per, true}); }
  SECTION("5000 slots: two words per summary group") { stress<TestType>({5000, 8, per, true}); }
}
