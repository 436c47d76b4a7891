// SPDX-License-Identifier: Apache-2.0
// The xlogrt tour: builds DeviceRuntime<DefaultStack> on the GPU when there is one, and
// the same stack on SimDriver otherwise, runs a small multi-stream workload
// through it — producers write blocks on their streams, consumers on other streams read
// them, owners free them while the reads may still be queued — and prints what it saw.
// Then an engine step that asks for more than the device has, with LiveBlocks recording:
// the snapshot of what was live when the allocation failed is written as a CSV that
// tools/memviz draws (bench/tour.sh does, and draws the run's log too).
//
// usage: tour [SNAPSHOT.csv]   (the log is XLOGRT_LOG_FILE's, when set)

#include <xlogrt/driver/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace xlogrt;

namespace {

/// Prints the Statistics layer's snapshot, wherever it sits in the stack.
template <class R>
void print_statistics(const R& r) {
  if constexpr (requires { r.snapshot(); }) {
    const auto snap = r.snapshot();
    std::printf("  statistics: %llu allocations, %llu frees, %llu refused; peak %zu bytes, %zu bytes in all\n",
                static_cast<unsigned long long>(snap.total.allocations), static_cast<unsigned long long>(snap.total.frees),
                static_cast<unsigned long long>(snap.total.failed), snap.total.peak_bytes, snap.total.total_bytes);
    for (const auto& t : snap.tags) {
      std::printf("    tag %u: %llu allocations, peak %zu bytes\n", t.tag.value,
                  static_cast<unsigned long long>(t.counters.allocations), t.counters.peak_bytes);
    }
  } else if constexpr (requires { r.upstream(); }) {
    print_statistics(r.upstream());
  }
}

/// Prints what the caching layer did, wherever it sits in the stack.
template <class R>
void print_cache(const R& r) {
  if constexpr (requires { r.stats().cross_stream_moves; }) {
    const CacheStats s = r.stats();
    std::printf("  cache: %llu hits, %llu from a stream's depot, %llu moved across streams, %llu from the pool; "
                "%zu bytes cached now%s\n",
                static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.depot_hits),
                static_cast<unsigned long long>(s.cross_stream_moves), static_cast<unsigned long long>(s.misses),
                s.cached_bytes, r.options().enabled ? "" : " (XLOGRT_CACHE=0: off)");
  } else if constexpr (requires { r.upstream(); }) {
    print_cache(r.upstream());
  }
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
  std::printf("  snapshot: a %zu-byte request %s; %zu blocks (%zu bytes) were live; %s %s\n", too_much,
              failed ? "succeeded (unexpected)" : "failed", snap.blocks.size(), snap.bytes(),
              saved ? "written to" : "not written:", saved ? path : saved.error().what().c_str());
  for (auto& b : held) fine = stack.deallocate(std::move(b)).has_value() && fine;
  fine = stack.reap_pending().has_value() && fine;
  return fine && !failed && saved && snap.blocks.size() == held.size() && snap.last_failure.has_value();
}

constexpr int THREADS = 4;
constexpr int ROUNDS = 200;
constexpr std::size_t BYTES = 256 * 1024;

template <class Runtime>
int tour(Runtime& rt, const char* driver_name, const char* snapshot_path) {
  const auto& info = rt.device()->info();
  std::printf("xlogrt tour on %s: ordinal %u, %s, %.1f GiB, %zu streams, stack %s\n", driver_name,
              rt.device_ordinal(), info.name.c_str(), static_cast<double>(info.total_bytes) / (1u << 30),
              rt.streams()->size(), Runtime::supports_block_use_tracking ? "tracks cross-stream uses" : "does not track");

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
        peak.store(std::max(peak.load(), rt.bytes_outstanding()));
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
  std::printf("  %d threads x %d rounds: write on stream t, read on stream t+1, free on t\n", THREADS, ROUNDS);
  std::printf("  reads verified: %ld, wrong: %ld, errors: %ld, %.1f us per round\n", verified.load(),
              wrong.load(), errors.load(), secs * 1e6 / (THREADS * ROUNDS));
  std::printf("  bytes outstanding: peak %zu, after the run %zu (queued frees), after reap_pending %zu\n",
              peak.load(), queued, reaped ? rt.bytes_outstanding() : queued);
  print_statistics(rt.stack());
  print_cache(rt.stack());
  auto zero = rt.allocate(0);
  std::printf("  a zero-byte request: %s\n", zero ? "accepted (bug)" : zero.error().what().c_str());
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
    if (rt) return tour(**rt, "the GPU (CudaDriver)", snapshot_path);
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
  const int rc = tour(**rt, "SimDriver", snapshot_path);
  const auto hazards = (*rt)->driver().hazards();
  std::printf("  cross-stream hazards the simulator found: %zu\n", hazards.size());
  for (const auto& h : hazards) std::printf("    %s\n", to_string(h).c_str());
  return rc != 0 || !hazards.empty() ? 1 : 0;
}
