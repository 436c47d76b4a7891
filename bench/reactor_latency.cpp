// SPDX-License-Identifier: Apache-2.0
// How long after a stream reaches a point does host code learn of it?
//
// Latency, on an idle stream: each round enqueues a tiny operation (a 4-byte memset)
// after which the point lies, and times from just before that enqueue to the moment the
// waiter runs. Nothing is subtracted: the figures include enqueueing, the device's
// launch and the notification. Every waiter records the time it ran in a Stamp that the
// measuring thread spins on, so every row learns of its waiter the same way. Variants,
// measured in the same rounds, interleaved:
//   floor          a host thread spinning on a flag written by cuStreamWriteValue32
//   reactor cb     Reactor::on_done callback (flag write, scanner thread)
//   reactor coro   co_await reactor.when_done(stream), resumed on the scanner; once in a
//                  plain coroutine (frame malloc'd per wait) and once in one whose frame
//                  is recycled (see RecycledDetached)
//   ... idle       the same two, as the first wait after the rest of the round
//   reactor hostfn Reactor with flag_writes = false (its host-function path)
//   host func      cuLaunchHostFunc; the function is the waiter
//   event poll     cuEventRecord + a thread polling cuEventQuery
//   event sync     cuEventRecord + cuEventSynchronize
//   stream sync    cuStreamSynchronize
// The scanner's state decides the reactor's latency, so the reactor rows say which state
// they measure and each delivery form is measured in both, the same number of times:
//   - "scanner polling": right after another completion of the same reactor, so the
//     scanner is in its spin phase, as in a busy engine. The two forms alternate which
//     comes first. These rows are the ones compared with the floor's targets.
//   - "after idle gap": the first wait of the round, after the rest of the round (well
//     over spin_for): the scanner is yielding between passes, or parked if the gap
//     exceeded spin_for + yield_for, and then the arm pays a futex wake. The forms
//     alternate rounds; the "woken" column counts the arms that woke a parked scanner.
// The "enqueued by" column is when the wait's last enqueue (the flag write, the host
// function) had returned, from the same start: the host's share of the latency.
// Then the scanner's idle policy (ping-pong round trips of a host thread that awaits a
// future and enqueues the next operation, for several spin budgets), fan-out (8 waiters
// of one StreamPoint against 8 separate waits), throughput with 1,024 waits in flight
// over 8 streams, and the CPU the reactor burns idle and busy.
//
// On a machine without a GPU it runs on SimDriver and says so: those figures measure the
// simulator, not a GPU.
//
// usage: reactor_latency [--throughput-only] [rounds=10000] [completions-per-run=50000]
//                        [throughput-runs=20]

#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_util.hpp"
#include "xlogrt/device/device.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/sim/sim_driver.hpp"
#include "xlogrt/reactor/awaitable.hpp"
#include "xlogrt/reactor/pinned_flags.hpp"
#include "xlogrt/reactor/point.hpp"
#include "xlogrt/reactor/reactor.hpp"

using namespace xlogrt;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

double ns_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::nano>(t1 - t0).count();
}

using Stats = bench::Summary;
Stats stats(std::vector<double> v) { return bench::summarize(std::move(v)); }
using bench::quantile;

double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

void pause_cpu() { StdAtomics::pause(); }

struct Detached {
  struct promise_type {
    Detached get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};

/// Where a waiter records when it ran.
struct Stamp {
  std::atomic<std::int64_t> at{0};
  void mark() { at.store(Clock::now().time_since_epoch().count(), std::memory_order_release); }
  Clock::time_point wait() const {
    std::int64_t v;
    while ((v = at.load(std::memory_order_acquire)) == 0) pause_cpu();
    return Clock::time_point(Clock::duration(v));
  }
  void reset() { at.store(0, std::memory_order_relaxed); }
};

void stamp_host_fn(void* p) { static_cast<Stamp*>(p)->mark(); }

template <class D>
Detached co_stamp(Reactor<D>& r, StreamId s, Stamp& st) {
  auto res = co_await r.when_done(s);
  (void)res;
  st.mark();
}

/// A Detached coroutine whose frame comes from a one-frame stash, as an engine's frame
/// pool would give it. A plain one is malloc'd on the arming thread and freed on the
/// scanner thread (where it finishes), so the arming thread's malloc never finds that
/// size in its own cache: the frame's allocation, not the reactor, then sits between
/// the operation and the flag write.
struct RecycledDetached {
  struct promise_type : Detached::promise_type {
    RecycledDetached get_return_object() noexcept { return {}; }
    static constexpr std::size_t CAP = 1024;
    static inline std::atomic<void*> stash{nullptr};
    static void* operator new(std::size_t n) {
      if (n <= CAP) {
        if (void* p = stash.exchange(nullptr, std::memory_order_acquire)) return p;
        return ::operator new(CAP);
      }
      return ::operator new(n);
    }
    static void operator delete(void* p, std::size_t n) noexcept {
      void* none = nullptr;
      if (n <= CAP && stash.compare_exchange_strong(none, p, std::memory_order_release)) return;
      ::operator delete(p);
    }
  };
};

template <class D>
RecycledDetached co_stamp_recycled(Reactor<D>& r, StreamId s, Stamp& st) {
  auto res = co_await r.when_done(s);
  (void)res;
  st.mark();
}

// ---- the rig: a device, its streams and a scratch buffer ---------------------------------

/// What every part of the bench uses: the driver, the device, 8 streams and a small
/// device buffer that op() writes 4 bytes of, on a stream (the "tiny operation" after
/// which a point lies).
template <class D>
struct Rig {
  D& d;
  std::shared_ptr<Device<D>> device;
  std::shared_ptr<StreamPool<D>> pool;
  std::uint64_t buf = 0;

  typename D::stream_t stream(std::uint32_t i) const { return *pool->get(StreamId{i}); }
  void op(std::uint32_t s, std::uint8_t v) {
    if (!d.memset_d8_async(buf + 256 * s, v, 4, stream(s))) std::abort();
  }
  void sync(std::uint32_t s) {
    if (!d.stream_synchronize(stream(s))) std::abort();
  }

  std::unique_ptr<Reactor<D>> reactor(ReactorOptions o) {
    auto r = Reactor<D>::create(pool, o);
    if (!r) {
      std::fprintf(stderr, "Reactor::create: %s\n", r.error().what().c_str());
      std::exit(1);
    }
    return std::move(*r);
  }
};

// ---- latency -------------------------------------------------------------------------------

/// The latency table's variants, in the table's order.
enum LatencyVariant {
  FLOOR, R_CB, R_CORO, R_CORO_RECYCLED, R_CB_IDLE, R_CORO_IDLE, R_HOSTFN, HOST_FUNC, EV_POLL, EV_SYNC,
  STREAM_SYNC, N_LATENCY
};
constexpr const char* latency_names[N_LATENCY] = {"floor (spin on flag)",
                                                  "reactor callback (scanner polling)",
                                                  "reactor coroutine (scanner polling)",
                                                  "reactor coroutine, recycled frame (scanner polling)",
                                                  "reactor callback (after idle gap)",
                                                  "reactor coroutine (after idle gap)",
                                                  "reactor, host-fn path",
                                                  "launch_host_func",
                                                  "event_record+poll",
                                                  "event_synchronize",
                                                  "stream_synchronize"};
constexpr bool idle_row(int v) { return v == R_CB_IDLE || v == R_CORO_IDLE; }

/// Round r's order: the floor, then the idle-gap sample (its form alternating by round)
/// as the first reactor wait, then the three polling samples, their order rotating, then
/// the rest. One of the two idle-gap forms per round: N_LATENCY - 1 samples.
std::array<int, N_LATENCY - 1> latency_order(unsigned r) {
  const bool odd = (r & 1) != 0;
  const int polling[3] = {R_CB, R_CORO, R_CORO_RECYCLED};
  const unsigned k = r % 3;
  return {FLOOR,    odd ? R_CORO_IDLE : R_CB_IDLE,
          polling[k], polling[(k + 1) % 3], polling[(k + 2) % 3],
          R_HOSTFN, HOST_FUNC, EV_POLL, EV_SYNC, STREAM_SYNC};
}

/// The event poller: a thread of its own, as a polling engine would have, that polls
/// `event` with cuEventQuery once go() is called and stamps when it is reached.
template <class D>
class EventPoller {
 public:
  EventPoller(Rig<D>& rig, typename D::event_t event) : thread_([this, &rig, event] { loop(rig, event); }) {}
  EventPoller(const EventPoller&) = delete;
  EventPoller& operator=(const EventPoller&) = delete;
  ~EventPoller() {
    stop_.store(true, std::memory_order_release);
    thread_.join();
  }
  /// Before the sample's clock starts: clears the last stamp.
  void reset() { stamp_.reset(); }
  /// Starts polling; returns when the event was reached, with the time the poller saw it.
  Clock::time_point poll() {
    go_.store(1, std::memory_order_release);
    const auto t = stamp_.wait();
    while (go_.load(std::memory_order_acquire) != 0) pause_cpu();
    return t;
  }

 private:
  void loop(Rig<D>& rig, typename D::event_t event) {
    (void)rig.device->make_current();
    while (!stop_.load(std::memory_order_acquire)) {
      if (go_.load(std::memory_order_acquire) == 0) {
        pause_cpu();
        continue;
      }
      for (;;) {
        auto q = rig.d.event_query(event);
        if (!q || *q) break;
        pause_cpu();
      }
      stamp_.mark();
      go_.store(0, std::memory_order_release);
    }
  }

  std::atomic<int> go_{0};
  std::atomic<bool> stop_{false};
  Stamp stamp_;
  std::thread thread_;  // last: started once the members it uses exist
};

/// One latency sample: t0 just before the enqueue, t1 when the waiter ran, ta when the
/// wait's last enqueue had returned (unset for the variants that have none).
struct LatencySample {
  Clock::time_point t0, t1, ta{};
};

/// Everything the latency variants wait with: pinned flags for the floor, a reactor with
/// flag writes (stream 0) and one without (its host-function path), events and the
/// poller. Stream 0 is the flag reactor's, 1 everything else's (each variant waits for
/// its sample to end and both streams to drain before the next starts, so every stream
/// is idle at its enqueue).
template <class D>
class LatencyProbe {
 public:
  explicit LatencyProbe(Rig<D>& rig) : rig_(rig) {
    auto flags = PinnedFlags<D>::create(rig.d, 1);
    auto ev = rig.d.event_create();
    auto ev_poll = rig.d.event_create();
    if (!flags || !ev || !ev_poll) std::abort();
    flags_.emplace(std::move(*flags));
    ev_ = *ev;
    ev_poll_ = *ev_poll;
    reactor_flags_ = rig.reactor(ReactorOptions{});
    ReactorOptions host_only;
    host_only.flag_writes = false;
    reactor_hostfn_ = rig.reactor(host_only);
    poller_ = std::make_unique<EventPoller<D>>(rig, ev_poll_);
  }
  LatencyProbe(const LatencyProbe&) = delete;
  LatencyProbe& operator=(const LatencyProbe&) = delete;
  ~LatencyProbe() {
    poller_.reset();
    (void)rig_.d.event_destroy(ev_);
    (void)rig_.d.event_destroy(ev_poll_);
  }

  Reactor<D>& flag_reactor() { return *reactor_flags_; }

  /// Measures variant `v` once.
  LatencySample sample(int v) {
    auto& d = rig_.d;
    st_.reset();
    LatencySample s;
    switch (v) {
      case FLOOR: {
        ++seq_;
        s.t0 = Clock::now();
        rig_.op(1, 1);
        if (!d.stream_write_value32(rig_.stream(1), flags_->device_address(0), seq_)) std::abort();
        s.ta = Clock::now();
        while (StdAtomics::load_flag(flags_->word(0), std::memory_order_acquire) != seq_) pause_cpu();
        s.t1 = Clock::now();
        break;
      }
      case R_CB:
      case R_CB_IDLE:
        s.t0 = Clock::now();
        rig_.op(0, 2);
        if (!reactor_flags_->on_done(StreamId{0}, [this](result<void>) { st_.mark(); })) std::abort();
        s.ta = Clock::now();
        s.t1 = st_.wait();
        break;
      case R_CORO:
      case R_CORO_IDLE:
      case R_CORO_RECYCLED:
        s.t0 = Clock::now();
        rig_.op(0, 3);
        if (v == R_CORO_RECYCLED) {
          co_stamp_recycled(*reactor_flags_, StreamId{0}, st_);
        } else {
          co_stamp(*reactor_flags_, StreamId{0}, st_);
        }
        s.ta = Clock::now();
        s.t1 = st_.wait();
        break;
      case R_HOSTFN:
        s.t0 = Clock::now();
        rig_.op(1, 4);
        if (!reactor_hostfn_->on_done(StreamId{1}, [this](result<void>) { st_.mark(); })) std::abort();
        s.t1 = st_.wait();
        break;
      case HOST_FUNC:
        s.t0 = Clock::now();
        rig_.op(1, 5);
        if (!d.launch_host_func(rig_.stream(1), &stamp_host_fn, &st_)) std::abort();
        s.ta = Clock::now();
        s.t1 = st_.wait();
        break;
      case EV_POLL:
        poller_->reset();
        s.t0 = Clock::now();
        rig_.op(1, 6);
        if (!d.event_record(ev_poll_, rig_.stream(1))) std::abort();
        s.t1 = poller_->poll();
        break;
      case EV_SYNC:
        s.t0 = Clock::now();
        rig_.op(1, 7);
        if (!d.event_record(ev_, rig_.stream(1)) || !d.event_synchronize(ev_)) std::abort();
        s.t1 = Clock::now();
        break;
      case STREAM_SYNC:
        s.t0 = Clock::now();
        rig_.op(1, 8);
        if (!d.stream_synchronize(rig_.stream(1))) std::abort();
        s.t1 = Clock::now();
        break;
    }
    return s;
  }

 private:
  Rig<D>& rig_;
  std::optional<PinnedFlags<D>> flags_;
  typename D::event_t ev_{}, ev_poll_{};
  std::unique_ptr<Reactor<D>> reactor_flags_, reactor_hostfn_;
  std::unique_ptr<EventPoller<D>> poller_;
  Stamp st_;
  std::uint32_t seq_ = 0;
};

/// The latency table: `rounds` rounds (after 200 that warm up) of every variant in
/// latency_order, then the targets of the reactor's polling rows.
template <class D>
void latency(Rig<D>& rig, unsigned rounds) {
  LatencyProbe<D> probe(rig);
  Reactor<D>& flag_reactor = probe.flag_reactor();
  std::vector<double> lat[N_LATENCY];
  for (auto& v : lat) v.reserve(rounds);
  std::uint64_t woken[N_LATENCY] = {};  // samples whose arm woke a parked scanner
  std::vector<double> armed_at[N_LATENCY];  // from t0 to the return of the wait's last enqueue

  for (unsigned r = 0; r < rounds + 200; ++r) {  // the first 200 rounds warm up
    const bool keep = r >= 200;
    for (const int v : latency_order(r)) {
      // Only the idle-gap rows count wake-ups: reading the counters pulls the scanner's
      // counter line to this core, which the next completion then waits for.
      const std::uint64_t wakeups0 = idle_row(v) ? flag_reactor.counters().wakeups : 0;
      const LatencySample s = probe.sample(v);
      if (keep) {
        lat[v].push_back(ns_since(s.t0, s.t1));
        if (s.ta != Clock::time_point{}) armed_at[v].push_back(ns_since(s.t0, s.ta));
        if (idle_row(v) && flag_reactor.counters().wakeups != wakeups0) ++woken[v];
      }
      // Let both streams drain fully so that the next variant starts on idle streams.
      rig.sync(0);
      rig.sync(1);
    }
  }

  const Stats floor = stats(lat[FLOOR]);
  std::printf("\n");
  {
    bench::Table t(bench::fmt("Latency: stream reaches the point -> the waiter runs (idle stream, %u rounds)", rounds),
                   {"variant", "samples", "median us", "p99 us", "median / floor", "p99 / floor p99", "woken",
                    "enqueued by, median us"},
                   true);
    for (int v = 0; v < N_LATENCY; ++v) {
      const Stats s = stats(lat[v]);
      t.row(latency_names[v], std::to_string(lat[v].size()), bench::fmt("%.2f", s.median / 1e3),
            bench::fmt("%.2f", s.p99 / 1e3), bench::fmt("%.2fx", s.median / floor.median),
            bench::fmt("%.2fx", s.p99 / floor.p99), idle_row(v) ? std::to_string(woken[v]) : "",
            armed_at[v].empty() ? "" : bench::fmt("%.2f", stats(armed_at[v]).median / 1e3));
    }
  }
  const Stats hf = stats(lat[HOST_FUNC]);
  for (const int v : {R_CB, R_CORO, R_CORO_RECYCLED}) {
    const Stats s = stats(lat[v]);
    std::printf("Targets, %s: median <= 1.25x floor: %.2fx %s; >= 2.5x faster than "
                "launch_host_func: %.2fx %s; p99 <= 2x floor p99: %.2fx %s\n",
                latency_names[v], s.median / floor.median,
                s.median <= 1.25 * floor.median ? "(met)" : "(NOT met)", hf.median / s.median,
                hf.median >= 2.5 * s.median ? "(met)" : "(NOT met)", s.p99 / floor.p99,
                s.p99 <= 2 * floor.p99 ? "(met)" : "(NOT met)");
  }
  std::printf("\n");
  const ReactorCounters c = flag_reactor.counters();
  std::printf("reactor (flags): armed %llu, completed %llu, fallbacks %llu, wakeups %llu, parks %llu\n",
              static_cast<unsigned long long>(c.armed), static_cast<unsigned long long>(c.completed),
              static_cast<unsigned long long>(c.fallbacks), static_cast<unsigned long long>(c.wakeups),
              static_cast<unsigned long long>(c.parks));
}

// ---- the scanner's idle policy ---------------------------------------------------------------

/// Ping-pong: a host thread awaits a future, then enqueues the next operation. The
/// scanner sees nothing armed between two rounds, so its idle policy decides whether
/// the next arm finds it polling or parked.
template <class D>
void idle_policy(Rig<D>& rig, unsigned rounds) {
  struct Policy {
    const char* name;
    std::chrono::nanoseconds spin, yield, nap;
  };
  const ReactorOptions def;
  const Policy policies[] = {
      {"park at once (spin 0, yield 0)", 0ns, 0ns, def.nap_max},
      {"spin 5 us, yield 20 us", 5us, 20us, def.nap_max},
      {"default (spin 50 us, yield 450 us)", def.spin_for, def.yield_for, def.nap_max},
      {"spin 2 ms", 2ms, 0ns, def.nap_max},
  };
  std::printf("\n");
  bench::Table t(bench::fmt("Scanner idle policy: ping-pong round trip (future.get, then enqueue), %u rounds", rounds),
                 {"policy", "median us", "p99 us", "wakeups/round", "scanner CPU / wall"}, true);
  for (const Policy& p : policies) {
    ReactorOptions o;
    o.spin_for = p.spin;
    o.yield_for = p.yield;
    o.nap_max = p.nap;
    auto r = rig.reactor(o);
    std::vector<double> v;
    v.reserve(rounds);
    const auto w0 = Clock::now();
    const auto c0 = r->scanner_cpu_time();
    for (unsigned i = 0; i < rounds + 100; ++i) {
      const auto t0 = Clock::now();
      rig.op(2, 1);
      auto f = r->when_done_future(StreamId{2});
      if (!f) std::abort();
      f->get();
      if (i >= 100) v.push_back(ns_since(t0, Clock::now()));
    }
    const double wall = ns_since(w0, Clock::now());
    const double cpu = static_cast<double>((r->scanner_cpu_time() - c0).count());
    const Stats s = stats(v);
    t.row(p.name, bench::fmt("%.2f", s.median / 1e3), bench::fmt("%.2f", s.p99 / 1e3),
          bench::fmt("%.2f", static_cast<double>(r->counters().wakeups) / (rounds + 100)),
          bench::fmt("%.0f%%", 100 * cpu / wall));
  }
}

// ---- fan-out -----------------------------------------------------------------------------------

/// Fan-out: W waiters of the same point of one stream. "separate waits": W on_done
/// calls (W slots, W flag writes, W retirements); "one StreamPoint": one mark() and W
/// callbacks attached to it. Both start with the scanner polling (an unmeasured wait
/// completes just before) and alternate which goes first. Timed from just before the
/// enqueue to the last of the W callbacks; "arming" is the registrant's part of that.
template <class D>
void fan_out(Rig<D>& rig, unsigned rounds) {
  constexpr unsigned W = 8;
  auto r = rig.reactor(ReactorOptions{});
  enum { SEPARATE, POINT, M };
  const char* names[M] = {"8 separate waits (on_done x8)", "one StreamPoint, 8 waiters"};
  std::vector<double> lat[M], arm[M];
  std::uint64_t armed[M] = {}, coalesced[M] = {};
  std::atomic<unsigned> left{0};
  Stamp st;
  auto last = [&left, &st](result<void>) {
    if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) st.mark();
  };
  const std::uint32_t s = 3;
  for (unsigned i = 0; i < rounds + 100; ++i) {
    const bool keep = i >= 100;
    for (int k = 0; k < M; ++k) {
      const int v = (i & 1) != 0 ? M - 1 - k : k;
      st.reset();
      left.store(1, std::memory_order_relaxed);
      rig.op(s, 1);  // the priming wait: leaves the scanner polling
      if (!r->on_done(StreamId{s}, last)) std::abort();
      (void)st.wait();
      rig.sync(s);
      st.reset();
      left.store(W, std::memory_order_relaxed);
      const ReactorCounters c0 = r->counters();
      const auto t0 = Clock::now();
      rig.op(s, 2);
      if (v == SEPARATE) {
        for (unsigned w = 0; w < W; ++w) {
          if (!r->on_done(StreamId{s}, last)) std::abort();
        }
      } else {
        auto p = r->mark(StreamId{s});
        if (!p) std::abort();
        for (unsigned w = 0; w < W; ++w) {
          if (!p->on_done(last)) std::abort();
        }
      }
      const auto ta = Clock::now();
      const auto t1 = st.wait();
      rig.sync(s);
      if (keep) {
        lat[v].push_back(ns_since(t0, t1));
        arm[v].push_back(ns_since(t0, ta));
        const ReactorCounters c1 = r->counters();
        armed[v] += c1.armed - c0.armed;
        coalesced[v] += c1.coalesced - c0.coalesced;
      }
    }
  }
  std::printf("\n");
  bench::Table t(bench::fmt("Fan-out: %u waiters of one point (scanner polling, %u rounds)", W, rounds),
                 {"variant", "median us (to last waiter)", "p99 us", "arming median us", "arming p99 us",
                  "completions armed / round", "waiters coalesced / round", "p99 / separate"},
                 true);
  const Stats base = stats(lat[SEPARATE]);
  for (int v = 0; v < M; ++v) {
    const Stats l = stats(lat[v]);
    const Stats a = stats(arm[v]);
    t.row(names[v], bench::fmt("%.2f", l.median / 1e3), bench::fmt("%.2f", l.p99 / 1e3),
          bench::fmt("%.2f", a.median / 1e3), bench::fmt("%.2f", a.p99 / 1e3),
          bench::fmt("%.2f", static_cast<double>(armed[v]) / rounds),
          bench::fmt("%.2f", static_cast<double>(coalesced[v]) / rounds), bench::fmt("%.2fx", l.p99 / base.p99));
  }
}

// ---- throughput ----------------------------------------------------------------------------------

/// What raw flag writes allow: one thread keeps `in_flight` flags armed over 8 streams,
/// polls them, and re-enqueues the same operation and cuStreamWriteValue32 for each flag
/// it finds set. Completions per second.
template <class D>
double raw_throughput(Rig<D>& rig, std::uint64_t total, unsigned in_flight) {
  auto made = PinnedFlags<D>::create(rig.d, in_flight);
  if (!made) std::abort();
  PinnedFlags<D> flags = std::move(*made);
  auto arm = [&](unsigned i) {
    StdAtomics::store_flag(flags.word(i), 0, std::memory_order_relaxed);
    rig.op(i % 8, 1);
    if (!rig.d.stream_write_value32(rig.stream(i % 8), flags.device_address(i), 1)) std::abort();
  };
  std::uint64_t started = 0, done = 0;
  const auto t0 = Clock::now();
  for (unsigned i = 0; i < in_flight; ++i, ++started) arm(i);
  while (done < total) {
    for (unsigned i = 0; i < in_flight; ++i) {
      if (StdAtomics::load_flag(flags.word(i), std::memory_order_acquire) != 1) continue;
      ++done;
      if (started < total) {
        ++started;
        arm(i);
      } else {
        StdAtomics::store_flag(flags.word(i), 2, std::memory_order_relaxed);  // retired
      }
    }
  }
  const double wall = ns_since(t0, Clock::now());
  for (std::uint32_t s = 0; s < 8; ++s) (void)rig.d.stream_synchronize(rig.stream(s));
  return static_cast<double>(done) / (wall / 1e9);
}

/// Completions per second with `in_flight` waits armed over 8 streams: every completion
/// enqueues the next operation on its stream and re-arms, from the scanner. Adds the
/// scanner's and the process's CPU time over the run to `scanner_ns` and `cpu_s`.
template <class D>
double reactor_throughput(Rig<D>& rig, Reactor<D>& r, std::uint64_t total, unsigned in_flight, double& scanner_ns,
                          double& cpu_s) {
  struct Shared {
    Rig<D>* rig;
    Reactor<D>* r;
    std::atomic<std::uint64_t> started{0};
    std::atomic<std::uint64_t> done{0};
    std::uint64_t total;
  } sh{&rig, &r, {}, {}, total};
  struct Rearm {
    Shared* sh;
    std::uint32_t s;
    void operator()(result<void>) const {
      sh->done.fetch_add(1, std::memory_order_relaxed);
      if (sh->started.fetch_add(1, std::memory_order_relaxed) < sh->total) {
        sh->rig->op(s, 1);
        if (!sh->r->on_done(StreamId{s}, Rearm{sh, s})) std::abort();
      }
    }
  };
  const double cpu0 = process_cpu_s();
  const auto sc0 = r.scanner_cpu_time();
  const auto t0 = Clock::now();
  for (unsigned i = 0; i < in_flight; ++i) {
    const std::uint32_t s = i % 8;
    sh.started.fetch_add(1);
    rig.op(s, 1);
    if (!r.on_done(StreamId{s}, Rearm{&sh, s})) std::abort();
  }
  while (sh.done.load(std::memory_order_relaxed) < total) std::this_thread::sleep_for(100us);
  const double wall = ns_since(t0, Clock::now());
  cpu_s += process_cpu_s() - cpu0;
  scanner_ns += static_cast<double>((r.scanner_cpu_time() - sc0).count());
  for (std::uint32_t st = 0; st < 8; ++st) (void)rig.d.stream_synchronize(rig.stream(st));
  return static_cast<double>(sh.done.load()) / (wall / 1e9);
}

/// The reactor's throughput against raw flag polling, `reps` short runs of each,
/// alternating (which goes first alternates too), each reactor run compared with the
/// raw run beside it: the host's rate moves between runs, so only many short pairs give
/// a steady median (bench/HISTORY.md has the runs).
/// Both loops run on one core, THROUGHPUT_CORE: the scanner inherits it from the
/// thread that creates the reactor, and the raw loop runs on that thread, pinned there
/// again for each raw run (while the reactor runs, the thread waits on the next core).
/// Unpinned, the two loops land on different cores and the ratio moves with the
/// placement. Then the CPU the reactor burns once idle.
template <class D>
void throughput(Rig<D>& rig, std::uint64_t total, unsigned in_flight, int reps) {
  constexpr int THROUGHPUT_CORE = 2;
  const int REPS = std::max(1, reps);
  const int core = bench::pin_to_core(THROUGHPUT_CORE);
  auto r = rig.reactor(ReactorOptions{});
  bench::pin_to_core(THROUGHPUT_CORE + 1);  // where this thread waits while the reactor runs
  std::vector<double> ours, raws, ratios;
  double scanner_ns = 0, cpu_s = 0, wall_s = 0;
  for (int rep = 0; rep < REPS; ++rep) {
    double raw_rate = 0;
    const auto raw_run = [&] {
      bench::pin_to_core(THROUGHPUT_CORE);
      raw_rate = raw_throughput(rig, total, in_flight);
      bench::pin_to_core(THROUGHPUT_CORE + 1);
    };
    if (rep % 2 == 1) raw_run();
    const double rate = reactor_throughput(rig, *r, total, in_flight, scanner_ns, cpu_s);
    if (rep % 2 == 0) raw_run();
    wall_s += static_cast<double>(total) / rate;
    ours.push_back(rate);
    raws.push_back(raw_rate);
    ratios.push_back(rate / raw_rate);
  }
  const ReactorCounters c = r->counters();
  std::printf("\n");
  {
    bench::Table t(bench::fmt("Throughput: %u waits in flight over 8 streams, re-armed from the callback "
                              "(%d runs of %llu completions, alternating with the raw baseline)",
                              in_flight, REPS, static_cast<unsigned long long>(total)),
                   {"reactor completions/s (median)", "raw completions/s (median)",
                    "reactor / raw (median of per-pair ratios)", "quartiles", "lowest / highest", "fallbacks",
                    "scanner CPU / wall", "process CPU / wall"},
                   true);
    t.row(bench::fmt("%.0f", quantile(ours, 0.5)), bench::fmt("%.0f", quantile(raws, 0.5)),
          bench::fmt("%.3f", quantile(ratios, 0.5)),
          bench::fmt("%.3f / %.3f", quantile(ratios, 0.25), quantile(ratios, 0.75)),
          bench::fmt("%.3f / %.3f", quantile(ratios, 0.0), quantile(ratios, 1.0)),
          std::to_string(c.fallbacks), bench::fmt("%.0f%%", 100 * scanner_ns / (wall_s * 1e9)),
          bench::fmt("%.0f%%", 100 * cpu_s / wall_s));
  }
  std::printf("raw baseline: one thread polling %u pinned flags and re-enqueuing the same memset + "
              "cuStreamWriteValue32 itself, no reactor (target: reactor / raw >= 1/1.2 = 0.833); "
              "the raw loop and the reactor's scanner both on core %d\n",
              in_flight, core);

  // Idle: once parked, the scanner should burn nothing.
  const auto p0 = Clock::now();
  while (r->counters().parks == c.parks && Clock::now() - p0 < 5s) std::this_thread::sleep_for(1ms);
  const auto i0 = r->scanner_cpu_time();
  const double pc0 = process_cpu_s();
  std::this_thread::sleep_for(1s);
  const double idle_scanner = static_cast<double>((r->scanner_cpu_time() - i0).count());
  const double idle_process = process_cpu_s() - pc0;
  std::printf("\nIdle (nothing armed, 1 s after parking): scanner CPU %.1f us (%.4f%% of wall), "
              "process CPU %.1f us\n",
              idle_scanner / 1e3, 100 * idle_scanner / 1e9, idle_process * 1e6);
}

// ---- the run -------------------------------------------------------------------------------------

template <class D>
int run(D& d, const char* where, bool throughput_only, unsigned rounds, std::uint64_t completions, int runs) {
  constexpr bool simulated = std::is_same_v<D, SimDriver>;
  auto dev = Device<D>::open(d, 0);
  if (!dev) {
    std::fprintf(stderr, "%s\n", dev.error().what().c_str());
    return 1;
  }
  auto pool = StreamPool<D>::create(*dev, 8);
  if (!pool) return 1;
  if (!(*dev)->make_current()) return 1;
  auto buf = d.mem_alloc(256 * 8);
  if (!buf) return 1;
  Rig<D> rig{d, *dev, *pool, *buf};
  std::printf("# reactor_latency on %s: %s, driver %s; host: %s; %s\n", where, rig.device->info().name.c_str(), D::kind,
              bench::cpu_model().c_str(), bench::machine_line().c_str());
  if (simulated) {
    std::printf("# SIMULATED: no GPU here; these figures measure SimDriver's executor threads, "
                "not a GPU. Do not compare them with the targets.\n");
  }
  if (!throughput_only) {
    latency(rig, rounds);
    idle_policy(rig, std::max(1000u, rounds / 5));
    fan_out(rig, std::max(1000u, rounds / 5));
  }
  throughput(rig, simulated && completions == 0 ? 5000 : (completions == 0 ? 50000 : completions), 1024, runs);
  (void)d.mem_free(rig.buf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool throughput_only = false;
  std::vector<const char*> pos;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--throughput-only") {
      throughput_only = true;
    } else {
      pos.push_back(argv[i]);
    }
  }
  const unsigned rounds = pos.size() > 0 ? static_cast<unsigned>(std::atoi(pos[0])) : 10000;
  // 0: the default, 50,000 completions per run on a GPU and 5,000 on the simulator.
  const std::uint64_t completions = pos.size() > 1 ? std::strtoull(pos[1], nullptr, 10) : 0;
  const int runs = pos.size() > 2 ? std::atoi(pos[2]) : 20;
  SimConfig cfg;
  cfg.devices = 1;
  cfg.memory_bytes = std::size_t{64} << 20;
  cfg.worker_threads = 2;
  cfg.check_hazards = false;
  return bench::on_gpu_or_sim(
      [&](auto& d, const char* where) { return run(d, where, throughput_only, rounds, completions, runs); }, cfg,
      "SimDriver");
}
