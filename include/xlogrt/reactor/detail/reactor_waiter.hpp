// SPDX-License-Identifier: Apache-2.0
#pragma once

// ReactorWaiter: the intrusive node the reactor moves around for one wait, and the
// callback and future waiters built on it. Every delivery form (callback, future,
// coroutine) is a ReactorWaiter with its own completion function; the reactor's arm()
// never allocates one itself (on_done and when_done_future do, through the helpers here,
// and so do a StreamPoint's).

#include <cstdint>
#include <exception>
#include <future>
#include <new>
#include <type_traits>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/future_error.hpp"

namespace xlogrt::detail {

/// One wait for a stream point. The owner (the delivery form) fills `complete_` and keeps
/// the node alive until complete_ has been called; the reactor owns every other field from
/// arm() until it calls complete_, exactly once, with the outcome. complete_ may destroy
/// the node (or resume a coroutine that does).
///
/// Not thread-safe: the reactor hands the node from the arming thread to the scanner
/// through its slot table or host-function queue, which order the accesses.
struct ReactorWaiter {
  using complete_fn = void (*)(ReactorWaiter*, result<void>) noexcept;

  constexpr explicit ReactorWaiter(complete_fn fn) noexcept : complete_(fn) {}
  ReactorWaiter(const ReactorWaiter&) = delete;
  ReactorWaiter& operator=(const ReactorWaiter&) = delete;

  /// Delivers the outcome. The node must not be touched afterwards.
  void finish(result<void> r) noexcept { complete_(this, std::move(r)); }

  complete_fn complete_;
  ReactorWaiter* next_ = nullptr;  ///< reactor's list link while queued
  std::uint32_t stream_ = 0;       ///< StreamId value, set by arm()
  std::uint32_t slot_ = 0;         ///< completion slot, when armed with a flag write
  bool faulted_ = false;           ///< the scanner found the stream faulted (scanner only)
  /// A line the completion will touch beyond the node (a coroutine's frame): the scanner
  /// prefetches it while the wait is armed. Null when there is none.
  const void* warm_ = nullptr;
};

/// A heap waiter that calls `fn(result<void>)` once and deletes itself.
///
/// Not thread-safe: owned by the reactor from arm() to completion, like any waiter.
template <class F>
struct CallbackWaiter final : ReactorWaiter {
  template <class G>
  explicit CallbackWaiter(G&& g) noexcept(std::is_nothrow_constructible_v<F, G&&>)
      : ReactorWaiter(&run), fn_(std::forward<G>(g)) {}

  static void run(ReactorWaiter* w, result<void> r) noexcept {
    auto* self = static_cast<CallbackWaiter*>(w);
    self->fn_(std::move(r));
    delete self;
  }

  F fn_;
};

/// A new CallbackWaiter holding `fn`, or nullptr when host memory (or F's copy) fails.
template <class F>
CallbackWaiter<std::decay_t<F>>* make_callback_waiter(F&& fn) noexcept {
  using Node = CallbackWaiter<std::decay_t<F>>;
  if constexpr (std::is_nothrow_constructible_v<Node, F&&>) {
    return new (std::nothrow) Node(std::forward<F>(fn));
  } else {
    try {
      return new Node(std::forward<F>(fn));
    } catch (...) {
      return nullptr;
    }
  }
}

/// A heap waiter that fulfils a std::promise<void> (errors as FutureError) and deletes
/// itself.
///
/// Not thread-safe: owned by the reactor from arm() to completion, like any waiter.
struct FutureWaiter final : ReactorWaiter {
  FutureWaiter() : ReactorWaiter(&run) {}

  /// A new waiter and its future, or nullptr (host memory exhausted).
  static FutureWaiter* make(std::future<void>& f) noexcept {
    FutureWaiter* node = nullptr;
    try {
      node = new FutureWaiter();
      f = node->promise_.get_future();
    } catch (...) {
      delete node;
      return nullptr;
    }
    return node;
  }

  static void run(ReactorWaiter* w, result<void> r) noexcept {
    auto* self = static_cast<FutureWaiter*>(w);
    try {
      if (r) {
        self->promise_.set_value();
      } else {
        self->promise_.set_exception(std::make_exception_ptr(FutureError(std::move(r).error())));
      }
    } catch (...) {  // only std::bad_alloc from make_exception_ptr: the future breaks
    }
    delete self;
  }

  std::promise<void> promise_;
};

}  // namespace xlogrt::detail
