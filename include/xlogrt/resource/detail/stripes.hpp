// SPDX-License-Identifier: Apache-2.0
#pragma once

// The calling thread's stripe: what Budget and Statistics use to spread their counters
// over cache lines, so that threads allocating at once do not write one shared line.

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xlogrt::detail {

/// Stripes are laid out this far apart. 128, not 64: adjacent-line prefetchers (Intel's
/// spatial prefetcher pairs 64-byte lines) make two threads on neighbouring lines
/// contend as if they shared one.
inline constexpr std::size_t STRIPE_ALIGN = 128;

/// Tickets below this are recycled when their thread exits.
inline constexpr std::uint32_t RECYCLED_TICKETS = 256;
/// The ticket of a thread that has exited (its thread_local destructors ran) and still
/// counts something, from a destructor of a static object on the main thread, say: it
/// owns no stripe, and lands in a shared one.
inline constexpr std::uint32_t RETIRED_TICKET = 0xfffffffeu;

struct TicketBook {
  std::atomic<std::uint64_t> free[RECYCLED_TICKETS / 64];  // returned tickets
  std::atomic<std::uint32_t> next;                         // never handed out yet

  /// The smallest returned ticket, else a new one. Acquire: the previous holder's writes
  /// to the stripes of the ticket happen-before the new holder's.
  std::uint32_t take() noexcept {
    for (std::uint32_t w = 0; w < RECYCLED_TICKETS / 64; ++w) {
      std::uint64_t m = free[w].load(std::memory_order_acquire);
      while (m != 0) {
        const std::uint64_t bit = m & (~m + 1);
        if (free[w].compare_exchange_weak(m, m & ~bit, std::memory_order_acquire)) {
          return w * 64 + static_cast<std::uint32_t>(std::countr_zero(bit));
        }
      }
    }
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  /// Release: see take().
  void give(std::uint32_t t) noexcept {
    if (t < RECYCLED_TICKETS) free[t / 64].fetch_or(std::uint64_t{1} << (t % 64), std::memory_order_release);
  }
};

/// Constant-initialised and trivially destructible: usable at any time, exit included.
inline TicketBook& ticket_book() noexcept {
  static constinit TicketBook book{};
  return book;
}

/// The first call's work: takes a ticket and arranges its return at thread exit.
[[gnu::cold, gnu::noinline]] inline std::uint32_t take_thread_ticket(std::uint32_t& mine) noexcept {
  mine = ticket_book().take();
  struct Returner {
    std::uint32_t* t;
    ~Returner() {
      ticket_book().give(*t);
      *t = RETIRED_TICKET;
    }
  };
  thread_local Returner returner{&mine};
  (void)returner;
  return mine;
}

/// The calling thread's ticket: taken on its first call, given back when the thread
/// exits. Live threads hold distinct tickets, and threads started one after another
/// while others exit reuse the small ones; so a striped structure can give each ticket
/// below its stripe count a stripe of its own (written by one thread, without
/// read-modify-writes) and let larger tickets share (Statistics), or use
/// `thread_ticket() & (stripes - 1)` with read-modify-writes everywhere (Budget).
/// A thread's contributions stay in its stripes when it exits; the next holder of the
/// ticket continues from them, so sums stay exact.
///
/// Thread-safe; lock-free.
[[gnu::always_inline]] inline std::uint32_t thread_ticket() noexcept {
  // Trivially destructible and constant-initialised (a plain TLS load, no init guard),
  // so still readable after the returner above has run.
  thread_local constinit std::uint32_t mine = RETIRED_TICKET + 1;  // not taken yet
  if (mine == RETIRED_TICKET + 1) [[unlikely]] return take_thread_ticket(mine);
  return mine;
}

/// The calling thread's own slot among `owned` slots owned one per ticket: its ticket when
/// that is below `owned`, else `owned` (the one slot the other threads share). Slot
/// `ticket` is written by one live thread only; slot `owned` needs read-modify-writes or
/// a lock.
[[gnu::always_inline]] inline std::uint32_t owned_slot(std::uint32_t owned) noexcept {
  const std::uint32_t t = thread_ticket();
  return t < owned ? t : owned;
}

/// Adds `n` to `a` and returns the old value: a load and a store when the calling thread
/// is the only one that writes `a` (`owned`: its owned_slot, or a slot written under a
/// lock), a read-modify-write otherwise.
template <class T>
[[gnu::always_inline]] inline T owned_add(std::atomic<T>& a, std::type_identity_t<T> n, std::memory_order order,
                                           bool owned) noexcept {
  if (owned) {
    const T v = a.load(std::memory_order_relaxed);
    a.store(v + n, order);
    return v;
  }
  return a.fetch_add(n, order);
}

/// The calling thread's stripe among `stripes` (a power of two).
inline std::uint32_t thread_stripe(std::uint32_t stripes) noexcept { return thread_ticket() & (stripes - 1); }

}  // namespace xlogrt::detail
