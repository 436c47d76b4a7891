// SPDX-License-Identifier: Apache-2.0
#pragma once

// WhenDone: `co_await reactor.when_done(stream)` in a C++20 coroutine. The coroutine is
// suspended until the stream reaches the point where when_done() was called, then resumed
// with a result<void>: success, errc::stream_fault when the stream faulted first, or
// errc::cancelled when the reactor was destroyed first.
//
// Where the coroutine resumes: on the reactor's scanner thread by default (it then runs
// there until its next suspension, and every other completion of that reactor waits for
// it: see Reactor's notes on what completion code may do), or on an executor the caller
// names, whose post() receives the coroutine handle.
//
// The awaiter is its own waiter node: co_await allocates nothing. The coroutine's frame
// is the caller's: one started per wait and finished on the scanner is malloc'd on one
// thread and freed on another, which costs more than the wait itself at the tail (see
// bench/HISTORY.md, the reactor); give such frames a pool, or loop over waits in one
// coroutine.

#include <concepts>
#include <coroutine>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"

namespace xlogrt {

/// An executor a coroutine can be resumed on: `e.post(h)` arranges for `h.resume()` to be
/// called on one of its threads. post() is called from the reactor's scanner thread and
/// must not throw (the scanner is noexcept; a throw terminates the process).
template <class E>
concept ResumeExecutor = requires(E& e, std::coroutine_handle<> h) { e.post(h); };

/// A non-owning reference to a ResumeExecutor, or to none (resume inline).
///
/// Thread-safe: immutable; the executor it names must outlive every wait that uses it.
class ExecutorRef {
 public:
  ExecutorRef() noexcept = default;
  // Not for E = ExecutorRef (which has post() too): copies must copy, not wrap.
  template <ResumeExecutor E>
    requires(!std::is_same_v<std::remove_cv_t<E>, ExecutorRef>)
  ExecutorRef(E& e) noexcept  // NOLINT: implicit, so that when_done(s, pool) reads well
      : obj_(std::addressof(e)),
        post_([](void* o, std::coroutine_handle<> h) noexcept { static_cast<E*>(o)->post(h); }) {}

  explicit operator bool() const noexcept { return obj_ != nullptr; }
  /// @pre *this names an executor.
  void post(std::coroutine_handle<> h) const noexcept { post_(obj_, h); }

 private:
  void* obj_ = nullptr;
  void (*post_)(void*, std::coroutine_handle<>) noexcept = nullptr;
};

namespace detail {

/// The waiter node of an awaiter (WhenDone, PointAwaiter): on completion it stores the
/// result and resumes the coroutine, inline or through the executor.
///
/// Not thread-safe: owned by the awaiting coroutine; the reactor or point completes it once.
class CoroutineWaiter : public ReactorWaiter {
 protected:
  explicit CoroutineWaiter(ExecutorRef executor) noexcept : ReactorWaiter(&resume), executor_(executor) {}

  ExecutorRef executor_;
  std::coroutine_handle<> handle_;
  result<void> outcome_;

 private:
  static void resume(ReactorWaiter* w, result<void> r) noexcept {
    auto* self = static_cast<CoroutineWaiter*>(w);
    self->outcome_ = std::move(r);
    // Copies first: once resumed, the coroutine may destroy *self at any moment.
    const std::coroutine_handle<> h = self->handle_;
    const ExecutorRef executor = self->executor_;
    if (executor) {
      executor.post(h);
    } else {
      h.resume();
    }
  }
};

}  // namespace detail

/// What a reactor offers an awaiter: arming a waiter node on a stream. (Checked where
/// the awaiter suspends, not on the class: a reactor names WhenDone<itself> while it is
/// still an incomplete type.)
template <class R>
concept WaiterArming = requires(R& r, StreamId s, detail::ReactorWaiter& w) {
  { r.arm(s, w) } -> std::same_as<result<void>>;
};

/// The awaiter of `co_await reactor.when_done(stream[, executor])`; await_resume() gives
/// the wait's result<void>. If the wait cannot be armed (unknown stream, a stream already
/// known to have faulted, a driver error, a reactor being destroyed), the coroutine is not
/// suspended and receives that error at once.
///
/// Not thread-safe: one co_await, by the coroutine that made it. Neither copyable nor
/// movable: the reactor holds its address while the coroutine is suspended.
template <class R>
class [[nodiscard]] WhenDone : detail::CoroutineWaiter {
 public:
  WhenDone(R& reactor, StreamId stream, ExecutorRef executor = {}) noexcept
      : detail::CoroutineWaiter(executor), reactor_(&reactor), target_(stream) {}
  WhenDone(const WhenDone&) = delete;
  WhenDone& operator=(const WhenDone&) = delete;

  bool await_ready() const noexcept { return false; }

  bool await_suspend(std::coroutine_handle<> h) noexcept {
    static_assert(WaiterArming<R>, "WhenDone<R> needs R::arm(StreamId, detail::ReactorWaiter&)");
    handle_ = h;
    warm_ = h.address();
    auto armed = reactor_->arm(target_, *this);
    if (armed) return true;  // from here on, *this belongs to the reactor: touch nothing
    outcome_ = std::move(armed);
    return false;
  }

  result<void> await_resume() noexcept { return std::move(outcome_); }

 private:
  R* reactor_;
  StreamId target_;
};

}  // namespace xlogrt
