// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reactor waits for the stack harness (stack_harness.hpp): a Reactor over the harness's
// stream pool, on the same manual-mode SimDriver, and the waits armed through it, each
// checked to complete exactly once, with the right outcome, after the stream work it
// waited for.
//
// The scanner thread and a manual-mode simulator. The reactor needs no executor thread:
// its flag writes and host functions are stream operations like any other, which run
// when the harness steps the simulator (or a synchronising call of a stack runs them),
// and the scanner only reads the flags in host memory. The scanner is a real thread,
// though, so the harness keeps it away from the driver, whose injected failures count
// calls: it waits until the scanner has made its context current (its one driver call
// when it starts), and the fault probe's period is longer than any run, so no probe
// queries a stream during one. Every other driver call of the reactor (arming, the
// destructor's make_current and stream queries) is on the harness's thread, so an input
// decodes to the same calls and the same injected failures on every run. Completions run
// on the scanner; they record their outcome under a mutex, and the harness checks the
// records when it settles the waits (after running every stream dry) or destroys the
// reactor. The probe's verdicts on failed queries are tested in test/reactor_rt, where
// their timing is the test's.
//
// What is checked:
// - an arm that fails returns a named error (unknown_stream for a stream outside the
//   pool, the driver's status only while a failure is injected) and its callback never
//   runs;
// - a wait completes at most once, with success only after the marker kernel enqueued
//   just before it has run, and with an error only as the reactor is destroyed
//   (errc::cancelled: no probe runs, so no stream_fault);
// - once every stream has run dry, every wait completes (with success);
// - destroying the reactor completes every wait still armed, exactly once, and its
//   counters agree with the records; with no wait left armed it frees its flags;
// - at the end, with the reactor gone, the host functions left in the streams run and
//   free their tickets (LeakSanitizer sees the rest).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/reactor/reactor.hpp>

#include "fuzz_check.hpp"

namespace xlogrt::fuzz {

/// The harness's reactor and its waits. `named(error, op, allowed)` is the harness's
/// check that an error is named and allowed.
///
/// Not thread-safe: the harness's, but for the completions, which take the mutex.
class ReactorWaits {
 public:
  using Named = std::function<void(const error&, const char*, std::initializer_list<errc>)>;

  ReactorWaits(SimDriver& sim, std::shared_ptr<StreamPool<SimDriver>> streams, std::uint32_t n_streams, Named named)
      : sim_(sim), streams_(std::move(streams)), n_streams_(n_streams), named_(std::move(named)) {}
  ReactorWaits(const ReactorWaits&) = delete;
  ReactorWaits& operator=(const ReactorWaits&) = delete;
  ~ReactorWaits() { destroy(); }

  /// Creates the reactor unless there is one: `slots` completion slots (few, so that the
  /// host-function fallback is reached too), with flag writes or not.
  void create(std::size_t slots, bool flag_writes) {
    if (reactor_) return;
    ReactorOptions o;
    o.slots = slots;
    o.flag_writes = flag_writes;
    o.spin_for = std::chrono::nanoseconds{0};  // the harness thread needs the core more
    o.yield_for = std::chrono::nanoseconds{0};
    o.nap_max = std::chrono::microseconds(20);
    o.probe_every = std::chrono::hours(24);  // no probe during a run: see the file comment
    const std::int64_t before = sim_.calls("cuCtxSetCurrent");
    auto r = Reactor<SimDriver>::create(streams_, o);
    if (!r) {
      named_(r.error(), "Reactor::create", {});
      return;
    }
    // The scanner's make_current, after create's own: wait for it, so that it cannot take
    // an injected failure meant for a later call of the harness.
    while (sim_.calls("cuCtxSetCurrent") < before + 2) std::this_thread::yield();
    reactor_ = std::move(*r);
  }
  bool alive() const { return reactor_ != nullptr; }

  /// Arms a wait on `stream` (it may be outside the pool) of form `form`: 0 a callback,
  /// 1 a future, 2 a StreamPoint with `extra` + 1 callbacks attached.
  void arm(std::uint32_t stream, unsigned form, unsigned extra) {
    if (!reactor_) return;
    Wait& w = waits_.emplace_back();
    w.stream = stream;
    if (stream < n_streams_) {
      auto s = streams_->get(StreamId{stream});
      if (!s) named_(s.error(), "StreamPool::get", {});
      if (s) {
        // Shared with the kernel, which may outlive the record (a wait cancelled first).
        auto mark = std::make_shared<std::atomic<bool>>(false);
        w.marker = mark;
        auto k = sim_.launch_kernel(*s, std::span<const SimAccess>{},
                                    [mark](std::span<std::byte* const>) { mark->store(true, std::memory_order_release); },
                                    "wait marker");
        if (!k) {
          named_(k.error(), "cuLaunchKernel", {});
        } else {
          w.has_marker = true;
        }
      }
    }
    const auto was_armed = reactor_->counters().armed;
    result<void> armed = ok();
    if (form == 0) {
      {
        std::lock_guard lk(mu_);
        w.callbacks = 1;  // before the arm: the callback may run before it returns
      }
      armed = reactor_->on_done(StreamId{stream}, [this, p = &w](result<void> r) { done(*p, std::move(r)); });
    } else if (form == 1) {
      auto f = reactor_->when_done_future(StreamId{stream});
      if (f) {
        w.future = std::move(*f);
      } else {
        armed = std::move(f).error();
      }
    } else {
      auto p = reactor_->mark(StreamId{stream});
      if (p) {
        w.point = *p;
        for (unsigned k = 0; k <= extra; ++k) attach(w);
      } else {
        armed = std::move(p).error();
      }
    }
    if (!armed) {
      named_(armed.error(), "arming a reactor wait", {errc::unknown_stream});
      XF_CHECK(stream >= n_streams_ || armed.error().driver_status() != 0,
               "arming a wait on stream " + std::to_string(stream) + " failed: " + armed.error().what());
      XF_CHECK(reactor_->counters().armed == was_armed, "a failed arm was counted as armed");
      waits_.pop_back();
      return;
    }
    XF_CHECK(stream < n_streams_, "a wait on stream " + std::to_string(stream) + " was armed");
  }

  /// One more callback on the latest StreamPoint, reached or not (a late one completes
  /// at once, on this thread).
  void attach_late() {
    for (std::size_t i = waits_.size(); i-- > 0;) {
      if (waits_[i].point) {
        attach(waits_[i]);
        return;
      }
    }
  }

  /// Runs every stream dry; then every wait completes, with success.
  void settle() {
    if (!reactor_) return;
    sim_.run_until_idle();
    for (std::size_t i = 0; i < waits_.size(); ++i) {
      Wait& w = waits_[i];
      if (w.future.valid()) {
        w.future.wait();
        try {
          w.future.get();
        } catch (const FutureError& e) {
          broken("a future wait on stream " + std::to_string(w.stream) + " failed with the reactor alive: " + e.error().what());
        }
        XF_CHECK(!w.has_marker || w.marker->load(std::memory_order_acquire),
                 "a future became ready before the work it waited for ran");
      }
    }
    std::unique_lock lk(mu_);
    const bool all = cv_.wait_for(lk, std::chrono::seconds(60), [&] {
      return std::all_of(waits_.begin(), waits_.end(), [](const Wait& w) { return w.completions == w.callbacks; });
    });
    XF_CHECK(all, "a reactor wait did not complete within a minute of its stream running dry");
    lk.unlock();
    waits_.clear();
  }

  /// Destroys the reactor: every wait still armed completes exactly once (success if its
  /// point was reached, cancelled if not).
  void destroy() {
    if (!reactor_) return;
    const bool none_left = [&] {
      std::lock_guard lk(mu_);
      for (auto& w : waits_) {
        if (w.completions != w.callbacks) return false;
        if (w.future.valid() && w.future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
      }
      return true;
    }();
    const bool flags = reactor_->uses_flag_writes();
    const std::int64_t frees = sim_.calls("cuMemFreeHost");
    closing_.store(true, std::memory_order_relaxed);
    reactor_.reset();
    closing_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard lk(mu_);
      for (auto& w : waits_) {
        XF_CHECK(w.completions == w.callbacks, "a wait on stream " + std::to_string(w.stream) +
                                                   " had not completed when its reactor was gone");
      }
    }
    for (auto& w : waits_) {
      if (!w.future.valid()) continue;
      XF_CHECK(w.future.wait_for(std::chrono::seconds(0)) == std::future_status::ready,
               "a future was not ready when its reactor was gone");
      try {
        w.future.get();
        XF_CHECK(!w.has_marker || w.marker->load(std::memory_order_acquire),
                 "a future became ready before the work it waited for ran");
      } catch (const FutureError& e) {
        XF_CHECK(e.error().code() == errc::cancelled, "a future wait ended with " + e.error().what());
      }
    }
    // With no wait left armed there is no flag write the device may still do: the flags
    // must have been freed.
    if (flags && none_left) {
      XF_CHECK(sim_.calls("cuMemFreeHost") == frees + 1, "a reactor with no wait armed did not free its flags");
    }
    waits_.clear();
  }

 private:
  struct Wait {
    std::uint32_t stream = 0;
    std::shared_ptr<std::atomic<bool>> marker;  // set by the marker kernel when it runs
    bool has_marker = false;
    unsigned callbacks = 0;    // expected completions (callbacks attached)
    unsigned completions = 0;  // under mu_
    std::future<void> future;
    StreamPoint point;
  };

  void attach(Wait& w) {
    {
      std::lock_guard lk(mu_);
      ++w.callbacks;
    }
    auto r = w.point.on_done([this, p = &w](result<void> res) { done(*p, std::move(res)); });
    if (!r) {
      named_(r.error(), "StreamPoint::on_done", {});
      std::lock_guard lk(mu_);
      --w.callbacks;
    }
  }

  /// A completion, on the scanner (or on the destroying or attaching thread).
  void done(Wait& w, result<void> r) {
    std::lock_guard lk(mu_);
    ++w.completions;
    XF_CHECK(w.completions <= w.callbacks, "a wait on stream " + std::to_string(w.stream) + " completed twice");
    if (r) {
      XF_CHECK(!w.has_marker || w.marker->load(std::memory_order_acquire),
               "a wait on stream " + std::to_string(w.stream) + " completed before the work it waited for ran");
    } else {
      XF_CHECK(r.error().code() == errc::cancelled && closing_.load(std::memory_order_relaxed),
               "a wait on stream " + std::to_string(w.stream) + " ended with " + r.error().what());
    }
    cv_.notify_all();
  }

  SimDriver& sim_;
  std::shared_ptr<StreamPool<SimDriver>> streams_;
  std::uint32_t n_streams_;
  Named named_;
  std::deque<Wait> waits_;  // stable addresses: completions and markers hold pointers
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> closing_{false};
  std::unique_ptr<Reactor<SimDriver>> reactor_;
};

}  // namespace xlogrt::fuzz
