// SPDX-License-Identifier: Apache-2.0
#pragma once

// PointCore: the lock-free heart of StreamPoint (reactor/point.hpp). Any thread may
// attach waiters to it until its one close(); close() stores the outcome and takes every
// waiter attached so far; an attach that comes later fails, and its caller delivers the
// stored outcome itself.
//
// ---- How it works ----------------------------------------------------------------------
//
// State. One word, head_: nullptr (nothing attached), the newest attached waiter (a
// Treiber stack linked through ReactorWaiter::next_), or CLOSED, the address of a
// sentinel that no waiter can have. head_ never leaves CLOSED once it is there.
//
// attach(w): load head_; if it is CLOSED, fail (w untouched). Else set w->next_ to it and
// compare-exchange head_ from it to w; a failed exchange reloads head_ and re-checks for
// CLOSED before trying again. close(r): write the outcome, then exchange head_ for
// CLOSED; the old value is every waiter that will ever be on the list, reversed into
// attach order.
//
// Exactly once, nothing lost. Read-modify-writes of one word are totally ordered, and
// each reads the value the previous one wrote. An attach succeeds only by a
// compare-exchange that read a non-CLOSED value: it comes before close()'s exchange in
// that order, and its waiter is in what the exchange took; any compare-exchange after it
// reads CLOSED and fails, and its attach then fails too. So every waiter is either taken
// by close() or handed back to its caller, never both, never neither. Nodes are only
// pushed, one at a time, and taken all at once by a single close(): no pop, so no ABA.
//
// Orders (Protocol names each, for the model test's mutants):
//   attach    the compare-exchange, acq_rel. Release on success publishes w's fields
//             (next_, and whatever the delivery form stored in its node: the callable,
//             the coroutine handle) to close(), whose exchange acquires them. Acquire on
//             failure: reading CLOSED makes the outcome readable.
//   observe   the loads of head_ (attach's first, closed()), acquire, for the same reason.
//   close     the exchange, acq_rel: acquire for the nodes above, release so that an
//             attacher or closed() that reads CLOSED reads the outcome written before it.
//
// Why not a mutex: a waiter's completion runs on the reactor's scanner; a mutex would
// make the scanner wait behind an attaching thread preempted while it holds the lock, and
// would cost every attach a lock and an unlock where one compare-exchange does.
// test/model/test_point_model.cpp runs this header under Relacy, with a mutant for each
// weakened order and for an attach that does not re-check for CLOSED.

#include <atomic>
#include <cstdint>
#include <utility>

#include "xlogrt/core/atomics.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"

namespace xlogrt::detail {

/// The orders and steps of PointCore. A test seam, like SlotProtocol: the model test
/// derives mutants that weaken one member. Production code never names it.
///
/// Thread-safe: constants only.
struct PointProtocol {
  /// attach: the compare-exchange that pushes a waiter (success and failure).
  static constexpr std::memory_order attach = std::memory_order_acq_rel;
  /// attach and closed(): the loads of head_.
  static constexpr std::memory_order observe = std::memory_order_acquire;
  /// close: the exchange that installs CLOSED.
  static constexpr std::memory_order close = std::memory_order_acq_rel;
  /// attach pushes with a compare-exchange (false: a load, a check, then a store).
  static constexpr bool attach_by_cas = true;
};

/// The sentinel head_ holds once closed. Never completed, never linked: only its address
/// is used.
inline constinit ReactorWaiter point_closed_sentinel{nullptr};

/// A closable list of waiters and the outcome that closed it. `Outcome` is what every
/// waiter receives (result<void>; the model test passes an instrumented value).
///
/// Thread-safe; lock-free. attach() and closed() may be called from any thread at any
/// time; close() once, by one thread; outcome() only after attach() failed or closed()
/// returned true (or by the thread that closed).
template <class Atomics = StdAtomics, class Protocol = PointProtocol, class Outcome = result<void>>
class PointCore {
 public:
  PointCore() = default;
  PointCore(const PointCore&) = delete;
  PointCore& operator=(const PointCore&) = delete;

  /// Links `w`, to be returned by close(). Returns false when already closed: `w` is then
  /// untouched and still the caller's, and outcome() is readable.
  bool attach(ReactorWaiter& w) noexcept {
    ReactorWaiter* h = head_.load(Protocol::observe);
    if constexpr (Protocol::attach_by_cas) {
      for (;;) {
        if (h == closed_mark()) return false;
        w.next_ = h;
        if (head_.compare_exchange_weak(h, &w, Protocol::attach)) return true;
      }
    } else {  // mutant: a close between the load and the store is overwritten
      if (h == closed_mark()) return false;
      w.next_ = h;
      head_.store(&w, Protocol::attach == std::memory_order_acq_rel ? std::memory_order_release
                                                                     : Protocol::attach);
      return true;
    }
  }

  /// Stores `outcome`, closes the list and returns every waiter attached, oldest first,
  /// linked through next_. @pre not closed yet; called by one thread.
  template <class R>
  ReactorWaiter* close(R&& outcome) noexcept {
    outcome_ = std::forward<R>(outcome);
    ReactorWaiter* lifo = head_.exchange(closed_mark(), Protocol::close);
    ReactorWaiter* fifo = nullptr;
    while (lifo != nullptr) {
      ReactorWaiter* next = lifo->next_;
      lifo->next_ = fifo;
      fifo = lifo;
      lifo = next;
    }
    return fifo;
  }

  /// Whether close() has run (then outcome() is readable).
  bool closed() const noexcept { return head_.load(Protocol::observe) == closed_mark(); }

  /// @pre attach() returned false or closed() true on this thread, or this thread closed.
  const Outcome& outcome() const noexcept { return outcome_; }
  Outcome& outcome() noexcept { return outcome_; }

 private:
  static ReactorWaiter* closed_mark() noexcept { return &point_closed_sentinel; }

  typename Atomics::template atomic<ReactorWaiter*> head_{nullptr};
  Outcome outcome_{};
};

}  // namespace xlogrt::detail
