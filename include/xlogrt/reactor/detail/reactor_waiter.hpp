// SPDX-License-Identifier: Apache-2.0
#pragma once

// ReactorWaiter: the intrusive node the reactor moves around for one wait, and the
// callback waiter built on it. Every delivery form (callback, future, coroutine) is a
// ReactorWaiter with its own completion function; the reactor never allocates one itself.

#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

#include "xlogrt/core/result.hpp"

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

  explicit ReactorWaiter(complete_fn fn) noexcept : complete_(fn) {}
  ReactorWaiter(const ReactorWaiter&) = delete;
  ReactorWaiter& operator=(const ReactorWaiter&) = delete;

  /// Delivers the outcome. The node must not be touched afterwards.
  void finish(result<void> r) noexcept { complete_(this, std::move(r)); }

  complete_fn complete_;
  ReactorWaiter* next_ = nullptr;  ///< reactor's list link while queued
  std::uint32_t stream_ = 0;       ///< StreamId value, set by arm()
  std::uint32_t slot_ = 0;         ///< completion slot, when armed with a flag write
  bool faulted_ = false;           ///< the scanner found the stream faulted (scanner only)
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

}  // namespace xlogrt::detail
