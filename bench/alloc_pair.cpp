// SPDX-License-Identifier: Apache-2.0
// The cost of one allocate + deallocate pair: raw cuMemAlloc/cuMemFree, DirectCuda, raw
// cuMemAllocFromPoolAsync/cuMemFreeAsync (pool release threshold at max; the call AsyncCuda
// makes, so its ratio column is the strict one), raw cuMemAllocAsync/cuMemFreeAsync (the
// device's current pool: the same pool, found by the driver from the stream), AsyncCuda and
// DeviceRuntime<AsyncCuda>, for 256 B, 64 KiB, 1 MiB and 64 MiB; then 1..16 threads, each
// on its own stream, aggregate pairs per second. Every variant of a table is measured in
// the same rounds, interleaved, so drift hits them alike.
//
// On a machine without a GPU it runs on SimDriver and says so: those figures measure the
// simulator, not a GPU.
//
// usage: alloc_pair [rounds=300] [pairs-per-sample=32] [--no-threads] [--async-only] [--core N]

#include <xlogrt/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "raw_driver.hpp"

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

/// Spins for `n` iterations of a loop the optimiser cannot remove.
void busy(long n) {
  for (long i = 0; i < n; ++i) asm volatile("" ::: "memory");
}
/// Iterations of busy() that take about `ns` nanoseconds here.
long calibrate_busy(double ns) {
  constexpr long N = 50'000'000;
  const double t0 = now_ns();
  busy(N);
  const double per = (now_ns() - t0) / N;
  std::printf("# host work: busy loop of %.2f ns per iteration, %ld iterations ~ %.0f ns\n\n", per,
              std::max(1L, static_cast<long>(ns / per)), std::max(1L, static_cast<long>(ns / per)) * per);
  return std::max(1L, static_cast<long>(ns / per));
}

/// Failed allocate+deallocate pairs of the wrappers (a failure is fast: any makes the
/// figures void, and the bench says so).
std::atomic<long> wrapper_failures{0};

/// One allocate + deallocate pair through a resource or runtime; `tag...` is AllocTag{}
/// for a resource, nothing for a runtime.
template <class R, class... Tag>
void pair_of(R& r, std::size_t n, StreamId s, Tag... tag) {
  auto b = r.allocate(n, s, tag...);
  if (!b || !r.deallocate(std::move(*b))) wrapper_failures.fetch_add(1, std::memory_order_relaxed);
}

struct Variant {
  std::string name;
  int baseline;  // index of the variant it is compared with (itself for a baseline)
  std::function<void(std::size_t bytes, int pairs)> run;  // `pairs` timed pairs
  std::function<void()> settle;                             // untimed, after each sample
  int alt = -1;  // a second baseline (the other stream-ordered call), or none
};

struct Options {
  int rounds = 300;
  int pairs = 32;            // pairs per timed sample
  bool threads = true;       // the 1..16-thread table
  bool async_only = false;   // leave out the synchronous cuMemAlloc/cuMemFree and DirectCuda (slow at 64 MiB)
  int core = 0;              // the core the size tables run on
};

/// Prints the failed calls; non-zero when any failed (the figures are then void).
int report_failures() {
  const long raw_failed = raw_failures.load(), ours_failed = wrapper_failures.load();
  std::printf("\nfailed calls: %ld raw, %ld wrapper pairs%s\n", raw_failed, ours_failed,
              raw_failed + ours_failed != 0 ? " -- the figures above are void" : "");
  return raw_failed + ours_failed != 0 ? 1 : 0;
}

template <class D>
int run_bench(D& drv, const char* where, const Options& opt) {
  const int rounds = opt.rounds, pairs = opt.pairs;
  auto streams = StreamPool<D>::open(drv, 0, 16);
  if (!streams) return std::printf("streams: %s\n", streams.error().what().c_str()), 1;
  auto async = AsyncCuda<D>::create(*streams);  // sets the release threshold to max
  if (!async) return std::printf("AsyncCuda: %s\n", async.error().what().c_str()), 1;
  DirectCuda<D> direct(*streams);
  auto rt_stack = AsyncCuda<D>::create(*streams);
  if (!rt_stack) return std::printf("AsyncCuda: %s\n", rt_stack.error().what().c_str()), 1;
  auto made = DeviceRuntime<AsyncCuda<D>>::create(*streams, std::move(*rt_stack));
  if (!made) return std::printf("runtime: %s\n", made.error().what().c_str()), 1;
  auto& rt = *made;
  Raw<D> raw{drv};
  auto s0 = *(*streams)->get(StreamId{0});
  auto pool = (*streams)->device()->mempool();
  (void)(*streams)->device()->make_current();

  std::printf("# allocate+deallocate pair cost on %s (%s)\n# %s; %d rounds x %d pairs per sample\n\n",
              where, (*streams)->device()->info().name.c_str(), machine_line().c_str(), rounds, pairs);

  // The tables run on one core, 0 unless --core names another (the thread table's
  // workers take cores 1..16): a move to another core mid-table would leave the next
  // samples with cold caches.
  pin_to_core(opt.core);
  // Half a second of stream-ordered pairs before the first table: on the H200 hosts the
  // first few hundred milliseconds of a process ran at about half speed (the raw pair at
  // 1.1 us instead of 0.6), which inflated the first size's figures alone.
  for (const double until = now_ns() + 500e6; now_ns() < until;) {
    for (int i = 0; i < 64; ++i) raw.free_async(raw.alloc_async(std::size_t{64} << 10, pool, s0), s0);
    for (int i = 0; i < 64; ++i) pair_of(*async, std::size_t{64} << 10, StreamId{0}, AllocTag{});
    (void)async->reap_pending();
  }

  for (std::size_t bytes : {std::size_t{256}, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
    std::vector<Variant> vs;
    if (!opt.async_only) {
      vs.push_back({"raw cuMemAlloc/cuMemFree", 0,
                    [&](std::size_t n, int k) { for (int i = 0; i < k; ++i) raw.free(raw.alloc(n)); }, [] {}});
      vs.push_back({"DirectCuda", 0,
                    [&](std::size_t n, int k) {
                      for (int i = 0; i < k; ++i) pair_of(direct, n, StreamId{0}, AllocTag{});
                    },
                    [] {}, {}});
    }
    const int from_pool = static_cast<int>(vs.size()), current = from_pool + 1;  // the two raw baselines
    vs.push_back({"raw cuMemAllocFromPoolAsync/cuMemFreeAsync", from_pool,
                  [&](std::size_t n, int k) { for (int i = 0; i < k; ++i) raw.free_async(raw.alloc_async(n, pool, s0), s0); },
                  [&] { (void)drv.stream_synchronize(s0); }});
    vs.push_back({"raw cuMemAllocAsync/cuMemFreeAsync", current,
                  [&](std::size_t n, int k) {
                    for (int i = 0; i < k; ++i) raw.free_async(raw.alloc_async_current(n, pool, s0), s0);
                  },
                  [&] { (void)drv.stream_synchronize(s0); }});
    vs.push_back({"AsyncCuda", from_pool,
                  [&](std::size_t n, int k) {
                    for (int i = 0; i < k; ++i) pair_of(*async, n, StreamId{0}, AllocTag{});
                  },
                  [&] { (void)async->reap_pending(); }, current});
    vs.push_back({"DeviceRuntime<AsyncCuda>", from_pool,
                  [&](std::size_t n, int k) {
                    for (int i = 0; i < k; ++i) pair_of(rt, n, StreamId{0});
                  },
                  [&] { (void)rt.reap_pending(); }, current});
    const Samples m = interleaved(
        vs.size(), rounds, pairs, [&](std::size_t k, int n) { vs[k].run(bytes, n); },
        [&](std::size_t k) { vs[k].settle(); });
    // Two estimates of each ratio: the ratio of the medians, and the median of the
    // per-round ratios (Samples::paired_ratio), which cancels the host's slower drifts
    // (the raw pair itself has moved between 0.6 and 1.3 us within one run).
    Table t(std::to_string(bytes) + " bytes",
            {"variant", "median ns/pair", "p99 ns/pair", "ratio to raw (median)", "paired ratio (median per round)",
             "ratio to raw cuMemAllocAsync"});
    for (std::size_t i = 0; i < vs.size(); ++i) {
      const auto base = static_cast<std::size_t>(vs[i].baseline);
      const Summary s = m.summary(i);
      t.row(vs[i].name, fmt("%.0f", s.median), fmt("%.0f", s.p99), fmt("%.3f", m.ratio(i, base)),
            base != i ? fmt("%.3f", m.paired_ratio(i, base)) : "",
            vs[i].alt >= 0 ? fmt("%.3f", m.ratio(i, static_cast<std::size_t>(vs[i].alt))) : "");
    }
  }

  if (!opt.threads) return report_failures();

  // Scaling: T threads, each allocating and freeing 64 KiB on its own stream. The raw,
  // AsyncCuda and "raw + host work" runs alternate, REPS times each, and each reports its
  // median rate: the driver's own throughput under contention moves from run to run. The
  // third variant is the raw pair plus ~50 ns of busy host work between the two calls:
  // how much the driver's rate itself moves when its caller spends a little time of its
  // own, as any wrapper does.
  constexpr int REPS = 7;
  // The host work is a calibrated loop, not a clock: a clock read alone can cost more
  // than 50 ns (72 ns on some VMs), which made an earlier "50 ns" of work about 200.
  const long work_50ns = calibrate_busy(50.0);
  {
    Table table("threads, each on its own stream, 64 KiB pairs: aggregate pairs per second (median of " +
                std::to_string(REPS) + " alternating runs each)",
                {"threads", "raw async pairs/s", "AsyncCuda pairs/s", "ratio", "raw + ~50 ns host work pairs/s",
                 "its ratio to raw"});
    for (int threads : {1, 2, 4, 8, 16}) {
      std::vector<double> rates[3];
      // Each triple of runs takes the three variants in a fresh random order (a fixed
      // order keeps who follows whom), and worker t stays on core t + 1 (Linux), so that
      // the variants are compared on the same cores, away from this thread's.
      std::mt19937 rng(7);
      int triple[3] = {0, 1, 2};
      for (int rep = 0; rep < 3 * REPS; ++rep) {
        if (rep % 3 == 0) std::shuffle(std::begin(triple), std::end(triple), rng);
        const int which = triple[rep % 3];
        std::atomic<bool> go{false};
        std::atomic<long> done{0};
        const int per_thread = std::max(2000, rounds * pairs / 4);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t) {
          ts.emplace_back([&, t] {
            pin_to_core(t + 1);
            (void)(*streams)->device()->make_current();
            const StreamId sid{static_cast<std::uint32_t>(t)};
            auto s = *(*streams)->get(sid);
            while (!go.load()) std::this_thread::yield();
            for (int i = 0; i < per_thread; ++i) {
              if (which == 0) {
                raw.free_async(raw.alloc_async(64 << 10, pool, s), s);
              } else if (which == 1) {
                pair_of(*async, 64 << 10, sid, AllocTag{});
              } else {
                const std::uint64_t p = raw.alloc_async(64 << 10, pool, s);
                busy(work_50ns);
                raw.free_async(p, s);
              }
            }
            done += per_thread;
          });
        }
        const double t0 = now_ns();
        go = true;
        for (auto& th : ts) th.join();
        const double t1 = now_ns();
        rates[which].push_back(static_cast<double>(done.load()) / ((t1 - t0) * 1e-9));
        for (int t = 0; t < threads; ++t) (void)drv.stream_synchronize(*(*streams)->get(StreamId{static_cast<std::uint32_t>(t)}));
        (void)async->reap_pending();
      }
      const double raw_rate = summarize(rates[0]).median, ours = summarize(rates[1]).median;
      const double worked = summarize(rates[2]).median;
      table.row(std::to_string(threads), fmt("%.0f", raw_rate), fmt("%.0f", ours), fmt("%.3f", ours / raw_rate),
                fmt("%.0f", worked), fmt("%.3f", worked / raw_rate));
    }
  }
  return report_failures();
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1, positional = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-threads") {
      opt.threads = false;
    } else if (a == "--core" && i + 1 < argc) {
      opt.core = std::atoi(argv[++i]);
    } else if (a == "--async-only") {
      opt.async_only = true;
    } else if (positional++ == 0) {
      opt.rounds = std::atoi(argv[i]);
    } else {
      opt.pairs = std::atoi(argv[i]);
    }
  }
  return on_gpu_or_sim([&](auto& drv, const char* where) { return run_bench(drv, where, opt); });
}
