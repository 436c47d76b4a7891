// SPDX-License-Identifier: Apache-2.0
// The xlogrt tour: builds DeviceRuntime<DefaultStack> on the GPU when there is one, and
// the same stack on SimDriver otherwise, runs a small multi-stream workload
// through it — producers write blocks on their streams, consumers on other streams read
// them, owners free them while the reads may still be queued — and prints what it saw.
// Then an engine step that asks for more than the device has, with LiveBlocks recording:
// the snapshot of what was live when the allocation failed is written as a CSV that
// tools/memviz draws (bench/tour.sh does, and draws the run's log too).
//
// What it prints, in order: the device and the stack it ran (its layers, and whether the
// budget, the log and the cache were on, from the environment as DeviceRuntime<DefaultStack>
// reads it); the workload and its figures, each saying what it counts; the Statistics
// and Cached layers' own counters; and the snapshot. Sizes are printed for people
// (B, KiB, MiB, GiB: powers of 1024).
//
// usage: tour [SNAPSHOT.csv]   (the log is XLOGRT_LOG_FILE's, when set)

#include <xlogrt/sim/sim_driver.hpp>  // the tour runs on the simulator when there is no GPU
#include <xlogrt/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace xlogrt;

namespace {

/// `n` bytes for people: "256 KiB", "1.5 MiB", "2.0 GiB" (powers of 1024), "0 B".
std::string size(std::size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v == static_cast<double>(static_cast<std::size_t>(v))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, units[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

/// Prints the stack the runtime holds and what of it the environment switched on.
template <class Runtime>
void print_stack(const Runtime& rt, const char* driver_type) {
  using D = typename Runtime::driver_type;
  static_assert(std::is_same_v<typename Runtime::stack_type, DefaultStackOn<D>>,
                "the tour describes the default stack: update print_stack with the stack");
  const auto& logging = *find_layer<Logging>(rt.stack());
  const auto& cache = *find_layer<Cached>(rt.stack());
  std::printf("  stack: Statistics<GraphPools<Logging<Cached<Budget<PoolOrVirtual<%s>>>, FileSink>>>\n"
              "         (DefaultStack%s: outermost first; it tracks cross-stream uses)\n",
              driver_type, std::is_same_v<D, CudaDriver> ? "" : "On<SimDriver>, the default stack on the simulator");
  std::printf("  base: %s\n", find_layer<PoolOrVirtual>(rt.stack())->is_virtual()
                                  ? "VirtualCuda, pages mapped on demand in one reserved address range (XLOGRT_BACKEND "
                                    "unset, auto or vmm)"
                                  : "AsyncCuda, the device's memory pool (XLOGRT_BACKEND=pool, or a device without "
                                    "virtual memory management)");
  const auto budget = device_budget(rt.driver(), rt.device_ordinal());
  if (budget && budget->limit != static_cast<std::size_t>(-1)) {
    std::printf("  budget: %s for ordinal %u (XLOGRT_BUDGET_BYTES)\n", size(budget->limit).c_str(),
                rt.device_ordinal());
  } else {
    std::printf("  budget: none (XLOGRT_BUDGET_BYTES is unset: Budget counts, never refuses)\n");
  }
  const char* log = std::getenv(ENV_LOG_FILE);
  if (logging.sink().active()) {
    std::printf("  logging: on, every allocate and free to %s (XLOGRT_LOG_FILE)\n", log != nullptr ? log : "?");
  } else {
    std::printf("  logging: off (XLOGRT_LOG_FILE is unset: Logging passes every call through)\n");
  }
  std::printf("  cache: %s\n", cache.options().enabled ? "on (XLOGRT_CACHE unset or 1)"
                                                        : "off (XLOGRT_CACHE=0: every call goes to the base)");
}

/// Prints the Statistics layer's counters (the top of the default stack).
template <class R>
void print_statistics(const R& r) {
  const auto snap = r.snapshot();
  std::printf("  Statistics (what the threads held): %llu allocations, %llu frees, %llu refused, %s handed out in all\n",
              static_cast<unsigned long long>(snap.total.allocations), static_cast<unsigned long long>(snap.total.frees),
              static_cast<unsigned long long>(snap.total.failed), size(snap.total.total_bytes).c_str());
  for (const auto& t : snap.tags) {
    std::printf("    tag %u (thread %u): %llu allocations, at most %s held at once\n", t.tag.value, t.tag.value - 1,
                static_cast<unsigned long long>(t.counters.allocations), size(t.counters.peak_bytes).c_str());
  }
}

/// Prints what the caching layer (Cached, under Statistics and Logging) did.
template <class R>
void print_cache(const R& cache) {
  const CacheStats s = cache.stats();
  std::printf("  Cached (freed blocks kept for the next allocations): of %llu allocations, %llu came from the\n"
              "    thread's own bin, %llu from its stream's depot (which every thread shares: blocks above %s\n"
              "    always go through it), %llu moved across streams (their free complete on the GPU), %llu\n"
              "    from another thread's bin and %llu from the base; %s cached now%s\n",
              static_cast<unsigned long long>(s.allocations()), static_cast<unsigned long long>(s.hits),
              static_cast<unsigned long long>(s.depot_hits), size(cache.options().thread_block_bytes).c_str(),
              static_cast<unsigned long long>(s.cross_stream_moves),
              static_cast<unsigned long long>(s.from_other_threads), static_cast<unsigned long long>(s.misses),
              size(s.cached_bytes).c_str(),
              cache.options().enabled ? "" : " (the layer is off)");
}

/// Flushes the Logging layer's sink, wherever it sits in the stack.
template <class R>
result<void> flush_log(R& r) {
  if constexpr (requires { r.flush(); }) {
    return r.flush();
  } else if constexpr (requires { r.upstream(); }) {
    return flush_log(r.upstream());
  } else {
    return ok();
  }
}

/// An engine step on its own stack, LiveBlocks over AsyncCuda on the runtime's streams:
/// weights, activations on three streams and a workspace are live when a request for
/// more than the device holds fails; the snapshot then goes to `path`.
template <class Runtime>
bool snapshot_on_failure(Runtime& rt, const char* path) {
  using D = typename Runtime::driver_type;
  auto base = AsyncCuda<D>::create(rt.streams());
  if (!base) {
    std::printf("  snapshot: AsyncCuda failed: %s\n", base.error().what().c_str());
    return false;
  }
  LiveBlocks<AsyncCuda<D>> stack{std::move(*base)};
  std::vector<DeviceBlock> held;
  auto take = [&](std::size_t bytes, std::uint32_t stream, std::uint32_t tag) {
    auto b = stack.allocate(bytes, StreamId{stream}, AllocTag{tag});
    if (b) held.push_back(std::move(*b));
    return b.has_value();
  };
  bool fine = true;
  for (int i = 0; i < 4; ++i) fine = take(std::size_t{8} << 20, 0, 10) && fine;           // weights
  for (std::uint32_t s = 1; s <= 3; ++s) fine = take(std::size_t{2} << 20, s, 20 + s) && fine;  // activations
  fine = take(std::size_t{1} << 20, 1, 30) && fine;                                              // workspace
  const std::size_t too_much = rt.device()->info().total_bytes * 2;
  auto failed = stack.allocate(too_much, StreamId{2}, AllocTag{40});
  const auto snap = stack.snapshot();
  const auto saved = snap.save(path);
  std::printf("\nan engine step on LiveBlocks<AsyncCuda>: weights, activations on three streams, a workspace, then\n"
              "a request for twice the device (%s), which %s\n"
              "  snapshot at the failure: %zu blocks live (%s), the refused request recorded; %s %s\n",
              size(too_much).c_str(), failed ? "succeeded (a bug)" : "fails, as it must", snap.blocks.size(),
              size(snap.bytes()).c_str(), saved ? "written to" : "not written:",
              saved ? path : saved.error().what().c_str());
  for (auto& b : held) fine = stack.deallocate(std::move(b)).has_value() && fine;
  fine = stack.reap_pending().has_value() && fine;
  return fine && !failed && saved && snap.blocks.size() == held.size() && snap.last_failure.has_value();
}

constexpr int THREADS = 4;
constexpr int ROUNDS = 200;
constexpr std::size_t BYTES = 256 * 1024;

template <class Runtime>
int tour(Runtime& rt, const char* where, const char* driver_type, const char* snapshot_path) {
  const auto& info = rt.device()->info();
  std::printf("xlogrt tour on %s\n  device: ordinal %u, %s, %s, %zu streams in the runtime's pool\n", where,
              rt.device_ordinal(), info.name.c_str(), size(info.total_bytes).c_str(), rt.streams()->size());
  print_stack(rt, driver_type);

  std::printf("\nworkload: %d threads at once, %d rounds each. In a round, thread t allocates a %s block on\n"
              "stream t, fills it there, reads it back to the host on stream t+1 (prepare/finish_block_use\n"
              "make t+1 wait for the fill), frees it at once (the free waits for the read), then waits\n"
              "for the read and checks every byte.\n",
              THREADS, ROUNDS, size(BYTES).c_str());
  std::atomic<long> verified{0}, wrong{0}, errors{0};
  std::atomic<std::size_t> peak{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < THREADS; ++t) {
    threads.emplace_back([&, t] {
      const StreamId producer{static_cast<std::uint32_t>(t)};
      const StreamId consumer{static_cast<std::uint32_t>((t + 1) % THREADS)};
      std::vector<std::uint8_t> host(BYTES);
      auto& drv = rt.driver();
      auto ps = rt.stream(producer);
      auto cs = rt.stream(consumer);
      if (!ps || !cs || !rt.device()->make_current()) {
        ++errors;
        return;
      }
      for (int i = 0; i < ROUNDS; ++i) {
        auto b = rt.allocate(BYTES, producer, AllocTag{static_cast<std::uint32_t>(t + 1)});
        if (!b) {
          std::printf("  allocate failed: %s\n", b.error().what().c_str());
          ++errors;
          return;
        }
        const std::size_t now = rt.bytes_outstanding();
        for (std::size_t seen = peak.load(); now > seen && !peak.compare_exchange_weak(seen, now);) {
        }
        const auto value = static_cast<std::uint8_t>(t * 31 + i);
        // Producer writes on its stream; the consumer reads on another stream.
        bool fine = rt.prepare_block_use(b->id(), producer, Access::Write).has_value() &&
                    drv.memset_d8_async(b->ptr(), value, BYTES, *ps).has_value() &&
                    rt.finish_block_use(b->id(), producer, Access::Write).has_value() &&
                    rt.prepare_block_use(b->id(), consumer, Access::Read).has_value() &&
                    drv.memcpy_dtoh_async(host.data(), b->ptr(), BYTES, *cs).has_value() &&
                    rt.finish_block_use(b->id(), consumer, Access::Read).has_value();
        // Freed at once: the free is queued on the producer's stream after the read.
        fine = fine && rt.deallocate(std::move(*b)).has_value();
        fine = fine && drv.stream_synchronize(*cs).has_value();
        if (!fine) {
          ++errors;
          continue;
        }
        const bool ok = std::all_of(host.begin(), host.end(), [&](std::uint8_t v) { return v == value; });
        ++(ok ? verified : wrong);
      }
    });
  }
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t queued = rt.bytes_outstanding();
  const bool reaped = rt.reap_pending().has_value();
  const auto snap = rt.stack().snapshot();
  std::printf("  reads checked: %ld right, %ld wrong, %ld rounds failed with an error\n", verified.load(), wrong.load(),
              errors.load());
  std::printf("  time: %.3f s of wall time; a thread's round took %.1f us on average; %.0f rounds per second\n"
              "        in all (the figures of %s, with the checks and the host copy)\n",
              secs, secs * 1e6 / ROUNDS, THREADS * ROUNDS / secs, where);
  std::printf("  memory, two peaks:\n"
              "    held by the threads at once, at most %s (Statistics' peak: blocks allocated and not yet\n"
              "      freed, an upper bound when several threads allocate; %d threads x %s is the most\n"
              "      the workload can hold)\n"
              "    outstanding, at most %s (bytes_outstanding(), read after each allocation: the blocks held\n"
              "      plus frees queued on a stream that no reap has yet seen complete)\n",
              size(snap.total.peak_bytes).c_str(), THREADS, size(BYTES).c_str(), size(peak.load()).c_str());
  std::printf("    outstanding after the run: %s (queued frees), after reap_pending: %s\n", size(queued).c_str(),
              size(reaped ? rt.bytes_outstanding() : queued).c_str());
  print_statistics(rt.stack());
  print_cache(*find_layer<Cached>(rt.stack()));
  auto zero = rt.allocate(0);
  std::printf("  a zero-byte request: %s\n",
              zero ? "accepted (a bug)" : ("refused, as bad input is: " + zero.error().what()).c_str());
  const bool flushed = flush_log(rt.stack()).has_value();
  if (const char* log = std::getenv(ENV_LOG_FILE); log != nullptr && *log != '\0') {
    std::printf("  log: %s%s\n", log, flushed ? "" : " (some records were dropped)");
  }
  const bool snapped = snapshot_path == nullptr || snapshot_on_failure(rt, snapshot_path);
  return (wrong == 0 && errors == 0 && reaped && rt.bytes_outstanding() == 0 && !zero && flushed && snapped) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* snapshot_path = argc > 1 ? argv[1] : nullptr;
  auto cuda = CudaDriver::open();
  if (cuda) {
    auto rt = DeviceRuntime<DefaultStack>::try_get(0);
    if (rt) return tour(**rt, "the GPU (CudaDriver)", "CudaDriver", snapshot_path);
    std::printf("xlogrt: the CUDA driver loaded but ordinal 0 did not open: %s\n", rt.error().what().c_str());
  } else {
    std::printf("xlogrt: no GPU here (%s)\n", cuda.error().what().c_str());
  }
  std::printf("xlogrt: running the tour on SimDriver, the simulated GPU\n");
  auto rt = DeviceRuntime<DefaultStackOn<SimDriver>>::try_get(0);
  if (!rt) {
    std::printf("xlogrt: SimDriver failed: %s\n", rt.error().what().c_str());
    return 1;
  }
  const int rc = tour(**rt, "SimDriver, the simulated GPU", "SimDriver", snapshot_path);
  const auto hazards = (*rt)->driver().hazards();
  std::printf("\ncross-stream hazards the simulator found (a use racing a free or a write): %zu\n", hazards.size());
  for (const auto& h : hazards) std::printf("    %s\n", to_string(h).c_str());
  return rc != 0 || !hazards.empty() ? 1 : 0;
}
