// SPDX-License-Identifier: Apache-2.0
#pragma once

// RelacyAtomics: the atomics policy of the model tests. It maps the policy interface of
// xlogrt's lock-free code (see include/xlogrt/core/atomics.hpp) onto Relacy's
// instrumented types, so that the shipped headers run under the model checker unchanged:
//   - atomic<T> wraps rl::atomic<T>; every operation takes the std::memory_order the
//     generic code passes and reports the caller's source line in Relacy's history;
//   - flag_word is such an atomic: a model's flag cannot be a view over foreign memory;
//   - cell<P> is an rl::var<P>, so two unordered accesses to one payload are a data race;
//   - pause() and yield() both hand the fiber back to Relacy's scheduler: a model has no
//     cores, and a spin that never yields would be an endless schedule.
//
// Relacy defines macros for memory_order_*, new, delete, malloc and free, so it must be
// the last header of a translation unit, this one included after everything else. Code
// after it spells orders as std::memory_order::acquire (the macros do not reach those).
// Relacy also replaces the global operator new: see test_slot_models.cpp for the deletes
// that go with it.

#include <atomic>
#include <cstdint>
#include <source_location>

#include "xlogrt/core/atomics.hpp"

#include <relacy/relacy.hpp>  // last: see above

// The allocation macros would rewrite every `new` and `delete` that follows, `= delete`
// included; the models allocate nothing of their own, so they go.
#undef new
#undef delete
#undef malloc
#undef calloc
#undef realloc
#undef free

struct RelacyAtomics {
  using here = std::source_location;

  static rl::memory_order order(std::memory_order o) noexcept {
    switch (o) {
      case std::memory_order::relaxed: return rl::mo_relaxed;
      case std::memory_order::consume: return rl::mo_consume;
      case std::memory_order::acquire: return rl::mo_acquire;
      case std::memory_order::release: return rl::mo_release;
      case std::memory_order::acq_rel: return rl::mo_acq_rel;
      case std::memory_order::seq_cst: return rl::mo_seq_cst;
    }
    return rl::mo_seq_cst;
  }
  static rl::debug_info at(const here& l) noexcept {
    return rl::debug_info(l.function_name(), l.file_name(), l.line());
  }

  template <class T>
  class atomic {
   public:
    explicit atomic(T v = T{}, here l = here::current()) { a_.store(v, rl::mo_relaxed, at(l)); }

    T load(std::memory_order o = std::memory_order::seq_cst, here l = here::current()) const {
      return a_.load(order(o), at(l));
    }
    void store(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      a_.store(v, order(o), at(l));
    }
    T exchange(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      return a_.exchange(v, order(o), at(l));
    }
    T fetch_add(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      return a_.fetch_add(v, order(o), at(l));
    }
    T fetch_sub(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      return a_.fetch_sub(v, order(o), at(l));
    }
    T fetch_or(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      return a_.fetch_or(v, order(o), at(l));
    }
    T fetch_and(T v, std::memory_order o = std::memory_order::seq_cst, here l = here::current()) {
      return a_.fetch_and(v, order(o), at(l));
    }
    bool compare_exchange_strong(T& expected, T desired,
                                 std::memory_order o = std::memory_order::seq_cst,
                                 here l = here::current()) {
      return a_.compare_exchange_strong(expected, desired, order(o), at(l));
    }
    bool compare_exchange_weak(T& expected, T desired,
                               std::memory_order o = std::memory_order::seq_cst,
                               here l = here::current()) {
      return a_.compare_exchange_weak(expected, desired, order(o), at(l));
    }

   private:
    rl::atomic<T> a_;
  };

  using flag_word = atomic<std::uint32_t>;
  static std::uint32_t load_flag(flag_word& w, std::memory_order o, here l = here::current()) {
    return w.load(o, l);
  }
  static void store_flag(flag_word& w, std::uint32_t v, std::memory_order o,
                         here l = here::current()) {
    w.store(v, o, l);
  }

  template <class P>
  class cell {
   public:
    void put(P&& p, here l = here::current()) { v_(at(l)) = p; }
    P take(here l = here::current()) { return v_(at(l)).load(); }
    void destroy() noexcept {}

   private:
    rl::var<P> v_;
  };

  class mutex {
   public:
    void lock(here l = here::current()) { m_.lock(at(l)); }
    bool try_lock(here l = here::current()) { return m_.try_lock(at(l)); }
    void unlock(here l = here::current()) { m_.unlock(at(l)); }

   private:
    rl::mutex m_;
  };

  static void pause(here l = here::current()) { rl::yield(1, at(l)); }
  static void yield(here l = here::current()) { rl::yield(1, at(l)); }

  /// Relacy runs its threads as fibers of one OS thread, so the hint comes from the
  /// model's own thread index, which is also what keeps every replay identical.
  static std::uint32_t thread_hint() { return xlogrt::detail::spread_thread_hint(rl::thread_index()); }
};

/// The model's Env for the scenarios: a failed expectation fails the model with its
/// sentence; waits never time out (Relacy reports an endless wait as a livelock).
struct RelacyEnv {
  static void expect(bool ok, const char* what, std::source_location l = std::source_location::current()) {
    if (!ok) rl::ctx().fail_test(what, rl::test_result_user_assert_failed, RelacyAtomics::at(l));
  }
  struct Deadline {
    bool passed() const noexcept { return false; }
  };
};
