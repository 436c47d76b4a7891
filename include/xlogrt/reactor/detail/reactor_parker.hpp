// SPDX-License-Identifier: Apache-2.0
#pragma once

// Parker: where the reactor's scanner sleeps when nothing is armed, and how a registrant
// that armed the first wait of an idle period wakes it.
//
// ---- How it works ----------------------------------------------------------------------
//
// State. One word, state_: RUNNING (0) or SLEEPY (1). SLEEPY means "the scanner has
// decided to sleep, or is asleep"; only the scanner sets it, and whoever clears it owes
// the scanner a notify. A mutex and a condition variable do the blocking; the mutex
// protects nothing but the scanner's re-check of state_ before it waits, which is what
// makes a notify impossible to miss.
//
// The race. A registrant publishes (its table fetch_or, release) and learns that the
// table was idle: it must wake the scanner. At the same moment the scanner, having found
// the table idle, decides to sleep. The classic lost wake-up is the scanner reading
// "idle" from before the publish while the registrant reads "awake" from before the
// scanner's announcement: each side's write sits unseen in the other's store buffer.
//
// Orders. Both sides touch state_ with read-modify-writes, acq_rel:
//   scanner     state_.exchange(SLEEPY)   then reads the idle predicate (acquire loads)
//   registrant  (publish)                 then state_.exchange(RUNNING)
// RMWs of one word are totally ordered and each reads the one before it. If the
// registrant's exchange comes second it reads SLEEPY and notifies (under the mutex, see
// below). If it comes first, the scanner's exchange reads the value it wrote (or a later
// one in its release sequence), so the registrant's publish happens-before the scanner's
// re-check, which therefore sees the table busy and does not sleep. For that chain to
// hold, every write of state_ is an exchange, the scanner's retractions included: a plain
// store slipped in between would be what the next announcement reads, and it carries
// nothing from the registrant that came before it.
//
// The notify. A registrant that read SLEEPY takes and drops the mutex, then notifies.
// The scanner tests `state_ == SLEEPY` under the mutex before each wait: either it tests
// after the registrant released the mutex (and sees RUNNING), or it is already inside
// wait() when the notify comes.
//
// Why not the simpler ways.
// - Always notifying (no state word) costs every registration a mutex and a futex check;
//   the reactor wakes only on the idle-to-active transition, and even then takes the
//   mutex only when the scanner really is going to sleep.
// - A plain load on the registrant's side, or a store and a load on the scanner's, is the
//   store-buffer pattern above: it needs seq_cst fences, which the atomics policy does not
//   offer and the model checker would have to trust. Two RMWs on one word need nothing
//   beyond acquire and release. test/model/test_park_model.cpp shows both weakenings lose
//   a wake-up.
// - std::atomic::wait has no timeout, and the scanner sleeps with one while host-function
//   waits are in flight (it must still probe their streams for faults).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace xlogrt::detail {

/// The blocking primitives of the production parker: std::mutex and
/// std::condition_variable. (The model test supplies Relacy's.)
///
/// Thread-safe: stateless; each call is the standard primitive's.
struct StdParkSync {
  using mutex = std::mutex;
  using condvar = std::condition_variable;

  static void lock(mutex& m) noexcept { m.lock(); }
  static void unlock(mutex& m) noexcept { m.unlock(); }
  /// @pre `m` is held by the caller; it is held again on return.
  static void wait(condvar& cv, mutex& m) noexcept {
    std::unique_lock<mutex> lk(m, std::adopt_lock);
    cv.wait(lk);
    lk.release();
  }
  /// Returns false when the time ran out. @pre `m` is held; it is held again on return.
  static bool wait_for(condvar& cv, mutex& m, std::chrono::nanoseconds d) noexcept {
    std::unique_lock<mutex> lk(m, std::adopt_lock);
    const bool woken = cv.wait_for(lk, d) == std::cv_status::no_timeout;
    lk.release();
    return woken;
  }
  static void notify_one(condvar& cv) noexcept { cv.notify_one(); }
};

/// The steps and orders of the park/unpark hand-off. A test seam, like SlotProtocol: the
/// model test derives mutants that weaken one member and requires the model checker to
/// report the lost wake-up. Production code never names it.
///
/// Thread-safe: constants only.
struct ParkProtocol {
  /// Scanner: announce SLEEPY with an exchange (false: a release store).
  static constexpr bool announce_by_rmw = true;
  /// Registrant: test-and-clear SLEEPY with an exchange (false: an acquire load, then a
  /// store).
  static constexpr bool wake_by_rmw = true;
  /// Scanner: re-check the idle predicate after announcing (false: check it first, then
  /// announce).
  static constexpr bool check_after_announce = true;
};

/// How a park() ended.
enum class ParkResult : std::uint8_t {
  busy,       ///< the predicate was already true: the scanner did not sleep
  woken,      ///< it slept and a wake() (or a spurious wake-up) ended the sleep
  timed_out,  ///< it slept for the whole timeout
};

/// The scanner's sleep and the registrants' wake-up. park() is called by one thread (the
/// scanner); wake() by any thread. Not movable.
///
/// Thread-safe. (wake() is lock-free unless the scanner is going to sleep; park() blocks.)
template <class Atomics, class Sync = StdParkSync, class Protocol = ParkProtocol>
class Parker {
 public:
  Parker() = default;
  Parker(const Parker&) = delete;
  Parker& operator=(const Parker&) = delete;

  /// Scanner: sleeps unless `busy()` is true, until a wake() or, when `timeout` is given,
  /// until it runs out. `busy` is evaluated after the sleep is announced; it must read
  /// every condition that a waker establishes before calling wake(), with acquire (or
  /// stronger) loads. @pre called by one thread at a time.
  template <class Busy>
  ParkResult park(Busy&& busy, const std::chrono::nanoseconds* timeout = nullptr) noexcept {
    if constexpr (Protocol::check_after_announce) {
      announce();
      if (busy()) {
        retract();
        return ParkResult::busy;
      }
    } else {  // mutant: the check may read the state from before a racing publish
      if (busy()) return ParkResult::busy;
      announce();
    }
    ParkResult how = ParkResult::woken;
    sleeps_.fetch_add(1, std::memory_order_relaxed);
    Sync::lock(mu_);
    while (state_.load(std::memory_order_acquire) == SLEEPY) {
      if (timeout == nullptr) {
        Sync::wait(cv_, mu_);
      } else if (!Sync::wait_for(cv_, mu_, *timeout)) {
        if (state_.load(std::memory_order_acquire) == SLEEPY) how = ParkResult::timed_out;
        break;
      }
    }
    Sync::unlock(mu_);
    if (how == ParkResult::timed_out) retract();
    return how;
  }

  /// Times park() went to sleep (counted as it does). Thread-safe; lock-free.
  std::uint64_t sleeps() const noexcept { return sleeps_.load(std::memory_order_relaxed); }

  /// Registrant: call after making the scanner busy (a publish that reported the table
  /// idle). Returns true when the scanner was going to sleep or asleep, and was woken.
  bool wake() noexcept {
    if constexpr (Protocol::wake_by_rmw) {
      if (state_.exchange(RUNNING, std::memory_order_acq_rel) != SLEEPY) return false;
    } else {  // mutant: a load cannot see an announcement still in the scanner's buffer
      if (state_.load(std::memory_order_acquire) != SLEEPY) return false;
      state_.store(RUNNING, std::memory_order_release);
    }
    Sync::lock(mu_);
    Sync::unlock(mu_);
    Sync::notify_one(cv_);
    return true;
  }

 private:
  static constexpr std::uint32_t RUNNING = 0;
  static constexpr std::uint32_t SLEEPY = 1;

  /// The scanner takes back its announcement (busy, or timed out). An exchange, not a
  /// store: see "Orders" above.
  void retract() noexcept { state_.exchange(RUNNING, std::memory_order_acq_rel); }

  void announce() noexcept {
    if constexpr (Protocol::announce_by_rmw) {
      state_.exchange(SLEEPY, std::memory_order_acq_rel);
    } else {
      state_.store(SLEEPY, std::memory_order_release);
    }
  }

  alignas(64) typename Atomics::template atomic<std::uint32_t> state_{RUNNING};
  typename Atomics::template atomic<std::uint64_t> sleeps_{0};
  typename Sync::mutex mu_;
  typename Sync::condvar cv_;
};

}  // namespace xlogrt::detail
