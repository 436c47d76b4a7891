// SPDX-License-Identifier: Apache-2.0
// What the decorators cost per allocate + deallocate pair: the stack
// Budget<Statistics<Logging<AsyncCuda<D>>>> logging to the null sink and to a file,
// against bare AsyncCuda<D>, side by side, with 1 and with 8 threads (each on its own
// stream). Every variant is measured in the same rounds, interleaved, so drift hits them
// alike; the budget is unlimited (its charge and credit still run). Then the decorators
// alone, over a no-op upstream that touches no shared cache line, with the budget
// unlimited and with a limit far above what the run holds (the reservation path).
//
// On a machine without a GPU it runs on SimDriver and says so: those figures measure the
// decorators over the simulator, whose own pair costs several microseconds.
//
// usage: decorator_overhead [rounds=200] [pairs-per-sample=64] [bytes=65536] [threads=1,8]
//                           [noop]  (noop: the no-op upstream tables only)

#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <unistd.h>
#include <vector>

#include "bench_util.hpp"

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

template <class D, class Sink>
using Full = Budget<Statistics<Logging<AsyncCuda<D>, Sink>>>;

/// An upstream that does nothing but hand out distinct blocks: under the same decorators
/// it shows their own cost, free of the driver's (and of the simulator's noise). It
/// shares no written cache line between threads (each numbers its blocks from a range of
/// its own), so a contended line in the table is the decorators'. Its frees are queued,
/// as AsyncCuda's are (Budget keeps them pending until a reap). Ordinal `ordinal`.
class NoopResource {
 public:
  static constexpr bool supports_block_use_tracking = false;
  explicit NoopResource(std::uint32_t ordinal = 15) noexcept : ordinal_(ordinal) {}
  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    static std::atomic<std::uint64_t> ranges{0};
    thread_local std::uint64_t next = ranges.fetch_add(1, std::memory_order_relaxed) << 32;
    const auto i = next++;
    return DeviceBlock{0x100000 + i * 256, bytes, s, ordinal_, t, BlockId{7, static_cast<std::uint32_t>(i), 0}};
  }
  result<void> deallocate(DeviceBlock&& b) noexcept {
    DeviceBlock gone = std::move(b);
    return ok();
  }
  std::size_t bytes_outstanding() const noexcept { return 0; }
  result<void> reap_pending() noexcept { return ok(); }
  std::uint32_t device_ordinal() const noexcept { return ordinal_; }

 private:
  std::uint32_t ordinal_;
};

struct Variant {
  std::string name;
  std::function<bool(std::size_t bytes, StreamId s, int pairs)> run;  // false on an error
  std::function<void()> settle;                                          // untimed
};

std::string temp_log_path() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/xlogrt_overhead_" + std::to_string(::getpid()) + ".csv";
}

template <class R>
Variant make_variant(std::string name, R& r) {
  return Variant{std::move(name),
                 [&r](std::size_t n, StreamId s, int k) {
                   for (int i = 0; i < k; ++i) {
                     auto b = r.allocate(n, s, AllocTag{1});
                     if (!b || !r.deallocate(std::move(*b))) return false;
                   }
                   return true;
                 },
                 [&r] { (void)r.reap_pending(); }};
}

/// Runs every variant `rounds` times with `threads` threads, all threads on the same
/// variant at once (a barrier between variants), after one warm-up round; returns
/// per-pair ns samples (one per thread per round) for each variant.
Samples measure(std::vector<Variant>& vs, int threads, int rounds, int pairs,
                                         std::size_t bytes, const std::function<void()>& make_current) {
  std::vector<std::vector<double>> ns(vs.size());
  std::vector<std::vector<std::vector<double>>> per_thread(
      static_cast<std::size_t>(threads), std::vector<std::vector<double>>(vs.size()));
  std::barrier sync(threads + 1);
  std::atomic<bool> failed{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      make_current();
      const StreamId s{static_cast<std::uint32_t>(t)};
      for (int r = -1; r < rounds; ++r) {  // round -1 warms up
        for (std::size_t v = 0; v < vs.size(); ++v) {
          sync.arrive_and_wait();
          const double t0 = now_ns();
          if (!vs[v].run(bytes, s, pairs)) failed = true;
          const double t1 = now_ns();
          if (r >= 0) per_thread[static_cast<std::size_t>(t)][v].push_back((t1 - t0) / pairs);
          sync.arrive_and_wait();
        }
      }
    });
  }
  for (int r = -1; r < rounds; ++r) {
    for (auto& v : vs) {
      sync.arrive_and_wait();  // start
      sync.arrive_and_wait();  // all done
      v.settle();
    }
  }
  for (auto& th : ts) th.join();
  if (failed) std::printf("(an allocation or free failed during the run: figures are suspect)\n");
  for (auto& pt : per_thread) {
    for (std::size_t v = 0; v < vs.size(); ++v) ns[v].insert(ns[v].end(), pt[v].begin(), pt[v].end());
  }
  return Samples{std::move(ns)};
}

template <class R>
std::unique_ptr<R> make_stack(std::uint32_t ordinal) {
  if constexpr (std::is_same_v<R, NoopResource>) {
    return std::make_unique<R>(ordinal);
  } else {
    using Up = std::remove_cvref_t<decltype(std::declval<R&>().upstream())>;
    return std::make_unique<R>(std::move(*make_stack<Up>(ordinal)));
  }
}

/// The decorators over the no-op upstream: together, and each alone.
int run_noop(int rounds, int pairs, std::size_t bytes, const std::vector<int>& thread_counts,
             const std::string& path, const std::function<void()>& current) {
  // Ordinal 15 stays unlimited; ordinal 14 gets a limit far above what the run holds, so
  // the limited rows measure the reservation path without ever being refused.
  constexpr std::uint32_t unlimited = 15, limited = 14;
  (void)clear_device_budget(unlimited);
  (void)set_device_budget(limited, std::size_t{1} << 50);
  auto noop = make_stack<NoopResource>(unlimited);
  auto noop_null = make_stack<Budget<Statistics<Logging<NoopResource, NullSink>>>>(unlimited);
  auto noop_null_lim = make_stack<Budget<Statistics<Logging<NoopResource, NullSink>>>>(limited);
  auto budget = make_stack<Budget<NoopResource>>(unlimited);
  auto budget_lim = make_stack<Budget<NoopResource>>(limited);
  auto stats = make_stack<Statistics<NoopResource>>(unlimited);
  auto null_log = make_stack<Logging<NoopResource, NullSink>>(unlimited);
  auto f2 = FileSink::open(path + ".noop");
  if (!f2) return std::printf("log file: %s\n", f2.error().what().c_str()), 1;
  Budget<Statistics<Logging<NoopResource, FileSink>>> noop_file{Statistics<Logging<NoopResource, FileSink>>{
      Logging<NoopResource, FileSink>{NoopResource{unlimited}, std::move(*f2)}}};
  std::vector<Variant> nv;
  nv.push_back(make_variant("no-op upstream (baseline)", *noop));
  nv.push_back(make_variant("Budget<Statistics<Logging<no-op, NullSink>>>", *noop_null));
  nv.push_back(make_variant("the same, with a (never reached) limit", *noop_null_lim));
  nv.push_back(make_variant("Budget<no-op>", *budget));
  nv.push_back(make_variant("Budget<no-op>, with a (never reached) limit", *budget_lim));
  nv.push_back(make_variant("Statistics<no-op>", *stats));
  nv.push_back(make_variant("Logging<no-op, NullSink>", *null_log));
  nv.push_back(make_variant("Budget<Statistics<Logging<no-op, FileSink>>>", noop_file));
  // Untimed: the first table otherwise pays for the clock ramping up and the first
  // touch of every stripe.
  (void)measure(nv, 1, rounds / 2 + 1, pairs * 16, bytes, current);
  for (int threads : thread_counts) {
    const Samples m = measure(nv, threads, rounds, pairs * 16, bytes, current);
    Table t(fmt("the decorators alone, over a no-op upstream, %d thread%s", threads, threads == 1 ? "" : "s"),
            {"variant", "median ns/pair", "p99 ns/pair", "added ns/pair (median)"});
    for (std::size_t i = 0; i < nv.size(); ++i) {
      const Summary s = m.summary(i);
      t.row(nv[i].name, fmt("%.1f", s.median), fmt("%.1f", s.p99), fmt("%.1f", s.median - m.summary(0).median));
    }
  }
  (void)noop_file.upstream().upstream().flush();
  std::printf("no-op file stack: %llu log records dropped\n\n",
              static_cast<unsigned long long>(noop_file.upstream().upstream().dropped()));
  std::remove((path + ".noop").c_str());
  (void)clear_device_budget(limited);
  return 0;
}

template <class D>
int run_bench(D& drv, const char* where, int rounds, int pairs, std::size_t bytes,
              const std::vector<int>& thread_counts, bool noop_only) {
  auto streams = StreamPool<D>::open(drv, 0, 8);
  if (!streams) return std::printf("streams: %s\n", streams.error().what().c_str()), 1;
  auto a0 = AsyncCuda<D>::create(*streams);
  auto a1 = AsyncCuda<D>::create(*streams);
  auto a2 = AsyncCuda<D>::create(*streams);
  if (!a0 || !a1 || !a2) return std::printf("AsyncCuda could not be created\n"), 1;
  const std::string path = temp_log_path();
  auto file = FileSink::open(path);
  if (!file) return std::printf("log file: %s\n", file.error().what().c_str()), 1;

  AsyncCuda<D>& bare = *a0;
  Full<D, NullSink> null_stack{Statistics<Logging<AsyncCuda<D>, NullSink>>{
      Logging<AsyncCuda<D>, NullSink>{std::move(*a1)}}};
  Full<D, FileSink> file_stack{Statistics<Logging<AsyncCuda<D>, FileSink>>{
      Logging<AsyncCuda<D>, FileSink>{std::move(*a2), std::move(*file)}}};

  std::vector<Variant> vs;
  vs.push_back(make_variant("AsyncCuda (baseline)", bare));
  vs.push_back(make_variant("Budget<Statistics<Logging<AsyncCuda, NullSink>>>", null_stack));
  vs.push_back(make_variant("Budget<Statistics<Logging<AsyncCuda, FileSink>>>", file_stack));
  auto current = [&] { (void)(*streams)->device()->make_current(); };
  current();

  std::printf("# decorator overhead per allocate+deallocate pair on %s (%s)\n"
              "# %s; %zu-byte blocks; %d rounds x %d pairs per sample; unlimited budget; file log at %s\n\n",
              where, (*streams)->device()->info().name.c_str(), machine_line().c_str(), bytes, rounds, pairs, path.c_str());
  if (noop_only) {
    const int rc = run_noop(rounds, pairs, bytes, thread_counts, path, current);
    std::remove(path.c_str());
    return rc;
  }
  for (int threads : thread_counts) {
    const Samples m = measure(vs, threads, rounds, pairs, bytes, current);
    Table t(fmt("%d thread%s (each on its own stream)", threads, threads == 1 ? "" : "s"),
            {"variant", "median ns/pair", "p99 ns/pair", "ratio to AsyncCuda (median)", "ratio (p99)"});
    for (std::size_t i = 0; i < vs.size(); ++i) {
      const Summary s = m.summary(i);
      t.row(vs[i].name, fmt("%.0f", s.median), fmt("%.0f", s.p99), fmt("%.3f", m.ratio(i, 0)),
            fmt("%.3f", s.p99 / m.summary(0).p99));
    }
  }
  if (const int rc = run_noop(rounds, pairs, bytes, thread_counts, path, current); rc != 0) return rc;
  (void)file_stack.upstream().upstream().flush();
  const auto snap = file_stack.upstream().snapshot();
  std::printf("file stack: %llu pairs counted by Statistics, %llu log records dropped\n",
              static_cast<unsigned long long>(snap.total.allocations),
              static_cast<unsigned long long>(file_stack.upstream().upstream().dropped()));
  std::remove(path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  const int pairs = argc > 2 ? std::atoi(argv[2]) : 64;
  const std::size_t bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 65536;
  std::vector<int> thread_counts;
  for (const char* p = argc > 4 ? argv[4] : "1,8"; *p != '\0';) {
    char* end = nullptr;
    const long t = std::strtol(p, &end, 10);
    if (end == p || t <= 0 || t > 1024) {
      thread_counts.clear();
      break;
    }
    thread_counts.push_back(static_cast<int>(t));
    p = *end == ',' ? end + 1 : end;
  }
  const bool noop_only = argc > 5 && std::string(argv[5]) == "noop";
  if (rounds <= 0 || pairs <= 0 || bytes == 0 || thread_counts.empty() || (argc > 5 && !noop_only)) {
    std::printf("usage: decorator_overhead [rounds>0] [pairs-per-sample>0] [bytes>0] [threads=1,8] [noop]\n");
    return 2;
  }
  return on_gpu_or_sim([&](auto& drv, const char* where) {
    return run_bench(drv, where, rounds, pairs, bytes, thread_counts, noop_only);
  });
}
