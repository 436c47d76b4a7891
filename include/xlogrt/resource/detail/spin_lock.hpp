// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <thread>

namespace xlogrt::detail {

/// A test-and-test-and-set lock for critical sections of a few dozen instructions (a
/// block of the block table): uncontended it costs one exchange to take and one store to give,
/// where std::mutex costs two atomic read-modify-writes plus a futex check. Under
/// contention it spins on a plain load (no cache-line ping-pong) and yields after a
/// short while, so a preempted holder does not burn the waiter's time slice. Acquire on
/// lock pairs with release on unlock. BasicLockable, for std::lock_guard.
///
/// Thread-safe; not fair, not recursive.
class SpinLock {
 public:
  /// Uncontended: one exchange, inlined; the waiting is out of line.
  [[gnu::always_inline]] void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) [[likely]] return;
    wait_and_lock();
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  [[gnu::noinline]] void wait_and_lock() noexcept {
    for (unsigned spins = 0;;) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace xlogrt::detail
