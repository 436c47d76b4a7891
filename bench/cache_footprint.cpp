// SPDX-License-Identifier: Apache-2.0
// The caching layer's footprint under the soak's pattern (test/gpu_repro/soak.cpp), on
// SimDriver: how many bytes the layer keeps against the bytes its users hold, over time.
// A cache hit makes no driver call, so what the layer keeps does not depend on the
// driver; this runs anywhere, in seconds, where the soak needs a GPU and minutes.
//
// Each round of each thread, with P and C streams picked at random (C != P): allocates
// 1 .. 8 blocks on P, of power-of-two and odd sizes from 256 B to 8 MiB; writes each on P
// and reads it on C (prepare / finish); frees a third at once, hands a third to another
// thread (freed at the start of its next round) and frees the rest once C is
// synchronised. Every --every rounds it prints one line: rounds, the users' bytes, the
// cached bytes (in thread-bin classes, in shared classes up to 1 MiB and above), misses,
// evictions, cross-stream moves and blocks taken from other threads' bins. It runs the
// default stack, which XLOGRT_CACHE configures (e.g. XLOGRT_CACHE=thread_block_bytes=1G
// keeps every class in the thread bins).
//
// usage: cache_footprint [--threads T (16)] [--streams S (8)] [--rounds R per thread (100000)]
//                        [--every N rounds in all (200000)] [--seed N]

#include <xlogrt/runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using namespace xlogrt;

namespace {

using Stack = DefaultStackOn<SimDriver>;
constexpr double MIB = 1024.0 * 1024.0;

std::size_t pick_size(std::mt19937_64& rng) {
  if (rng() & 1) return std::size_t{1} << (8 + rng() % 16);
  const std::size_t lo = std::size_t{1} << (8 + rng() % 15);
  return (lo + rng() % lo) | 1;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cache_footprint: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T check(result<T> r, const char* what) {
  if (!r) fail(std::string(what) + ": " + r.error().what());
  if constexpr (!std::is_void_v<T>) return std::move(*r);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned threads = 16, streams = 8;
  unsigned long long rounds = 100000, every = 200000, seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const unsigned long long v = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--threads") && v >= 1 && v <= 256) threads = static_cast<unsigned>(v);
    else if (!std::strcmp(argv[i], "--streams") && v >= 2 && v <= 64) streams = static_cast<unsigned>(v);
    else if (!std::strcmp(argv[i], "--rounds") && v >= 1) rounds = v;
    else if (!std::strcmp(argv[i], "--every") && v >= 1) every = v;
    else if (!std::strcmp(argv[i], "--seed")) seed = v;
    else fail(std::string("bad argument ") + argv[i] + " " + argv[i + 1] + " (see the usage in the source's header)");
  }
  if (argc % 2 == 0) fail(std::string(argv[argc - 1]) + " needs a value");

  // Untouched memory is never filled, so a large simulated device costs no host memory.
  SimDriver sim(SimConfig{.devices = 1, .memory_bytes = std::size_t{64} << 30, .check_hazards = false,
                          .fill_memory = false, .vmm_address_bytes = std::size_t{128} << 30});
  auto dev = check(Device<SimDriver>::open(sim, 0), "opening the simulated device");
  auto pool = check(StreamPool<SimDriver>::create(dev, streams), "creating the streams");
  // The default stack, configured from the environment as try_get configures it.
  Stack stack = check(StackBuilder<Stack>::build(pool), "building the default stack");
  auto& cache = *find_layer<Cached>(stack);
  const CachedOptions& opt = cache.options();

  std::printf("# cache_footprint: %u threads, %u streams, %llu rounds each; thread_block_bytes %zu, bin_bytes %zu, "
              "thread_bytes %zu, depot_bytes %zu\n",
              threads, streams, rounds, opt.thread_block_bytes, opt.bin_bytes, opt.thread_bytes, opt.depot_bytes);
  std::printf("| rounds | users' MiB | cached MiB | in thread-bin classes | shared, to 1 MiB | shared, above | misses | "
              "evictions | cross-stream moves | from other threads' bins | base: physical / used MiB, pages created / unmapped |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  // Over the virtual base (XLOGRT_BACKEND=vmm), what it holds of the device; SimDriver
  // keeps no counters for the pool's reserve.
  const auto* virt = find_layer<PoolOrVirtual>(stack)->virtual_base();

  std::vector<std::mutex> mu(threads);
  std::vector<std::vector<DeviceBlock>> mail(threads);
  std::atomic<unsigned long long> done{0};
  std::atomic<long long> users{0};
  auto free_one = [&](DeviceBlock&& b) {
    users -= static_cast<long long>(b.bytes());
    check(stack.deallocate(std::move(b)), "deallocate");
  };
  auto use = [&](const DeviceBlock& b, StreamId s, Access a) {
    check(stack.prepare_block_use(b.id(), s, a), "prepare_block_use");
    check(sim.launch_kernel(*pool->get(s), {SimAccess{b.ptr(), 64, a}}), "launching a kernel");
    check(stack.finish_block_use(b.id(), s, a), "finish_block_use");
  };
  auto worker = [&](unsigned t) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + t);
    std::vector<DeviceBlock> blocks, kept, m;
    for (unsigned long long r = 0; r < rounds; ++r) {
      {
        std::lock_guard lock(mu[t]);
        m.swap(mail[t]);
      }
      for (auto& b : m) free_one(std::move(b));
      m.clear();
      const StreamId P{static_cast<std::uint32_t>(rng() % streams)};
      const StreamId C{static_cast<std::uint32_t>((P.value + 1 + rng() % (streams - 1)) % streams)};
      blocks.clear();
      kept.clear();
      for (std::size_t i = 0, k = 1 + rng() % 8; i < k; ++i) {
        DeviceBlock b = check(stack.allocate(pick_size(rng), P, AllocTag{1 + t % 8}), "allocate");
        users += static_cast<long long>(b.bytes());
        use(b, P, Access::Write);
        use(b, C, Access::Read);
        blocks.push_back(std::move(b));
      }
      for (auto& b : blocks) {
        const auto roll = rng() % 6;
        if (roll < 2 && threads > 1) {
          const unsigned to = (t + 1 + static_cast<unsigned>(rng() % (threads - 1))) % threads;
          std::lock_guard lock(mu[to]);
          mail[to].push_back(std::move(b));
        } else if (roll < 4) {
          kept.push_back(std::move(b));
        } else {
          free_one(std::move(b));
        }
      }
      check(sim.stream_synchronize(*pool->get(C)), "synchronising C");
      for (auto& b : kept) free_one(std::move(b));
      done.fetch_add(1, std::memory_order_relaxed);
    }
    // Blocks handed to this thread go on being freed until every thread is done.
    while (done.load(std::memory_order_relaxed) < rounds * threads) {
      {
        std::lock_guard lock(mu[t]);
        m.swap(mail[t]);
      }
      for (auto& b : m) free_one(std::move(b));
      m.clear();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) workers.emplace_back(worker, t);
  const unsigned long long total = rounds * threads;
  for (unsigned long long next = every;; next += every) {
    while (done.load(std::memory_order_relaxed) < std::min(next, total)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const CacheStats s = cache.stats();
    double bins = 0, mid = 0, large = 0;
    for (std::uint32_t c = 0; c < s.cached_bytes_per_class.size(); ++c) {
      const std::size_t bytes = detail::class_bytes(c);
      (bytes <= opt.thread_block_bytes ? bins : bytes <= (std::size_t{1} << 20) ? mid : large) +=
          static_cast<double>(s.cached_bytes_per_class[c]);
    }
    std::string base = "-";
    if (virt != nullptr) {
      const VirtualStats v = virt->stats();
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f / %.1f, %" PRIu64 " / %" PRIu64, static_cast<double>(v.physical_bytes) / MIB,
                    static_cast<double>(v.used_bytes) / MIB, v.pages_created, v.pages_unmapped);
      base = buf;
    }
    std::printf("| %llu | %.1f | %.1f | %.1f | %.1f | %.1f | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %s |\n",
                done.load(), static_cast<double>(users.load()) / MIB, static_cast<double>(s.cached_bytes) / MIB,
                bins / MIB, mid / MIB, large / MIB, s.misses, s.evictions, s.cross_stream_moves, s.from_other_threads,
                base.c_str());
    std::fflush(stdout);
    if (next >= total) break;
  }
  for (auto& w : workers) w.join();
  for (auto& box : mail) {
    for (auto& b : box) free_one(std::move(b));
  }
  (void)cache.trim();
  sim.run_until_idle();
  check(stack.reap_pending(), "reap_pending");
  if (stack.bytes_outstanding() != 0 || users.load() != 0) fail("bytes left at the end");
  return 0;
}
