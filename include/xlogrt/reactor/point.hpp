// SPDX-License-Identifier: Apache-2.0
#pragma once

// StreamPoint: one point of one stream, armed once, awaited by any number of waiters.
//
// Reactor::mark(stream) arms a single completion at the stream's current position (one
// slot and one cuStreamWriteValue32, or one host function when no slot is free) and
// returns a StreamPoint, a copyable, reference-counted handle. Any number of waiters may
// attach to it, from any thread, before or after the point is reached, by callback
// (on_done), std::future (when_done_future) or coroutine (`co_await point`,
// `co_await point.when_done(executor)`). When the armed completion fires, every waiter
// attached so far completes with the same result<void>: success, errc::stream_fault, or
// errc::cancelled when the reactor was destroyed first. N waiters cost one flag write and
// one scanner retirement instead of N of each.
//
// Where waiters run. Waiters attached before the point fires run where the reactor's
// completions run (the scanner thread, or the destroying thread during destruction, or
// a coroutine's executor): see "What completion code may do" in reactor.hpp. A waiter
// attached after the point has fired completes at once, on the attaching thread:
//   - on_done(fn) calls fn before it returns, on the calling thread;
//   - when_done_future() returns a future that is already ready;
//   - `co_await point` does not suspend;
//   - `co_await point.when_done(executor)` posts the coroutine to executor (so that code
//     that names an executor always continues on it).
// Why not hand late waiters to the scanner: a StreamPoint may outlive its reactor (its
// outcome is then cancelled or final), and a completed point needs no reactor at all; a
// late waiter completing inline is what a ready std::future does too. So on_done's
// callback may run on the calling thread: do not call it while holding a lock that the
// callback takes.
//
// Lifetime. The state is shared by the handles and by the armed completion (a reference
// count): it lives until the last handle is gone and the completion has fired, whichever
// comes last. Attached waiters do not need a handle to be kept.

#include <atomic>
#include <coroutine>
#include <cstdint>
#include <future>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/reactor/awaitable.hpp"
#include "xlogrt/reactor/detail/point_core.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"

namespace xlogrt {

namespace detail {

/// The shared state of a StreamPoint, and the one waiter its reactor arms.
///
/// Thread-safe; lock-free. (The reference count and the PointCore are; the rest is
/// immutable after construction.)
class PointState final : public ReactorWaiter {
 public:
  /// Two references: the first handle's and the armed completion's. `coalesced` is the
  /// reactor's counter of waiters served by a point's completion (bumped only from the
  /// completion, which the reactor runs while it exists).
  PointState(StreamId stream, std::atomic<std::uint64_t>* coalesced) noexcept
      : ReactorWaiter(&fire), point_stream_(stream), coalesced_(coalesced) {}

  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  /// Acq_rel: every use of the state by the other holders happens-before the delete.
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  StreamId point_stream() const noexcept { return point_stream_; }
  PointCore<>& core() noexcept { return core_; }

 private:
  ~PointState() = default;

  /// The armed completion: closes the list, completes every attached waiter with the
  /// outcome (each gets its own copy), then drops the completion's reference.
  static void fire(ReactorWaiter* w, result<void> r) noexcept {
    auto* self = static_cast<PointState*>(w);
    ReactorWaiter* list = self->core_.close(std::move(r));
    std::uint64_t n = 0;
    for (const ReactorWaiter* p = list; p != nullptr; p = p->next_) ++n;
    // Counted before the waiters run, so that a waiter that reads the counters sees its own.
    if (n != 0) self->coalesced_->fetch_add(n, std::memory_order_relaxed);
    while (list != nullptr) {
      ReactorWaiter* next = list->next_;  // read first: finish() may free the node
      list->finish(self->core_.outcome());
      list = next;
    }
    self->release();
  }

  PointCore<> core_;
  std::atomic<std::uint32_t> refs_{2};
  StreamId point_stream_;
  std::atomic<std::uint64_t>* coalesced_;
};

}  // namespace detail

class PointAwaiter;

/// A handle to one armed point of a stream (see the file comment). Copying it shares the
/// point; a default-constructed or moved-from handle is empty, and every wait on an empty
/// handle fails with errc::invalid_argument.
///
/// Thread-safe; lock-free. Different handles to one point may be used, copied and
/// destroyed on any threads at once; one handle object may be used from several threads
/// at once through its const members (the waits), but assigning to it is not
/// thread-safe, like a std::shared_ptr.
class StreamPoint {
 public:
  StreamPoint() noexcept = default;
  StreamPoint(const StreamPoint& o) noexcept : state_(o.state_) {
    if (state_ != nullptr) state_->retain();
  }
  StreamPoint(StreamPoint&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  StreamPoint& operator=(StreamPoint o) noexcept {
    std::swap(state_, o.state_);
    return *this;
  }
  ~StreamPoint() {
    if (state_ != nullptr) state_->release();
  }

  /// Whether the handle names a point.
  explicit operator bool() const noexcept { return state_ != nullptr; }
  /// @pre *this names a point.
  StreamId stream() const noexcept { return state_->point_stream(); }
  /// Whether the point's outcome is in (reached, faulted or cancelled): waits attached
  /// from now on complete at once. False for an empty handle.
  bool done() const noexcept { return state_ != nullptr && state_->core().closed(); }

  /// Calls `fn(result<void>)` once: when the point is reached (on the scanner), or with
  /// the error that ended the wait (stream_fault, cancelled). If the point is already
  /// done, calls it now, on this thread, before returning.
  /// Errors (fn is then never called): invalid_argument for an empty handle;
  /// out_of_memory.
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&, result<void>>
  result<void> on_done(F&& fn) const noexcept {
    if (state_ == nullptr) return empty_error();
    auto& core = state_->core();
    if (core.closed()) {  // no node needed
      if constexpr (std::is_invocable_v<F&, result<void>>) {
        fn(result<void>(core.outcome()));
      } else {  // e.g. a mutable lambda passed as const&: call a copy, as a node would
        std::decay_t<F> copy(std::forward<F>(fn));
        copy(result<void>(core.outcome()));
      }
      return ok();
    }
    auto* node = detail::make_callback_waiter(std::forward<F>(fn));
    if (node == nullptr) return error{errc::out_of_memory, "host allocation of a callback failed"};
    if (!core.attach(*node)) node->finish(core.outcome());  // done meanwhile
    return ok();
  }

  /// A future that becomes ready when the point is reached (ready at once if it is done);
  /// get() throws FutureError for stream_fault and cancelled.
  /// Errors: invalid_argument for an empty handle; out_of_memory.
  result<std::future<void>> when_done_future() const noexcept {
    if (state_ == nullptr) return empty_error();
    std::future<void> f;
    auto* node = detail::FutureWaiter::make(f);
    if (node == nullptr) return error{errc::out_of_memory, "host allocation of a promise failed"};
    auto& core = state_->core();
    if (!core.attach(*node)) node->finish(core.outcome());
    return f;
  }

  /// `co_await point.when_done(executor)`: resumes through executor.post() (also when the
  /// point is already done); without an executor, as `co_await point`.
  PointAwaiter when_done(ExecutorRef executor = {}) const noexcept;
  /// `co_await point`: resumes on the scanner, or does not suspend if the point is done.
  PointAwaiter operator co_await() const noexcept;

  /// The primitive under the waits: links `w`, which the point completes exactly once,
  /// later, with w.finish(outcome). Returns false when the point is already done (or the
  /// handle empty): `w` is untouched and still the caller's.
  bool attach(detail::ReactorWaiter& w) const noexcept {
    return state_ != nullptr && state_->core().attach(w);
  }

  /// For Reactor::mark(): a handle that takes over one reference of `s`, a state made
  /// with two (this handle's and the armed completion's).
  static StreamPoint adopt(detail::PointState* s) noexcept { return StreamPoint(s); }

 private:
  friend class PointAwaiter;

  explicit StreamPoint(detail::PointState* s) noexcept : state_(s) {}

  static error empty_error() {
    return error{errc::invalid_argument, "waiting on an empty StreamPoint (default-"
                                         "constructed or moved from)"};
  }

  detail::PointState* state_ = nullptr;
};

/// The awaiter of `co_await point` and `co_await point.when_done(executor)`; it holds a
/// reference to the point, and is its own waiter node (co_await allocates nothing).
///
/// Not thread-safe: one co_await, by the coroutine that made it. Neither copyable nor
/// movable: the point holds its address while the coroutine is suspended.
class [[nodiscard]] PointAwaiter : detail::CoroutineWaiter {
 public:
  PointAwaiter(StreamPoint point, ExecutorRef executor) noexcept
      : detail::CoroutineWaiter(executor), point_(std::move(point)) {}
  PointAwaiter(const PointAwaiter&) = delete;
  PointAwaiter& operator=(const PointAwaiter&) = delete;

  bool await_ready() noexcept {
    if (!point_) {
      outcome_ = StreamPoint::empty_error();
      return true;
    }
    auto& core = point_.state_->core();
    if (!executor_ && core.closed()) {
      outcome_ = core.outcome();
      return true;
    }
    return false;
  }

  bool await_suspend(std::coroutine_handle<> h) noexcept {
    handle_ = h;
    auto& core = point_.state_->core();
    if (core.attach(*this)) return true;  // from here on, *this is the point's: touch nothing
    outcome_ = core.outcome();
    if (!executor_) return false;
    const ExecutorRef executor = executor_;
    executor.post(h);  // the coroutine may run (and destroy *this) from here on
    return true;
  }

  result<void> await_resume() noexcept { return std::move(outcome_); }

 private:
  StreamPoint point_;
};

inline PointAwaiter StreamPoint::when_done(ExecutorRef executor) const noexcept {
  return PointAwaiter(*this, executor);
}
inline PointAwaiter StreamPoint::operator co_await() const noexcept {
  return PointAwaiter(*this, {});
}

}  // namespace xlogrt
