// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reactor<Driver>: tells host code that a stream has reached a point, by callback,
// std::future or C++20 coroutine, without a driver call on the waiting side.
//
// ---- How it works ----------------------------------------------------------------------
//
// Arming a wait on a stream claims a completion slot (SlotTable), clears the slot's flag,
// enqueues cuStreamWriteValue32(flag, 1) on the stream — so the device writes the flag
// once everything enqueued before it has run — and publishes the waiter on the slot. One
// scanner thread polls the flags of armed slots (plain loads of pinned host memory) and
// completes the waiters whose flags are set. When no slot is free, or the device cannot
// write flags from a stream (DeviceInfo::stream_mem_ops or map_host_memory false), the
// wait is enqueued as a host function instead (cuLaunchHostFunc): correct, slower, and
// counted as a fallback. Either way the waiter is completed on the scanner thread.
// One more cost of the fallback: CUDA queues only a few dozen host functions interleaved
// with device work behind one that has not run, and the next enqueue on that stream then
// blocks until the stream moves (bench/HISTORY.md has the observation). Size `slots` for
// the waits an engine keeps in flight, so that the fallback stays rare.
// mark() arms one such completion and returns a StreamPoint that any number of waiters
// attach to, lock-free; the one completion then serves them all (point.hpp).
//
// The parts, each with its own narrative:
// - reactor_options.hpp: the options and the counters;
// - slot_table.hpp and pinned_flags.hpp: the completion slots and their flags;
// - detail/reactor_fallback.hpp: the host-function path;
// - detail/reactor_idle.hpp: the scanner's idle policy (spin, yield, nap, park);
// - detail/reactor_parker.hpp: where the scanner parks and how a registration wakes it;
// - detail/stream_faults.hpp: the fault probe's verdicts (sticky statuses, failures in a
//   row) and how arm() reads them;
// - detail/slot_waiters.hpp: the mirror of the waiter armed on each slot, through which
//   the probe and the destructor find the waits of a stream, and its orders;
// - detail/reactor_waiter.hpp: the node every delivery form is.
// This file composes them: arming, the scanner's loop, the probe's pass over the armed
// waits, and destruction.
//
// ---- What completion code may do -------------------------------------------------------
//
// Callbacks, future continuations and coroutines resumed inline run on the scanner thread
// (or, during destruction, on the destroying thread), with the device's context current.
// Every other completion of the reactor waits while one runs, so they must be short: they
// may enqueue work on streams, arm new waits on this or another reactor, set promises,
// post to executors. They must not block (on a future of this reactor in particular: that
// deadlocks), must not throw (the scanner is noexcept), and must not destroy the reactor.

#include <pthread.h>
#include <time.h>

#include <atomic>
#include <bitset>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "xlogrt/core/atomics.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/reactor/awaitable.hpp"
#include "xlogrt/reactor/detail/reactor_counters.hpp"
#include "xlogrt/reactor/detail/reactor_fallback.hpp"
#include "xlogrt/reactor/detail/reactor_idle.hpp"
#include "xlogrt/reactor/detail/reactor_parker.hpp"
#include "xlogrt/reactor/detail/reactor_waiter.hpp"
#include "xlogrt/reactor/detail/slot_waiters.hpp"
#include "xlogrt/reactor/detail/stream_faults.hpp"
#include "xlogrt/reactor/future_error.hpp"
#include "xlogrt/reactor/pinned_flags.hpp"
#include "xlogrt/reactor/point.hpp"
#include "xlogrt/reactor/reactor_options.hpp"
#include "xlogrt/reactor/slot_table.hpp"

namespace xlogrt {

/// The completion reactor of one device's streams (see the file comment).
///
/// Thread-safe. arm(), on_done(), when_done(), when_done_future(), mark(), counters() and
/// the accessors may be called from any thread, completion code included. Destruction must
/// happen-after every other call has returned, and not on the scanner thread.
///
/// Destruction completes every waiter exactly once: those whose point was reached with
/// success, the others with errc::cancelled. If waits were still armed and their streams
/// not idle, the flag memory is leaked rather than freed under the device's pending
/// writes.
template <Driver D>
class Reactor {
 public:
  using driver_type = D;
  using stream_t = typename D::stream_t;
  static constexpr std::size_t MAX_SLOTS = REACTOR_MAX_SLOTS;
  /// Probes in a row whose query of a stream fails with a status that is not sticky
  /// before the stream counts as faulted (see detail/stream_faults.hpp).
  static constexpr std::uint8_t QUERY_FAILURES_TO_FAULT =
      detail::StreamFaults<StreamPool<D>::MAX_STREAMS>::QUERY_FAILURES_TO_FAULT;

  /// A reactor over the streams of `streams`, with its scanner thread started.
  /// Errors: invalid_argument (null pool, options out of range), the driver's (making
  /// the context current, allocating the flags), out_of_memory (host), driver_error when
  /// the scanner thread cannot be started.
  static result<std::unique_ptr<Reactor>> create(std::shared_ptr<StreamPool<D>> streams,
                                                 ReactorOptions options = {}) noexcept {
    if (!streams) return error{errc::invalid_argument, "Reactor::create needs a stream pool"};
    if (auto checked = check_reactor_options(options); !checked) return std::move(checked).error();
    const auto& device = streams->device();
    if (auto r = device->make_current(); !r) return std::move(r).error();
    std::unique_ptr<Reactor> self(new (std::nothrow) Reactor(std::move(streams), options));
    if (!self) return error{errc::out_of_memory, "host allocation of a Reactor failed"};
    if (auto r = self->init(); !r) return std::move(r).error();
    return self;
  }

  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  ~Reactor() {
    if (!hub_) return;  // create() failed before anything could be armed
    closing_.store(true, std::memory_order_release);
    stop_.store(true, std::memory_order_release);
    (void)parker_.wake();  // after the store: the parker's busy() reads stop_
    if (scanner_.joinable()) scanner_.join();
    (void)device_->make_current();
    drain();  // what was reached completes with success
    std::bitset<StreamPool<D>::MAX_STREAMS> still_armed;
    if (table_) {
      for (std::size_t i = 0; i < table_->capacity(); ++i) {
        if (detail::ReactorWaiter* w = armed_waiters_.take(i)) {
          still_armed.set(w->stream_);
          cancel(w);
        }
      }
    }
    auto [ready, pending] = hub_->close();
    deliver_list(ready, [](std::uint32_t) { return result<void>{}; });
    for (detail::ReactorWaiter* w = pending; w != nullptr;) {
      detail::ReactorWaiter* next = w->next_;
      cancel(w);
      w = next;
    }
    if (still_armed.any() && !streams_idle(still_armed)) table_->flags().leak();
  }

  // --- Arming ---------------------------------------------------------------------------

  /// Calls `fn(result<void>)` once `stream` has reached this point (all work enqueued on
  /// it before this call has run), or with the error that ended the wait (stream_fault,
  /// cancelled). On the scanner thread: see "What completion code may do".
  /// Errors (fn is then never called): unknown_stream; stream_fault for a stream already
  /// found faulted; cancelled while the reactor is being destroyed; out_of_memory; the
  /// driver's, when the flag write or host function cannot be enqueued.
  template <class F>
    requires std::is_invocable_v<std::decay_t<F>&, result<void>>
  result<void> on_done(StreamId stream, F&& fn) noexcept {
    auto* node = detail::make_callback_waiter(std::forward<F>(fn));
    if (node == nullptr) return error{errc::out_of_memory, "host allocation of a callback failed"};
    auto armed = arm(stream, *node);
    if (!armed) delete node;
    return armed;
  }

  /// A future that becomes ready once `stream` has reached this point. Its get() returns,
  /// or throws FutureError holding the error that ended the wait (stream_fault,
  /// cancelled). Errors: as for on_done().
  result<std::future<void>> when_done_future(StreamId stream) noexcept {
    std::future<void> f;
    auto* node = detail::FutureWaiter::make(f);
    if (node == nullptr) return error{errc::out_of_memory, "host allocation of a promise failed"};
    auto armed = arm(stream, *node);
    if (!armed) {
      delete node;
      return std::move(armed).error();
    }
    return f;
  }

  /// `co_await reactor.when_done(stream)`: resumes the coroutine on the scanner thread
  /// with the wait's result<void> (see awaitable.hpp).
  WhenDone<Reactor> when_done(StreamId stream) noexcept { return WhenDone<Reactor>(*this, stream); }

  /// `co_await reactor.when_done(stream, executor)`: resumes it through executor.post().
  WhenDone<Reactor> when_done(StreamId stream, ExecutorRef executor) noexcept {
    return WhenDone<Reactor>(*this, stream, executor);
  }

  /// Arms one completion at this point of `stream` (as on_done would) and returns a
  /// handle that any number of waiters may attach to, from any thread, before or after
  /// the point is reached: they all complete from that one flag write (see point.hpp).
  /// Errors: as for on_done(); out_of_memory for the point's state.
  result<StreamPoint> mark(StreamId stream) noexcept {
    auto* state = new (std::nothrow) detail::PointState(stream, &coalesced_);
    if (state == nullptr) {
      return error{errc::out_of_memory, "host allocation of a StreamPoint failed"};
    }
    StreamPoint point = StreamPoint::adopt(state);
    if (auto armed = arm(stream, *state); !armed) {
      state->release();  // the completion's reference: nothing was armed
      return std::move(armed).error();
    }
    return point;
  }

  /// The primitive under the delivery forms: arms `w` on `stream`; on success the reactor
  /// calls w.finish() exactly once, later, and the caller must not touch `w` until then.
  /// Errors: as for on_done(); `w` is then untouched and still the caller's.
  result<void> arm(StreamId stream, detail::ReactorWaiter& w) noexcept {
    if (closing_.load(std::memory_order_acquire)) [[unlikely]] {
      return error{errc::cancelled, "cannot wait on stream " + std::to_string(stream.value) +
                                        ": the reactor is being destroyed"};
    }
    auto s = streams_->get(stream);
    if (!s) [[unlikely]] return std::move(s).error();
    if (faults_.faulted(stream.value)) [[unlikely]] return faults_.error_of(stream.value);
    // No make_current: the flag write and the host function name their stream, which
    // carries its context (a cuCtxGetCurrent per arm would cost more than the rest).
    w.stream_ = stream.value;
    w.faulted_ = false;
    if (table_) {
      if (auto slot = table_->claim()) {
        table_->reset_flag(*slot);
        auto r = driver_->stream_write_value32(*s, table_->flags().device_address(*slot), 1);
        if (!r) [[unlikely]] {
          (void)table_->release(*slot);
          return arm_failure(std::move(r).error(), stream);
        }
        w.slot_ = static_cast<std::uint32_t>(*slot);
        armed_waiters_.publish(*slot, &w);
        armed_.add();
        if (table_->publish(*slot, &w)) wake();
        return ok();
      }
    }
    return arm_host_func(*s, stream, w);
  }

  // --- Observing ------------------------------------------------------------------------

  ReactorCounters counters() const noexcept {
    ReactorCounters c;
    c.armed = armed_.value();
    c.fallbacks = fallbacks_.value();
    c.completed = completed_.load(std::memory_order_relaxed);
    c.faulted = faulted_count_.load(std::memory_order_relaxed);
    c.cancelled = cancelled_.load(std::memory_order_relaxed);
    c.wakeups = wakeups_.load(std::memory_order_relaxed);
    c.parks = parker_.sleeps();
    c.probes = probes_.load(std::memory_order_relaxed);
    c.coalesced = coalesced_.load(std::memory_order_relaxed);
    return c;
  }

  /// Whether waits are armed with flag writes (false: every wait is a host function).
  bool uses_flag_writes() const noexcept { return table_.has_value(); }
  /// Completion slots (0 when uses_flag_writes() is false).
  std::size_t slots() const noexcept { return table_ ? table_->capacity() : 0; }
  const ReactorOptions& options() const noexcept { return options_; }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return streams_; }

  /// CPU time the scanner thread has used so far (0 if it cannot be read).
  std::chrono::nanoseconds scanner_cpu_time() const noexcept {
    clockid_t id{};
    timespec ts{};
    if (!scanner_.joinable() ||
        pthread_getcpuclockid(const_cast<std::thread&>(scanner_).native_handle(), &id) != 0 ||
        clock_gettime(id, &ts) != 0) {
      return std::chrono::nanoseconds{0};
    }
    return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
  }

 private:
  using Table = SlotTable<detail::ReactorWaiter*, PinnedFlags<D>, StdAtomics>;
  using clock = std::chrono::steady_clock;
  static constexpr std::size_t MAX_STREAMS = StreamPool<D>::MAX_STREAMS;

  Reactor(std::shared_ptr<StreamPool<D>> streams, const ReactorOptions& options) noexcept
      : streams_(std::move(streams)),
        device_(streams_->device()),
        driver_(&device_->driver()),
        options_(options) {}

  result<void> init() noexcept {
    try {
      hub_ = std::make_shared<detail::FallbackHub>(&wake_thunk, this);
      faults_.allocate();
      const DeviceInfo& info = device_->info();
      if (options_.flag_writes && info.stream_mem_ops && info.map_host_memory) {
        auto flags = PinnedFlags<D>::create(*driver_, options_.slots);
        if (!flags) return std::move(flags).error();
        table_.emplace(options_.slots, std::move(*flags));
        armed_waiters_.allocate(options_.slots);
        woken_.reserve(options_.slots);
      }
    } catch (const std::bad_alloc&) {
      return error{errc::out_of_memory, "host allocation of the reactor's tables failed (" +
                                            std::to_string(options_.slots) + " slots)"};
    }
    try {
      scanner_ = std::thread([this] { run(); });
    } catch (const std::exception& e) {
      return error{errc::driver_error, std::string("the reactor's scanner thread could not be "
                                                   "started: ") + e.what()};
    }
    return ok();
  }

  error arm_failure(error e, StreamId stream) const {
    std::string m = e.message();
    m += " (arming a completion on stream " + std::to_string(stream.value) + " of ordinal " +
         std::to_string(device_->ordinal()) + ")";
    return error{e.code(), std::move(m), e.driver_status()};
  }

  result<void> arm_host_func(stream_t s, StreamId stream, detail::ReactorWaiter& w) noexcept {
    bool first = false;
    bool closed = false;
    detail::FallbackHub::Ticket* t = detail::FallbackHub::open(hub_, w, first, closed);
    if (t == nullptr) {
      if (closed) {
        return error{errc::cancelled, "cannot wait on stream " + std::to_string(stream.value) +
                                          ": the reactor is being destroyed"};
      }
      return error{errc::out_of_memory, "host allocation of a host-function wait failed"};
    }
    auto r = driver_->launch_host_func(s, &detail::FallbackHub::trampoline, t);
    if (!r) [[unlikely]] {
      // Unless a fault probe or the destructor ended the wait meanwhile (then it is over,
      // and its waiter has had its one completion), the failure is the caller's to see.
      if (detail::FallbackHub::abandon(t)) return arm_failure(std::move(r).error(), stream);
      return ok();
    }
    armed_.add();
    fallbacks_.add();
    if (first) wake();
    return ok();
  }

  void wake() noexcept {
    if (parker_.wake()) wakeups_.fetch_add(1, std::memory_order_relaxed);
  }
  static void wake_thunk(void* self) noexcept { static_cast<Reactor*>(self)->wake(); }

  // --- The scanner ----------------------------------------------------------------------

  void run() noexcept {
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "xlogrt-reactor");
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // naps of microseconds, not 50 us more
#endif
    (void)device_->make_current();
    const detail::ScannerIdle idle_policy(options_);
    clock::time_point last_progress = clock::now();
    clock::time_point next_probe = last_progress + options_.probe_every;
    for (;;) {
      const bool progress = drain();
      if (stop_.load(std::memory_order_acquire)) return;
      const clock::time_point now = clock::now();
      if (now >= next_probe) {
        probe();
        next_probe = now + options_.probe_every;
      }
      if (progress) {
        last_progress = now;
        continue;
      }
      const auto idle = now - last_progress;
      const detail::IdlePhase phase = idle_policy.phase(idle);
      if (phase == detail::IdlePhase::spin) {
        // A flag is noticed only between passes; the clock is read once per spin().
        if (idle_policy.spin([this] { return drain(); })) last_progress = clock::now();
        continue;
      }
      if (phase == detail::IdlePhase::yield) {
        idle_policy.yield();
        continue;
      }
      if (table_ && !table_->is_idle()) {
        idle_policy.nap(idle);
        continue;
      }
      // Nothing armed with a flag. Host-function waits may be pending: they wake the
      // scanner when they run, but a faulted stream never runs them, so sleep no longer
      // than a probe period then.
      const bool timed = hub_->pending() != 0;
      const auto busy = [this, timed] {
        return stop_.load(std::memory_order_acquire) || (table_ && !table_->is_idle()) ||
               hub_->has_ready() || (!timed && hub_->pending() != 0);
      };
      const detail::ParkResult how = parker_.park(busy, timed ? &options_.probe_every : nullptr);
      // A timed-out sleep found nothing to do: go back to sleep after the probe, without
      // another spin. Anything else may be the start of a busy period: spin again.
      if (how != detail::ParkResult::timed_out) last_progress = clock::now();
    }
  }

  /// One pass over both paths; true when anything completed.
  bool drain() noexcept {
    bool any = false;
    if (table_) {
      woken_.clear();
      try {
        // capacity reserved for every slot: cannot throw
        table_->scan_once(woken_, [this](std::size_t slot) noexcept { armed_waiters_.warm(slot); });
      } catch (...) {
      }
      for (detail::ReactorWaiter* w : woken_) retire(w);
      any = !woken_.empty();
    }
    if (hub_->has_ready()) {
      detail::ReactorWaiter* ready = hub_->take_ready();
      any = any || ready != nullptr;
      deliver_list(ready, [](std::uint32_t) { return result<void>{}; });
    }
    return any;
  }

  /// A waiter whose slot the scanner retired: its flag was written by the device, or by
  /// the fault probe.
  void retire(detail::ReactorWaiter* w) noexcept {
    armed_waiters_.clear(w);
    if (w->faulted_) {
      faulted_count_.fetch_add(1, std::memory_order_relaxed);
      deliver(w, faults_.error_of(w->stream_));
    } else {
      deliver(w, ok());
    }
  }

  void deliver(detail::ReactorWaiter* w, result<void> r) noexcept {
    // One writer at a time (the scanner, then the destructor after joining it): a plain
    // increment, not a read-modify-write that would wait for the stores before it.
    completed_.store(completed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    w->finish(std::move(r));
  }

  template <class Outcome>
  void deliver_list(detail::ReactorWaiter* w, Outcome&& outcome) noexcept {
    while (w != nullptr) {
      detail::ReactorWaiter* next = w->next_;
      deliver(w, outcome(w->stream_));
      w = next;
    }
  }

  void cancel(detail::ReactorWaiter* w) noexcept {
    cancelled_.fetch_add(1, std::memory_order_relaxed);
    deliver(w, error{errc::cancelled, "the reactor was destroyed before stream " +
                                          std::to_string(w->stream_) + " of ordinal " +
                                          std::to_string(device_->ordinal()) +
                                          " reached the awaited point"});
  }

  /// Queries every stream with an armed wait; a failed query faults the stream's waits.
  void probe() noexcept {
    std::bitset<MAX_STREAMS> armed;
    if (table_) {
      for (std::size_t i = 0; i < table_->capacity(); ++i) {
        if (const detail::ReactorWaiter* w = armed_waiters_.armed(i)) {
          armed.set(w->stream_);
        }
      }
    }
    hub_->for_each_pending([&armed](std::uint32_t s) { armed.set(s); });
    if (armed.none()) return;
    probes_.fetch_add(1, std::memory_order_relaxed);
    for (std::size_t s = 0; s < MAX_STREAMS; ++s) {
      if (!armed.test(s)) continue;
      const auto stream = static_cast<std::uint32_t>(s);
      if (faults_.unsynchronized_faulted(stream)) {  // waits armed since the fault
        fail_stream(stream);
        continue;
      }
      auto h = streams_->get(StreamId{stream});
      if (!h) continue;
      auto q = driver_->stream_query(*h);
      if (q) {
        faults_.query_ok(stream);
        continue;
      }
      if (faults_.query_failed(stream, q.error(), device_->ordinal())) fail_stream(stream);
    }
  }

  /// Completes every wait armed on faulted stream `s` with its fault.
  void fail_stream(std::uint32_t s) noexcept {
    if (table_) {
      for (std::size_t i = 0; i < table_->capacity(); ++i) {
        detail::ReactorWaiter* w = armed_waiters_.armed(i);
        if (w == nullptr || w->stream_ != s || w->faulted_) continue;
        auto& word = table_->flags().word(i);
        if (StdAtomics::load_flag(word, std::memory_order_acquire) != 0) continue;  // reached
        // The waiter is armed, so its slot cannot change hands before the scanner (this
        // thread) retires it: setting the flag makes the next pass retire it.
        w->faulted_ = true;
        StdAtomics::store_flag(word, 1, std::memory_order_release);
      }
    }
    // A sticky status: the context is gone, its host functions never run, and the hub
    // frees their tickets when it closes (detail/reactor_fallback.hpp).
    detail::ReactorWaiter* w = hub_->take_stream(s, status::sticky(faults_.error_of(s).driver_status()));
    while (w != nullptr) {
      detail::ReactorWaiter* next = w->next_;
      faulted_count_.fetch_add(1, std::memory_order_relaxed);
      deliver(w, faults_.error_of(s));
      w = next;
    }
  }

  /// True when every stream in `set` reports all its work done.
  bool streams_idle(const std::bitset<MAX_STREAMS>& set) noexcept {
    for (std::size_t s = 0; s < MAX_STREAMS; ++s) {
      if (!set.test(s)) continue;
      auto h = streams_->get(StreamId{static_cast<std::uint32_t>(s)});
      if (!h) return false;
      auto q = driver_->stream_query(*h);
      if (!q || !*q) return false;
    }
    return true;
  }

  // Immutable after create().
  std::shared_ptr<StreamPool<D>> streams_;
  std::shared_ptr<Device<D>> device_;
  D* driver_;
  ReactorOptions options_;
  std::optional<Table> table_;
  detail::SlotWaiters armed_waiters_;
  std::vector<detail::ReactorWaiter*> woken_;  // the scanner's
  std::shared_ptr<detail::FallbackHub> hub_;

  // Faults: written once per stream by the scanner, read by arm().
  detail::StreamFaults<MAX_STREAMS> faults_;

  // Registrant-side counters.
  detail::ReactorStripedCount armed_;
  detail::ReactorStripedCount fallbacks_;
  std::atomic<std::uint64_t> wakeups_{0};
  // Scanner-side counters (and the destructor's, after the scanner has stopped).
  alignas(64) std::atomic<std::uint64_t> completed_{0};  // the scanner's; off arm()'s lines
  std::atomic<std::uint64_t> faulted_count_{0};
  std::atomic<std::uint64_t> cancelled_{0};
  std::atomic<std::uint64_t> probes_{0};
  std::atomic<std::uint64_t> coalesced_{0};  // bumped by points' completions

  alignas(64) std::atomic<bool> closing_{false};  // read by every arm()
  std::atomic<bool> stop_{false};
  detail::Parker<StdAtomics> parker_;
  std::thread scanner_;
};

}  // namespace xlogrt
