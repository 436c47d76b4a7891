// SPDX-License-Identifier: Apache-2.0
// The cost of cross-stream use tracking: prepare_block_use + finish_block_use for one
// buffer argument of a launch, through DeviceRuntime<AsyncCuda>, in four cases:
//   same stream            a use on the block's own stream (target: no driver call)
//   cross read             repeated reads on another stream
//   cross read after write a read on another stream right after a write on the owner's
//   write after 4 reads    a write on a fifth stream after reads on four others
// Each case's driver calls are counted first (through a counting driver around the real
// one), then each use is timed on its own, next to the raw driver calls it makes (the
// floor: the same cuEventRecord and cuStreamWaitEvent calls, straight into libcuda, on
// events in the same state: a floor cycle makes the raw calls of the tracked cycle's
// untimed setup too) and one raw cuEventRecord + cuStreamWaitEvent pair, all in the same
// interleaved rounds.
// Then 1..8 threads, each on its own stream with its own blocks: aggregate prepare +
// finish pairs per second (allocations and frees outside the timed loops).
//
// The streams are idle (no kernels), so the figures are the host-side cost of the calls.
// On a machine without a GPU it runs on SimDriver and says so: those figures measure the
// simulator, not a GPU.
//
// usage: tracking_cost [rounds=200] [uses-per-round=100] [pairs-per-thread=100000]

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

// ---- a driver that counts the calls it forwards ----------------------------------------

// Every member of the Driver concept, once.
#define XLOGRT_BENCH_DRIVER_CALLS(X)                                                                   \
  X(device_count) X(device_get) X(device_name) X(device_total_mem) X(device_attribute)                 \
  X(primary_ctx_retain) X(primary_ctx_release) X(ctx_make_current) X(mem_get_info) X(stream_create)    \
  X(stream_destroy) X(stream_synchronize) X(stream_query) X(stream_get_id) X(stream_wait_event) X(event_create)         \
  X(event_destroy) X(event_record) X(event_query) X(event_synchronize) X(device_default_mempool)       \
  X(mempool_set_release_threshold) X(mem_alloc_async) X(mem_free_async) X(mem_alloc) X(mem_free)       \
  X(mem_host_alloc_mapped) X(mem_host_device_pointer) X(mem_host_free) X(memset_d8_async)              \
  X(memcpy_htod_async) X(memcpy_dtoh_async) X(memcpy_dtod_async) X(stream_write_value32)               \
  X(launch_host_func) X(stream_capture_info) X(exchange_capture_mode) X(ctx_synchronize)

enum class Call : std::size_t {
#define XLOGRT_BENCH_ENUM(name) name,
  XLOGRT_BENCH_DRIVER_CALLS(XLOGRT_BENCH_ENUM)
#undef XLOGRT_BENCH_ENUM
  count
};
constexpr std::size_t call_count = static_cast<std::size_t>(Call::count);

using CallCounts = std::array<std::uint64_t, call_count>;

/// Forwards every Driver member to a driver the caller opened, counting each call.
/// Thread-safe (relaxed counters), as the driver it wraps.
template <Driver D>
class CountingDriver {
 public:
  using device_t = typename D::device_t;
  using context_t = typename D::context_t;
  using stream_t = typename D::stream_t;
  using event_t = typename D::event_t;
  using mempool_t = typename D::mempool_t;
  static constexpr const char* kind = D::kind;

  explicit CountingDriver(D& d) noexcept : d_(&d) {}

  /// There is no process-wide instance: construct one around an opened driver.
  static result<CountingDriver*> open() noexcept {
    return error{errc::no_driver, "CountingDriver has no process-wide instance; construct it around a driver"};
  }

#define XLOGRT_BENCH_FORWARD(name)                                                   \
  template <class... Args>                                                           \
  auto name(Args... args) noexcept {                                                 \
    calls_[static_cast<std::size_t>(Call::name)].fetch_add(1, std::memory_order_relaxed); \
    return d_->name(args...);                                                        \
  }
  XLOGRT_BENCH_DRIVER_CALLS(XLOGRT_BENCH_FORWARD)
#undef XLOGRT_BENCH_FORWARD

  std::string status_name(int s) const { return d_->status_name(s); }

  CallCounts counts() const noexcept {
    CallCounts c{};
    for (std::size_t i = 0; i < call_count; ++i) c[i] = calls_[i].load(std::memory_order_relaxed);
    return c;
  }

 private:
  D* d_;
  std::array<std::atomic<std::uint64_t>, call_count> calls_{};
};

// ---- the raw floor -----------------------------------------------------------------------

/// cuEventRecord and cuStreamWaitEvent as the driver's library exports them: libcuda's
/// own entry points for CudaDriver, the driver's members otherwise.
template <class D>
struct Raw {
  D& d;
  void record(typename D::event_t e, typename D::stream_t s) { (void)d.event_record(e, s); }
  void wait(typename D::stream_t s, typename D::event_t e) { (void)d.stream_wait_event(s, e); }
};
template <>
struct Raw<CudaDriver> {
  CudaDriver& d;
  void record(CUevent e, CUstream s) { d.api().cuEventRecord_(e, s); }
  void wait(CUstream s, CUevent e) { d.api().cuStreamWaitEvent_(s, e, 0); }
};

// ---- the cases -----------------------------------------------------------------------------

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tracking_cost: %s\n", what.c_str());
  std::exit(1);
}
void must(result<void> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().what());
}

constexpr StreamId S(std::uint32_t i) { return StreamId{i}; }

enum class Case { same_stream, cross_read, cross_read_after_write, write_after_reads };
constexpr std::array<Case, 4> cases = {Case::same_stream, Case::cross_read, Case::cross_read_after_write,
                                       Case::write_after_reads};

const char* name_of(Case c) {
  switch (c) {
    case Case::same_stream: return "same stream (read-write on the block's own stream)";
    case Case::cross_read: return "cross-stream read (repeated, on stream 1)";
    case Case::cross_read_after_write: return "cross-stream read after a write on the owner's stream";
    case Case::write_after_reads: return "cross-stream write (stream 5) after reads on streams 1-4";
  }
  return "?";
}

/// One prepare + finish of block `id` on `s`.
template <class Rt>
void use(Rt& rt, BlockId id, StreamId s, Access a) {
  must(rt.prepare_block_use(id, s, a), "prepare_block_use");
  must(rt.finish_block_use(id, s, a), "finish_block_use");
}

/// One cycle of case `c` on block `id` (allocated on stream 0): its untimed setup, then
/// the measured use, run inside `measure`.
template <class Rt, class Measure>
void cycle(Case c, Rt& rt, BlockId id, Measure&& measure) {
  switch (c) {
    case Case::same_stream:
      measure([&] { use(rt, id, S(0), Access::ReadWrite); });
      break;
    case Case::cross_read:
      measure([&] { use(rt, id, S(1), Access::Read); });
      break;
    case Case::cross_read_after_write:
      use(rt, id, S(0), Access::Write);
      measure([&] { use(rt, id, S(1), Access::Read); });
      break;
    case Case::write_after_reads:
      for (std::uint32_t s = 1; s <= 4; ++s) use(rt, id, S(s), Access::Read);
      measure([&] { use(rt, id, S(5), Access::Write); });
      break;
  }
}

/// Driver calls per measured use of each case, counted through CountingDriver.
struct PerUse {
  double records = 0;
  double waits = 0;
  double contexts = 0;  // ctx_make_current (cuCtxGetCurrent on CudaDriver)
  double other = 0;
};

template <class D>
std::array<PerUse, cases.size()> count_calls(D& drv) {
  using C = CountingDriver<D>;
  C counting(drv);
  auto dev = Device<C>::open(counting, 0);
  if (!dev) die("counting: " + dev.error().what());
  auto streams = StreamPool<C>::create(*dev, 8);
  if (!streams) die("counting: " + streams.error().what());
  auto stack = AsyncCuda<C>::create(*streams);
  if (!stack) die("counting: " + stack.error().what());
  auto made = DeviceRuntime<AsyncCuda<C>>::create(*streams, std::move(*stack));
  if (!made) die("counting: " + made.error().what());
  auto& rt = *made;

  std::array<PerUse, cases.size()> out{};
  constexpr int cycles = 64;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    auto b = rt.allocate(4096, S(0));
    if (!b) die("counting: " + b.error().what());
    CallCounts total{};
    int measured = 0;
    auto measure = [&](auto&& f) {
      const CallCounts before = counting.counts();
      f();
      const CallCounts after = counting.counts();
      for (std::size_t k = 0; k < call_count; ++k) total[k] += after[k] - before[k];
      ++measured;
    };
    for (int w = 0; w < 4; ++w) cycle(cases[i], rt, b->id(), [](auto&& f) { f(); });  // steady state
    for (int n = 0; n < cycles; ++n) cycle(cases[i], rt, b->id(), measure);
    must(rt.deallocate(std::move(*b)), "deallocate");
    PerUse& p = out[i];
    for (std::size_t k = 0; k < call_count; ++k) {
      const double per = static_cast<double>(total[k]) / measured;
      if (k == static_cast<std::size_t>(Call::event_record)) {
        p.records += per;
      } else if (k == static_cast<std::size_t>(Call::stream_wait_event)) {
        p.waits += per;
      } else if (k == static_cast<std::size_t>(Call::ctx_make_current)) {
        p.contexts += per;
      } else {
        p.other += per;
      }
    }
  }
  must(rt.reap_pending(), "reap_pending");
  return out;
}

struct Series {
  std::string name;
  std::vector<double> ns;
};

template <class D>
int run_bench(D& drv, const char* where, int rounds, int per_round, long pairs_per_thread) {
  const auto per_use = count_calls(drv);

  auto dev = Device<D>::open(drv, 0);
  if (!dev) die("open: " + dev.error().what());
  auto streams = StreamPool<D>::create(*dev, 16);
  if (!streams) die("streams: " + streams.error().what());
  auto stack = AsyncCuda<D>::create(*streams);
  if (!stack) die("AsyncCuda: " + stack.error().what());
  auto made = DeviceRuntime<AsyncCuda<D>>::create(*streams, std::move(*stack));
  if (!made) die("runtime: " + made.error().what());
  auto& rt = *made;
  must((*dev)->make_current(), "make_current");
  Raw<D> raw{drv};
  std::array<typename D::stream_t, 6> s{};
  for (std::uint32_t i = 0; i < s.size(); ++i) s[i] = *(*streams)->get(S(i));
  std::array<typename D::event_t, 5> ev{};
  for (auto& e : ev) {
    auto made = drv.event_create();
    if (!made) die("event_create: " + made.error().what());
    e = *made;
  }

  std::printf("# prepare_block_use + finish_block_use per buffer argument on %s (%s)\n"
              "# %s; %d rounds x %d uses per case, each use timed on its own, cases interleaved\n\n",
              where, (*dev)->info().name.c_str(), machine_line().c_str(), rounds, per_round);

  // The floor of each case: the raw calls its use makes (counted above), made the same
  // way: records on the using stream(s), waits on the using stream.
  auto raw_floor = [&](Case c) -> std::function<void()> {
    switch (c) {
      case Case::same_stream: return {};
      case Case::cross_read: return [&] { raw.record(ev[0], s[1]); };
      case Case::cross_read_after_write:
        return [&] {
          raw.record(ev[0], s[0]);
          raw.wait(s[1], ev[0]);
          raw.record(ev[1], s[1]);
        };
      case Case::write_after_reads:
        return [&] {
          for (std::size_t k = 1; k <= 4; ++k) raw.wait(s[5], ev[k]);
          raw.record(ev[0], s[5]);
        };
    }
    return {};
  };
  // The untimed part of a floor cycle, mirroring the untimed setup of the tracked cycle:
  // before the timed write, the reads on streams 1-4 each wait for the last write (on
  // stream 5) and record their event, so the timed waits are on freshly recorded events,
  // as the tracked write's are (a wait on a long-completed event can be cheaper).
  auto raw_setup = [&](Case c) {
    if (c != Case::write_after_reads) return;
    for (std::size_t k = 1; k <= 4; ++k) {
      raw.wait(s[k], ev[0]);
      raw.record(ev[k], s[k]);
    }
  };

  std::vector<DeviceBlock> blocks;
  std::vector<Series> tracked, floors;
  for (Case c : cases) {
    auto b = rt.allocate(4096, S(0));
    if (!b) die("allocate: " + b.error().what());
    blocks.push_back(std::move(*b));
    tracked.push_back({name_of(c), {}});
    floors.push_back({"raw", {}});
  }
  Series pair{"raw cuEventRecord + cuStreamWaitEvent", {}};
  Series empty{"empty timed region (timer overhead, in every figure)", {}};

  auto time_one = [](std::vector<double>& into) {
    return [&into](auto&& f) {
      const double t0 = now_ns();
      f();
      into.push_back(now_ns() - t0);
    };
  };
  auto settle = [&] {
    for (auto& st : s) (void)drv.stream_synchronize(st);
  };
  for (int r = -1; r < rounds; ++r) {  // round -1 warms up and is dropped
    for (std::size_t i = 0; i < cases.size(); ++i) {
      std::vector<double> sink;
      auto& tn = r < 0 ? sink : tracked[i].ns;
      auto& fn = r < 0 ? sink : floors[i].ns;
      for (int k = 0; k < per_round; ++k) cycle(cases[i], rt, blocks[i].id(), time_one(tn));
      if (auto f = raw_floor(cases[i])) {
        for (int k = 0; k < per_round; ++k) {
          raw_setup(cases[i]);
          time_one(fn)(f);
        }
      }
    }
    std::vector<double> sink;
    for (int k = 0; k < per_round; ++k) {
      time_one(r < 0 ? sink : pair.ns)([&] {
        raw.record(ev[0], s[0]);
        raw.wait(s[1], ev[0]);
      });
      time_one(r < 0 ? sink : empty.ns)([] {});
    }
    settle();  // keep the streams' queues short
  }

  const Summary ps = summarize(pair.ns);
  const Summary es = summarize(empty.ns);
  {
    Table t("", {"case", "driver calls per use: records / waits / context checks / other", "median ns", "p99 ns",
                 "floor: the same raw calls, median / p99 ns", "ratio to floor (median)",
                 "ratio to one raw record + wait (median)"});
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Summary tr = summarize(tracked[i].ns);
      const PerUse& u = per_use[i];
      std::string floor_col = "none (no call)", floor_ratio = "-";
      if (!floors[i].ns.empty()) {
        const Summary f = summarize(floors[i].ns);
        floor_col = fmt("%.0f / %.0f", f.median, f.p99);
        floor_ratio = fmt("%.2f", tr.median / f.median);
      }
      t.row(tracked[i].name, fmt("%.2f / %.2f / %.2f / %.2f", u.records, u.waits, u.contexts, u.other),
            fmt("%.0f", tr.median), fmt("%.0f", tr.p99), floor_col, floor_ratio, fmt("%.3f", tr.median / ps.median));
    }
    t.row(pair.name, "1 / 1 / 0 / 0", fmt("%.0f", ps.median), fmt("%.0f", ps.p99), "-", "-", "1.000");
    t.row(empty.name, "-", fmt("%.0f", es.median), fmt("%.0f", es.p99), "-", "-", "-");
  }

  // The target for a use on the block's own stream is no driver call at all.
  const PerUse& same = per_use[0];
  const double same_calls = same.records + same.waits + same.contexts + same.other;
  std::printf("same-stream use, counted: %.2f event records, %.2f waits, %.2f context checks (ctx_make_current; "
              "cuCtxGetCurrent on CudaDriver), %.2f other calls per use: target of no driver call %s\n\n",
              same.records, same.waits, same.contexts, same.other, same_calls == 0 ? "met" : "NOT met");

  // Threads, each on its own stream(s) with its own 16 blocks.
  Table table("threads, each with its own blocks: aggregate prepare + finish pairs per second",
              {"threads", "same stream (own stream t)", "cross-stream read (blocks of stream t read on stream 8+t)",
               "raw cuEventRecord on stream 8+t", "cross-stream / raw"});
  for (int threads : {1, 2, 4, 8}) {
    double rate[3] = {0, 0, 0};
    for (int which = 0; which < 3; ++which) {
      std::atomic<bool> go{false};
      std::atomic<int> ready{0};
      const long per_thread = which == 0 ? pairs_per_thread : std::max(1000L, pairs_per_thread / 10);
      std::vector<double> ends(static_cast<std::size_t>(threads), 0.0);  // each thread's loop end
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          must((*dev)->make_current(), "make_current");
          const StreamId own{static_cast<std::uint32_t>(t)};
          const StreamId other{static_cast<std::uint32_t>(8 + t)};
          std::vector<DeviceBlock> mine;
          for (int k = 0; k < 16; ++k) {
            auto b = rt.allocate(4096, own);
            if (!b) die("allocate: " + b.error().what());
            mine.push_back(std::move(*b));
          }
          auto so = *(*streams)->get(other);
          auto e = drv.event_create();
          if (!e) die("event_create: " + e.error().what());
          ready.fetch_add(1);
          while (!go.load()) std::this_thread::yield();
          for (long i = 0; i < per_thread; ++i) {
            const BlockId id = mine[static_cast<std::size_t>(i) % mine.size()].id();
            if (which == 0) {
              use(rt, id, own, Access::ReadWrite);
            } else if (which == 1) {
              use(rt, id, other, Access::Read);
            } else {
              raw.record(*e, so);
            }
          }
          ends[static_cast<std::size_t>(t)] = now_ns();
          (void)drv.event_destroy(*e);
          for (auto& b : mine) must(rt.deallocate(std::move(b)), "deallocate");
        });
      }
      while (ready.load() < threads) std::this_thread::yield();
      const double t0 = now_ns();
      go = true;
      for (auto& th : ts) th.join();
      const double t1 = *std::max_element(ends.begin(), ends.end());
      rate[which] = static_cast<double>(per_thread) * threads / ((t1 - t0) * 1e-9);
      must(rt.reap_pending(), "reap_pending");
      for (std::uint32_t k = 0; k < 16; ++k) (void)drv.stream_synchronize(*(*streams)->get(S(k)));
    }
    table.row(std::to_string(threads), fmt("%.0f", rate[0]), fmt("%.0f", rate[1]), fmt("%.0f", rate[2]),
              fmt("%.3f", rate[1] / rate[2]));
  }

  for (auto& b : blocks) must(rt.deallocate(std::move(b)), "deallocate");
  must(rt.reap_pending(), "reap_pending");
  for (auto e : ev) (void)drv.event_destroy(e);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  const int per_round = argc > 2 ? std::atoi(argv[2]) : 100;
  const long pairs_per_thread = argc > 3 ? std::atol(argv[3]) : 100000;
  if (rounds < 1 || per_round < 1 || pairs_per_thread < 1) {
    std::fprintf(stderr, "usage: tracking_cost [rounds=200] [uses-per-round=100] [pairs-per-thread=100000]\n");
    return 2;
  }
  // The manual executor runs simulated operations only when a stream is synchronised,
  // so nothing runs while a use is timed: the figures are the calls' own host cost, not
  // lock contention with the simulator's executor threads.
  return on_gpu_or_sim(
      [&](auto& drv, const char* where) { return run_bench(drv, where, rounds, per_round, pairs_per_thread); },
      SimConfig{.devices = 1, .executor = SimExecutor::manual}, "SimDriver (manual executor)");
}
