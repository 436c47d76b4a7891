// SPDX-License-Identifier: Apache-2.0
#pragma once

// StdAtomics: the one atomics policy of xlogrt's lock-free code.
//
// Code whose interleavings the model tests check (the reactor's SlotTable, Parker and
// StreamPoint; the caching layer's OwnerClaim; BlockTable's lock-free peek; the budget's
// stripes) never names std::atomic directly: it takes an Atomics policy that supplies
// the atomic type, the way completion flags are read and written, the payload cell, the
// mutex and the two ways of waiting. StdAtomics maps them onto the standard library;
// the model tests supply a Relacy policy with the same names (test/model/
// relacy_atomics.hpp), so the header that ships is the header the model checker runs.
// It sits in core, below every layer that uses it (resource and reactor).
//
// An Atomics policy A provides:
//   template <class T> using atomic = ...;       std::atomic's interface (load, store,
//                                                 exchange, fetch_add, fetch_sub,
//                                                 fetch_or, fetch_and, compare_exchange_*)
//   using flag_word = ...;                        what a Flags object stores per slot
//   static std::uint32_t load_flag(flag_word&, std::memory_order) noexcept;
//   static void store_flag(flag_word&, std::uint32_t, std::memory_order) noexcept;
//   template <class P> class cell;                one payload: put(P&&), take() -> P, destroy()
//   using mutex = ...;                            for code that blocks (the reactor's parker)
//   static void pause() noexcept;                 a spin-wait hint to the core (the x86
//                                                 `pause`): for a wait of a few hundred
//                                                 cycles; the thread keeps its core
//   static void yield() noexcept;                 give the core away to the OS scheduler:
//                                                 for a wait that may last as long as
//                                                 another thread's whole call
//   static std::uint32_t thread_hint() noexcept;  a per-thread number that spreads threads
//                                                 over a table (a hint, never an identity)
//
// The flag seam is the reason flag_word exists: in production a flag is a plain
// std::uint32_t in page-locked memory that the GPU writes (cuStreamWriteValue32), read
// on the host through std::atomic_ref. A model checker's atomic cannot be a view over
// foreign memory, so a Flags object stores A::flag_word values and only A reads them.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

namespace xlogrt {

namespace detail {

/// Reverses the bits of a thread's serial, so that serials 0, 1, 2, 3, ... read as the
/// fractions 0, 1/2, 1/4, 3/4, ...: any number of threads scaled onto a table's words
/// (`(hint * words) >> 32`) land as far apart as they can.
constexpr std::uint32_t spread_thread_hint(std::uint32_t serial) noexcept {
  std::uint32_t r = 0;
  for (int i = 0; i < 32; ++i) {
    r = (r << 1) | (serial & 1u);
    serial >>= 1;
  }
  return r;
}

}  // namespace detail

/// The production atomics policy: std::atomic, std::atomic_ref over plain 32-bit flags,
/// an in-place payload cell, std::mutex.
///
/// Thread-safe; lock-free. (The policy is stateless; cell<P> has the discipline below.)
struct StdAtomics {
  template <class T>
  using atomic = std::atomic<T>;

  /// A completion flag is a plain word, so that it can live in memory the GPU writes.
  using flag_word = std::uint32_t;
  static_assert(std::atomic_ref<flag_word>::is_always_lock_free);

  static std::uint32_t load_flag(flag_word& w, std::memory_order order) noexcept {
    return std::atomic_ref<flag_word>(w).load(order);
  }
  static void store_flag(flag_word& w, std::uint32_t v, std::memory_order order) noexcept {
    std::atomic_ref<flag_word>(w).store(v, order);
  }

  /// One payload, constructed in place. Not thread-safe: single producer, single
  /// consumer, with the hand-off ordered by the caller (SlotTable orders put() before
  /// the slot's active bit is published, and take() after the bit is observed). Empty
  /// until put(); take() and destroy() empty it again; the cell never destroys on its own.
  template <class P>
  class cell {
    static_assert(std::is_nothrow_move_constructible_v<P>,
                  "a payload is moved on the reactor's noexcept paths");

   public:
    cell() noexcept {}  // NOLINT: the union member is deliberately left unconstructed
    cell(const cell&) = delete;
    cell& operator=(const cell&) = delete;
    ~cell() {}  // NOLINT: the owner empties the cell (take or destroy) before this runs

    /// @pre empty.
    void put(P&& p) noexcept { std::construct_at(std::addressof(value_), std::move(p)); }
    /// @pre holds a payload; leaves the cell empty.
    P take() noexcept {
      P p(std::move(value_));
      std::destroy_at(std::addressof(value_));
      return p;
    }
    /// @pre holds a payload; leaves the cell empty.
    void destroy() noexcept { std::destroy_at(std::addressof(value_)); }

   private:
    union {
      P value_;
    };
  };

  using mutex = std::mutex;

  static void pause() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  static void yield() noexcept { std::this_thread::yield(); }

  /// A number fixed for the calling thread: its creation serial, bit-reversed (see
  /// detail::spread_thread_hint). The first call on a thread takes the next serial.
  static std::uint32_t thread_hint() noexcept {
    static std::atomic<std::uint32_t> next_serial{0};
    thread_local const std::uint32_t hint =
        detail::spread_thread_hint(next_serial.fetch_add(1, std::memory_order_relaxed));
    return hint;
  }
};

}  // namespace xlogrt
