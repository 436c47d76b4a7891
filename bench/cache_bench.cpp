// SPDX-License-Identifier: Apache-2.0
// The caching layer against the allocators it replaces, side by side in one process: the
// raw driver pool (cuMemAllocFromPoolAsync / cuMemFreeAsync), AsyncCuda, Cached<AsyncCuda>
// (the layer bare), the full default stack in a DeviceRuntime (Statistics, Logging off,
// Cached, Budget, AsyncCuda) and, when the bench was built against torch, PyTorch's
// caching allocator (raw_alloc_with_stream / raw_delete). Workloads:
//   1. same-size pairs on one thread: 256 B, 64 KiB, 1 MiB, 64 MiB;
//   2. 1, 2, 4, 8, 16 threads, each on its own stream, 64 KiB pairs: aggregate rate;
//   3. cross-thread frees: a producer allocates 64 KiB, a consumer frees (and the ring
//      that carries the handles alone, with no allocator: the floor under those figures);
//   4. mixed sizes round robin with 16 live blocks (FIFO) on one thread;
//   5. alternating phases on two streams: 64 blocks allocated and freed on one stream,
//      then 64 on the other (a cached block can only move once its free is complete).
// Variants run interleaved in a fresh random order each round; figures are medians (p99
// over samples of `pairs` pairs each) and ratios of medians.
//
// On a machine without a GPU it runs on SimDriver and says so: those figures measure the
// simulator, not a GPU.
//
// With --layers, each layer the default stack puts above the cache (Statistics,
// GraphPools, Logging with no file) also runs alone over Cached<AsyncCuda>, the three
// together, and the cache over the default stack's base (Budget, PoolOrVirtual), so that
// a layer that costs more with more threads shows in the thread table.
//
// usage: cache_bench [rounds=200] [pairs-per-sample=64] [--no-threads] [--layers]

#include <xlogrt/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench_util.hpp"
#include "raw_driver.hpp"
#ifdef XLOGRT_BENCH_TORCH
#include "torch_alloc.hpp"
#endif

using namespace xlogrt;
using namespace xlogrt::bench;

namespace {

std::atomic<long> failures{0};

/// One allocator under test: allocate `n` bytes on stream `s`, returning a handle that
/// free() takes back. Handles are slots of a per-variant table, so every variant moves
/// the same small values around.
struct Alloc {
  std::string name;
  std::function<std::uint64_t(std::size_t n, StreamId s)> alloc;  // 0: failed
  std::function<void(std::uint64_t h)> free;
  std::function<void()> settle;  // untimed, after each sample
  /// `k` same-size pairs on stream `s`, the loop inlined (no call through alloc / free).
  std::function<void(std::size_t n, StreamId s, int k)> pairs;
};

/// Keeps the DeviceBlocks of a resource behind integer handles, so that the allocator
/// table above has one signature for every variant. Every workload frees its blocks in
/// the order it allocated them, with fewer than SLOTS live: a ring written by the
/// allocating thread and read by the freeing one, the handle's hand-off between them
/// (release / acquire in the cross-thread table) carrying the slot's contents.
struct BlockSlots {
  static constexpr std::uint64_t SLOTS = 1024;
  struct alignas(64) Slot {  // a line each: the two threads of the cross-thread table never share one
    DeviceBlock b;
  };
  std::vector<Slot> slots = std::vector<Slot>(SLOTS);
  std::uint64_t next = 0;  // the allocating thread's
  std::uint64_t put(DeviceBlock&& b) {
    const std::uint64_t i = next++ % SLOTS;
    slots[i].b = std::move(b);
    return i + 1;
  }
  DeviceBlock take(std::uint64_t h) { return std::move(slots[h - 1].b); }
};

template <class R, class... Tag>
Alloc resource_alloc(std::string name, R& r, std::shared_ptr<BlockSlots> slots, Tag... tag) {
  Alloc a;
  a.name = std::move(name);
  a.alloc = [&r, slots, tag...](std::size_t n, StreamId s) -> std::uint64_t {
    auto b = r.allocate(n, s, tag...);
    if (!b) {
      failures.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    return slots->put(std::move(*b));
  };
  a.free = [&r, slots](std::uint64_t h) {
    if (h == 0 || !r.deallocate(slots->take(h))) failures.fetch_add(1, std::memory_order_relaxed);
  };
  a.settle = [&r] { (void)r.reap_pending(); };
  a.pairs = [&r, tag...](std::size_t n, StreamId s, int k) {
    for (int i = 0; i < k; ++i) {
      auto b = r.allocate(n, s, tag...);
      if (!b || !r.deallocate(std::move(*b))) failures.fetch_add(1, std::memory_order_relaxed);
    }
  };
  return a;
}

struct Options {
  int rounds = 200;
  int pairs = 64;
  bool threads = true;
  bool layers = false;
};

/// Runs `body(variant, pairs)` for every variant, `rounds` times, in a fresh random
/// order each round (bench::interleaved), and returns each variant's samples (ns per pair).
Samples interleave(std::vector<Alloc>& vs, int rounds, int pairs, const std::function<void(Alloc&, int)>& body) {
  return interleaved(
      vs.size(), rounds, pairs, [&](std::size_t k, int n) { body(vs[k], n); }, [&](std::size_t k) { vs[k].settle(); });
}

/// The table of one workload: each variant's median and p99, and its ratios to the raw
/// pool (and to PyTorch's allocator, the last variant, when it is there).
void print_table(const std::string& title, const std::vector<Alloc>& vs, const Samples& m,
                 const char* unit = "ns/pair") {
  const bool torch = vs.back().name.starts_with("PyTorch");
  std::vector<std::string> cols = {"variant", std::string("median ") + unit, std::string("p99 ") + unit, "x raw pool",
                                   "raw pool / variant"};
  if (torch) cols.push_back("torch / variant");
  Table t(title, cols);
  for (std::size_t i = 0; i < vs.size(); ++i) {
    const Summary s = m.summary(i);
    std::vector<std::string> row = {vs[i].name, fmt("%.1f", s.median), fmt("%.1f", s.p99), fmt("%.3f", m.ratio(i, 0)),
                                    fmt("%.2f", m.ratio(0, i))};
    if (torch) row.push_back(fmt("%.2f", m.ratio(vs.size() - 1, i)));
    t.row(row);
  }
}

template <class D>
int run_bench(D& drv, const char* where, const Options& opt) {
  auto streams = StreamPool<D>::open(drv, 0, 17);
  if (!streams) return std::printf("streams: %s\n", streams.error().what().c_str()), 1;
  auto async = AsyncCuda<D>::create(*streams);
  auto bare_up = AsyncCuda<D>::create(*streams);
  if (!async || !bare_up) return std::printf("AsyncCuda failed\n"), 1;
  Cached<AsyncCuda<D>> bare(std::move(*bare_up));
  auto stack = StackBuilder<DefaultStackOn<D>>::build(*streams);
  if (!stack) return std::printf("default stack: %s\n", stack.error().what().c_str()), 1;
  auto made = DeviceRuntime<DefaultStackOn<D>>::create(*streams, std::move(*stack));
  if (!made) return std::printf("runtime: %s\n", made.error().what().c_str()), 1;
  auto& rt = *made;
  auto& rt_cache = *find_layer<Cached>(rt.stack());
  Raw<D> raw{drv};
  auto pool = (*streams)->device()->mempool();
  (void)(*streams)->device()->make_current();

  std::printf("# caching layer: allocate + deallocate pairs on %s (%s)\n# %s; %d rounds x %d pairs per sample\n",
              where, (*streams)->device()->info().name.c_str(), machine_line().c_str(), opt.rounds, opt.pairs);
  std::printf("# default stack: %s\n\n",
              rt_cache.options().enabled ? "Statistics<GraphPools<Logging<Cached<Budget<AsyncCuda>>>>> (cache on)"
                                         : "Statistics<GraphPools<Logging<Cached<Budget<AsyncCuda>>>>> with XLOGRT_CACHE=0 (cache off)");

  std::vector<Alloc> vs;
  {
    // The handle is the pointer with the stream in its low bits (blocks are 256-aligned),
    // which the free needs.
    Alloc a;
    a.name = "raw driver pool";
    a.alloc = [&](std::size_t n, StreamId s) { return raw.alloc_async(n, pool, *(*streams)->get(s)) | s.value; };
    a.free = [&](std::uint64_t h) {
      raw.free_async(h & ~std::uint64_t{255}, *(*streams)->get(StreamId{static_cast<std::uint32_t>(h & 255)}));
    };
    a.settle = [&] {
      for (std::uint32_t i = 0; i < 17; ++i) (void)drv.stream_synchronize(*(*streams)->get(StreamId{i}));
    };
    a.pairs = [&](std::size_t n, StreamId sid, int k) {
      const auto s = *(*streams)->get(sid);
      for (int i = 0; i < k; ++i) raw.free_async(raw.alloc_async(n, pool, s), s);
    };
    vs.push_back(std::move(a));
  }
  vs.push_back(resource_alloc("AsyncCuda", *async, std::make_shared<BlockSlots>(), AllocTag{}));
  vs.push_back(resource_alloc("Cached<AsyncCuda> (bare)", bare, std::make_shared<BlockSlots>(), AllocTag{}));
  vs.push_back(resource_alloc("DeviceRuntime<DefaultStack>", rt, std::make_shared<BlockSlots>()));
  // --layers: the layers above the default stack's cache, one at a time and together, and
  // the cache over the default stack's base.
  using Bare = Cached<AsyncCuda<D>>;
  using Logged = Logging<Bare, FileSink>;
  std::unique_ptr<Statistics<Bare>> with_stats;
  std::unique_ptr<GraphPools<Bare>> with_graphs;
  std::unique_ptr<Logged> with_logging;
  std::unique_ptr<Statistics<GraphPools<Logged>>> with_all_above;
  std::unique_ptr<Cached<Budget<PoolOrVirtual<D>>>> with_base;
  if (opt.layers) {
    auto fresh = [&] {
      auto a = AsyncCuda<D>::create(*streams);
      if (!a) std::printf("AsyncCuda failed: %s\n", a.error().what().c_str()), std::exit(1);
      return std::move(*a);
    };
    with_stats = std::make_unique<Statistics<Bare>>(Bare(fresh()));
    with_graphs = std::make_unique<GraphPools<Bare>>(Bare(fresh()));
    with_logging = std::make_unique<Logged>(Bare(fresh()));
    with_all_above = std::make_unique<Statistics<GraphPools<Logged>>>(GraphPools<Logged>(Logged(Bare(fresh()))));
    with_base = std::make_unique<Cached<Budget<PoolOrVirtual<D>>>>(
        Budget<PoolOrVirtual<D>>(PoolOrVirtual<D>(fresh())));
    vs.push_back(resource_alloc("Statistics<Cached<AsyncCuda>>", *with_stats, std::make_shared<BlockSlots>(), AllocTag{}));
    vs.push_back(resource_alloc("GraphPools<Cached<AsyncCuda>>", *with_graphs, std::make_shared<BlockSlots>(), AllocTag{}));
    vs.push_back(resource_alloc("Logging<Cached<AsyncCuda>> (no file)", *with_logging, std::make_shared<BlockSlots>(),
                                AllocTag{}));
    vs.push_back(resource_alloc("the three over Cached<AsyncCuda>", *with_all_above, std::make_shared<BlockSlots>(),
                                AllocTag{}));
    vs.push_back(resource_alloc("Cached<Budget<PoolOrVirtual>>", *with_base, std::make_shared<BlockSlots>(), AllocTag{}));
  }
#ifdef XLOGRT_BENCH_TORCH
  if constexpr (!std::is_same_v<D, CudaDriver>) {
    std::printf("# torch: no PyTorch column on %s\n\n", where);
  } else if (torch_alloc_init()) {
    Alloc a;
    a.name = "PyTorch CUDACachingAllocator";
    a.alloc = [&](std::size_t n, StreamId s) {
      return reinterpret_cast<std::uint64_t>(torch_alloc(n, *(*streams)->get(s)));
    };
    a.free = [](std::uint64_t p) { torch_free(reinterpret_cast<void*>(p)); };
    a.settle = [] {};
    a.pairs = [&](std::size_t n, StreamId sid, int k) {
      const auto s = *(*streams)->get(sid);
      for (int i = 0; i < k; ++i) torch_free(torch_alloc(n, s));
    };
    vs.push_back(std::move(a));
  } else {
    std::printf("# torch: init failed, no PyTorch column\n\n");
  }
#else
  std::printf("# torch: not found when this bench was built, no PyTorch column\n\n");
#endif
  pin_to_core(0);
  for (const double until = now_ns() + 300e6; now_ns() < until;) {  // the host's first moments run slow
    for (auto& v : vs) v.pairs(64 << 10, StreamId{0}, 16);
  }

  // 1. same-size pairs
  for (std::size_t bytes : {std::size_t{256}, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{64} << 20}) {
    auto ns = interleave(vs, opt.rounds, opt.pairs, [&](Alloc& v, int k) {
      v.pairs(bytes, StreamId{0}, k);
    });
    const std::string title = "same-size pairs, one thread, " + std::to_string(bytes) + " bytes";
    print_table(title, vs, ns);
  }

  // 4. mixed sizes, 16 live blocks, FIFO
  {
    static constexpr std::size_t sizes[] = {256,    1000,    4096, 65536, 100000, 1 << 20, 3 << 20, 512,
                                            20000, 8192, 1 << 16, 777,  2 << 20, 300,    40000,   16 << 10};
    auto ns = interleave(vs, opt.rounds, opt.pairs * 4, [&](Alloc& v, int k) {
      std::uint64_t live[16];
      for (int i = 0; i < 16; ++i) live[i] = v.alloc(sizes[i], StreamId{0});
      for (int i = 0; i < k; ++i) {
        v.free(live[i % 16]);
        live[i % 16] = v.alloc(sizes[(i * 7 + 3) % 16], StreamId{0});
      }
      for (auto h : live) v.free(h);
    });
    print_table("mixed sizes round robin, 16 live blocks (FIFO), one thread: ns per allocate + free", vs, ns);
  }

  // 5. alternating phases on two streams
  {
    auto ns = interleave(vs, opt.rounds / 4 + 1, 64, [&](Alloc& v, int k) {
      static int phase = 0;
      const StreamId s{static_cast<std::uint32_t>(1 + (phase++ & 1))};
      std::vector<std::uint64_t> hs;
      for (int i = 0; i < k; ++i) hs.push_back(v.alloc(64 << 10, s));
      for (auto h : hs) v.free(h);
      (void)drv.stream_synchronize(*(*streams)->get(s));  // the GPU finishes between phases
    });
    print_table("alternating phases: 64 pairs on stream 1, then 64 on stream 2 (64 KiB)", vs, ns);
  }

  // 3. cross-thread frees
  {
    for (auto& v : vs) v.settle();
    // The ring alone (handles that name no block, a free that does nothing): what the
    // pattern costs without an allocator, the floor under every variant's figure.
    std::vector<Alloc> ring_alone(1);
    ring_alone.reserve(3);  // the references below stay valid
    ring_alone[0].name = "the ring alone";
    ring_alone[0].alloc = [](std::size_t, StreamId) { return std::uint64_t{1}; };
    ring_alone[0].free = [](std::uint64_t) {};
    ring_alone[0].settle = [] {};
    // The ring and the handles' slots (a DeviceBlock moved in by the producer and out by
    // the consumer, as every resource variant's are): the floor a variant's figure is
    // compared with, since the slot's line crosses between the threads too.
    auto floor_slots = std::make_shared<BlockSlots>();
    Alloc& with_slots = ring_alone.emplace_back();
    with_slots.name = "the ring and the block slots";
    with_slots.alloc = [floor_slots](std::size_t n, StreamId s) {
      return floor_slots->put(DeviceBlock{std::uint64_t{1} << 32, n, s, 0, AllocTag{0}, BlockId{}});
    };
    with_slots.free = [floor_slots](std::uint64_t h) { DeviceBlock gone = floor_slots->take(h); };
    with_slots.settle = [] {};
    // ... and a state word per block, on a line of its own, that the allocation writes
    // and the free changes with a read-modify-write (512 blocks in turn: more than the
    // ring holds, so no two blocks in flight share a line): the least that tracking each
    // block's owner costs, as the base's block slot does (an allocation makes it live, a
    // free is checked against it and makes the id stale), both threads writing the line
    // once per pair.
    struct alignas(64) StateLine {
      std::atomic<std::uint64_t> owner{0};
    };
    constexpr std::uint64_t STATES = 512;
    auto states = std::make_shared<std::vector<StateLine>>(STATES);
    Alloc& with_state = ring_alone.emplace_back();
    with_state.name = "the ring, the slots and a state line per block";
    with_state.alloc = [floor_slots, states](std::size_t n, StreamId s) {
      const std::uint64_t h = floor_slots->put(DeviceBlock{std::uint64_t{1} << 32, n, s, 0, AllocTag{0}, BlockId{}});
      (*states)[h % STATES].owner.store(h, std::memory_order_release);
      return h;
    };
    with_state.free = [floor_slots, states](std::uint64_t h) {
      std::uint64_t expected = h;
      if (!(*states)[h % STATES].owner.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
        failures.fetch_add(1, std::memory_order_relaxed);
      }
      DeviceBlock gone = floor_slots->take(h);
    };
    with_state.settle = [] {};
    auto cross = [&](Alloc& v, int k) {
      constexpr int RING = 256;
      struct alignas(64) Cell {  // a line each, so that the two threads meet on one line per block
        std::atomic<std::uint64_t> h{0};
      };
      std::vector<Cell> ring(RING);
      std::atomic<bool> pinned{false};
      std::thread consumer([&] {
        pin_to_core(1);
        pinned.store(true, std::memory_order_release);
        for (int i = 0; i < k; ++i) {
          // Spin reading, not exchanging: a read-modify-write in the loop would take the
          // line from the producer on every turn. Release: the producer reuses the cell
          // (and, 1,024 blocks on, the block's slot) only after this thread is done.
          std::uint64_t h;
          while ((h = ring[i % RING].h.load(std::memory_order_acquire)) == 0) {
          }
          ring[i % RING].h.store(0, std::memory_order_release);
          v.free(h);
        }
      });
      // The consumer starts with this thread's affinity (core 0): until it has moved to
      // core 1 it runs only when this thread yields (spinning here, it waited for the
      // scheduler's time slice, milliseconds, every sample).
      while (!pinned.load(std::memory_order_acquire)) std::this_thread::yield();
      for (int i = 0; i < k; ++i) {
        const std::uint64_t h = v.alloc(64 << 10, StreamId{0});
        while (ring[i % RING].h.load(std::memory_order_acquire) != 0) {
        }
        ring[i % RING].h.store(h == 0 ? 1 : h, std::memory_order_release);
      }
      consumer.join();
    };
    auto ns = interleave(vs, opt.rounds / 4 + 1, 4096, cross);
    print_table("cross-thread frees: producer allocates 64 KiB, consumer frees (ns per pair, wall)", vs, ns);
    const Samples floors = interleave(ring_alone, opt.rounds / 4 + 1, 4096, cross);
    for (std::size_t i = 0; i < ring_alone.size(); ++i) {
      const Summary f = floors.summary(i);
      std::printf("%s, no allocator: median %.1f ns per pair, p99 %.1f\n", ring_alone[i].name.c_str(), f.median, f.p99);
    }
    std::printf("\n");
  }

  if (opt.threads) {
    constexpr int REPS = 5;
    std::vector<std::string> cols = {"threads"};
    for (auto& v : vs) cols.push_back(v.name);
    Table table("threads, each on its own stream, 64 KiB pairs: aggregate M pairs/s (median of " +
                    std::to_string(REPS) + " alternating runs)",
                cols);
    for (int threads : {1, 2, 4, 8, 16}) {
      std::vector<std::vector<double>> rates(vs.size());
      shuffled_rounds(vs.size(), REPS, [&](std::size_t k) {
        auto& v = vs[k];
        std::atomic<bool> go{false};
        std::atomic<int> ready{0};
        std::atomic<long> done{0};
        const int per_thread = k == 0 || v.name == "AsyncCuda" ? 4000 : 200000;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t) {
          ts.emplace_back([&, t] {
            pin_to_core(t + 1);
            (void)(*streams)->device()->make_current();
            const StreamId sid{static_cast<std::uint32_t>(t + 1)};
            ready.fetch_add(1);
            while (!go.load()) std::this_thread::yield();
            v.pairs(64 << 10, sid, per_thread);
            done += per_thread;
          });
        }
        // The clock starts once every thread runs on its core: a thread still starting
        // or moving there would count its start against every thread's pairs.
        while (ready.load() < threads) std::this_thread::yield();
        const double t0 = now_ns();
        go = true;
        for (auto& th : ts) th.join();
        rates[k].push_back(static_cast<double>(done.load()) / ((now_ns() - t0) * 1e-3));
        for (int t = 0; t <= threads; ++t) (void)drv.stream_synchronize(*(*streams)->get(StreamId{static_cast<std::uint32_t>(t)}));
        v.settle();
      });
      std::vector<std::string> row = {std::to_string(threads)};
      for (auto& r : rates) row.push_back(fmt("%.2f", summarize(r).median));
      table.row(row);
    }
  }

  const CacheStats b = bare.stats(), d = rt_cache.stats();
  for (const auto& [name, s] : {std::pair{"Cached<AsyncCuda>", b}, std::pair{"DefaultStack's Cached", d}}) {
    std::printf("%s: %llu hits, %llu depot hits, %llu cross-stream moves, %llu from other threads' bins, %llu misses "
                "(%llu evicting a larger block), %llu bypasses; waste %.2f %% of granted bytes\n",
                name, static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.depot_hits),
                static_cast<unsigned long long>(s.cross_stream_moves),
                static_cast<unsigned long long>(s.from_other_threads), static_cast<unsigned long long>(s.misses),
                static_cast<unsigned long long>(s.evictions),
                static_cast<unsigned long long>(s.bypasses),
                s.granted_bytes ? 100.0 * static_cast<double>(s.waste_bytes()) / static_cast<double>(s.granted_bytes) : 0.0);
  }
  const long f = failures.load() + raw_failures.load();
  std::printf("\nfailed calls: %ld%s\n", f, f ? " -- the figures above are void" : "");
  return f ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1, positional = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-threads") {
      opt.threads = false;
    } else if (a == "--layers") {
      opt.layers = true;
    } else if (a.starts_with("--") || a.find_first_not_of("0123456789") != std::string::npos || positional > 1) {
      std::fprintf(stderr, "cache_bench: bad argument '%s' (usage: cache_bench [rounds] [pairs] [--no-threads] [--layers])\n",
                   a.c_str());
      return 2;
    } else if (positional++ == 0) {
      opt.rounds = std::max(4, std::atoi(argv[i]));
    } else {
      opt.pairs = std::max(1, std::atoi(argv[i]));
    }
  }
  return on_gpu_or_sim([&](auto& drv, const char* where) { return run_bench(drv, where, opt); });
}
