// SPDX-License-Identifier: Apache-2.0
// Replays an allocation log (the CSV Logging writes, or RMM's logging_resource_adaptor's)
// against resource stacks, in log order on one thread, keeping each record's stream
// (modulo the pool's 8 streams) and tag, and prints the median and p99 of each operation
// per stack, side by side. `allocate failure` and `free failure` records are skipped, and
// so are samples (`sample held` ...: what the logged stack held, not an operation), left
// out before the replay and counted; a free of a pointer the replay does not hold is
// counted and skipped. Queued frees are
// reaped (untimed) every 256 records, as an application does between batches.
//
// Without a log argument it first records one: 4 threads running a mixed workload through
// Logging<AsyncCuda, FileSink>, then replays that file.
//
// On a machine without a GPU it runs on SimDriver and says so.
//
// usage: log_replay [log.csv] [repeats=3]

#include <xlogrt/driver/cuda_driver.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/direct_cuda.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <vector>

#include "bench_util.hpp"
#include "log_replay.hpp"

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

constexpr std::uint32_t STREAMS = 8;

/// Records a synthetic log: 4 threads, sizes from 256 B to 4 MiB, each thread holding a
/// window of up to 32 blocks and freeing them out of order.
template <class D>
result<void> record_log(const std::shared_ptr<StreamPool<D>>& streams, const std::string& path) {
  auto a = AsyncCuda<D>::create(streams);
  if (!a) return std::move(a).error();
  auto sink = FileSink::open(path);
  if (!sink) return std::move(sink).error();
  Logging<AsyncCuda<D>, FileSink> log{std::move(*a), std::move(*sink)};
  std::vector<std::thread> ts;
  for (std::uint32_t t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      (void)streams->device()->make_current();
      std::mt19937 rng(t + 1);
      std::vector<DeviceBlock> live;
      for (int i = 0; i < 5000; ++i) {
        const std::size_t bytes = std::size_t{256} << (rng() % 15);
        auto b = log.allocate(bytes, StreamId{t}, AllocTag{t + 1});
        if (b) live.push_back(std::move(*b));
        if (live.size() > 32 || (i % 3 == 0 && !live.empty())) {
          const std::size_t k = rng() % live.size();
          (void)log.deallocate(std::move(live[k]));
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto& b : live) (void)log.deallocate(std::move(b));
    });
  }
  for (auto& th : ts) th.join();
  (void)log.reap_pending();
  return log.flush();
}

struct Stack {
  std::string name;
  std::function<result<DeviceBlock>(std::size_t, StreamId, AllocTag)> allocate;
  std::function<result<void>(DeviceBlock&&)> deallocate;
  std::function<void()> reap;
  std::vector<double> alloc_ns, free_ns;
  std::uint64_t failed = 0;
  std::string first_error;
};

template <class R>
Stack wrap(std::string name, R& r) {
  return Stack{std::move(name), [&r](std::size_t n, StreamId s, AllocTag t) { return r.allocate(n, s, t); },
               [&r](DeviceBlock&& b) { return r.deallocate(std::move(b)); }, [&r] { (void)r.reap_pending(); },
               {}, {}, 0, {}};
}

struct ReplayStats {
  std::uint64_t unknown_frees = 0;
  std::size_t peak_bytes = 0;
};

ReplayStats replay(const std::vector<LogRecord>& log, Stack& s) {
  LogReplayer rp;
  auto allocate = [&](std::size_t n, StreamId sid, AllocTag tag) {
    const double t0 = now_ns();
    auto b = s.allocate(n, sid, tag);
    s.alloc_ns.push_back(now_ns() - t0);
    return b;
  };
  auto deallocate = [&](DeviceBlock&& b) {
    const double t0 = now_ns();
    auto e = s.deallocate(std::move(b));
    s.free_ns.push_back(now_ns() - t0);
    return e;
  };
  std::size_t n = 0;
  for (const auto& r : log) {
    if (++n % 256 == 0) s.reap();  // untimed, as an application reaps between batches
    (void)rp.step(r, StreamId{r.stream.value % STREAMS}, allocate, deallocate);
  }
  rp.finish([&](DeviceBlock&& b) { return s.deallocate(std::move(b)); });
  s.reap();
  if (s.failed == 0 && rp.failures() != 0) s.first_error = rp.first_error();
  s.failed += rp.failures();
  return ReplayStats{rp.unknown_frees(), rp.peak_granted_bytes()};
}

template <class D>
int run(D& drv, const char* where, const char* log_path, int repeats) {
  auto streams = StreamPool<D>::open(drv, 0, STREAMS);
  if (!streams) return std::printf("streams: %s\n", streams.error().what().c_str()), 1;
  (void)(*streams)->device()->make_current();

  std::string path;
  bool recorded = false;
  if (log_path != nullptr) {
    path = log_path;
  } else {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir && *dir ? dir : "/tmp") + "/xlogrt_replay_" + std::to_string(::getpid()) + ".csv";
    if (auto r = record_log(*streams, path); !r) return std::printf("recording: %s\n", r.error().what().c_str()), 1;
    recorded = true;
  }
  std::ifstream in(path);
  if (!in) return std::printf("cannot read %s\n", path.c_str()), 1;
  auto log = read_log_csv(in);
  if (recorded) std::remove(path.c_str());
  if (!log) return std::printf("%s: %s\n", path.c_str(), log.error().what().c_str()), 1;
  const std::size_t samples = std::erase_if(*log, [](const LogRecord& r) { return is_sample(r.action); });

  auto a0 = AsyncCuda<D>::create(*streams);
  auto a1 = AsyncCuda<D>::create(*streams);
  if (!a0 || !a1) return std::printf("AsyncCuda could not be created\n"), 1;
  DirectCuda<D> direct(*streams);
  Budget<Statistics<Logging<AsyncCuda<D>, NullSink>>> full{
      Statistics<Logging<AsyncCuda<D>, NullSink>>{Logging<AsyncCuda<D>, NullSink>{std::move(*a1)}}};
  std::vector<Stack> stacks;
  stacks.push_back(wrap("AsyncCuda", *a0));
  stacks.push_back(wrap("Budget<Statistics<Logging<AsyncCuda, NullSink>>>", full));
  stacks.push_back(wrap("DirectCuda", direct));

  std::size_t allocs = 0, frees = 0;
  for (const auto& r : *log) {
    allocs += r.action == LogAction::allocate;
    frees += r.action == LogAction::free;
  }
  std::printf("# replay of %s%s on %s (%s)\n# %s; %zu records (%zu allocate, %zu free; %zu sample lines left "
              "out), %d repeat%s, stacks interleaved per repeat\n\n",
              recorded ? "a freshly recorded synthetic log" : path.c_str(), recorded ? "" : "", where,
              (*streams)->device()->info().name.c_str(), machine_line().c_str(), log->size(), allocs, frees, samples,
              repeats, repeats == 1 ? "" : "s");
  ReplayStats st;
  for (int k = 0; k < repeats; ++k) {
    for (auto& s : stacks) st = replay(*log, s);
  }
  std::vector<Summary> a, f;
  for (auto& s : stacks) {
    a.push_back(summarize(s.alloc_ns));
    f.push_back(summarize(s.free_ns));
  }
  {
    Table t("", {"stack", "allocate median ns", "allocate p99 ns", "free median ns", "free p99 ns",
                 "allocate ratio (median)", "free ratio (median)", "failed"});
    for (std::size_t i = 0; i < stacks.size(); ++i) {
      t.row(stacks[i].name, fmt("%.0f", a[i].median), fmt("%.0f", a[i].p99), fmt("%.0f", f[i].median),
            fmt("%.0f", f[i].p99), fmt("%.3f", a[i].median / a[0].median), fmt("%.3f", f[i].median / f[0].median),
            std::to_string(stacks[i].failed));
    }
  }
  for (auto& s : stacks) {
    if (s.failed != 0) std::printf("\n%s: first failure: %s", s.name.c_str(), s.first_error.c_str());
  }
  std::printf("\npeak live bytes in the replay: %zu; frees of pointers the replay did not hold: %llu\n",
              st.peak_bytes, static_cast<unsigned long long>(st.unknown_frees));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* log_path = argc > 1 ? argv[1] : nullptr;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  if (repeats <= 0) return std::printf("usage: log_replay [log.csv] [repeats>0]\n"), 2;
  return on_gpu_or_sim([&](auto& drv, const char* where) { return run(drv, where, log_path, repeats); });
}
