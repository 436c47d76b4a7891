// SPDX-License-Identifier: Apache-2.0
//
// Relacy models of the reactor's park/unpark hand-off: the shipped Parker
// (reactor/detail/reactor_parker.hpp) over the shipped SlotTable, under Relacy's atomics,
// mutex and condition variable. A registrant publishes a completed slot and, when its
// publish reports the idle-to-active transition, wakes the scanner; the scanner, having
// found the table idle, decides to sleep at the same moment. A lost wake-up leaves the
// scanner asleep on its condition variable with nobody left to wake it, which Relacy
// reports as a deadlock.
//
// The protocol must pass. Each mutant weakens one step or order of the hand-off (through
// the Parker's Protocol seam) and must FAIL with that deadlock; a mutant the checker lets
// through fails its test, because the model could then not have caught the bug.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "xlogrt/reactor/detail/reactor_parker.hpp"
#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/slot_table.hpp"

#include "relacy_atomics.hpp"  // last: it brings <relacy/relacy.hpp> and its macros
#include "relacy_harness.hpp"

namespace {

using namespace xlogrt_model;
using xlogrt::detail::ParkProtocol;

/// The Parker's blocking primitives, as Relacy's instrumented mutex and condition
/// variable. A timed wait may time out at any point Relacy chooses.
struct RelacyParkSync {
  using mutex = rl::mutex;
  using condvar = rl::condition_variable;
  static void lock(mutex& m) { m.lock($); }
  static void unlock(mutex& m) { m.unlock($); }
  static void wait(condvar& cv, mutex& m) { cv.wait(m, $); }
  static bool wait_for(condvar& cv, mutex& m, std::chrono::nanoseconds d) {
    return cv.wait_for(m, d, $);
  }
  static void notify_one(condvar& cv) { cv.notify_one($); }
};

template <class Proto>
using ModelParker = xlogrt::detail::Parker<RelacyAtomics, RelacyParkSync, Proto>;
using Flags = xlogrt::BasicHostFlags<RelacyAtomics::flag_word>;
using Table = xlogrt::SlotTable<int, Flags, RelacyAtomics>;

void expect(bool ok, const char* what) {
  if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RL_INFO);
}

/// What every scenario shares: a table, the parker, and the scanner's loop as the
/// reactor runs it (scan; when nothing was delivered and the table is idle, park until
/// the table is busy or `stop` is set; otherwise poll again).
template <class Proto>
struct Rig {
  explicit Rig(std::size_t slots) : table(slots, Flags(slots)) {}

  std::size_t claim_and_reset() {
    const auto s = table.claim();
    expect(s.has_value(), "a table with free slots must hand one out");
    table.reset_flag(s.value_or(0));
    return s.value_or(0);
  }

  /// A registrant whose stream has already reached the point: the flag is set, then the
  /// payload published, and the scanner woken on the idle-to-active transition.
  void arm_completed(std::size_t slot, int payload) {
    RelacyAtomics::store_flag(table.flags().word(slot), 1, std::memory_order::release);
    if (table.publish(slot, payload)) parker.wake();
  }

  void scan_until(std::size_t n) {
    while (delivered.size() < n && stop.load(std::memory_order::acquire) == 0) {
      table.scan_once(delivered);
      if (delivered.size() >= n) break;
      if (table.is_idle()) {
        (void)parker.park([this] {
          return stop.load(std::memory_order::acquire) != 0 || !table.is_idle();
        });
      } else {
        RelacyAtomics::yield();
      }
    }
  }

  /// After every thread: nothing left to deliver, and one more pass leaves the table
  /// idle. (A publisher's summary bit may land after its slot was retired; the next pass
  /// drops it. That costs the scanner a pass, never a wake-up.)
  void expect_drained() {
    std::vector<int> more;
    table.scan_once(more);
    expect(more.empty(), "a payload was delivered twice");
    expect(table.is_idle(), "a drained table must be idle after one more pass");
  }

  Table table;
  ModelParker<Proto> parker;
  RelacyAtomics::atomic<std::uint32_t> stop{0};
  std::vector<int> delivered;  // the scanner's, until after()
};

/// One registrant arms twice: each publish may find the scanner awake, deciding to
/// sleep, or asleep, and the second may come after the scanner went back to sleep.
template <class Proto>
struct TwoRounds : rl::test_suite<TwoRounds<Proto>, 2> {
  std::optional<Rig<Proto>> r;
  std::size_t a = 0, b = 0;
  void before() {
    r.emplace(2);
    a = r->claim_and_reset();
    b = r->claim_and_reset();
  }
  void thread(unsigned i) {
    if (i == 0) {
      r->arm_completed(a, 1);
      r->arm_completed(b, 2);
    } else {
      r->scan_until(2);
    }
  }
  void after() {
    expect(r->delivered == std::vector<int>{1, 2}, "both payloads must be delivered, in order");
    r->expect_drained();
    r.reset();
  }
};

/// Two registrants race: only one of them sees the idle-to-active transition and wakes
/// the scanner; the other relies on that.
template <class Proto>
struct TwoRegistrants : rl::test_suite<TwoRegistrants<Proto>, 3> {
  std::optional<Rig<Proto>> r;
  std::size_t slot[2] = {0, 0};
  void before() {
    r.emplace(2);
    slot[0] = r->claim_and_reset();
    slot[1] = r->claim_and_reset();
  }
  void thread(unsigned i) {
    if (i < 2) {
      r->arm_completed(slot[i], static_cast<int>(i) + 1);
    } else {
      r->scan_until(2);
    }
  }
  void after() {
    std::vector<int> got = r->delivered;
    std::sort(got.begin(), got.end());
    expect(got == std::vector<int>{1, 2}, "both payloads must be delivered, once each");
    r->expect_drained();
    r.reset();
  }
};

/// The reactor's destructor: the stop flag, then a wake, against a scanner that parks
/// with nothing armed.
template <class Proto>
struct StopWhileParking : rl::test_suite<StopWhileParking<Proto>, 2> {
  std::optional<Rig<Proto>> r;
  void before() { r.emplace(1); }
  void thread(unsigned i) {
    if (i == 0) {
      r->stop.store(1, std::memory_order::release);
      (void)r->parker.wake();
    } else {
      r->scan_until(1);
    }
  }
  void after() {
    expect(r->delivered.empty(), "nothing was published");
    r.reset();
  }
};

template <class Suite>
void require_lost_wakeup(const Search& search) {
  require_caught<Suite>(rl::test_result_deadlock, search);
}

// ---- the mutants ------------------------------------------------------------------------

/// The registrant tests the scanner's state with a load (then a store) instead of one
/// exchange: it can read "awake" from before an announcement the scanner has made.
struct WakeByLoad : ParkProtocol {
  static constexpr bool wake_by_rmw = false;
};
/// The scanner announces with a plain store: the registrant's exchange may come first in
/// the word's order without the scanner's announcement acquiring it, so the scanner's
/// idle check can miss the publish.
struct AnnounceByStore : ParkProtocol {
  static constexpr bool announce_by_rmw = false;
};
/// The scanner checks the table before announcing: a publish between the two finds it
/// still awake, and does not wake it.
struct CheckBeforeAnnounce : ParkProtocol {
  static constexpr bool check_after_announce = false;
};

}  // namespace

TEST_CASE("model: a registrant arms twice against a scanner that parks", "[model][park]") {
  require_pass<TwoRounds<ParkProtocol>>(random(1000000));
}

TEST_CASE("model: two registrants race one idle-to-active transition", "[model][park]") {
  require_pass<TwoRegistrants<ParkProtocol>>(random(1000000));
}

TEST_CASE("model: the destructor's stop wakes a parking scanner", "[model][park]") {
  require_pass<StopWhileParking<ParkProtocol>>(full());
}

TEST_CASE("mutant: registrant tests the state with a load: lost wake-up caught",
          "[model][park][mutant]") {
  require_lost_wakeup<TwoRounds<WakeByLoad>>(random(1000000));
}

TEST_CASE("mutant: scanner announces with a store: lost wake-up caught",
          "[model][park][mutant]") {
  require_lost_wakeup<TwoRounds<AnnounceByStore>>(random(1000000));
}

TEST_CASE("mutant: scanner checks idleness before announcing: lost wake-up caught",
          "[model][park][mutant]") {
  require_lost_wakeup<TwoRounds<CheckBeforeAnnounce>>(random(1000000));
}
