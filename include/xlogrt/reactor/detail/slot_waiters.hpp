// SPDX-License-Identifier: Apache-2.0
#pragma once

// SlotWaiters: which waiter is armed on each completion slot, for the reactor's fault
// probe and its destructor (SlotTable hands a slot's payload only to the scan that
// retires it, and those two must find the waiters armed on a stream before that).
//
// Orders. The registrant stores its waiter with release after filling it in and before
// publishing the slot, and the probe loads it with acquire, which makes the waiter's
// stream readable. Only the scanner clears an entry, with a relaxed compare-exchange from
// the waiter it has just retired: a registrant that already re-claimed the recycled slot
// has stored its own waiter, and the exchange leaves that alone (the waiter cannot have
// been freed and reused meanwhile: it is completed after the exchange). A non-null entry
// is therefore a waiter that nobody but the scanner can retire, so the probe, on the
// scanner's thread, may set its flag (release, as the device would; the scan's acquire
// load of the flag pairs with it) without racing the slot's next owner.
//
// Why not a per-stream list of armed waiters under a mutex: that puts a lock on every arm
// for the sake of a rare fault; the mirror costs arm one store and retirement one
// compare-exchange on a line the scanner has warmed (warm()).

#include <atomic>
#include <cstddef>
#include <memory>

#include "xlogrt/reactor/detail/prefetch.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"

namespace xlogrt::detail {

/// One entry per completion slot; empty until allocate().
///
/// Thread-safe; lock-free. publish() is the registrant's (the slot's claimer), clear()
/// and warm() the scanner's, armed() and take() the scanner's or the destructor's.
class SlotWaiters {
 public:
  /// Allocates `slots` empty entries. Throws std::bad_alloc.
  void allocate(std::size_t slots) { w_ = std::make_unique<std::atomic<ReactorWaiter*>[]>(slots); }

  /// Registrant, holding `slot`: `w` is armed on it (filled in, before the publish).
  void publish(std::size_t slot, ReactorWaiter* w) noexcept {
    // Release: the fault probe reads the waiter's fields after loading this.
    w_[slot].store(w, std::memory_order_release);
  }

  /// The waiter armed on `slot`, or null; its fields may be read.
  ReactorWaiter* armed(std::size_t slot) const noexcept {
    return w_[slot].load(std::memory_order_acquire);
  }

  /// Scanner, retiring `w` from its slot: empties the entry unless the slot's next owner
  /// has already stored its own waiter.
  void clear(ReactorWaiter* w) noexcept {
    ReactorWaiter* expected = w;
    // Relaxed: the entry only names armed waiters for the probe; a registrant that has
    // already claimed the recycled slot stored its own waiter, and the CAS leaves it.
    w_[w->slot_].compare_exchange_strong(expected, nullptr, std::memory_order_relaxed);
  }

  /// Destructor, after the scanner stopped: empties `slot`'s entry and returns its waiter.
  ReactorWaiter* take(std::size_t slot) noexcept {
    return w_[slot].exchange(nullptr, std::memory_order_acq_rel);
  }

  /// Scanner, while `slot`'s wait is armed: pulls in what retiring it will touch besides
  /// the slot table's lines (this entry, the waiter, a coroutine's frame), so that the
  /// completion waits for no line the arming thread wrote (see SlotTable::scan_once).
  void warm(std::size_t slot) const noexcept {
    prefetch_write(&w_[slot]);
    // Acquire: pairs with publish()'s release store, so the waiter's fields may be read.
    if (const ReactorWaiter* w = w_[slot].load(std::memory_order_acquire)) {
      // A node spans up to 3 lines (an awaiter's holds its outcome); a coroutine frame,
      // which the resumed coroutine writes, a few more.
      for (int line = 0; line < 3; ++line) prefetch_write(reinterpret_cast<const char*>(w) + 64 * line);
      if (w->warm_ != nullptr) {
        for (int line = 0; line < 4; ++line) prefetch_write(static_cast<const char*>(w->warm_) + 64 * line);
      }
    }
  }

 private:
  std::unique_ptr<std::atomic<ReactorWaiter*>[]> w_;
};

}  // namespace xlogrt::detail
