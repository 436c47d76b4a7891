// SPDX-License-Identifier: Apache-2.0
#pragma once

// The Driver conformance suite: what driver/concept.hpp promises, written once over any
// D satisfying Driver and run over SimDriver (host suite) and CudaDriver (gpu suite); for
// a D that also models VirtualMemoryDriver (both do), the virtual memory properties too.
//
// Each property is a function template that drives D::open()'s instance on device 0
// and reports what it saw in a Probe rather than through Catch2 assertions, so that a
// test can also require a property to FAIL over a deliberately broken driver (see
// mutant_driver.hpp): a property that a broken driver passes is no check at all.
//
// Only what both drivers must do is asserted. Where CUDA leaves a choice (whether a
// freed range is handed to another stream's allocation, say) a property asserts the
// consequence every legal choice has (that stream is then ordered after the free).
// Ordering is observed with gates: a host function that holds its stream until the
// test opens it. Work behind a closed gate must not have happened; a driver that ignores
// an order shows it by running the work early, which the test looks for after a short
// pause. The pause only gives wrong work time to run, so a correct driver never fails
// for lack of time; a gate waits at most 20 s, so a broken driver cannot hang the test.
//
// The gates live in static storage (a driver thread may still run a callback after a
// property has given up), and at most one gate is closed at a time: SimDriver's
// executor threads and CUDA's callback thread run host functions one per thread.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <xlogrt/driver/concept.hpp>
#include <xlogrt/driver/status.hpp>

namespace xlogrt::drvtest {

/// Thrown by Probe::need when a step the property depends on failed.
struct Abort {};

/// What a property saw: the broken promises, one sentence each.
class Probe {
 public:
  void expect(bool ok, const std::string& what) {
    if (!ok) failures_.push_back(what);
  }
  template <class T>
  T need(result<T> r, std::string_view step) {
    if (!r) {
      failures_.push_back(std::string(step) + " failed: " + r.error().what());
      throw Abort{};
    }
    return std::move(r).value();
  }
  void need(const result<void>& r, std::string_view step) {
    if (!r) {
      failures_.push_back(std::string(step) + " failed: " + r.error().what());
      throw Abort{};
    }
  }
  /// `r` failed with errc `code` and driver status `st` (0: any status).
  template <class T>
  void expect_error(const result<T>& r, errc code, int st, const std::string& call) {
    if (r) {
      failures_.push_back(call + " succeeded; expected " + std::string(to_string(code)) +
                          (st != 0 ? " with " + std::string(status::name(st)) : std::string()));
      return;
    }
    const bool code_ok = r.error().code() == code;
    const bool status_ok = st == 0 || r.error().driver_status() == st;
    expect(code_ok && status_ok,
           call + " failed with " + r.error().what() + " (status " +
               std::to_string(r.error().driver_status()) + "); expected " +
               std::string(to_string(code)) +
               (st != 0 ? " with status " + std::to_string(st) : std::string()));
  }
  const std::vector<std::string>& failures() const { return failures_; }
  bool passed() const { return failures_.empty(); }

 private:
  std::vector<std::string> failures_;
};

template <class D>
using Property = void (*)(Probe&);

/// Runs one property; the broken promises it found (empty: it holds).
template <class D>
std::vector<std::string> run_property(Property<D> p) {
  Probe probe;
  try {
    p(probe);
  } catch (const Abort&) {
  }
  return probe.failures();
}

/// "a; b; c" for a Catch2 INFO.
inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "\n  ") + x;
  return s;
}

/// A host function that holds its stream until opened (or 20 s have passed).
struct Gate {
  std::atomic<bool> open{true};
  std::atomic<bool> entered{false};

  void close() {
    entered.store(false, std::memory_order_relaxed);
    open.store(false, std::memory_order_release);
  }
  void release() { open.store(true, std::memory_order_release); }
  bool is_open() const { return open.load(std::memory_order_acquire); }

  static void wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    g->entered.store(true, std::memory_order_release);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!g->is_open() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

/// Opens a gate when the property ends, however it ends.
struct GateGuard {
  Gate& g;
  ~GateGuard() { g.release(); }
};

/// A host function that records, when it runs, whether a gate was open then.
struct Witness {
  std::atomic<int> runs{0};
  std::atomic<bool> saw_closed{false};
  Gate* gate = nullptr;

  void reset(Gate& g) {
    gate = &g;
    saw_closed.store(false, std::memory_order_relaxed);
    runs.store(0, std::memory_order_release);
  }
  static void run(void* p) {
    auto* w = static_cast<Witness*>(p);
    if (!w->gate->is_open()) w->saw_closed.store(true, std::memory_order_relaxed);
    w->runs.fetch_add(1, std::memory_order_acq_rel);
  }
  int count() const { return runs.load(std::memory_order_acquire); }
};

/// Appends its tag to a log, in the order the host functions run.
struct OrderLog {
  std::atomic<int> next{0};
  int order[8] = {};
  struct Entry {
    OrderLog* log;
    int tag;
  };
  Entry entries[8];
  void reset() {
    next.store(0);
    for (int i = 0; i < 8; ++i) entries[i] = Entry{this, i}, order[i] = -1;
  }
  static void run(void* p) {
    auto* e = static_cast<Entry*>(p);
    const int at = e->log->next.fetch_add(1, std::memory_order_acq_rel);
    if (at < 8) e->log->order[at] = e->tag;
  }
};

/// Gives wrongly ordered work a chance to run before the test looks.
inline void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

/// Waits (at most 20 s) until a gate's host function has started.
inline bool wait_entered(const Gate& g) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!g.entered.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

/// D::open()'s instance with device 0's primary context retained and current on the
/// calling thread, for the length of one property. Streams and events made through it
/// are destroyed (after a synchronisation) when it goes.
template <Driver D>
class Rig {
 public:
  using stream_t = typename D::stream_t;
  using event_t = typename D::event_t;

  explicit Rig(Probe& p) : p_(p), d_(*p.need(D::open(), "D::open()")) {
    dev_ = p.need(d_.device_get(0), "device_get(0)");
    ctx_ = p.need(d_.primary_ctx_retain(dev_), "primary_ctx_retain(device 0)");
    retained_ = true;
    p.need(d_.ctx_make_current(ctx_), "ctx_make_current(device 0's primary context)");
  }
  ~Rig() {
    (void)d_.ctx_make_current(ctx_);
    for (auto s : streams_) (void)d_.stream_synchronize(s);
    for (auto e : events_) (void)d_.event_destroy(e);
    for (auto s : streams_) (void)d_.stream_destroy(s);
    for (void* h : mapped_) (void)d_.mem_host_free(h);
    if (retained_) (void)d_.primary_ctx_release(dev_);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  D& d() { return d_; }
  typename D::device_t dev() const { return dev_; }
  typename D::context_t ctx() const { return ctx_; }

  stream_t stream() {
    stream_t s = p_.need(d_.stream_create(), "stream_create");
    streams_.push_back(s);
    return s;
  }
  event_t event() {
    event_t e = p_.need(d_.event_create(), "event_create");
    events_.push_back(e);
    return e;
  }
  typename D::mempool_t pool() {
    return p_.need(d_.device_default_mempool(dev_), "device_default_mempool(device 0)");
  }
  void* mapped(std::size_t n) {
    void* h = p_.need(d_.mem_host_alloc_mapped(n), "mem_host_alloc_mapped");
    mapped_.push_back(h);
    return h;
  }
  /// `n` bytes of pinned (mapped) host memory filled with `fill`. Copies that must not
  /// block the host use it: a copy to or from pageable memory may be synchronous in
  /// CUDA, and would then wait for a gate that only this thread can open.
  std::span<std::uint8_t> pinned(std::size_t n, std::uint8_t fill = 0) {
    auto* h = static_cast<std::uint8_t*>(mapped(n));
    std::memset(h, fill, n);
    return {h, n};
  }
  /// Forgets a stream the property destroyed itself.
  void forget(stream_t s) { std::erase(streams_, s); }

 private:
  Probe& p_;
  D& d_;
  typename D::device_t dev_{};
  typename D::context_t ctx_{};
  bool retained_ = false;
  std::vector<stream_t> streams_;
  std::vector<event_t> events_;
  std::vector<void*> mapped_;
};

inline std::size_t count_not(std::span<const std::uint8_t> v, std::uint8_t x) {
  return static_cast<std::size_t>(std::count_if(v.begin(), v.end(), [&](auto b) { return b != x; }));
}

// --- the properties --------------------------------------------------------------------

/// open() hands out one process-wide instance; kind and status names are the CUDA ones.
template <Driver D>
void open_is_one_instance(Probe& p) {
  D* a = p.need(D::open(), "D::open()");
  D* b = p.need(D::open(), "D::open() again");
  p.expect(a == b, "two D::open() calls returned different instances");
  const std::string kind = D::kind;
  p.expect(kind == "cuda" || kind == "sim", "D::kind is '" + kind + "', not cuda or sim");
  p.expect(a->status_name(status::invalid_value) == "CUDA_ERROR_INVALID_VALUE",
           "status_name(1) is '" + a->status_name(status::invalid_value) + "'");
  p.expect(a->status_name(status::not_ready) == "CUDA_ERROR_NOT_READY",
           "status_name(600) is '" + a->status_name(status::not_ready) + "'");
}

/// Devices, their attributes, and the errors for a device or attribute that is not one.
template <Driver D>
void devices_and_attributes(Probe& p) {
  D& d = *p.need(D::open(), "D::open()");
  const int n = p.need(d.device_count(), "device_count");
  p.expect(n >= 1, "device_count is " + std::to_string(n) + " on a machine with a device");
  typename D::device_t dev = p.need(d.device_get(0), "device_get(0)");
  for (int i = 1; i < n; ++i) (void)p.need(d.device_get(i), "device_get(" + std::to_string(i) + ")");
  p.expect_error(d.device_get(n), errc::no_device, status::invalid_device,
                 "device_get(device_count())");
  p.expect_error(d.device_get(-1), errc::no_device, status::invalid_device, "device_get(-1)");

  const std::string name = p.need(d.device_name(dev), "device_name");
  p.expect(!name.empty(), "device_name is empty");
  const std::size_t total = p.need(d.device_total_mem(dev), "device_total_mem");
  p.expect(total > 0, "device_total_mem is 0");

  auto attr = [&](DeviceAttr a, const char* what) {
    return p.need(d.device_attribute(dev, a), std::string("device_attribute(") + what + ")");
  };
  const int major = attr(DeviceAttr::compute_capability_major, "compute_capability_major");
  const int minor = attr(DeviceAttr::compute_capability_minor, "compute_capability_minor");
  const int sms = attr(DeviceAttr::multiprocessor_count, "multiprocessor_count");
  p.expect(major >= 5, "compute capability major " + std::to_string(major) + " < 5 (CUDA 12's floor)");
  p.expect(minor >= 0 && minor <= 9, "compute capability minor " + std::to_string(minor));
  p.expect(sms > 0, "multiprocessor_count " + std::to_string(sms));
  // The library needs these three; both drivers' default devices have them.
  p.expect(attr(DeviceAttr::memory_pools_supported, "memory_pools_supported") == 1,
           "memory_pools_supported is not 1");
  p.expect(attr(DeviceAttr::can_map_host_memory, "can_map_host_memory") == 1,
           "can_map_host_memory is not 1");
  p.expect(attr(DeviceAttr::stream_mem_ops_supported, "stream_mem_ops_supported") == 1,
           "stream_mem_ops_supported is not 1");
  p.expect(attr(DeviceAttr::compute_capability_major, "compute_capability_major") == major,
           "compute_capability_major changed between two reads");

  // A DeviceAttr value outside the enumeration is the caller's mistake, refused by name
  // (CudaDriver refuses it before asking libcuda).
  p.expect_error(d.device_attribute(dev, static_cast<DeviceAttr>(99)), errc::invalid_argument, 0,
                 "device_attribute(device 0, DeviceAttr 99)");

  if constexpr (std::is_integral_v<typename D::device_t>) {
    // Both drivers' device handles are ordinals; one past the last is no device.
    const auto bad = static_cast<typename D::device_t>(n);
    p.expect_error(d.device_name(bad), errc::no_device, status::invalid_device,
                   "device_name(device_count())");
    p.expect_error(d.device_total_mem(bad), errc::no_device, status::invalid_device,
                   "device_total_mem(device_count())");
    p.expect_error(d.device_attribute(bad, DeviceAttr::compute_capability_major), errc::no_device,
                   status::invalid_device, "device_attribute(device_count(), major)");
  }
}

/// The primary context is one per device; calls that need a current context refuse
/// with CUDA_ERROR_INVALID_CONTEXT when none is, and work again once one is.
template <Driver D>
void contexts_and_current(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  auto again = p.need(d.primary_ctx_retain(rig.dev()), "primary_ctx_retain a second time");
  p.expect(again == rig.ctx(), "a second primary_ctx_retain returned another context");
  p.need(d.primary_ctx_release(rig.dev()), "primary_ctx_release of the second retain");
  p.need(d.ctx_make_current(rig.ctx()), "ctx_make_current when already current");

  p.need(d.ctx_make_current(typename D::context_t{}), "ctx_make_current(null)");
  p.expect_error(d.stream_create(), errc::driver_error, status::invalid_context,
                 "stream_create with no current context");
  p.expect_error(d.event_create(), errc::driver_error, status::invalid_context,
                 "event_create with no current context");
  p.expect_error(d.mem_alloc(256), errc::driver_error, status::invalid_context,
                 "mem_alloc with no current context");
  p.expect_error(d.mem_get_info(), errc::driver_error, status::invalid_context,
                 "mem_get_info with no current context");
  p.need(d.ctx_make_current(rig.ctx()), "ctx_make_current after none was current");
  auto s = d.stream_create();
  p.expect(s.has_value(), "stream_create failed after the context was made current again");
  if (s) p.need(d.stream_destroy(*s), "stream_destroy");
}

/// mem_get_info sees a synchronous allocation come and go.
template <Driver D>
void mem_info_follows_allocation(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  constexpr std::size_t n = std::size_t{64} << 20;
  const MemInfo before = p.need(d.mem_get_info(), "mem_get_info");
  p.expect(before.total > 0 && before.free <= before.total,
           "mem_get_info: free " + std::to_string(before.free) + " of total " +
               std::to_string(before.total));
  const std::uint64_t ptr = p.need(d.mem_alloc(n), "mem_alloc(64 MiB)");
  p.expect(ptr != 0, "mem_alloc returned address 0");
  const MemInfo during = p.need(d.mem_get_info(), "mem_get_info after mem_alloc");
  p.expect(during.total == before.total, "mem_get_info's total changed");
  p.expect(during.free + n <= before.free,
           "mem_get_info's free went from " + std::to_string(before.free) + " to " +
               std::to_string(during.free) +
               " bytes, not down by at least 64 MiB, over a 64 MiB mem_alloc");
  p.need(d.mem_free(ptr), "mem_free");
  const MemInfo after = p.need(d.mem_get_info(), "mem_get_info after mem_free");
  p.expect(after.free > during.free, "mem_get_info's free did not rise after mem_free");
}

/// Streams: a fresh one is idle, synchronises, and has an id no other live stream has,
/// and a stream created after one is destroyed has an id never seen before.
template <Driver D>
void streams_and_ids(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  std::vector<typename D::stream_t> ss;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    ss.push_back(rig.stream());
    ids.push_back(p.need(d.stream_get_id(ss.back()), "stream_get_id"));
  }
  for (std::size_t i = 0; i < ss.size(); ++i) {
    for (std::size_t j = i + 1; j < ss.size(); ++j) {
      p.expect(ss[i] != ss[j], "stream_create returned one handle twice");
      p.expect(ids[i] != ids[j], "stream_get_id gave live streams " + std::to_string(i) + " and " +
                                     std::to_string(j) + " the same id " + std::to_string(ids[i]));
    }
  }
  p.expect(p.need(d.stream_get_id(ss[0]), "stream_get_id again") == ids[0],
           "stream_get_id of one stream changed between two calls");
  p.expect(p.need(d.stream_query(ss[0]), "stream_query of a fresh stream"),
           "stream_query of a stream with no work is false");
  p.need(d.stream_synchronize(ss[0]), "stream_synchronize of a fresh stream");
  p.need(d.stream_synchronize(typename D::stream_t{}), "stream_synchronize(legacy stream)");

  // Destroyed and created again, a handle may be reused; its id may not.
  for (int i = 0; i < 3; ++i) {
    p.need(d.stream_destroy(ss[0]), "stream_destroy");
    rig.forget(ss[0]);
    ss[0] = rig.stream();
    const std::uint64_t id = p.need(d.stream_get_id(ss[0]), "stream_get_id of a new stream");
    p.expect(std::find(ids.begin(), ids.end(), id) == ids.end(),
             "a stream created after a stream_destroy has id " + std::to_string(id) +
                 ", which another stream had");
    ids.push_back(id);
  }
}

/// Within a stream, work runs in the order enqueued and not before the work ahead of it:
/// queries say so, and a copy reads what the fills before it wrote.
template <Driver D>
void stream_order(Probe& p) {
  static Gate gate;
  static OrderLog log;
  Rig<D> rig(p);
  D& d = rig.d();
  GateGuard open_at_end{gate};
  auto s = rig.stream();
  auto pool = rig.pool();
  constexpr std::size_t n = std::size_t{1} << 16;
  const std::uint64_t a = p.need(d.mem_alloc_async(n, pool, s), "mem_alloc_async");
  const auto h = rig.pinned(n);
  log.reset();

  gate.close();
  p.need(d.launch_host_func(s, &Gate::wait, &gate), "launch_host_func(gate)");
  p.need(d.memset_d8_async(a, 0x44, n, s), "memset_d8_async 0x44");
  p.need(d.launch_host_func(s, &OrderLog::run, &log.entries[1]), "launch_host_func(1)");
  p.need(d.memset_d8_async(a, 0x55, n, s), "memset_d8_async 0x55");
  p.need(d.launch_host_func(s, &OrderLog::run, &log.entries[2]), "launch_host_func(2)");
  p.need(d.memcpy_dtoh_async(h.data(), a, n, s), "memcpy_dtoh_async");
  p.need(d.launch_host_func(s, &OrderLog::run, &log.entries[3]), "launch_host_func(3)");
  p.expect(wait_entered(gate), "the gate's host function never started");
  settle();
  p.expect(!p.need(d.stream_query(s), "stream_query"), "stream_query is true behind a closed gate");
  p.expect(log.next.load() == 0, "host functions behind a closed gate ran");
  p.expect(count_not(h, 0) == 0, "memcpy_dtoh_async behind a closed gate wrote the host buffer");

  gate.release();
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(p.need(d.stream_query(s), "stream_query after synchronize"),
           "stream_query is false after stream_synchronize");
  p.expect(log.next.load() == 3 && log.order[0] == 1 && log.order[1] == 2 && log.order[2] == 3,
           "host functions ran " + std::to_string(log.next.load()) + " times, in order " +
               std::to_string(log.order[0]) + "," + std::to_string(log.order[1]) + "," +
               std::to_string(log.order[2]) + " (expected 1,2,3)");
  p.expect(count_not(h, 0x55) == 0,
           std::to_string(count_not(h, 0x55)) + " of " + std::to_string(n) +
               " bytes read back are not the last fill 0x55 (first: " + std::to_string(h[0]) + ")");
  p.need(d.mem_free_async(a, s), "mem_free_async");
  p.need(d.stream_synchronize(s), "stream_synchronize after the free");
}

/// An event is reached when its stream reaches the record; a stream that waits on it
/// runs nothing enqueued after the wait before then, and then sees the data written
/// before the record.
template <Driver D>
void events_order_streams(Probe& p) {
  static Gate gate;
  static Witness after_wait;
  Rig<D> rig(p);
  D& d = rig.d();
  GateGuard open_at_end{gate};
  auto s1 = rig.stream();
  auto s2 = rig.stream();
  auto e = rig.event();
  auto pool = rig.pool();
  constexpr std::size_t n = std::size_t{1} << 16;
  const std::uint64_t a = p.need(d.mem_alloc_async(n, pool, s1), "mem_alloc_async");
  p.need(d.memset_d8_async(a, 0x11, n, s1), "memset_d8_async 0x11");
  p.need(d.stream_synchronize(s1), "stream_synchronize");
  const auto h = rig.pinned(n);
  after_wait.reset(gate);

  gate.close();
  p.need(d.launch_host_func(s1, &Gate::wait, &gate), "launch_host_func(gate)");
  p.need(d.memset_d8_async(a, 0x22, n, s1), "memset_d8_async 0x22");
  p.need(d.event_record(e, s1), "event_record");
  p.need(d.stream_wait_event(s2, e), "stream_wait_event");
  p.need(d.launch_host_func(s2, &Witness::run, &after_wait), "launch_host_func(witness)");
  p.need(d.memcpy_dtoh_async(h.data(), a, n, s2), "memcpy_dtoh_async on the waiting stream");
  p.expect(wait_entered(gate), "the gate's host function never started");
  settle();
  p.expect(!p.need(d.event_query(e), "event_query"), "event_query is true behind a closed gate");
  p.expect(!p.need(d.stream_query(s2), "stream_query(waiting stream)"),
           "stream_query of a stream waiting on an unreached event is true");
  p.expect(after_wait.count() == 0, "work enqueued after stream_wait_event ran before the event");

  gate.release();
  p.need(d.stream_synchronize(s2), "stream_synchronize(waiting stream)");
  p.expect(after_wait.count() == 1, "the waiting stream's host function ran " +
                                        std::to_string(after_wait.count()) + " times, not once");
  p.expect(!after_wait.saw_closed.load(), "the waiting stream's host function ran while the gate was closed");
  p.expect(count_not(h, 0x22) == 0,
           std::to_string(count_not(h, 0x22)) + " of " + std::to_string(n) +
               " bytes the waiting stream read are not the 0x22 written before the record");
  p.need(d.event_synchronize(e), "event_synchronize");
  p.expect(p.need(d.event_query(e), "event_query after synchronize"),
           "event_query is false after the event was reached");

  // Recording again moves the event: it is unreached until its stream gets there. (The
  // first gate's host function has returned once s1 is synchronised, so closing the
  // gate again cannot catch it.)
  p.need(d.stream_synchronize(s1), "stream_synchronize(s1)");
  gate.close();
  p.need(d.launch_host_func(s1, &Gate::wait, &gate), "launch_host_func(gate) again");
  p.need(d.event_record(e, s1), "event_record again");
  p.expect(wait_entered(gate), "the gate's host function never started (second time)");
  p.expect(!p.need(d.event_query(e), "event_query of the re-recorded event"),
           "event_query is true for an event re-recorded behind a closed gate");
  gate.release();
  p.need(d.event_synchronize(e), "event_synchronize of the re-recorded event");
  p.expect(p.need(d.event_query(e), "event_query after the second synchronize"),
           "event_query is false after event_synchronize");
  p.need(d.mem_free_async(a, s1), "mem_free_async");
}

/// An event never recorded is complete: querying, synchronising and waiting on it
/// succeed at once (cuEventQuery / cuEventSynchronize / cuStreamWaitEvent document it).
template <Driver D>
void unrecorded_event_is_complete(Probe& p) {
  static Witness w;
  static Gate open_gate;  // never closed
  Rig<D> rig(p);
  D& d = rig.d();
  auto s = rig.stream();
  auto e = rig.event();
  w.reset(open_gate);
  p.expect(p.need(d.event_query(e), "event_query(never recorded)"),
           "event_query of a never-recorded event is false");
  p.need(d.event_synchronize(e), "event_synchronize(never recorded)");
  p.need(d.stream_wait_event(s, e), "stream_wait_event(never recorded)");
  p.need(d.launch_host_func(s, &Witness::run, &w), "launch_host_func");
  p.need(d.stream_synchronize(s), "stream_synchronize after waiting on a never-recorded event");
  p.expect(w.count() == 1, "work after a wait on a never-recorded event did not run");
}

/// Pool allocations are distinct and hold their bytes through fills and copies in all
/// three directions; zero-byte fills and copies succeed and change nothing.
template <Driver D>
void memory_round_trip(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  auto s = rig.stream();
  auto pool = rig.pool();
  p.need(d.mempool_set_release_threshold(pool, std::uint64_t{64} << 20),
         "mempool_set_release_threshold(64 MiB)");
  constexpr std::size_t n = std::size_t{1} << 16;
  const std::uint64_t a = p.need(d.mem_alloc_async(n, pool, s), "mem_alloc_async a");
  const std::uint64_t b = p.need(d.mem_alloc_async(n, pool, s), "mem_alloc_async b");
  p.expect(a != 0 && b != 0, "mem_alloc_async returned address 0");
  p.expect(a + n <= b || b + n <= a, "two live pool allocations overlap");
  p.expect(a % 256 == 0 && b % 256 == 0, "a pool allocation is not 256-byte aligned");

  // Pageable host memory here (no gate is closed, so a copy that CUDA makes synchronous
  // waits for nothing).
  std::vector<std::uint8_t> src(n), h(n, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::uint8_t>(i * 7 + 3);
  p.need(d.memset_d8_async(b, 0x5A, n, s), "memset_d8_async b 0x5A");
  p.need(d.memcpy_htod_async(a, src.data(), n, s), "memcpy_htod_async");
  p.need(d.memcpy_dtod_async(b + 256, a, n - 512, s), "memcpy_dtod_async");
  p.need(d.memcpy_dtoh_async(h.data(), b, n, s), "memcpy_dtoh_async");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t want = (i < 256 || i >= n - 256) ? 0x5A : src[i - 256];
    wrong += h[i] != want;
  }
  p.expect(wrong == 0, std::to_string(wrong) + " of " + std::to_string(n) +
                           " bytes wrong after memset / htod / dtod (offset 256) / dtoh");

  // Zero bytes: succeed, move nothing.
  std::vector<std::uint8_t> h2(16, 0x77);
  p.need(d.memset_d8_async(b, 0x00, 0, s), "memset_d8_async of 0 bytes");
  p.need(d.memcpy_htod_async(b, src.data(), 0, s), "memcpy_htod_async of 0 bytes");
  p.need(d.memcpy_dtod_async(b, a, 0, s), "memcpy_dtod_async of 0 bytes");
  p.need(d.memcpy_dtoh_async(h2.data(), b, 0, s), "memcpy_dtoh_async of 0 bytes");
  p.need(d.memcpy_dtoh_async(h.data(), b, n, s), "memcpy_dtoh_async");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(count_not(h2, 0x77) == 0, "a zero-byte memcpy_dtoh_async wrote the host buffer");
  p.expect(h[0] == 0x5A && h[n - 1] == 0x5A, "a zero-byte fill or copy changed device memory");

  p.need(d.mem_free_async(a, s), "mem_free_async a");
  p.need(d.mem_free_async(b, s), "mem_free_async b");
  p.need(d.stream_synchronize(s), "stream_synchronize after the frees");

  // Synchronous memory is usable by stream work too.
  const std::uint64_t c = p.need(d.mem_alloc(4096), "mem_alloc(4096)");
  p.need(d.memset_d8_async(c, 0x3C, 4096, s), "memset_d8_async on mem_alloc memory");
  std::vector<std::uint8_t> h3(4096, 0);
  p.need(d.memcpy_dtoh_async(h3.data(), c, 4096, s), "memcpy_dtoh_async from mem_alloc memory");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(count_not(h3, 0x3C) == 0, "mem_alloc memory did not hold its fill");
  p.need(d.mem_free(c), "mem_free");
}

/// A stream-ordered free frees when its stream gets there. If the driver hands the range
/// to another stream's allocation before then, that stream is ordered after the free:
/// its work neither runs early nor is overwritten by the work the free waits for.
template <Driver D>
void free_is_stream_ordered(Probe& p) {
  static Gate gate;
  static Witness on_t;
  Rig<D> rig(p);
  D& d = rig.d();
  GateGuard open_at_end{gate};
  auto s = rig.stream();
  auto t = rig.stream();
  auto pool = rig.pool();
  constexpr std::size_t n = std::size_t{1} << 16;
  const std::uint64_t a = p.need(d.mem_alloc_async(n, pool, s), "mem_alloc_async on s");
  p.need(d.memset_d8_async(a, 0x11, n, s), "memset_d8_async 0x11");
  p.need(d.stream_synchronize(s), "stream_synchronize(s)");
  on_t.reset(gate);

  gate.close();
  p.need(d.launch_host_func(s, &Gate::wait, &gate), "launch_host_func(gate)");
  p.need(d.memset_d8_async(a, 0x22, n, s), "memset_d8_async 0x22 behind the gate");
  p.need(d.mem_free_async(a, s), "mem_free_async behind the gate");
  const std::uint64_t b = p.need(d.mem_alloc_async(n, pool, t), "mem_alloc_async on t");
  p.need(d.memset_d8_async(b, 0x33, n, t), "memset_d8_async 0x33 on t");
  p.need(d.launch_host_func(t, &Witness::run, &on_t), "launch_host_func(witness) on t");
  p.expect(wait_entered(gate), "the gate's host function never started");
  settle();
  const bool overlap = a < b + n && b < a + n;
  if (overlap) {
    p.expect(on_t.count() == 0,
             "the range freed on s behind a closed gate was allocated on t, and t's work ran "
             "before the free");
  }
  gate.release();
  p.need(d.stream_synchronize(s), "stream_synchronize(s)");
  p.need(d.stream_synchronize(t), "stream_synchronize(t)");
  p.expect(!on_t.saw_closed.load() || !overlap,
           "t's work on the reused range ran while the free's stream was held");
  const auto h = rig.pinned(n);
  p.need(d.memcpy_dtoh_async(h.data(), b, n, t), "memcpy_dtoh_async of t's block");
  p.need(d.stream_synchronize(t), "stream_synchronize(t)");
  p.expect(count_not(h, 0x33) == 0,
           std::to_string(count_not(h, 0x33)) + " bytes of t's block are not t's fill 0x33" +
               (overlap ? " (the block reuses the range freed on s)" : ""));
  p.need(d.mem_free_async(b, t), "mem_free_async on t");
}

/// ctx_synchronize returns once the work of every stream of the context has run, that of
/// a stream destroyed with work still queued included (StreamPool recycles a destroyed
/// stream's id after it, with no call on the dead handle).
template <Driver D>
void ctx_synchronize_waits_for_every_stream(Probe& p) {
  static Gate gate;
  static Witness on_live, on_destroyed;
  Rig<D> rig(p);
  D& d = rig.d();
  GateGuard open_at_end{gate};
  auto live = rig.stream();
  auto doomed = p.need(d.stream_create(), "stream_create");
  on_live.reset(gate);
  on_destroyed.reset(gate);
  gate.close();
  p.need(d.launch_host_func(live, &Gate::wait, &gate), "launch_host_func(gate) on a live stream");
  p.need(d.launch_host_func(live, &Witness::run, &on_live), "launch_host_func(witness) on the live stream");
  p.need(d.launch_host_func(doomed, &Gate::wait, &gate), "launch_host_func(gate) on a stream to destroy");
  p.need(d.launch_host_func(doomed, &Witness::run, &on_destroyed), "launch_host_func(witness) on it");
  p.need(d.stream_destroy(doomed), "stream_destroy with work queued");
  p.expect(wait_entered(gate), "the gate's host function never started");
  std::thread opener([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.release();
  });
  const auto synced = d.ctx_synchronize();
  const int live_runs = on_live.count(), destroyed_runs = on_destroyed.count();
  opener.join();
  p.need(synced, "ctx_synchronize");
  p.expect(live_runs == 1, "ctx_synchronize returned before a live stream's work ran");
  p.expect(destroyed_runs == 1, "ctx_synchronize returned before a destroyed stream's work ran");
}

/// stream_write_value32 writes mapped host memory in stream order; the device address
/// of an interior host pointer is the base's plus the offset.
template <Driver D>
void write_value_to_mapped_memory(Probe& p) {
  static Gate gate;
  Rig<D> rig(p);
  D& d = rig.d();
  GateGuard open_at_end{gate};
  auto s = rig.stream();
  void* host = rig.mapped(4096);
  auto* words = static_cast<std::uint32_t*>(host);
  std::memset(host, 0, 4096);
  const std::uint64_t dptr = p.need(d.mem_host_device_pointer(host), "mem_host_device_pointer");
  p.expect(dptr != 0, "mem_host_device_pointer returned 0");
  const std::uint64_t inner =
      p.need(d.mem_host_device_pointer(static_cast<char*>(host) + 100), "mem_host_device_pointer(+100)");
  p.expect(inner == dptr + 100, "the device address of host + 100 is not the base's + 100");
  auto read = [&](int i) { return std::atomic_ref<std::uint32_t>(words[i]).load(std::memory_order_acquire); };

  gate.close();
  p.need(d.launch_host_func(s, &Gate::wait, &gate), "launch_host_func(gate)");
  p.need(d.stream_write_value32(s, dptr + 8, 0xC0FFEEu), "stream_write_value32");
  p.expect(wait_entered(gate), "the gate's host function never started");
  settle();
  p.expect(read(2) == 0, "stream_write_value32 behind a closed gate wrote early");
  gate.release();
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(read(2) == 0xC0FFEEu, "stream_write_value32 did not write its value");
  p.expect(read(1) == 0 && read(3) == 0, "stream_write_value32 wrote beside its word");

  // A host polling the word sees it without synchronising (the reactor's use).
  p.need(d.stream_write_value32(s, dptr + 12, 7u), "stream_write_value32 (polled)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (read(3) != 7u && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  p.expect(read(3) == 7u, "a polling host never saw the write");
  p.need(d.stream_synchronize(s), "stream_synchronize");
}

/// Bad input is refused with the CUDA status, and loses nothing: the context still works.
template <Driver D>
void bad_input_is_refused(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  auto s = rig.stream();
  const typename D::event_t null_event{};
  p.expect_error(d.mem_alloc(0), errc::driver_error, status::invalid_value, "mem_alloc(0)");
  p.expect_error(d.event_query(null_event), errc::driver_error, status::invalid_handle,
                 "event_query(null event)");
  p.expect_error(d.event_record(null_event, s), errc::driver_error, status::invalid_handle,
                 "event_record(null event)");
  p.expect_error(d.event_synchronize(null_event), errc::driver_error, status::invalid_handle,
                 "event_synchronize(null event)");
  p.expect_error(d.stream_wait_event(s, null_event), errc::driver_error, status::invalid_handle,
                 "stream_wait_event(null event)");
  auto bogus = d.mem_free(0xdead0000ull);
  p.expect(!bogus, "mem_free of an address never allocated succeeded");
  if (!bogus) {
    p.expect(bogus.error().code() == errc::driver_error && bogus.error().driver_status() != 0,
             "mem_free(never allocated) failed with " + bogus.error().what() +
                 "; expected a driver_error carrying the driver's status");
  }
  // Nothing was lost: the stream and the context still work.
  const std::uint64_t c = p.need(d.mem_alloc(256), "mem_alloc after the refusals");
  p.need(d.memset_d8_async(c, 1, 256, s), "memset_d8_async after the refusals");
  p.need(d.stream_synchronize(s), "stream_synchronize after the refusals");
  p.expect(p.need(d.stream_query(s), "stream_query"), "the stream is not idle after synchronize");
  p.need(d.mem_free(c), "mem_free");
}

// --- virtual memory (drivers that model VirtualMemoryDriver) ------------------------------

/// A Rig's virtual memory: what a property reserved, created and mapped through it, each
/// undone when it goes (after a synchronisation of the context), whatever the property
/// undid itself already. So a property that gives up half way leaves the driver as it
/// found it.
template <VirtualMemoryDriver D>
class VmmRig {
 public:
  using phys_t = typename D::phys_t;

  explicit VmmRig(Probe& p, Rig<D>& rig) : p_(p), rig_(rig), d_(rig.d()) {
    g_ = p.need(d_.mem_granularity(rig.dev()), "mem_granularity(device 0)");
  }
  ~VmmRig() {
    (void)d_.ctx_make_current(rig_.ctx());
    (void)d_.ctx_synchronize();
    for (auto [va, n] : maps_) (void)d_.mem_unmap(va, n);
    for (phys_t h : phys_) (void)d_.mem_release(h);
    for (auto [va, n] : ranges_) (void)d_.mem_address_free(va, n);
  }
  VmmRig(const VmmRig&) = delete;
  VmmRig& operator=(const VmmRig&) = delete;

  std::size_t g() const { return g_.minimum; }
  const AllocationGranularity& granularity() const { return g_; }

  std::uint64_t reserve(std::size_t n, std::size_t align = 0) {
    const std::uint64_t va = p_.need(d_.mem_address_reserve(n, align), "mem_address_reserve");
    ranges_.emplace_back(va, n);
    return va;
  }
  void free_range(std::uint64_t va, std::size_t n) {
    p_.need(d_.mem_address_free(va, n), "mem_address_free");
    std::erase(ranges_, std::pair{va, n});
  }
  phys_t create(std::size_t n) {
    const phys_t h = p_.need(d_.mem_create(n, rig_.dev()), "mem_create(device 0)");
    phys_.push_back(h);
    return h;
  }
  void release(phys_t h) {
    p_.need(d_.mem_release(h), "mem_release");
    std::erase_if(phys_, [&](phys_t x) { return x == h; });
  }
  void map(std::uint64_t va, std::size_t n, phys_t h) {
    p_.need(d_.mem_map(va, n, h), "mem_map");
    maps_.emplace_back(va, n);
  }
  void unmap(std::uint64_t va, std::size_t n) {
    p_.need(d_.mem_unmap(va, n), "mem_unmap");
    std::erase(maps_, std::pair{va, n});
  }
  void access(std::uint64_t va, std::size_t n) {
    p_.need(d_.mem_set_access(va, n, rig_.dev()), "mem_set_access(device 0)");
  }
  /// Forgets a mapping the property unmapped itself.
  void forget_mapping(std::uint64_t va, std::size_t n) { std::erase(maps_, std::pair{va, n}); }

 private:
  Probe& p_;
  Rig<D>& rig_;
  D& d_;
  AllocationGranularity g_;
  std::vector<std::pair<std::uint64_t, std::size_t>> ranges_;
  std::vector<phys_t> phys_;
  std::vector<std::pair<std::uint64_t, std::size_t>> maps_;
};

/// The granularity is a power of two with the recommended one a multiple of it;
/// reservations are aligned to it (or to the alignment asked for) and disjoint.
template <VirtualMemoryDriver D>
void vmm_granularity_and_reservations(Probe& p) {
  Rig<D> rig(p);
  VmmRig<D> vm(p, rig);
  const AllocationGranularity g = vm.granularity();
  p.expect(g.minimum >= 4096 && (g.minimum & (g.minimum - 1)) == 0,
           "the minimum granularity " + std::to_string(g.minimum) +
               " is not a power of two of at least a page");
  p.expect(g.recommended >= g.minimum && g.recommended % g.minimum == 0,
           "the recommended granularity " + std::to_string(g.recommended) +
               " is not a multiple of the minimum " + std::to_string(g.minimum));
  const std::uint64_t a = vm.reserve(4 * g.minimum);
  const std::uint64_t b = vm.reserve(4 * g.minimum);
  const std::uint64_t w = vm.reserve(2 * g.minimum, 16 * g.minimum);
  p.expect(a != 0 && b != 0 && w != 0, "mem_address_reserve returned address 0");
  p.expect(a % g.minimum == 0 && b % g.minimum == 0,
           "a reservation is not aligned to the minimum granularity");
  p.expect(w % (16 * g.minimum) == 0, "a reservation is not aligned as asked");
  p.expect(a + 4 * g.minimum <= b || b + 4 * g.minimum <= a, "two reservations overlap");
  vm.free_range(a, 4 * g.minimum);
  vm.free_range(b, 4 * g.minimum);
  vm.free_range(w, 2 * g.minimum);
}

/// Two physical allocations mapped side by side read as one range (a copy crosses from
/// one to the other), one mapped at a second address shows the same bytes there, and
/// copies and fills move bytes between virtual and pool memory.
template <VirtualMemoryDriver D>
void vmm_stitched_round_trip(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  VmmRig<D> vm(p, rig);
  auto s = rig.stream();
  const std::size_t g = vm.g();
  const std::uint64_t va = vm.reserve(4 * g);
  const std::uint64_t alias = vm.reserve(g);
  auto a = vm.create(g);
  auto b = vm.create(g);
  vm.map(va, g, b);  // b first, a after it
  vm.map(va + g, g, a);
  vm.map(alias, g, a);
  vm.access(va, 2 * g);  // two whole mappings in one call
  vm.access(alias, g);

  constexpr std::size_t n = 8192;  // half before the seam, half after
  std::vector<std::uint8_t> src(n), across(n, 0), after(n / 2, 0), viapool(n, 0), head(256, 0);
  for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<std::uint8_t>(i * 13 + 5);
  const std::uint64_t pooled = p.need(d.mem_alloc_async(n, rig.pool(), s), "mem_alloc_async");
  p.need(d.memset_d8_async(va, 0x5A, g, s), "memset_d8_async of the first mapping");
  p.need(d.memcpy_htod_async(va + g - n / 2, src.data(), n, s), "memcpy_htod_async across the seam");
  p.need(d.memcpy_dtoh_async(across.data(), va + g - n / 2, n, s), "memcpy_dtoh_async across the seam");
  p.need(d.memcpy_dtoh_async(after.data(), alias, n / 2, s), "memcpy_dtoh_async through the alias");
  p.need(d.memcpy_dtod_async(pooled, va + g - n / 2, n, s), "memcpy_dtod_async to pool memory");
  p.need(d.memcpy_dtoh_async(viapool.data(), pooled, n, s), "memcpy_dtoh_async of the pool copy");
  p.need(d.memcpy_dtoh_async(head.data(), va, 256, s), "memcpy_dtoh_async of the first bytes");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  auto wrong = [&](const std::vector<std::uint8_t>& got, std::size_t from) {
    std::size_t w = 0;
    for (std::size_t i = 0; i < got.size(); ++i) w += got[i] != src[from + i];
    return w;
  };
  p.expect(wrong(across, 0) == 0, std::to_string(wrong(across, 0)) +
                                      " bytes read back across two stitched mappings differ from those written");
  p.expect(wrong(after, n / 2) == 0,
           std::to_string(wrong(after, n / 2)) +
               " bytes of an allocation read through its second mapping differ from those "
               "written through the first");
  p.expect(wrong(viapool, 0) == 0, std::to_string(wrong(viapool, 0)) +
                                       " bytes copied from virtual to pool memory differ");
  p.expect(count_not(head, 0x5A) == 0, "the fill of the first mapping did not hold");

  p.need(d.mem_free_async(pooled, s), "mem_free_async");
  p.need(d.stream_synchronize(s), "stream_synchronize before unmapping");
  vm.unmap(alias, g);
  vm.unmap(va + g, g);
  vm.unmap(va, g);
  vm.release(a);
  vm.release(b);
  vm.free_range(alias, g);
  vm.free_range(va, 4 * g);
}

/// Physical memory is device memory: mem_get_info's free memory falls when it is
/// created, stays down while a mapping holds it after its release (whose bytes stay
/// readable), and rises when the last mapping goes.
template <VirtualMemoryDriver D>
void vmm_mem_info_follows_physical_memory(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  VmmRig<D> vm(p, rig);
  auto s = rig.stream();
  const std::size_t g = vm.g();
  const std::size_t n = ((std::size_t{64} << 20) + g - 1) / g * g;
  const MemInfo before = p.need(d.mem_get_info(), "mem_get_info");
  auto h = vm.create(n);
  const MemInfo during = p.need(d.mem_get_info(), "mem_get_info after mem_create");
  p.expect(during.free + n <= before.free,
           "mem_get_info's free went from " + std::to_string(before.free) + " to " +
               std::to_string(during.free) + " bytes, not down by at least " +
               std::to_string(n) + ", over a mem_create of that many");
  const std::uint64_t va = vm.reserve(n);
  vm.map(va, n, h);
  vm.access(va, n);
  p.need(d.memset_d8_async(va, 0x3C, n, s), "memset_d8_async of the mapping");
  p.need(d.stream_synchronize(s), "stream_synchronize");

  vm.release(h);  // legal while mapped: the mapping keeps the memory
  const MemInfo held = p.need(d.mem_get_info(), "mem_get_info after mem_release");
  p.expect(held.free + n <= before.free,
           "mem_get_info's free rose to " + std::to_string(held.free) +
               " bytes after mem_release of memory still mapped");
  std::vector<std::uint8_t> tail(4096, 0);
  p.need(d.memcpy_dtoh_async(tail.data(), va + n - tail.size(), tail.size(), s),
         "memcpy_dtoh_async of released, mapped memory");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(count_not(tail, 0x3C) == 0, "released memory still mapped did not keep its bytes");

  vm.unmap(va, n);
  const MemInfo after = p.need(d.mem_get_info(), "mem_get_info after the last unmap");
  p.expect(after.free > held.free, "mem_get_info's free did not rise after the last unmap of "
                                   "released memory");
  vm.free_range(va, n);
}

/// What the driver API documents as wrong is refused, and loses nothing: a size or address
/// that is not a multiple of the granularity, a mapping larger than its allocation or over
/// a mapping, part of a mapping unmapped, access set on a range not fully mapped, a
/// reservation freed with another size. Every refusal is a driver_error.
template <VirtualMemoryDriver D>
void vmm_bad_input_is_refused(Probe& p) {
  Rig<D> rig(p);
  D& d = rig.d();
  VmmRig<D> vm(p, rig);
  auto s = rig.stream();
  const std::size_t g = vm.g();
  const std::uint64_t va = vm.reserve(4 * g);
  auto h = vm.create(2 * g);
  auto refused = [&](const auto& r, const std::string& call) {
    p.expect_error(r, errc::driver_error, 0, call);
  };
  refused(d.mem_create(g / 2, rig.dev()), "mem_create(half the granularity)");
  refused(d.mem_map(va + g / 2, g, h), "mem_map at an address off the granularity");
  refused(d.mem_map(va, g / 2, h), "mem_map of half the granularity");
  refused(d.mem_map(va, 4 * g, h), "mem_map of more than the allocation");
  vm.map(va, 2 * g, h);
  refused(d.mem_map(va + g, 2 * g, h), "mem_map over a mapping");
  refused(d.mem_unmap(va, g), "mem_unmap of the first half of a mapping");
  refused(d.mem_set_access(va, 4 * g, rig.dev()), "mem_set_access of a range half unmapped");
  refused(d.mem_address_free(va, 2 * g), "mem_address_free with another size than reserved");

  // Nothing was lost: the mapping works, and comes apart as it was made.
  vm.access(va, 2 * g);
  p.need(d.memset_d8_async(va + 2 * g - 256, 0x21, 256, s), "memset_d8_async after the refusals");
  std::vector<std::uint8_t> back(256, 0);
  p.need(d.memcpy_dtoh_async(back.data(), va + 2 * g - 256, 256, s), "memcpy_dtoh_async");
  p.need(d.stream_synchronize(s), "stream_synchronize");
  p.expect(count_not(back, 0x21) == 0, "a mapping did not hold its fill after the refusals");
  vm.unmap(va, 2 * g);
  vm.release(h);
  vm.free_range(va, 4 * g);
}

/// Prints (does not check) what a VirtualMemoryDriver answers where the driver API
/// documentation is silent or vague, and SimDriver chose (see its class comment).
template <VirtualMemoryDriver D>
void report_unspecified_vmm() {
  Probe p;
  try {
    Rig<D> rig(p);
    D& d = rig.d();
    VmmRig<D> vm(p, rig);
    const std::size_t g = vm.g();
    auto say = [](const char* call, const auto& r) {
      std::printf("%s answers %s -> %s\n", D::kind, call,
                  r ? "success" : r.error().what().c_str());
    };
    const std::uint64_t va = vm.reserve(8 * g);
    auto h = vm.create(2 * g);
    auto part = d.mem_map(va, g, h);
    say("mem_map(the first half of an allocation)", part);
    if (part) (void)d.mem_unmap(va, g);
    vm.map(va, g, h);
    vm.map(va + g, g, h);
    auto both = d.mem_unmap(va, 2 * g);
    say("mem_unmap(two adjacent mappings in one call)", both);
    if (both) {
      vm.forget_mapping(va, g);
      vm.forget_mapping(va + g, g);
    } else {
      vm.unmap(va, g);
      vm.unmap(va + g, g);
    }
    vm.map(va, 2 * g, h);
    say("mem_set_access(the first half of a mapping)", d.mem_set_access(va, g, rig.dev()));
  } catch (const Abort&) {
  }
  for (const auto& f : p.failures()) std::printf("%s report_unspecified_vmm: %s\n", D::kind, f.c_str());
}

/// Prints (does not check) what the driver answers to input whose outcome the CUDA
/// documentation leaves open, so that a GPU run shows where SimDriver's choice differs
/// from the real driver's. Only calls that cannot harm the context are made.
template <Driver D>
void report_unspecified() {
  Probe p;
  try {
    Rig<D> rig(p);
    D& d = rig.d();
    auto s = rig.stream();
    auto pool = rig.pool();
    auto say = [](const char* call, const auto& r) {
      std::printf("%s answers %s -> %s\n", D::kind, call,
                  r ? "success" : r.error().what().c_str());
    };
    auto z = d.mem_alloc_async(0, pool, s);
    say("mem_alloc_async(0 bytes)", z);
    if (z && *z != 0) (void)d.mem_free_async(*z, s);
    auto m = d.mem_host_alloc_mapped(0);
    say("mem_host_alloc_mapped(0 bytes)", m);
    if (m && *m != nullptr) (void)d.mem_host_free(*m);
    std::vector<std::uint8_t> pageable(64);
    say("mem_host_device_pointer(pageable memory)", d.mem_host_device_pointer(pageable.data()));
    (void)d.stream_synchronize(s);
  } catch (const Abort&) {
  }
  for (const auto& f : p.failures()) std::printf("%s report_unspecified: %s\n", D::kind, f.c_str());
}

/// Every property, by name, for one driver.
template <Driver D>
struct NamedProperty {
  const char* name;
  Property<D> fn;
};

template <Driver D>
std::vector<NamedProperty<D>> all_properties() {
  return {
      {"open_is_one_instance", &open_is_one_instance<D>},
      {"devices_and_attributes", &devices_and_attributes<D>},
      {"contexts_and_current", &contexts_and_current<D>},
      {"mem_info_follows_allocation", &mem_info_follows_allocation<D>},
      {"streams_and_ids", &streams_and_ids<D>},
      {"stream_order", &stream_order<D>},
      {"events_order_streams", &events_order_streams<D>},
      {"unrecorded_event_is_complete", &unrecorded_event_is_complete<D>},
      {"memory_round_trip", &memory_round_trip<D>},
      {"free_is_stream_ordered", &free_is_stream_ordered<D>},
      {"ctx_synchronize_waits_for_every_stream", &ctx_synchronize_waits_for_every_stream<D>},
      {"write_value_to_mapped_memory", &write_value_to_mapped_memory<D>},
      {"bad_input_is_refused", &bad_input_is_refused<D>},
  };
}

/// The virtual memory properties, for a driver that models VirtualMemoryDriver.
template <VirtualMemoryDriver D>
std::vector<NamedProperty<D>> vmm_properties() {
  return {
      {"vmm_granularity_and_reservations", &vmm_granularity_and_reservations<D>},
      {"vmm_stitched_round_trip", &vmm_stitched_round_trip<D>},
      {"vmm_mem_info_follows_physical_memory", &vmm_mem_info_follows_physical_memory<D>},
      {"vmm_bad_input_is_refused", &vmm_bad_input_is_refused<D>},
  };
}

/// The whole suite as Catch2 checks: one CHECK per property, naming what broke.
template <Driver D>
void driver_conformance_suite() {
  auto props = all_properties<D>();
  if constexpr (VirtualMemoryDriver<D>) {
    for (const auto& prop : vmm_properties<D>()) props.push_back(prop);
  }
  for (const auto& prop : props) {
    const auto failures = run_property<D>(prop.fn);
    INFO(std::string(D::kind) + " driver, property " + prop.name + ":\n  " + joined(failures));
    CHECK(failures.empty());
    std::printf("%s %s: %s\n", D::kind, prop.name, failures.empty() ? "holds" : "BROKEN");
  }
  report_unspecified<D>();
  if constexpr (VirtualMemoryDriver<D>) report_unspecified_vmm<D>();
}

}  // namespace xlogrt::drvtest
