// SPDX-License-Identifier: Apache-2.0
// The device memory a stack holds against what its users hold, replaying allocation logs
// on SimDriver: a deterministic byte count, for CI (issue 26).
//
// Each log (the CSV Logging's FileSink writes, XLOGRT_LOG_FILE; plain or gzip-compressed,
// by the name's .gz) is replayed in log order through the default stack (configured from
// the environment as try_get configures it: XLOGRT_CACHE applies) and, for comparison,
// through the same stack with the caching layer off. Streams are as logged (each distinct
// Stream value one stream of the pool, in order of appearance; more than 64 wrap), and
// so are threads: each distinct Thread value is one host thread, and the records run in
// log order, handed from thread to thread, so that a thread's frees reach its own cache
// as they did in the program, and the run is the same every time. Queued frees are
// reaped after every free by default (the GPU keeps up; --reap-every N: after every N
// records).
//
// "live": the bytes the log's live allocations asked for (what the tensors hold).
// "held": what the stack holds from the device. Over the virtual memory base (the
// default stack's on SimDriver, which has virtual memory), the physical pages it holds
// (VirtualCuda::physical_bytes(): mapped and spare, page rounding and holes included).
// Over the pool base (XLOGRT_BACKEND=pool, replayed a second time): the users' blocks as
// granted, the blocks the cache keeps, and frees queued but not reaped (AsyncCuda's
// bytes_outstanding(), the pool's reserve aside: SimDriver's pool places every block
// first-fit in one arena, with no reserve of its own to count). Each with and without
// the cache. Per log it prints exactly one line
//   footprint <trace>: peak live <N> B, peak held <N> B, held/live <R>
// (R = peak held / peak live, the default stack) and then, indented, where the held
// bytes sat at their peak (per layer: the users' request, the rounding of size classes,
// the cache, queued frees; per size range), the stack without the cache and the pool base.
//
// usage: footprint [--max-ratio R] [--reap-every N] LOG.csv[.gz]|DIR ...
//   DIR: every *.csv and *.csv.gz in it, by name (bench/traces: the committed traces).
//   --max-ratio R: exit 1 when a log's held/live passes R for the default stack.

#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <semaphore>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if XLOGRT_FOOTPRINT_ZLIB
#include <zlib.h>
#endif

#include "log_replay.hpp"

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

using Stack = DefaultStackOn<SimDriver>;
constexpr std::uint32_t MAX_STREAMS = 64;
constexpr std::uint32_t MAX_THREADS = 64;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "footprint: %s\n", what.c_str());
  std::exit(2);
}

template <class T>
T check(result<T> r, const std::string& what) {
  if (!r) fail(what + ": " + r.error().what());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

/// The whole file, gunzipped when its name ends in .gz.
std::string read_file(const std::string& path) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::string text;
  if (!gz) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read " + path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
#if XLOGRT_FOOTPRINT_ZLIB
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) fail("cannot read " + path);
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  const bool bad = n < 0;
  gzclose(f);
  if (bad) fail(path + ": not a gzip file, or a damaged one");
#else
  const std::string cmd = "gzip -dc < '" + path + "'";  // the name is the caller's own
  if (path.find('\'') != std::string::npos) fail(path + ": a name with a quote needs zlib");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) fail("cannot run gzip for " + path);
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  if (::pclose(p) != 0) fail(path + ": gzip -dc failed");
#endif
  return text;
}

/// Size ranges of the breakdown: upper bounds (inclusive).
constexpr std::array<std::size_t, 4> RANGE_TOP{std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20,
                                               ~std::size_t{0}};
constexpr std::array<const char*, 4> RANGE_NAME{"<= 64 KiB", "64 KiB - 1 MiB", "1 - 16 MiB", "> 16 MiB"};
std::size_t range_of(std::size_t bytes) {
  std::size_t i = 0;
  while (bytes > RANGE_TOP[i]) ++i;
  return i;
}

/// Where the held bytes sat at their peak.
struct Peak {
  std::size_t held = 0, requested = 0, granted = 0, cached = 0, queued = 0;
  std::array<std::size_t, 4> requested_by{}, rounding_by{}, cached_by{};
};

struct Result {
  std::size_t peak_live = 0;  // requested
  Peak at;                    // at the peak of held
  std::uint64_t unknown_frees = 0, failures = 0;
  std::string first_error;
  std::size_t records = 0, threads = 0, streams = 0;
};

struct Trace {
  std::vector<LogRecord> records;
  std::vector<std::uint32_t> stream;  // per record, the pool's stream
  std::vector<std::uint32_t> worker;  // per record, the replaying thread
  std::uint32_t streams = 1, threads = 1;
};

Trace load(const std::string& path) {
  std::istringstream in(read_file(path));
  Trace t;
  t.records = check(read_log_csv(in), path);
  // Samples (what the logged stack held) are no operation to replay: this replay makes its own.
  std::erase_if(t.records, [](const LogRecord& r) { return is_sample(r.action); });
  std::map<std::uint64_t, std::uint32_t> streams, threads;
  for (const LogRecord& r : t.records) {
    auto s = streams.emplace(r.stream.value, static_cast<std::uint32_t>(streams.size())).first->second;
    auto w = threads.emplace(r.thread, static_cast<std::uint32_t>(threads.size())).first->second;
    t.stream.push_back(s % MAX_STREAMS);
    t.worker.push_back(w % MAX_THREADS);
  }
  t.streams = std::max<std::uint32_t>(1, std::min<std::uint32_t>(MAX_STREAMS, static_cast<std::uint32_t>(streams.size())));
  t.threads = std::max<std::uint32_t>(1, std::min<std::uint32_t>(MAX_THREADS, static_cast<std::uint32_t>(threads.size())));
  return t;
}

/// Replays `t` through a stack `make(pool)` builds, in log order, each record on its
/// logged thread.
template <class Make>
Result replay(const Trace& t, std::size_t reap_every, Make&& make) {
  // Untouched memory is never filled, so a large simulated device costs no host memory.
  // The virtual memory base reserves twice the device's memory in address space.
  SimConfig cfg{.devices = 1, .memory_bytes = std::size_t{256} << 30, .executor = SimExecutor::manual,
                .check_hazards = false, .fill_memory = false};
  cfg.vmm_address_bytes = std::size_t{520} << 30;
  SimDriver sim(cfg);
  auto dev = check(Device<SimDriver>::open(sim, 0), "opening the simulated device");
  auto pool = check(StreamPool<SimDriver>::create(dev, t.streams), "creating the streams");
  Stack stack = make(pool);
  auto& base = *find_layer<PoolOrVirtual>(stack);
  // The virtual memory base holds its physical pages; the pool, what it has handed out.
  auto held_now = [&base] {
    return base.is_virtual() ? static_cast<std::size_t>(base.virtual_base()->physical_bytes())
                             : base.bytes_outstanding();
  };
  auto& cache = *find_layer<Cached>(stack);

  LogReplayer rp;
  Result res;
  res.records = t.records.size();
  res.threads = t.threads;
  res.streams = t.streams;
  auto allocate = [&](std::size_t n, StreamId s, AllocTag tag) { return stack.allocate(n, s, tag); };
  auto deallocate = [&](DeviceBlock&& b) { return stack.deallocate(std::move(b)); };
  std::size_t since_reap = 0;
  auto after = [&](const LogRecord& r) {
    if (reap_every == 0 ? r.action == LogAction::free : ++since_reap >= reap_every) {
      check(stack.reap_pending(), "reap_pending");
      since_reap = 0;
    }
    const std::size_t held = held_now();
    if (rp.requested_bytes() > res.peak_live) res.peak_live = rp.requested_bytes();
    if (held <= res.at.held) return;
    Peak p;
    p.held = held;
    p.requested = rp.requested_bytes();
    p.granted = rp.granted_bytes();
    const CacheStats cs = cache.stats();
    p.cached = cs.cached_bytes;
    p.queued = held - std::min(held, p.granted + p.cached);
    for (const auto& [ptr, h] : rp.live()) {
      const std::size_t k = range_of(h.requested);
      p.requested_by[k] += h.requested;
      p.rounding_by[k] += h.block.bytes() - h.requested;
    }
    for (std::uint32_t c = 0; c < cs.cached_bytes_per_class.size(); ++c) {
      p.cached_by[range_of(detail::class_bytes(c))] += cs.cached_bytes_per_class[c];
    }
    res.at = p;
  };

  // One host thread per logged thread; a semaphore each hands the log on in its order.
  std::vector<std::unique_ptr<std::binary_semaphore>> go;
  for (std::uint32_t w = 0; w < t.threads; ++w) go.push_back(std::make_unique<std::binary_semaphore>(0));
  std::binary_semaphore finished(0);
  std::size_t next = 0;  // the next record; written by the thread holding the baton
  bool done = false;
  auto worker = [&](std::uint32_t me) {
    for (;;) {
      go[me]->acquire();
      if (done) return;
      while (next < t.records.size() && t.worker[next] == me) {
        const LogRecord& r = t.records[next];
        if (rp.step(r, StreamId{t.stream[next]}, allocate, deallocate)) after(r);
        ++next;
      }
      if (next < t.records.size()) {
        go[t.worker[next]]->release();
      } else {
        finished.release();
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::uint32_t w = 0; w < t.threads; ++w) threads.emplace_back(worker, w);
  if (t.records.empty()) {
    finished.release();
  } else {
    go[t.worker[0]]->release();
  }
  finished.acquire();
  done = true;
  for (auto& g : go) g->release();
  for (auto& th : threads) th.join();

  rp.finish(deallocate);
  (void)cache.trim();
  check(stack.reap_pending(), "reap_pending");
  if (stack.bytes_outstanding() != 0) fail("bytes left in the stack at the end of the replay");
  res.unknown_frees = rp.unknown_frees();
  res.failures = rp.failures();
  res.first_error = rp.first_error();
  return res;
}

double ratio(std::size_t a, std::size_t b) { return b == 0 ? 1.0 : static_cast<double>(a) / static_cast<double>(b); }

}  // namespace

int main(int argc, char** argv) {
  double max_ratio = 0;
  std::size_t reap_every = 0;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--max-ratio" || a == "--reap-every") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || v < 0) fail("bad value for " + a + ": " + argv[i]);
      if (a == "--max-ratio") max_ratio = v; else reap_every = static_cast<std::size_t>(v);
    } else if (!a.empty() && a[0] == '-') {
      fail("usage: footprint [--max-ratio R] [--reap-every N] LOG.csv[.gz]|DIR ...");
    } else if (std::filesystem::is_directory(a)) {
      std::vector<std::string> found;
      for (const auto& e : std::filesystem::directory_iterator(a)) {
        const std::string name = e.path().filename().string();
        const auto ends = [&](const char* x) {
          const std::size_t n = std::strlen(x);
          return name.size() > n && name.compare(name.size() - n, n, x) == 0;
        };
        if (e.is_regular_file() && (ends(".csv") || ends(".csv.gz"))) found.push_back(e.path().string());
      }
      std::sort(found.begin(), found.end());
      if (found.empty()) fail(a + ": no *.csv or *.csv.gz in it");
      paths.insert(paths.end(), found.begin(), found.end());
    } else {
      paths.push_back(a);
    }
  }
  if (paths.empty()) fail("usage: footprint [--max-ratio R] [--reap-every N] LOG.csv[.gz]|DIR ...");

  int rc = 0;
  for (const std::string& path : paths) {
    const Trace t = load(path);
    const Result on = replay(t, reap_every, [](const auto& pool) {
      return check(StackBuilder<Stack>::build(pool), "building the default stack");
    });
    // The default stack without its cache, over the base `make_base` builds.
    auto uncached = [](auto make_base) {
      return [make_base](const auto& pool) {
        using Base = Cached<Budget<PoolOrVirtual<SimDriver>>>;
        Base off(Budget<PoolOrVirtual<SimDriver>>(make_base(pool)), CachedOptions{.enabled = false});
        using Logged = Logging<Base, FileSink>;
        return Stack(GraphPools<Logged>(Logged(std::move(off), FileSink{})));
      };
    };
    auto pool_base = [](const auto& pool) {
      return PoolOrVirtual<SimDriver>(check(AsyncCuda<SimDriver>::create(pool), "creating AsyncCuda"));
    };
    auto virtual_base = [](const auto& pool) {
      auto idle = check(AsyncCuda<SimDriver>::create(pool, AsyncCudaOptions{.reserve_events = 0}), "creating AsyncCuda");
      // One region, as the default stack builds it with the cache off.
      auto virt = VirtualCuda<SimDriver>::create(pool, VirtualCudaOptions{.small_block_bytes = 0});
      return PoolOrVirtual<SimDriver>(std::move(idle), check(std::move(virt), "creating VirtualCuda"));
    };
    const Result off = replay(t, reap_every, uncached(virtual_base));
    const Result pool_on = replay(t, reap_every, [](const auto& pool) {
      const char* was = std::getenv(ENV_BACKEND);
      const std::string saved = was != nullptr ? was : "";
      ::setenv(ENV_BACKEND, "pool", 1);
      auto s = StackBuilder<Stack>::build(pool);
      if (was != nullptr) ::setenv(ENV_BACKEND, saved.c_str(), 1); else ::unsetenv(ENV_BACKEND);
      return check(std::move(s), "building the default stack with XLOGRT_BACKEND=pool");
    });
    const Result pool_off = replay(t, reap_every, uncached(pool_base));
    const double r = ratio(on.at.held, on.peak_live);
    std::printf("footprint %s: peak live %zu B, peak held %zu B, held/live %.4f\n", path.c_str(), on.peak_live,
                on.at.held, r);
    std::printf("  %zu records, %zu threads, %zu streams; frees of pointers not held: %llu; failures: %llu%s%s\n",
                on.records, on.threads, on.streams, static_cast<unsigned long long>(on.unknown_frees),
                static_cast<unsigned long long>(on.failures), on.failures ? " (first: " : "",
                on.failures ? (on.first_error + ")").c_str() : "");
    const Peak& p = on.at;
    std::printf("  at the peak of held: users' requests %zu B, size-class rounding %zu B, cached %zu B, queued frees %zu B\n",
                p.requested, p.granted - p.requested, p.cached, p.queued);
    for (std::size_t k = 0; k < RANGE_TOP.size(); ++k) {
      std::printf("    %-15s requests %12zu B, rounding %11zu B, cached %12zu B\n", RANGE_NAME[k], p.requested_by[k],
                  p.rounding_by[k], p.cached_by[k]);
    }
    std::printf("  without the cache (XLOGRT_CACHE=0): peak held %zu B, held/live %.4f; the cache's stack holds %.4f times as much\n",
                off.at.held, ratio(off.at.held, off.peak_live), ratio(on.at.held, off.at.held));
    std::printf("  pool (XLOGRT_BACKEND=pool, held = blocks granted, cached and queued): peak held %zu B, held/live "
                "%.4f; without the cache: peak held %zu B, held/live %.4f\n",
                pool_on.at.held, ratio(pool_on.at.held, pool_on.peak_live), pool_off.at.held,
                ratio(pool_off.at.held, pool_off.peak_live));
    if (max_ratio > 0 && r > max_ratio) {
      std::printf("  FAILED: held/live %.4f is above %.4f\n", r, max_ratio);
      rc = 1;
    }
    std::fflush(stdout);
  }
  return rc;
}
