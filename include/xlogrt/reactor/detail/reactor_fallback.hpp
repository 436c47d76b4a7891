// SPDX-License-Identifier: Apache-2.0
#pragma once

// FallbackHub: the reactor's host-function path, for waits that get no completion slot
// (the slots are exhausted, or the device cannot write flags from a stream).
//
// A wait on this path is a Ticket enqueued with launch_host_func. When the stream reaches
// it, the driver's callback thread runs trampoline(), which moves the waiter to the ready
// list and wakes the scanner; the scanner completes it, so that callbacks and coroutines
// run on the scanner (or the caller's executor) on both paths, never on the driver's
// thread, where calling the driver is forbidden.
//
// Four parties may end a ticket: the trampoline (the point was reached), the scanner's
// fault probe (the stream faulted), the reactor's destructor (cancelled), and the
// registrant itself when launch_host_func fails. Whoever unlinks the ticket from the
// pending list, under the hub's mutex, owns the waiter's completion; the others find it
// unlinked and leave the waiter alone. The ticket's memory belongs to the trampoline once
// the launch succeeded (it deletes the ticket whenever it runs), and to the registrant
// when the launch failed. A ticket holds the hub by shared_ptr, so a host function that
// runs after the reactor is gone still finds the mutex it needs.
//
// This is the slow path by design, so a mutex is fine here: each ticket costs one
// allocation and three short critical sections.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <utility>

#include "xlogrt/reactor/detail/reactor_waiter.hpp"

namespace xlogrt::detail {

/// Thread-safe. (Every member may be called from any thread; trampoline() runs on the
/// driver's callback thread.)
class FallbackHub {
 public:
  using wake_fn = void (*)(void*) noexcept;

  /// One host-function wait. Not thread-safe: its links and `linked` are the hub's,
  /// under its mutex; the rest is written before the launch.
  struct Ticket {
    std::shared_ptr<FallbackHub> hub;
    ReactorWaiter* waiter = nullptr;
    Ticket* prev = nullptr;
    Ticket* next = nullptr;
    bool linked = false;
  };

  /// `wake(ctx)` is called, under the hub's mutex, when a waiter becomes ready, until
  /// close().
  FallbackHub(wake_fn wake, void* ctx) noexcept : wake_(wake), wake_ctx_(ctx) {}
  FallbackHub(const FallbackHub&) = delete;
  FallbackHub& operator=(const FallbackHub&) = delete;

  /// Registrant: a linked ticket for `w`, or nullptr when host memory is exhausted or the
  /// hub is closed (`closed` says which). `first` is set when the pending count went from
  /// 0 to 1.
  static Ticket* open(const std::shared_ptr<FallbackHub>& self, ReactorWaiter& w, bool& first,
                      bool& closed) noexcept {
    auto* t = new (std::nothrow) Ticket{self, &w};
    closed = false;
    if (t == nullptr) return nullptr;
    FallbackHub& h = *self;
    std::lock_guard lock(h.mu_);
    if (h.closed_) {
      closed = true;
      delete t;
      return nullptr;
    }
    h.link(t);
    first = h.pending_.load(std::memory_order_relaxed) == 0;
    // Release: the scanner's park predicate reads it with acquire (see reactor_parker.hpp).
    h.pending_.store(h.pending_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    return t;
  }

  /// Registrant, after launch_host_func failed: deletes the ticket. Returns true when the
  /// waiter is still the caller's (report the failure), false when a fault probe or the
  /// destructor completed it meanwhile (the wait is over: report success).
  static bool abandon(Ticket* t) noexcept {
    std::shared_ptr<FallbackHub> hub = std::move(t->hub);
    bool mine = false;
    {
      std::lock_guard lock(hub->mu_);
      if (t->linked) {
        hub->unlink(t);
        mine = true;
      }
    }
    delete t;
    return mine;
  }

  /// The host function. Deletes the ticket; hands its waiter to the scanner unless
  /// someone else ended the wait first.
  static void trampoline(void* p) noexcept {
    auto* t = static_cast<Ticket*>(p);
    std::shared_ptr<FallbackHub> hub = std::move(t->hub);
    {
      std::lock_guard lock(hub->mu_);
      if (t->linked) {
        hub->unlink(t);
        hub->push_ready(t->waiter);
        if (!hub->closed_) hub->wake_(hub->wake_ctx_);
      }
    }
    delete t;
  }

  /// Scanner: whether the ready list may be non-empty. Lock-free.
  bool has_ready() const noexcept { return has_ready_.load(std::memory_order_acquire); }

  /// Scanner: waits launched and not yet ended. Lock-free.
  std::size_t pending() const noexcept { return pending_.load(std::memory_order_acquire); }

  /// Scanner: the ready waiters, oldest first, linked through next_.
  ReactorWaiter* take_ready() noexcept {
    if (!has_ready()) return nullptr;
    std::lock_guard lock(mu_);
    ReactorWaiter* head = ready_head_;
    ready_head_ = ready_tail_ = nullptr;
    has_ready_.store(false, std::memory_order_relaxed);
    return head;
  }

  /// Scanner: calls f(stream) for every pending wait (under the mutex: f must be short).
  template <class F>
  void for_each_pending(F&& f) {
    std::lock_guard lock(mu_);
    for (Ticket* t = pending_head_; t != nullptr; t = t->next) f(t->waiter->stream_);
  }

  /// Scanner: ends every pending wait on `stream`; returns their waiters, linked.
  ReactorWaiter* take_stream(std::uint32_t stream) noexcept {
    ReactorWaiter* out = nullptr;
    std::lock_guard lock(mu_);
    for (Ticket* t = pending_head_; t != nullptr;) {
      Ticket* next = t->next;
      if (t->waiter->stream_ == stream) {
        unlink(t);
        t->waiter->next_ = out;
        out = t->waiter;
      }
      t = next;
    }
    return out;
  }

  /// Destructor: no more tickets, no more wakes. Returns the ready waiters (reached) and
  /// the pending ones (to cancel), each linked.
  std::pair<ReactorWaiter*, ReactorWaiter*> close() noexcept {
    std::lock_guard lock(mu_);
    closed_ = true;
    ReactorWaiter* ready = ready_head_;
    ready_head_ = ready_tail_ = nullptr;
    has_ready_.store(false, std::memory_order_relaxed);
    ReactorWaiter* pending = nullptr;
    while (Ticket* t = pending_head_) {
      unlink(t);
      t->waiter->next_ = pending;
      pending = t->waiter;
    }
    return {ready, pending};
  }

 private:
  // All under mu_.
  void link(Ticket* t) noexcept {
    t->prev = nullptr;
    t->next = pending_head_;
    if (pending_head_ != nullptr) pending_head_->prev = t;
    pending_head_ = t;
    t->linked = true;
  }
  void unlink(Ticket* t) noexcept {
    if (t->prev != nullptr) {
      t->prev->next = t->next;
    } else {
      pending_head_ = t->next;
    }
    if (t->next != nullptr) t->next->prev = t->prev;
    t->prev = t->next = nullptr;
    t->linked = false;
    pending_.store(pending_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
  void push_ready(ReactorWaiter* w) noexcept {
    w->next_ = nullptr;
    if (ready_tail_ != nullptr) {
      ready_tail_->next_ = w;
    } else {
      ready_head_ = w;
    }
    ready_tail_ = w;
    // Release: pairs with has_ready()'s acquire in the scanner's park predicate.
    has_ready_.store(true, std::memory_order_release);
  }

  std::mutex mu_;
  Ticket* pending_head_ = nullptr;
  ReactorWaiter* ready_head_ = nullptr;
  ReactorWaiter* ready_tail_ = nullptr;
  std::atomic<std::size_t> pending_{0};
  std::atomic<bool> has_ready_{false};
  bool closed_ = false;
  wake_fn wake_;
  void* wake_ctx_;
};

}  // namespace xlogrt::detail
