// SPDX-License-Identifier: Apache-2.0
#pragma once

// Reactor scenarios written once over the driver, run on SimDriver (test_reactor_sim.cpp,
// suite 'host', also under ASan+UBSan and TSan) and on the real GPU (gpu_reactor.cpp,
// suite 'gpu').
//
// Completion code runs on the reactor's scanner thread, where Catch2's assertions must
// not be used (they are not thread-safe): completions record into a Tally, and the test
// thread checks the tally once every wait has ended.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "xlogrt/device/device.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/reactor/awaitable.hpp"
#include "xlogrt/reactor/reactor.hpp"

namespace reactor_rt {

using namespace xlogrt;
using namespace std::chrono_literals;

/// Polls `done` until it holds or `limit` passes; returns whether it held.
template <class Pred>
bool eventually(Pred&& done, std::chrono::milliseconds limit = 60s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(200us);
  }
  return true;
}

/// A fire-and-forget coroutine: starts at once, frees its frame when it finishes.
struct Detached {
  struct promise_type {
    Detached get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

/// A ResumeExecutor with one thread of its own.
class ThreadExecutor {
 public:
  ThreadExecutor() : thread_([this] { loop(); }) {}
  ~ThreadExecutor() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  // Notifies under the lock: the resumed coroutine may let the owner destroy this
  // executor at once, and the destructor's lock then waits until post() is done with cv_.
  void post(std::coroutine_handle<> h) noexcept {
    std::lock_guard lock(mu_);
    queue_.push_back(h);
    cv_.notify_one();
  }
  std::thread::id id() const noexcept { return thread_.get_id(); }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto h = queue_.front();
      queue_.pop_front();
      lock.unlock();
      h.resume();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::coroutine_handle<>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

/// What the completions of one scenario saw.
struct Tally {
  explicit Tally(std::size_t tokens) : seen(tokens) {}
  std::vector<std::atomic<std::uint32_t>> seen;  // completions per token: must end at 1
  std::atomic<std::uint64_t> done{0};
  std::atomic<std::uint64_t> ok{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> early{0};  // completed before the stream reached the point
  std::atomic<int> last_code{0};

  void record(std::size_t token, const result<void>& r, bool reached) {
    seen[token].fetch_add(1, std::memory_order_relaxed);
    if (r) {
      ok.fetch_add(1, std::memory_order_relaxed);
      if (!reached) early.fetch_add(1, std::memory_order_relaxed);
    } else {
      errors.fetch_add(1, std::memory_order_relaxed);
      last_code.store(static_cast<int>(r.error().code()), std::memory_order_relaxed);
    }
    done.fetch_add(1, std::memory_order_release);
  }
  std::size_t wrong_counts() const {
    std::size_t n = 0;
    for (const auto& s : seen) n += s.load() != 1 ? 1 : 0;
    return n;
  }
};

/// Collects futures: get() on each (which returns once its wait ended), recorded in
/// `tally` as reached when `marker` is null or has counted to `expect`.
inline void collect_futures(std::vector<std::pair<std::future<void>, std::size_t>>& futures,
                            Tally& tally, const std::atomic<std::uint64_t>* marker,
                            std::uint64_t expect) {
  for (auto& [f, tok] : futures) {
    const auto reached = [&] {
      return marker == nullptr || marker->load(std::memory_order_acquire) >= expect;
    };
    try {
      f.get();
      tally.record(tok, ok(), reached());
    } catch (const FutureError& e) {
      tally.record(tok, e.error(), reached());
    }
  }
  futures.clear();
}

/// A host function that counts how far a stream has got.
inline void count_marker(void* p) {
  static_cast<std::atomic<std::uint64_t>*>(p)->fetch_add(1, std::memory_order_acq_rel);
}

/// A host function that holds its stream until opened (or 30 s have passed, so that a
/// failing test cannot hang a driver thread for ever). A test that relies on the hold
/// checks `timed_out` afterwards: a gate that gave up did not hold.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
  void close() noexcept {
    open.store(false);
    timed_out.store(false);
  }
  static void hold(void* p) {
    auto* g = static_cast<Gate*>(p);
    const auto end = std::chrono::steady_clock::now() + 30s;
    while (!g->open.load(std::memory_order_acquire)) {
      if (std::chrono::steady_clock::now() >= end) {
        g->timed_out.store(true, std::memory_order_release);
        return;
      }
      std::this_thread::sleep_for(100us);
    }
  }
};

/// A device, its streams, a reactor, and device memory for work to enqueue.
template <class D>
struct Rig {
  static constexpr std::size_t REGION = 4096;
  D& driver;
  std::shared_ptr<Device<D>> device;
  std::shared_ptr<StreamPool<D>> pool;
  std::unique_ptr<Reactor<D>> reactor;
  std::uint64_t scratch = 0;
  std::size_t n_streams;

  Rig(D& d, ReactorOptions options, std::size_t streams = 4) : driver(d), n_streams(streams) {
    auto dev = Device<D>::open(d, 0);
    REQUIRE(dev);
    device = *dev;
    auto p = StreamPool<D>::create(device, streams);
    REQUIRE(p);
    pool = *p;
    REQUIRE(device->make_current());
    auto m = d.mem_alloc(REGION * streams);
    REQUIRE(m);
    scratch = *m;
    auto r = Reactor<D>::create(pool, options);
    INFO((r ? std::string() : r.error().what()));
    REQUIRE(r);
    reactor = std::move(*r);
  }
  ~Rig() {
    reactor.reset();
    if (device->make_current()) {
      for (std::size_t i = 0; i < n_streams; ++i) (void)driver.stream_synchronize(stream(i));
      (void)driver.mem_free(scratch);
    }
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  typename D::stream_t stream(std::size_t i) const {
    return *pool->get(StreamId{static_cast<std::uint32_t>(i)});
  }
  /// Enqueues a small fill of stream i's own region (streams never share bytes).
  result<void> work(std::size_t i, std::uint8_t v) {
    return driver.memset_d8_async(scratch + i * REGION, v, REGION, stream(i));
  }
};

/// Waits by coroutine and records the outcome.
template <class D>
Detached await_and_record(Reactor<D>& r, StreamId s, ExecutorRef ex, Tally& tally,
                          std::size_t token, const std::atomic<std::uint64_t>* marker,
                          std::uint64_t expect) {
  result<void> got = co_await r.when_done(s, ex);
  const bool reached = marker == nullptr || marker->load(std::memory_order_acquire) >= expect;
  tally.record(token, got, reached);
}

/// Thousands of waits from `threads` threads over every stream of the rig, each thread
/// cycling through callback, future and coroutine delivery. Before some waits a thread
/// enqueues a counting host function; the wait must complete only after it ran.
template <class D>
void many_waiters(Rig<D>& rig, unsigned threads, unsigned per_thread) {
  const std::size_t n_streams = rig.n_streams;
  const std::size_t total = std::size_t{threads} * per_thread;
  Tally tally(total);
  // markers[t * n_streams + s]: host functions of thread t that stream s has run.
  std::vector<std::atomic<std::uint64_t>> markers(threads * n_streams);
  std::atomic<std::uint64_t> arm_failures{0};
  std::atomic<std::uint64_t> future_waits{0};
  Reactor<D>& reactor = *rig.reactor;

  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      if (!rig.device->make_current()) {
        arm_failures.fetch_add(per_thread);
        return;
      }
      std::vector<std::uint64_t> enqueued(n_streams, 0);
      std::vector<std::pair<std::future<void>, std::size_t>> futures;
      for (unsigned i = 0; i < per_thread; ++i) {
        const std::size_t s = (t + i) % n_streams;
        const std::size_t token = std::size_t{t} * per_thread + i;
        auto& marker = markers[t * n_streams + s];
        if (!rig.work(s, static_cast<std::uint8_t>(i))) arm_failures.fetch_add(1);
        if (i % 4 == 0) {
          if (rig.driver.launch_host_func(rig.stream(s), &count_marker, &marker)) ++enqueued[s];
        }
        const std::uint64_t expect = enqueued[s];
        const StreamId sid{static_cast<std::uint32_t>(s)};
        switch (i % 3) {
          case 0: {
            auto r = reactor.on_done(sid, [&tally, &marker, token, expect](result<void> got) {
              tally.record(token, got, marker.load(std::memory_order_acquire) >= expect);
            });
            if (!r) arm_failures.fetch_add(1);
            break;
          }
          case 1: {
            auto f = reactor.when_done_future(sid);
            if (!f) {
              arm_failures.fetch_add(1);
            } else {
              futures.emplace_back(std::move(*f), token);
              (void)expect;
            }
            break;
          }
          default:
            await_and_record(reactor, sid, {}, tally, token, &marker, expect);
            break;
        }
        // Drain futures now and then so that some waits are awaited while others are
        // still being armed.
        if (futures.size() >= 16) {
          future_waits.fetch_add(futures.size());
          collect_futures(futures, tally, nullptr, 0);
        }
      }
      future_waits.fetch_add(futures.size());
      collect_futures(futures, tally, nullptr, 0);
    });
  }
  for (auto& w : workers) w.join();
  REQUIRE(arm_failures.load() == 0);
  REQUIRE(eventually([&] { return tally.done.load(std::memory_order_acquire) >= total; }));
  CHECK(tally.wrong_counts() == 0);
  CHECK(tally.ok.load() == total);
  CHECK(tally.errors.load() == 0);
  CHECK(tally.early.load() == 0);
  CHECK(future_waits.load() > 0);
  const ReactorCounters c = reactor.counters();
  CHECK(c.armed == total);
  REQUIRE(eventually([&] { return reactor.counters().completed == total; }));
  CHECK(c.faulted == 0);
  CHECK(c.cancelled == 0);
}

/// Destroying the reactor while waits are armed on a held stream: every waiter completes
/// exactly once, with cancelled.
///
/// On a real GPU keep the host-function waits few: CUDA queues only a few dozen host
/// functions interleaved with device work behind an unfinished one, and the next enqueue
/// then blocks until the stream moves (on the H200, driver 580, the 57th memset + host
/// function pair behind a held host function blocked for the whole hold). The gate would
/// time out and the waits complete normally; the timed_out check below says so.
template <class D>
void shutdown_in_flight(Rig<D>& rig, unsigned waits) {
  REQUIRE(rig.device->make_current());
  static Gate gate;  // static: the held host function may outlive this scope
  gate.close();
  const auto armed_from = std::chrono::steady_clock::now();
  REQUIRE(rig.driver.launch_host_func(rig.stream(0), &Gate::hold, &gate));
  Tally tally(waits);
  std::vector<std::future<void>> futures;
  Reactor<D>& reactor = *rig.reactor;
  for (unsigned i = 0; i < waits; ++i) {
    REQUIRE(rig.work(0, static_cast<std::uint8_t>(i)));
    if (i % 3 == 0) {
      REQUIRE(reactor.on_done(StreamId{0}, [&tally, i](result<void> r) { tally.record(i, r, true); }));
    } else if (i % 3 == 1) {
      auto f = reactor.when_done_future(StreamId{0});
      REQUIRE(f);
      futures.push_back(std::move(*f));
    } else {
      await_and_record(reactor, StreamId{0}, {}, tally, i, nullptr, 0);
    }
  }
  const std::uint64_t fallbacks = reactor.counters().fallbacks;
  INFO("arming " << waits << " waits took "
                 << std::chrono::duration<double>(std::chrono::steady_clock::now() - armed_from).count()
                 << " s; " << fallbacks << " took the host-function path");
  REQUIRE_FALSE(gate.timed_out.load(std::memory_order_acquire));
  rig.reactor.reset();
  // Every callback and coroutine has completed by the time the destructor returned.
  const unsigned futures_n = static_cast<unsigned>(futures.size());
  CHECK(tally.done.load() == waits - futures_n);
  std::size_t cancelled = 0;
  for (auto& f : futures) {
    REQUIRE(f.wait_for(0s) == std::future_status::ready);
    try {
      f.get();
    } catch (const FutureError& e) {
      if (e.error().code() == errc::cancelled) ++cancelled;
    }
  }
  CHECK(cancelled == futures_n);
  CHECK(tally.errors.load() == waits - futures_n);
  CHECK(tally.last_code.load() == static_cast<int>(errc::cancelled));
  for (unsigned i = 0; i < waits; ++i) {
    if (i % 3 != 1) CHECK(tally.seen[i].load() == 1);
  }
  gate.open.store(true, std::memory_order_release);
  REQUIRE(rig.driver.stream_synchronize(rig.stream(0)));
  // The stream was held for the whole test, so every outcome above was a real cancellation.
  CHECK_FALSE(gate.timed_out.load(std::memory_order_acquire));
  // Late flag writes and host functions ran after the reactor was gone; nothing broke.
}

/// Coroutines resume on the scanner thread by default, on a named executor otherwise, and
/// a coroutine that keeps awaiting (the resumed code arming the next wait from the
/// scanner) works.
template <class D>
void coroutines_resume_where_asked(Rig<D>& rig) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;

  std::atomic<bool> got_id{false};
  std::thread::id scanner_id;
  REQUIRE(rig.work(1, 1));
  REQUIRE(reactor.on_done(StreamId{1}, [&](result<void>) {
    scanner_id = std::this_thread::get_id();
    got_id.store(true, std::memory_order_release);
  }));
  REQUIRE(eventually([&] { return got_id.load(std::memory_order_acquire); }));

  struct Where {
    std::atomic<int> done{0};
    std::thread::id on;
    std::vector<std::thread::id> chain;
    result<void> last;
  };
  auto once = [](Reactor<D>& r, StreamId s, ExecutorRef ex, Where& w) -> Detached {
    w.last = co_await r.when_done(s, ex);
    w.on = std::this_thread::get_id();
    w.done.store(1, std::memory_order_release);
  };
  auto chain = [](Rig<D>& rig, StreamId s, Where& w, int rounds) -> Detached {
    for (int i = 0; i < rounds; ++i) {
      if (!rig.work(s.value, static_cast<std::uint8_t>(i))) break;
      result<void> r = co_await rig.reactor->when_done(s);
      if (!r) break;
      w.chain.push_back(std::this_thread::get_id());
    }
    w.done.store(1, std::memory_order_release);
  };

  Where inline_w;
  REQUIRE(rig.work(2, 2));
  once(reactor, StreamId{2}, {}, inline_w);
  REQUIRE(eventually([&] { return inline_w.done.load(std::memory_order_acquire) == 1; }));
  CHECK(inline_w.last.has_value());
  CHECK(inline_w.on == scanner_id);

  ThreadExecutor exec;
  Where exec_w;
  REQUIRE(rig.work(3, 3));
  once(reactor, StreamId{3}, exec, exec_w);
  REQUIRE(eventually([&] { return exec_w.done.load(std::memory_order_acquire) == 1; }));
  CHECK(exec_w.last.has_value());
  CHECK(exec_w.on == exec.id());
  CHECK(exec_w.on != scanner_id);

  Where chain_w;
  chain(rig, StreamId{0}, chain_w, 200);
  REQUIRE(eventually([&] { return chain_w.done.load(std::memory_order_acquire) == 1; }));
  REQUIRE(chain_w.chain.size() == 200);
  for (auto id : chain_w.chain) CHECK(id == scanner_id);

  // A wait that cannot be armed does not suspend: the coroutine gets the error at once.
  Where bad;
  once(reactor, StreamId{999}, {}, bad);
  CHECK(bad.done.load() == 1);
  REQUIRE_FALSE(bad.last.has_value());
  CHECK(bad.last.error().code() == errc::unknown_stream);
}

/// Host thread awaits, then enqueues the next operation: `rounds` round trips.
template <class D>
void ping_pong(Rig<D>& rig, unsigned rounds) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;
  unsigned failures = 0;
  for (unsigned i = 0; i < rounds; ++i) {
    if (!rig.work(0, static_cast<std::uint8_t>(i))) {
      ++failures;
      break;
    }
    auto f = reactor.when_done_future(StreamId{0});
    if (!f) {
      ++failures;
      break;
    }
    f->get();
  }
  CHECK(failures == 0);
  const ReactorCounters c = reactor.counters();
  CHECK(c.completed >= rounds);
}

/// After the scanner's budgets run out with nothing armed, it parks, burns (almost) no
/// CPU, and the next registration wakes it.
template <class D>
void parks_when_idle_and_wakes(Rig<D>& rig) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;
  REQUIRE(eventually([&] { return reactor.counters().parks >= 1; }, 10s));
  const auto cpu0 = reactor.scanner_cpu_time();
  std::this_thread::sleep_for(300ms);
  const auto cpu1 = reactor.scanner_cpu_time();
  // Parked: a handful of microseconds at most; 30 ms leaves room for sanitizers and a
  // loaded machine while still telling parked from polling (polling burns ~300 ms).
  CHECK(cpu1 - cpu0 < 30ms);
  const ReactorCounters before = reactor.counters();
  REQUIRE(rig.work(0, 9));
  auto f = reactor.when_done_future(StreamId{0});
  REQUIRE(f);
  f->get();
  const ReactorCounters after = reactor.counters();
  CHECK(after.wakeups >= before.wakeups + 1);
  CHECK(after.completed == before.completed + 1);
}

// ---- StreamPoint: one armed completion, many waiters -----------------------------------

/// Waits on a point by coroutine (on `ex` when it names an executor) and records it.
inline Detached await_point_and_record(StreamPoint p, ExecutorRef ex, Tally& tally,
                                       std::size_t token,
                                       const std::atomic<std::uint64_t>* marker,
                                       std::uint64_t expect) {
  result<void> got;
  if (ex) {
    got = co_await p.when_done(ex);
  } else {
    got = co_await p;
  }
  const bool reached = marker == nullptr || marker->load(std::memory_order_acquire) >= expect;
  tally.record(token, got, reached);
}

/// Attaches waiter `token` to `p` by the delivery form `kind` picks: callback, future
/// (kept in `futures`, recorded when collected), coroutine resumed inline, coroutine on
/// `ex`. Returns false when attaching failed.
inline bool attach_one(const StreamPoint& p, unsigned kind, ExecutorRef ex, Tally& tally,
                       std::size_t token, const std::atomic<std::uint64_t>* marker,
                       std::uint64_t expect,
                       std::vector<std::pair<std::future<void>, std::size_t>>& futures) {
  switch (kind % 4) {
    case 0:
      return static_cast<bool>(p.on_done([&tally, token, marker, expect](result<void> got) {
        tally.record(token, got,
                     marker == nullptr || marker->load(std::memory_order_acquire) >= expect);
      }));
    case 1: {
      auto f = p.when_done_future();
      if (!f) return false;
      futures.emplace_back(std::move(*f), token);
      return true;
    }
    case 2:
      await_point_and_record(p, {}, tally, token, marker, expect);
      return true;
    default:
      await_point_and_record(p, ex, tally, token, marker, expect);
      return true;
  }
}

/// `rounds` points on stream `s`, each marked after a counting host function; `threads`
/// threads, released together, attach `per_thread` waiters each (all four delivery forms)
/// while the point fires. Every waiter completes exactly once, with success, after the
/// marker ran; each point costs the reactor one armed completion.
template <class D>
void point_many_attachers(Rig<D>& rig, unsigned rounds, unsigned threads, unsigned per_thread,
                          std::size_t s = 0) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;
  const std::size_t per_round = std::size_t{threads} * per_thread;
  const std::size_t total = rounds * per_round;
  Tally tally(total);
  std::atomic<std::uint64_t> marker{0};
  std::atomic<std::uint64_t> attach_failures{0};
  ThreadExecutor exec;
  const ReactorCounters c0 = reactor.counters();
  for (unsigned r = 0; r < rounds; ++r) {
    REQUIRE(rig.work(s, static_cast<std::uint8_t>(r)));
    REQUIRE(rig.driver.launch_host_func(rig.stream(s), &count_marker, &marker));
    const std::uint64_t expect = r + 1;
    auto marked = reactor.mark(StreamId{static_cast<std::uint32_t>(s)});
    REQUIRE(marked);
    const StreamPoint point = std::move(*marked);
    std::atomic<unsigned> at_gate{0};
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        at_gate.fetch_add(1, std::memory_order_acq_rel);
        while (at_gate.load(std::memory_order_acquire) < threads) std::this_thread::yield();
        std::vector<std::pair<std::future<void>, std::size_t>> futures;
        for (unsigned i = 0; i < per_thread; ++i) {
          const std::size_t token = r * per_round + std::size_t{t} * per_thread + i;
          if (!attach_one(point, t + i, exec, tally, token, &marker, expect, futures)) {
            attach_failures.fetch_add(1);
          }
        }
        collect_futures(futures, tally, &marker, expect);
      });
    }
    for (auto& w : workers) w.join();
  }
  REQUIRE(attach_failures.load() == 0);
  REQUIRE(eventually([&] { return tally.done.load(std::memory_order_acquire) >= total; }));
  CHECK(tally.wrong_counts() == 0);
  CHECK(tally.ok.load() == total);
  CHECK(tally.errors.load() == 0);
  CHECK(tally.early.load() == 0);
  REQUIRE(eventually([&] { return reactor.counters().completed - c0.completed == rounds; }));
  const ReactorCounters c = reactor.counters();
  CHECK(c.armed - c0.armed == rounds);  // one completion per point, however many waiters
  CHECK(c.coalesced - c0.coalesced <= total);
  // Which side of the race each waiter fell on is up to the schedule; say what happened.
  UNSCOPED_INFO("waiters served by a point's completion: " << (c.coalesced - c0.coalesced)
                                                           << " of " << total
                                                           << "; the rest attached after it");
}

/// Waiters that attach after the point has fired complete at once: a callback on the
/// calling thread before on_done returns, a future ready on return, `co_await point`
/// without suspending, `co_await point.when_done(executor)` on the executor. Empty
/// handles and unknown streams fail.
template <class D>
void point_attach_after_fire(Rig<D>& rig) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;
  REQUIRE(rig.work(1, 1));
  auto marked = reactor.mark(StreamId{1});
  REQUIRE(marked);
  StreamPoint point = *marked;  // a copy: two handles
  CHECK(point.stream().value == 1u);
  REQUIRE(eventually([&] { return point.done(); }));
  const std::uint64_t coalesced0 = reactor.counters().coalesced;
  const std::thread::id me = std::this_thread::get_id();

  int calls = 0;
  std::thread::id ran_on;
  bool got_ok = false;
  REQUIRE(point.on_done([&](result<void> r) {
    ++calls;
    ran_on = std::this_thread::get_id();
    got_ok = r.has_value();
  }));
  CHECK(calls == 1);  // before on_done returned
  CHECK(ran_on == me);
  CHECK(got_ok);

  auto f = point.when_done_future();
  REQUIRE(f);
  CHECK(f->wait_for(0s) == std::future_status::ready);
  f->get();

  struct Where {
    std::atomic<int> done{0};
    std::thread::id on;
    result<void> last;
  };
  auto once = [](StreamPoint p, ExecutorRef ex, Where& w) -> Detached {
    if (ex) {
      w.last = co_await p.when_done(ex);
    } else {
      w.last = co_await p;
    }
    w.on = std::this_thread::get_id();
    w.done.store(1, std::memory_order_release);
  };
  Where inline_w;
  once(*marked, {}, inline_w);
  CHECK(inline_w.done.load() == 1);  // never suspended
  CHECK(inline_w.on == me);
  CHECK(inline_w.last.has_value());

  ThreadExecutor exec;
  Where exec_w;
  once(*marked, exec, exec_w);
  REQUIRE(eventually([&] { return exec_w.done.load(std::memory_order_acquire) == 1; }));
  CHECK(exec_w.on == exec.id());
  CHECK(exec_w.last.has_value());
  CHECK(reactor.counters().coalesced == coalesced0);  // none of them needed the completion

  // Empty handles: default-constructed and moved from.
  StreamPoint moved = std::move(point);
  CHECK(moved.done());
  for (const bool moved_from : {true, false}) {
    StreamPoint empty = moved_from ? point : StreamPoint{};  // NOLINT: use after move, on purpose
    CHECK_FALSE(empty);
    CHECK_FALSE(empty.done());
    int n = 0;
    auto r = empty.on_done([&n](result<void>) { ++n; });
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK(n == 0);
    auto ef = empty.when_done_future();
    REQUIRE_FALSE(ef);
    CHECK(ef.error().code() == errc::invalid_argument);
    Where empty_w;
    once(empty, {}, empty_w);
    CHECK(empty_w.done.load() == 1);
    REQUIRE_FALSE(empty_w.last.has_value());
    CHECK(empty_w.last.error().code() == errc::invalid_argument);
  }

  auto unknown = reactor.mark(StreamId{999});
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().code() == errc::unknown_stream);
}

/// Destroying the reactor while a point is armed on a held stream: every attached waiter
/// completes once with cancelled, and a waiter attached afterwards (the handle outlives
/// the reactor) is cancelled at once.
template <class D>
void point_cancelled_by_shutdown(Rig<D>& rig, unsigned waiters) {
  REQUIRE(rig.device->make_current());
  static Gate gate;  // static: the held host function may outlive this scope
  gate.close();
  ThreadExecutor exec;  // outlives the reactor: cancelled coroutines are posted to it
  REQUIRE(rig.driver.launch_host_func(rig.stream(0), &Gate::hold, &gate));
  REQUIRE(rig.work(0, 1));
  auto marked = rig.reactor->mark(StreamId{0});
  REQUIRE(marked);
  const StreamPoint point = std::move(*marked);
  Tally tally(waiters);
  std::vector<std::pair<std::future<void>, std::size_t>> futures;
  for (unsigned i = 0; i < waiters; ++i) {
    REQUIRE(attach_one(point, i, exec, tally, i, nullptr, 0, futures));
  }
  CHECK_FALSE(point.done());
  CHECK(tally.done.load() == 0);
  REQUIRE_FALSE(gate.timed_out.load(std::memory_order_acquire));
  rig.reactor.reset();
  CHECK(point.done());
  const std::size_t n_futures = futures.size();
  for (auto& [f, tok] : futures) CHECK(f.wait_for(0s) == std::future_status::ready);
  collect_futures(futures, tally, nullptr, 0);
  REQUIRE(eventually([&] { return tally.done.load(std::memory_order_acquire) == waiters; }));
  CHECK(n_futures > 0);
  CHECK(tally.wrong_counts() == 0);
  CHECK(tally.errors.load() == waiters);
  CHECK(tally.last_code.load() == static_cast<int>(errc::cancelled));

  bool called = false;
  int code = 0;
  REQUIRE(point.on_done([&](result<void> r) {
    called = true;
    code = r ? 0 : static_cast<int>(r.error().code());
  }));
  CHECK(called);
  CHECK(code == static_cast<int>(errc::cancelled));
  gate.open.store(true, std::memory_order_release);
  REQUIRE(rig.driver.stream_synchronize(rig.stream(0)));
}

/// Points on the host-function path: every slot is taken by waits on held stream 2, so
/// each mark() falls back; the attach race then runs on that path. With no slots (a
/// reactor without flag writes) nothing is held.
///
/// Not for slots on a real GPU: CUDA runs the host functions of every stream on one
/// thread, so the gate's host function would hold the points' host functions too.
template <class D>
void point_on_fallback_path(Rig<D>& rig, unsigned rounds, unsigned threads,
                            unsigned per_thread) {
  REQUIRE(rig.device->make_current());
  Reactor<D>& reactor = *rig.reactor;
  static Gate gate;
  gate.close();
  const std::size_t held = reactor.slots();
  if (held != 0) REQUIRE(rig.driver.launch_host_func(rig.stream(2), &Gate::hold, &gate));
  std::atomic<std::size_t> held_done{0};
  for (std::size_t i = 0; i < held; ++i) {
    REQUIRE(reactor.on_done(StreamId{2}, [&held_done](result<void>) { held_done.fetch_add(1); }));
  }
  const std::uint64_t fallbacks0 = reactor.counters().fallbacks;
  CHECK(fallbacks0 == 0);
  point_many_attachers(rig, rounds, threads, per_thread, 0);
  CHECK(reactor.counters().fallbacks - fallbacks0 == rounds);
  CHECK_FALSE(gate.timed_out.load(std::memory_order_acquire));
  gate.open.store(true, std::memory_order_release);
  REQUIRE(eventually([&] { return held_done.load() == held; }));
}

}  // namespace reactor_rt
