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
// unlinked and leave the waiter alone. A ticket holds the hub by shared_ptr, so a host
// function that runs after the reactor is gone still finds the mutex it needs.
//
// Who frees a ticket, exactly once:
//   - the registrant, when the launch failed (abandon());
//   - else the trampoline, whenever it runs, whoever ended the wait;
//   - else, for a ticket the fault probe ended on a stream whose context is gone (a
//     sticky status), the hub's close(), that is the reactor's destructor: CUDA never
//     calls the host functions of a faulted context (cuLaunchHostFunc, unlike
//     cuStreamAddCallback, is not called "in the event of an error in the CUDA
//     context"), so the trampoline would never free it, and the ticket, holding the hub,
//     would keep both for ever. The probe moves such a ticket to the hub's list of
//     orphans (`orphaned`, under the mutex); the trampoline, abandon() and close() each
//     take it out of that list under the mutex before they free it, so only one does.
//     close() frees orphans, not the probe: a host function that the driver had already
//     started when the context faulted may still be running on its thread, and by the
//     reactor's destruction it is long over.
// A ticket the probe ends on a stream that merely could not be queried (no sticky status)
// stays the trampoline's: such a stream may still run its host functions, and freeing the
// ticket under it would be a use after free; if it never runs, the ticket is lost, as a
// ticket cancelled by close() on a stream that never reaches it is.
// tickets_alive() counts the tickets allocated and not yet freed, process-wide: what a
// leak check reads.
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
    Ticket* prev = nullptr;  // in the pending list while linked, in the orphans while orphaned
    Ticket* next = nullptr;
    bool linked = false;
    bool orphaned = false;  // ended by the fault probe on a context that is gone: close() frees it
  };

  /// Tickets allocated and not yet freed, in every hub of the process.
  static std::size_t tickets_alive() noexcept { return tickets_alive_.load(std::memory_order_acquire); }

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
    tickets_alive_.fetch_add(1, std::memory_order_relaxed);
    FallbackHub& h = *self;
    std::unique_lock lock(h.mu_);
    if (h.closed_) {
      closed = true;
      lock.unlock();
      free_ticket(t);
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
      } else if (t->orphaned) {
        hub->unlink_orphan(t);
      }
    }
    free_ticket(t);
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
      } else if (t->orphaned) {  // ended by the probe, run after all: this frees it, not close()
        hub->unlink_orphan(t);
      }
    }
    free_ticket(t);
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

  /// Scanner (fault probe): ends every pending wait on `stream`; returns their waiters,
  /// linked. `context_gone`: the stream faulted with a sticky status, so the driver will
  /// never run its host functions, and the tickets become orphans that close() frees.
  ReactorWaiter* take_stream(std::uint32_t stream, bool context_gone) noexcept {
    ReactorWaiter* out = nullptr;
    std::lock_guard lock(mu_);
    for (Ticket* t = pending_head_; t != nullptr;) {
      Ticket* next = t->next;
      if (t->waiter->stream_ == stream) {
        unlink(t);
        t->waiter->next_ = out;
        out = t->waiter;
        if (context_gone) link_orphan(t);
      }
      t = next;
    }
    return out;
  }

  /// Destructor: no more tickets, no more wakes; frees the orphans. Returns the ready
  /// waiters (reached) and the pending ones (to cancel), each linked.
  std::pair<ReactorWaiter*, ReactorWaiter*> close() noexcept {
    Ticket* orphans = nullptr;
    ReactorWaiter* ready = nullptr;
    ReactorWaiter* pending = nullptr;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      ready = ready_head_;
      ready_head_ = ready_tail_ = nullptr;
      has_ready_.store(false, std::memory_order_relaxed);
      while (Ticket* t = pending_head_) {
        unlink(t);
        t->waiter->next_ = pending;
        pending = t->waiter;
      }
      orphans = orphans_head_;
      orphans_head_ = nullptr;
      for (Ticket* t = orphans; t != nullptr; t = t->next) t->orphaned = false;
    }
    // Outside the mutex: a ticket's shared_ptr may hold the hub (never the last one here:
    // the reactor holds it while it closes).
    while (orphans != nullptr) {
      Ticket* next = orphans->next;
      free_ticket(orphans);
      orphans = next;
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
  // An ended ticket that only close() (or its trampoline, if it runs after all) frees.
  void link_orphan(Ticket* t) noexcept {
    t->prev = nullptr;
    t->next = orphans_head_;
    if (orphans_head_ != nullptr) orphans_head_->prev = t;
    orphans_head_ = t;
    t->orphaned = true;
  }
  void unlink_orphan(Ticket* t) noexcept {
    if (t->prev != nullptr) {
      t->prev->next = t->next;
    } else {
      orphans_head_ = t->next;
    }
    if (t->next != nullptr) t->next->prev = t->prev;
    t->prev = t->next = nullptr;
    t->orphaned = false;
  }
  static void free_ticket(Ticket* t) noexcept {
    delete t;
    tickets_alive_.fetch_sub(1, std::memory_order_release);
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
  Ticket* orphans_head_ = nullptr;
  ReactorWaiter* ready_head_ = nullptr;
  ReactorWaiter* ready_tail_ = nullptr;
  std::atomic<std::size_t> pending_{0};
  std::atomic<bool> has_ready_{false};
  bool closed_ = false;
  wake_fn wake_;
  void* wake_ctx_;
  static inline std::atomic<std::size_t> tickets_alive_{0};
};

}  // namespace xlogrt::detail
