// SPDX-License-Identifier: Apache-2.0
// The soak of the default stack on a real GPU: many threads on many streams allocating,
// using blocks across streams with tracking, freeing them across threads and waiting
// through the completion reactor, for minutes, with every result checked and the host's
// and device's memory sampled for growth.
//
// Each round of each thread, with P, C and Q streams picked at random (C != P, Q != C):
//   1. allocates 1 .. --max-blocks blocks on P, of power-of-two and odd sizes from 256 B
//      to 8 MiB, each with the thread's tag, and fills each with a kernel on P
//      (prepare_block_use / finish_block_use, Write);
//   2. allocates a result block on C, zeroes it, and checks every block with a kernel on
//      C (prepare / finish, Read): the kernel compares every word and byte with what the
//      fill wrote and adds them up;
//   3. rewrites about one block in four on Q (Write: Q waits for C's read) and checks it
//      again on C (Read: C waits for Q's write);
//   4. copies the results to pinned host memory on C;
//   5. frees about a third of its blocks at once (their frees wait for C's reads), hands
//      another third to other threads (a queue per thread; the other thread frees them
//      at the start of its next round, or the main thread at the end), keeps the rest,
//      frees the result block, and arms a reactor wait on C (Reactor::when_done_future:
//      no stream synchronisation);
//   6. once the wait completes, checks every result: the sum against its closed form,
//      and no mismatching word or byte; then frees the blocks it kept.
// A block freed while its reads are still running is the cross-stream use-after-free
// that tracking prevents: if a free did not wait, another thread's fill could land in
// the memory before the check reads it, and that check would count mismatches.
//
// Every --sample-seconds it prints a progress line: rounds, allocations per second,
// wrong results so far, the host's resident memory (/proc/self/statm), the device's used
// memory (cuMemGetInfo), the default pool's reserved and used memory (cuMemPoolGetAttribute),
// the caching layer's cached bytes and, after a reap, the stack's outstanding bytes. At the
// end it checks:
//   - every result right (a wrong one is printed, with its block, the first ten of them);
//   - after reap_pending, bytes_outstanding() exactly 0 and Statistics' current bytes and
//     blocks 0 for every tag, its allocation count equal to the soak's own;
//   - after trim() and reap_pending, nothing cached and AsyncCuda's bytes 0;
//   - growth of resident host memory and of the device memory the process holds (the
//     default pool's reserved memory: cuMemGetInfo counts every process on the device),
//     from the first sample at or after 20% of the run to the last sample, within
//     --max-rss-growth-mib (64) and --max-device-growth-mib (256).
//
// Exit status: 0 when every check holds; 1 when one fails, a call fails or a wait does
// not complete within --wait-timeout seconds; 2 for a bad argument; 77 (SKIP) without a
// driver, a device, memory pools or a GPU that runs the sm_90 kernels.
//
// Checks of the checks: --inject-corruption N overwrites one byte of one block in every
// Nth round of thread 0, tracked, between its fill and its check: that run must report
// exactly as many wrong results as corruptions and exit 1 (soak.sh runs it).
// --untracked drops the tracking (each thread orders its streams with its own events, as
// a correct program without xlogrt's tracking would, and frees wait for nothing): the
// use-after-free then shows as wrong results when the timing lets it (reported; it exits
// 1 when it happened).
//
// usage: gpu_soak [--seconds N] [--threads T] [--streams S] [--sample-seconds N]
//                 [--max-blocks B] [--max-rss-growth-mib M] [--max-device-growth-mib M]
//                 [--release-threshold-mib M] [--pool-reuse-strict] [--wait-timeout N] [--seed N]
//                 [--inject-corruption N] [--untracked] [--free-after-wait] [--probe]
//   --release-threshold-mib  the pool's release threshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
//             by default unlimited, as the default stack sets it): above it the pool gives
//             its free memory back at the next synchronisation (the samples' reaps)
//   --pool-reuse-strict  the pool reuses memory freed on another stream only after an
//             event dependency on the free: no opportunistic reuse, and no stream
//             dependency inserted by the allocation: the stack's own cross-stream
//             ordering is then all that orders a block's reuse
//   --free-after-wait  frees every block, and the results, only once the round's wait has
//             completed, when the GPU has finished every use: no free is queued behind work
//             still to run (for telling a tool's view of stream-ordered frees from the
//             library's)
//   --probe   only check that the GPU can run the kernels (exit 0 or 77)
//
// The kernels are in soak_kernels.cu (nvcc); this file is plain C++.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <xlogrt/reactor/reactor.hpp>
#include <xlogrt/resource/nvtx_marks.hpp>
#include <xlogrt/runtime.hpp>

#include "soak_kernels.hpp"
#include "uaf_kernels.hpp"

using namespace xlogrt;

namespace {

constexpr int SKIP = 77;
using Rt = DeviceRuntime<DefaultStack>;
using Clock = std::chrono::steady_clock;
constexpr std::size_t MIB = std::size_t{1} << 20;
constexpr std::size_t MIN_BYTES = 256;
constexpr std::size_t MAX_BYTES = 8 * MIB;
constexpr AllocTag RESULT_TAG{9};  // the result blocks; thread t's blocks carry tag 1 + t % 8

struct Options {
  std::uint64_t seconds = 600;
  std::uint32_t threads = 16;
  std::uint32_t streams = 8;
  std::uint64_t sample_seconds = 10;
  std::uint32_t max_blocks = 8;
  std::uint64_t max_rss_growth_mib = 64;
  std::uint64_t max_device_growth_mib = 256;
  std::optional<std::uint64_t> release_threshold_mib;  // the pool's release threshold; default: keep all
  std::uint64_t wait_timeout = 120;
  std::uint64_t seed = 1;
  std::uint64_t inject_every = 0;  // 0: no corruption
  bool untracked = false;
  bool free_after_wait = false;
  bool pool_reuse_strict = false;
  bool probe = false;
};

[[noreturn]] void usage(const std::string& what) {
  std::fprintf(stderr,
               "gpu_soak: %s\nusage: gpu_soak [--seconds N] [--threads T] [--streams S] [--sample-seconds N] "
               "[--max-blocks B] [--max-rss-growth-mib M] [--max-device-growth-mib M] [--release-threshold-mib M] "
               "[--pool-reuse-strict] [--wait-timeout N] [--seed N] [--inject-corruption N] [--untracked] "
               "[--free-after-wait] [--probe]\n",
               what.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  auto number = [&](int& i, unsigned long long lo, unsigned long long hi) -> unsigned long long {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    char* end = nullptr;
    const char* s = argv[++i];
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || *end != '\0' || *s == '-' || v < lo || v > hi) {
      usage(std::string(argv[i - 1]) + " needs an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--seconds") {
      o.seconds = number(i, 1, 7 * 24 * 3600);
    } else if (a == "--threads") {
      o.threads = static_cast<std::uint32_t>(number(i, 1, 256));
    } else if (a == "--streams") {
      o.streams = static_cast<std::uint32_t>(number(i, 2, 64));
    } else if (a == "--sample-seconds") {
      o.sample_seconds = number(i, 1, 3600);
    } else if (a == "--max-blocks") {
      o.max_blocks = static_cast<std::uint32_t>(number(i, 1, 64));
    } else if (a == "--max-rss-growth-mib") {
      o.max_rss_growth_mib = number(i, 0, 1u << 30);
    } else if (a == "--max-device-growth-mib") {
      o.max_device_growth_mib = number(i, 0, 1u << 30);
    } else if (a == "--release-threshold-mib") {
      o.release_threshold_mib = number(i, 0, 1u << 30);
    } else if (a == "--wait-timeout") {
      o.wait_timeout = number(i, 1, 3600);
    } else if (a == "--seed") {
      o.seed = number(i, 0, ~0ull);
    } else if (a == "--inject-corruption") {
      o.inject_every = number(i, 1, ~0ull);
    } else if (a == "--untracked") {
      o.untracked = true;
    } else if (a == "--free-after-wait") {
      o.free_after_wait = true;
    } else if (a == "--pool-reuse-strict") {
      o.pool_reuse_strict = true;
    } else if (a == "--probe") {
      o.probe = true;
    } else {
      usage("unknown argument " + std::string(a));
    }
  }
  return o;
}

/// Errors that mean "no GPU to run on here", not "the library is wrong".
bool is_skip(const error& e) {
  return e.code() == errc::no_driver || e.code() == errc::driver_too_old || e.code() == errc::no_device ||
         e.code() == errc::invalid_ordinal || e.driver_status() == status::not_supported;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0;
  unsigned long long resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

/// Power-of-two sizes 2^8 .. 2^23 half the time, odd sizes in [2^e, 2^(e+1)) for
/// e = 8 .. 22 the other half: every size class from 256 B to 8 MiB, and sizes that are
/// not multiples of 4 (the kernels' byte tails).
std::size_t pick_size(std::mt19937_64& rng) {
  if (rng() & 1) return std::size_t{1} << (8 + rng() % 16);
  const std::size_t lo = std::size_t{1} << (8 + rng() % 15);
  return (lo + rng() % lo) | 1;
}

/// A block of one thread, hand-off included.
struct Mailbox {
  std::mutex mu;
  std::vector<DeviceBlock> blocks;
};

/// One thread's counts, read by the sampler (relaxed: each figure is a moment's view).
struct alignas(64) Counts {
  std::atomic<std::uint64_t> rounds{0};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> checks{0};
  std::atomic<std::uint64_t> wrong{0};
  std::atomic<std::uint64_t> handed{0};     // blocks handed to another thread
  std::atomic<std::uint64_t> cross_frees{0};  // blocks freed for another thread
  std::atomic<std::uint64_t> injected{0};

  void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) { c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
};

struct Totals {
  std::uint64_t rounds = 0, allocations = 0, checks = 0, wrong = 0, handed = 0, cross_frees = 0, injected = 0;
};

struct Sample {
  double elapsed = 0;
  Totals totals;
  std::size_t rss = 0;
  std::size_t device_used = 0;
  std::size_t cached = 0;
  std::uint64_t misses = 0;  // the caching layer's allocations from the pool, cumulative
  std::uint64_t trimmed = 0;  // ... and its blocks freed to the pool, cumulative
  std::size_t outstanding = 0;  // after a reap: the users' blocks and the frees queued since
  MemPoolUsage pool;            // the device's default pool, which AsyncCuda allocates from
};

/// What every worker shares: the runtime, the reactor, the mailboxes, the stop flag and
/// the first failure.
class Soak {
 public:
  Soak(Rt& rt, Reactor<CudaDriver>& reactor, const Options& o)
      : rt_(rt), reactor_(reactor), o_(o), mailboxes_(o.threads), counts_(o.threads) {}

  void run_thread(std::uint32_t t) {
    // The context for the driver calls that need one (cuMemHostAlloc, cuEventCreate), and
    // the runtime API's device for the <<<>>> launches: the same primary context.
    if (!ok(rt_.device()->make_current(), "making the primary context current")) return;
    if (const int e = uaf::select_device(0); e != 0) {
      return fail("thread " + std::to_string(t) + ": cudaSetDevice(0): " + uaf::error_name(e));
    }
    Worker w(*this, t);
    if (!w.init()) return;
    while (!stop_.load(std::memory_order_relaxed)) {
      if (!w.free_mail() || !w.round()) break;
    }
    w.close();
  }

  /// Frees what is left in the mailboxes once every worker has stopped.
  bool drain_mailboxes() {
    for (std::uint32_t t = 0; t < o_.threads; ++t) {
      std::lock_guard lock(mailboxes_[t].mu);
      for (DeviceBlock& b : mailboxes_[t].blocks) {
        if (!ok(rt_.deallocate(std::move(b)), "freeing a handed-off block at the end")) return false;
        counts_[t].bump(counts_[t].cross_frees);
      }
      mailboxes_[t].blocks.clear();
    }
    return true;
  }

  Totals totals() const {
    Totals s;
    for (const Counts& c : counts_) {
      s.rounds += c.rounds.load(std::memory_order_relaxed);
      s.allocations += c.allocations.load(std::memory_order_relaxed);
      s.checks += c.checks.load(std::memory_order_relaxed);
      s.wrong += c.wrong.load(std::memory_order_relaxed);
      s.handed += c.handed.load(std::memory_order_relaxed);
      s.cross_frees += c.cross_frees.load(std::memory_order_relaxed);
      s.injected += c.injected.load(std::memory_order_relaxed);
    }
    return s;
  }

  void stop() { stop_.store(true, std::memory_order_relaxed); }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() {
    std::lock_guard lock(mu_);
    return failure_;
  }

  void fail(const std::string& what) {
    {
      std::lock_guard lock(mu_);
      if (failure_.empty()) failure_ = what;
    }
    failed_.store(true, std::memory_order_release);
    stop_.store(true, std::memory_order_relaxed);
  }
  template <class T>
  bool ok(const result<T>& r, const char* what) {
    if (r) return true;
    fail(std::string(what) + ": " + r.error().what());
    return false;
  }

 private:
  /// One check: which block, and the seed of the fill it must find.
  struct Check {
    std::size_t block = 0;
    std::uint32_t seed = 0;
    bool rewritten = false;
  };

  class Worker {
   public:
    Worker(Soak& s, std::uint32_t t)
        : s_(s), t_(t), rng_(s.o_.seed * 0x9E3779B97F4A7C15ull + t), tag_{1 + t % 8}, c_(s.counts_[t]) {}

    bool init() {
      auto& d = s_.rt_.driver();
      auto host = d.mem_host_alloc_mapped(sizeof(soak::CheckResult) * 2 * s_.o_.max_blocks);
      if (!s_.ok(host, "cuMemHostAlloc of the results")) return false;
      host_ = static_cast<soak::CheckResult*>(*host);
      if (s_.o_.untracked) {
        for (CUevent& e : events_) {
          auto ev = d.event_create();
          if (!s_.ok(ev, "cuEventCreate")) return false;
          e = *ev;
        }
      }
      return true;
    }

    void close() {
      auto& d = s_.rt_.driver();
      if (host_ != nullptr) (void)d.mem_host_free(host_);
      for (CUevent e : events_) {
        if (e != nullptr) (void)d.event_destroy(e);
      }
    }

    /// Frees the blocks other threads handed to this one.
    bool free_mail() {
      std::vector<DeviceBlock> mail;
      {
        std::lock_guard lock(s_.mailboxes_[t_].mu);
        mail.swap(s_.mailboxes_[t_].blocks);
      }
      for (DeviceBlock& b : mail) {
        if (!s_.ok(s_.rt_.deallocate(std::move(b)), "freeing a block another thread handed over")) return false;
        c_.bump(c_.cross_frees);
      }
      return true;
    }

    bool round() {
      const Options& o = s_.o_;
      Rt& rt = s_.rt_;
      const std::uint32_t S = o.streams;
      const StreamId P{static_cast<std::uint32_t>(rng_() % S)};
      const StreamId C{other_than(P.value)};
      const StreamId Q{other_than(C.value)};
      auto sp = rt.stream(P);
      auto sc = rt.stream(C);
      auto sq = rt.stream(Q);
      if (!s_.ok(sp, "stream P") || !s_.ok(sc, "stream C") || !s_.ok(sq, "stream Q")) return false;

      // 1. Allocate on P and fill on P.
      const std::size_t k = 1 + rng_() % o.max_blocks;
      blocks_.clear();
      req_.clear();
      checks_.clear();
      for (std::size_t i = 0; i < k; ++i) {
        // The caching layer hands out its size class; the kernels use the bytes asked
        // for, so that odd sizes keep their tails.
        const std::size_t bytes = pick_size(rng_);
        auto b = rt.allocate(bytes, P, tag_);
        if (!s_.ok(b, "allocate")) return false;
        c_.bump(c_.allocations);
        if (b->ptr() % 4 != 0) {
          s_.fail("allocate returned a pointer that is not 4-byte aligned: " + std::to_string(b->ptr()));
          return false;
        }
        if (b->bytes() < bytes) {
          s_.fail("allocate returned " + std::to_string(b->bytes()) + " bytes for a request of " +
                  std::to_string(bytes));
          return false;
        }
        blocks_.push_back(std::move(*b));
        req_.push_back(bytes);
        const std::uint32_t seed = static_cast<std::uint32_t>(rng_());
        if (!use(blocks_.back(), P, Access::Write, [&](CUstream s) {
              return soak::enqueue_fill(s, blocks_.back().ptr(), bytes, seed);
            })) {
          return false;
        }
        checks_.push_back({i, seed, false});
      }
      if (o.inject_every != 0 && t_ == 0 && (c_.rounds.load(std::memory_order_relaxed) + 1) % o.inject_every == 0) {
        // One byte of block 0 overwritten on P after its fill, before its check, with
        // the complement of what the fill wrote: a corruption the checks must see.
        const DeviceBlock& b = blocks_[0];
        const std::uint64_t at = rng_() % req_[0];
        const std::uint32_t seed = checks_[0].seed;
        const std::uint8_t was = at < req_[0] / 4 * 4
                                     ? static_cast<std::uint8_t>(soak::word(seed, static_cast<std::uint32_t>(at / 4)) >>
                                                                 (8 * (at % 4)))
                                     : soak::tail_byte(seed, at);
        if (!use(b, P, Access::Write, [&](CUstream s) {
              auto r = s_.rt_.driver().memset_d8_async(b.ptr() + at, static_cast<std::uint8_t>(~was), 1, s);
              return s_.ok(r, "the injected corruption (cuMemsetD8Async)") ? 0 : -1;
            })) {
          return false;
        }
        c_.bump(c_.injected);
      }
      if (!order(P, *sp, C, *sc)) return false;  // untracked only

      // 2. The results on C, zeroed, and a check of every block on C. 3. Rewrites on Q,
      // checked again on C.
      std::vector<std::size_t> rewrite;
      for (std::size_t i = 0; i < k; ++i) {
        if (rng_() % 4 == 0) rewrite.push_back(i);
      }
      const std::size_t n_checks = k + rewrite.size();
      const std::size_t result_bytes = sizeof(soak::CheckResult) * n_checks;
      auto results = rt.allocate(result_bytes, C, RESULT_TAG);
      if (!s_.ok(results, "allocating the results")) return false;
      c_.bump(c_.allocations);
      auto* out = results->as<soak::CheckResult>();
      if (!track(rt.prepare_block_use(results->id(), C, Access::ReadWrite), "prepare (results)")) return false;
      if (!s_.ok(rt.driver().memset_d8_async(results->ptr(), 0, result_bytes, *sc), "zeroing the results")) {
        return false;
      }
      for (std::size_t i = 0; i < k; ++i) {
        if (!check(i, checks_[i].seed, C, out + i)) return false;
      }
      if (!rewrite.empty()) {
        if (!order(C, *sc, Q, *sq)) return false;
        for (std::size_t r = 0; r < rewrite.size(); ++r) {
          const std::size_t i = rewrite[r];
          const std::uint32_t seed = static_cast<std::uint32_t>(rng_());
          if (!use(blocks_[i], Q, Access::Write, [&](CUstream s) {
                return soak::enqueue_fill(s, blocks_[i].ptr(), req_[i], seed);
              })) {
            return false;
          }
          checks_.push_back({i, seed, true});
        }
        if (!order(Q, *sq, C, *sc)) return false;
        for (std::size_t r = 0; r < rewrite.size(); ++r) {
          if (!check(rewrite[r], checks_[k + r].seed, C, out + k + r)) return false;
        }
      }
      // 4. The results to the host, on C.
      if (!s_.ok(rt.driver().memcpy_dtoh_async(host_, results->ptr(), result_bytes, *sc), "copying the results")) {
        return false;
      }
      if (!track(rt.finish_block_use(results->id(), C, Access::ReadWrite), "finish (results)")) return false;

      // 5. Free, hand off or keep each block; free the results; wait on C.
      sizes_.assign(k, 0);
      kept_.clear();
      for (std::size_t i = 0; i < k; ++i) {
        sizes_[i] = req_[i];
        const auto roll = rng_() % 6;
        if (roll < 2 && o.threads > 1) {
          const std::uint32_t to = (t_ + 1 + static_cast<std::uint32_t>(rng_() % (o.threads - 1))) % o.threads;
          std::lock_guard lock(s_.mailboxes_[to].mu);
          s_.mailboxes_[to].blocks.push_back(std::move(blocks_[i]));
          c_.bump(c_.handed);
        } else if (roll < 4 || o.free_after_wait) {
          kept_.push_back(i);
        } else if (!s_.ok(rt.deallocate(std::move(blocks_[i])), "deallocate")) {
          return false;
        }
      }
      if (!o.free_after_wait && !s_.ok(rt.deallocate(std::move(*results)), "freeing the results")) return false;
      auto done = s_.reactor_.when_done_future(C);
      if (!s_.ok(done, "Reactor::when_done_future")) return false;
      if (done->wait_for(std::chrono::seconds(o.wait_timeout)) != std::future_status::ready) {
        s_.fail("thread " + std::to_string(t_) + ": the reactor's wait on stream " + std::to_string(C.value) +
                " did not complete in " + std::to_string(o.wait_timeout) + " s");
        return false;
      }
      try {
        done->get();
      } catch (const FutureError& e) {
        s_.fail(std::string("the reactor's wait failed: ") + e.what());
        return false;
      }

      // 6. Check every result, then free the kept blocks.
      std::uint64_t wrong = 0;
      for (std::size_t j = 0; j < n_checks; ++j) {
        const soak::CheckResult& r = host_[j];
        const std::size_t bytes = sizes_[checks_[j].block];
        const unsigned long long want = soak::expected_sum(checks_[j].seed, bytes);
        if (r.sum == want && r.mismatches == 0 && r.first_bad == 0) continue;
        ++wrong;
        if (s_.reported_.fetch_add(1, std::memory_order_relaxed) < 10) {
          std::printf("WRONG: thread %u round %" PRIu64 ": %s of a %zu-byte block (alloc stream %u, read on %u%s): "
                      "sum %llu, expected %llu; %llu mismatching words or bytes, the first at byte %llu\n",
                      t_, c_.rounds.load(std::memory_order_relaxed), checks_[j].rewritten ? "re-check" : "check",
                      bytes, P.value, C.value,
                      checks_[j].rewritten ? (", rewritten on " + std::to_string(Q.value)).c_str() : "", r.sum,
                      want, r.mismatches, r.first_bad == 0 ? 0ull : ~r.first_bad);
          std::fflush(stdout);
        }
      }
      for (const std::size_t i : kept_) {
        if (!s_.ok(rt.deallocate(std::move(blocks_[i])), "deallocate (kept)")) return false;
      }
      if (o.free_after_wait && !s_.ok(rt.deallocate(std::move(*results)), "freeing the results")) return false;
      c_.bump(c_.checks, n_checks);
      if (wrong != 0) c_.bump(c_.wrong, wrong);
      c_.bump(c_.rounds);
      return true;
    }

   private:
    std::uint32_t other_than(std::uint32_t s) {
      const auto r = static_cast<std::uint32_t>(rng_() % (s_.o_.streams - 1));
      return r >= s ? r + 1 : r;
    }

    bool track(const result<void>& r, const char* what) { return s_.ok(r, what); }

    /// Enqueues `work(stream)` on `on`, a use of `b` with `access`: between
    /// prepare_block_use and finish_block_use, unless --untracked.
    template <class F>
    bool use(const DeviceBlock& b, StreamId on, Access access, F&& work) {
      auto cs = s_.rt_.stream(on);
      if (!s_.ok(cs, "stream")) return false;
      if (!s_.o_.untracked && !track(s_.rt_.prepare_block_use(b.id(), on, access), "prepare_block_use")) {
        return false;
      }
      if (const int e = work(*cs); e != 0) {
        // A cudaError_t; -1: the work has reported its failure itself.
        if (e > 0) s_.fail(std::string("enqueuing a kernel: ") + uaf::error_name(e));
        return false;
      }
      if (!s_.o_.untracked && !track(s_.rt_.finish_block_use(b.id(), on, access), "finish_block_use")) {
        return false;
      }
      return true;
    }

    bool check(std::size_t i, std::uint32_t seed, StreamId on, soak::CheckResult* out) {
      const DeviceBlock& b = blocks_[i];
      const std::size_t bytes = req_[i];
      return use(b, on, Access::Read, [&](CUstream s) { return soak::enqueue_check(s, b.ptr(), bytes, seed, out); });
    }

    /// --untracked: makes `to` wait for what `from` has enqueued so far, with an event of
    /// the thread's own (what a correct program does without xlogrt's tracking: the free
    /// then waits for nothing). Tracked, prepare_block_use does this.
    bool order(StreamId from, CUstream sfrom, StreamId to, CUstream sto) {
      if (!s_.o_.untracked || from == to) return true;
      CUevent e = events_[next_event_++ % events_.size()];
      auto& d = s_.rt_.driver();
      return s_.ok(d.event_record(e, sfrom), "cuEventRecord") && s_.ok(d.stream_wait_event(sto, e), "cuStreamWaitEvent");
    }

    Soak& s_;
    std::uint32_t t_;
    std::mt19937_64 rng_;
    AllocTag tag_;
    Counts& c_;
    soak::CheckResult* host_ = nullptr;
    std::array<CUevent, 4> events_{};
    std::size_t next_event_ = 0;
    std::vector<DeviceBlock> blocks_;
    std::vector<std::size_t> req_;  // the bytes asked for, per block
    std::vector<Check> checks_;
    std::vector<std::size_t> sizes_;
    std::vector<std::size_t> kept_;
  };

  Rt& rt_;
  Reactor<CudaDriver>& reactor_;
  const Options& o_;
  std::vector<Mailbox> mailboxes_;
  std::vector<Counts> counts_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> reported_{0};
  std::mutex mu_;
  std::string failure_;
};

double mib(std::size_t b) { return static_cast<double>(b) / static_cast<double>(MIB); }
double mib_signed(std::size_t to, std::size_t from) {
  return (static_cast<double>(to) - static_cast<double>(from)) / static_cast<double>(MIB);
}

/// The closed form of the checks' sum against a plain loop, for a few sizes and seeds:
/// a wrong closed form would make every result wrong, or hide nothing, so it is checked
/// before the soak relies on it.
bool closed_form_holds() {
  std::mt19937_64 rng(7);
  for (std::size_t bytes : {std::size_t{256}, std::size_t{257}, std::size_t{1023}, std::size_t{4096},
                            std::size_t{65537}, std::size_t{1} << 21, MAX_BYTES, MAX_BYTES - 1}) {
    for (int r = 0; r < 3; ++r) {
      const auto seed = static_cast<std::uint32_t>(rng());
      unsigned long long s = 0;
      for (std::uint64_t j = 0; j < bytes / 4; ++j) s += soak::word(seed, static_cast<std::uint32_t>(j));
      for (std::uint64_t k = bytes / 4 * 4; k < bytes; ++k) s += soak::tail_byte(seed, k);
      if (s != soak::expected_sum(seed, bytes)) {
        std::printf("FAIL: the closed form of the checksum is wrong for %zu bytes, seed %u\n", bytes, seed);
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  auto drv = CudaDriver::open();
  if (!drv) {
    std::printf("SKIP: no usable CUDA driver: %s\n", drv.error().what().c_str());
    return SKIP;
  }
  auto got = Rt::try_get(0);
  if (!got) {
    const bool skip = is_skip(got.error());
    std::printf("%s: cannot open ordinal 0: %s\n", skip ? "SKIP" : "FAIL", got.error().what().c_str());
    return skip ? SKIP : 1;
  }
  Rt& rt = **got;
  const DeviceInfo& info = rt.device()->info();
  if (auto r = rt.device()->make_current(); !r) {
    std::printf("FAIL: making the primary context current: %s\n", r.error().what().c_str());
    return 1;
  }
  if (const int e = uaf::select_device(0); e != 0) {
    if (!uaf::runtime_without_driver(e)) {
      std::printf("FAIL: cudaSetDevice(0): %s\n", uaf::error_name(e));
      return 1;
    }
    std::printf("SKIP: the CUDA runtime API finds no usable driver or device (cudaSetDevice: %s)\n",
                uaf::error_name(e));
    return SKIP;
  }
  if (const int e = soak::kernels_loadable(); e != 0) {
    std::printf("SKIP: the kernels, built for sm_90, cannot run on %s (sm_%d%d): %s\n", info.name.c_str(),
                info.cc_major, info.cc_minor, uaf::error_name(e));
    return SKIP;
  }
  if (o.probe) {
    std::printf("probe: %s (sm_%d%d) runs the kernels\n", info.name.c_str(), info.cc_major, info.cc_minor);
    return 0;
  }
  if (!closed_form_holds()) return 1;

  if (o.release_threshold_mib) {
    if (auto r = rt.driver().mempool_set_release_threshold(rt.device()->mempool(), *o.release_threshold_mib * MIB);
        !r) {
      return std::printf("FAIL: setting the pool's release threshold: %s\n", r.error().what().c_str()), 1;
    }
  }
  if (o.pool_reuse_strict) {
    if (const int e = soak::strict_pool_reuse(rt.device()->mempool()); e != 0) {
      return std::printf("FAIL: setting the pool's reuse policies: %s\n", uaf::error_name(e)), 1;
    }
  }

  // The runtime's pool has DEFAULT_STREAMS streams; more are created and adopted.
  while (rt.streams()->size() < o.streams) {
    auto s = rt.driver().stream_create();
    if (!s) return std::printf("FAIL: cuStreamCreate: %s\n", s.error().what().c_str()), 1;
    if (auto id = rt.streams()->adopt(*s); !id) {
      return std::printf("FAIL: adopting a stream: %s\n", id.error().what().c_str()), 1;
    }
  }
  auto reactor = Reactor<CudaDriver>::create(rt.streams());
  if (!reactor) return std::printf("FAIL: Reactor::create: %s\n", reactor.error().what().c_str()), 1;

  auto& cache = *find_layer<Cached>(rt.stack());
  auto& stats = *find_layer<Statistics>(rt.stack());
  auto& base = *find_layer<PoolOrVirtual>(rt.stack());

  std::printf("# soak of DeviceRuntime<DefaultStack> on %s (sm_%d%d, %d SMs, %.1f GiB), driver %d\n",
              info.name.c_str(), info.cc_major, info.cc_minor, info.multiprocessors,
              static_cast<double>(info.total_bytes) / (1024.0 * MIB), (*drv)->driver_version());
  std::printf("# %u threads, %u streams, %" PRIu64 " s, a sample every %" PRIu64 " s; 1..%u blocks of 256 B..8 MiB "
              "per round; caching layer %s; reactor on %s; %s%s%s%s\n",
              o.threads, o.streams, o.seconds, o.sample_seconds, o.max_blocks,
              cache.options().enabled ? (cache.options().nvtx_marks ? "on, NVTX marks" : "on") : "off (XLOGRT_CACHE=0)",
              (*reactor)->uses_flag_writes() ? "flag writes" : "host functions",
              o.untracked ? "UNTRACKED (no prepare/finish: a use-after-free is expected)"
              : o.free_after_wait ? "tracked, every free after the round's wait"
                                  : "tracked",
              o.inject_every != 0 ? (", a corruption every " + std::to_string(o.inject_every) + " rounds of thread 0").c_str()
                                  : "",
              o.release_threshold_mib ? ("; the pool's release threshold " + std::to_string(*o.release_threshold_mib) +
                                         " MiB").c_str()
                                      : "",
              o.pool_reuse_strict ? "; the pool reuses another stream's frees only after an event" : "");

  if (cache.options().enabled) {
    const CachedOptions& co = cache.options();
    std::printf("# caching layer: thread_block_bytes %zu, bin_bytes %zu, thread_bytes %zu, depot_bytes %zu, "
                "max_block_bytes %zu (XLOGRT_CACHE sets them)\n",
                co.thread_block_bytes, co.bin_bytes, co.thread_bytes, co.depot_bytes, co.max_block_bytes);
  }

  std::vector<Sample> samples;
  // A sample's own calls are checked like the workers': a failed pool query would
  // otherwise read as no growth.
  auto sample = [&](double elapsed, Soak& soak) {
    Sample s;
    s.elapsed = elapsed;
    s.totals = soak.totals();
    s.rss = resident_bytes();
    if (auto m = rt.driver().mem_get_info()) s.device_used = m->total - m->free;
    const CacheStats cs = cache.stats();
    s.cached = cs.cached_bytes;
    s.misses = cs.misses;
    s.trimmed = cs.trimmed_blocks;
    // A long-running engine reaps now and then; without it bytes_outstanding would count
    // every free queued since the start.
    if (auto r = rt.reap_pending(); !r) soak.fail("reap_pending at a sample: " + r.error().what());
    s.outstanding = rt.bytes_outstanding();
    // What the base holds of the device. Over the virtual base (XLOGRT_BACKEND=vmm): its
    // physical pages as "reserved" and its blocks (live and pending, aligned) as "used".
    s.pool = {};
    if (const auto* v = base.virtual_base()) {
      const VirtualStats vs = v->stats();
      s.pool.reserved = vs.physical_bytes;
      s.pool.reserved_high = vs.peak_physical_bytes;
      s.pool.used = vs.used_bytes;
      s.pool.used_high = vs.used_bytes;  // the base keeps no peak of its used bytes
      return s;
    }
    // Over the pool: the device's default one and, when the caching layer's sizes have a
    // pool of their own (AsyncCudaOptions::small_pool_bytes), that one too.
    const auto& pools = *find_layer<AsyncCuda>(rt.stack());
    for (CUmemoryPool pool : {pools.pool(), pools.small_pool()}) {
      if (pool == pools.small_pool() && pool == pools.pool()) break;
      if (auto u = rt.driver().mempool_usage(pool)) {
        s.pool.reserved += u->reserved;
        s.pool.reserved_high += u->reserved_high;  // the pools' peaks may fall apart: a bound
        s.pool.used += u->used;
        s.pool.used_high += u->used_high;
      } else {
        soak.fail("the pool's counters at a sample: " + u.error().what());
      }
    }
    return s;
  };
  auto print = [&](const Sample& s, const Sample* prev, const char* label) {
    const double dt = prev != nullptr ? s.elapsed - prev->elapsed : s.elapsed;
    const std::uint64_t da = s.totals.allocations - (prev != nullptr ? prev->totals.allocations : 0);
    std::printf("%s t=%7.1f s  rounds %10" PRIu64 "  allocs/s %9.0f  wrong %" PRIu64 "  rss %8.1f MiB  device used "
                "%9.1f MiB  pool reserved %9.1f used %9.1f (peak %9.1f) MiB  cached %8.1f MiB (%" PRIu64
                " new from the pool, %" PRIu64 " freed to it)  outstanding %8.1f MiB\n",
                label, s.elapsed, s.totals.rounds, dt > 0 ? static_cast<double>(da) / dt : 0.0, s.totals.wrong,
                mib(s.rss), mib(s.device_used), mib(s.pool.reserved), mib(s.pool.used), mib(s.pool.used_high),
                mib(s.cached), s.misses - (prev != nullptr ? prev->misses : 0),
                s.trimmed - (prev != nullptr ? prev->trimmed : 0), mib(s.outstanding));
  };

  Soak soak(rt, **reactor, o);
  const auto t0 = Clock::now();
  samples.push_back(sample(0, soak));
  print(samples.back(), nullptr, "sample");
  std::vector<std::thread> workers;
  workers.reserve(o.threads);
  for (std::uint32_t t = 0; t < o.threads; ++t) workers.emplace_back([&soak, t] { soak.run_thread(t); });

  for (std::uint64_t k = 1; k * o.sample_seconds <= o.seconds && !soak.failed(); ++k) {
    const auto at = t0 + std::chrono::seconds(k * o.sample_seconds);
    while (Clock::now() < at && !soak.failed()) {
      std::this_thread::sleep_for(std::min<Clock::duration>(at - Clock::now(), std::chrono::milliseconds(100)));
    }
    if (soak.failed()) break;
    Sample s = sample(seconds_since(t0), soak);
    print(s, &samples.back(), "sample");
    samples.push_back(s);
  }
  // A run shorter than one sample interval still runs its full length.
  while (seconds_since(t0) < static_cast<double>(o.seconds) && !soak.failed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  soak.stop();
  for (std::thread& w : workers) w.join();
  const double ran = seconds_since(t0);
  if (soak.failed()) {
    std::printf("FAIL: %s\n", soak.failure().c_str());
    return 1;
  }
  Sample last_running = samples.back();

  bool pass = true;
  // Bytes exact: everything handed back, every queued free reaped.
  if (!soak.drain_mailboxes()) return std::printf("FAIL: %s\n", soak.failure().c_str()), 1;
  const Sample end = sample(ran, soak);
  print(end, &samples.back(), "end   ");
  if (soak.failed()) return std::printf("FAIL: %s\n", soak.failure().c_str()), 1;
  if (auto r = rt.reap_pending(); !r) return std::printf("FAIL: reap_pending: %s\n", r.error().what().c_str()), 1;
  const std::size_t outstanding = rt.bytes_outstanding();
  const StatisticsSnapshot snap = stats.snapshot();
  const Totals tot = soak.totals();
  std::string tag_drift;
  for (const auto& e : snap.tags) {
    if (e.counters.current_bytes != 0 || e.counters.current_count != 0) {
      tag_drift += " tag " + std::to_string(e.tag.value) + ": " + std::to_string(e.counters.current_bytes) +
                   " bytes in " + std::to_string(e.counters.current_count) + " blocks;";
    }
  }
  if (snap.other && (snap.other->current_bytes != 0 || snap.other->current_count != 0)) {
    tag_drift += " other tags: " + std::to_string(snap.other->current_bytes) + " bytes;";
  }
  if (snap.total.current_bytes != 0 || snap.total.current_count != 0) {
    tag_drift += " total: " + std::to_string(snap.total.current_bytes) + " bytes;";
  }
  const CacheStats cs = cache.stats();
  const std::size_t given_back = cache.trim();
  if (auto r = rt.reap_pending(); !r) return std::printf("FAIL: reap_pending: %s\n", r.error().what().c_str()), 1;
  const std::size_t cached_after_trim = cache.stats().cached_bytes;
  const std::size_t base_after_trim = base.bytes_outstanding();
  const ReactorCounters rc = (*reactor)->counters();
  reactor->reset();

  std::printf("\n# summary after %.1f s\n", ran);
  std::printf("rounds %" PRIu64 ", allocations %" PRIu64 " (%.0f/s), results checked %" PRIu64 ", right %" PRIu64
              ", wrong %" PRIu64 "\n",
              tot.rounds, tot.allocations, static_cast<double>(tot.allocations) / ran, tot.checks,
              tot.checks - tot.wrong, tot.wrong);
  std::printf("blocks handed to another thread %" PRIu64 ", freed by another thread %" PRIu64 "\n", tot.handed,
              tot.cross_frees);
  std::printf("cache: hits %" PRIu64 ", depot hits %" PRIu64 ", cross-stream moves %" PRIu64
              ", from other threads %" PRIu64 ", misses %" PRIu64 ", bypasses %" PRIu64 ", evictions %" PRIu64
              "; %.1f MiB cached at the end, trim gave back %.1f MiB, %.1f MiB cached after\n",
              cs.hits, cs.depot_hits, cs.cross_stream_moves, cs.from_other_threads, cs.misses, cs.bypasses,
              cs.evictions, mib(cs.cached_bytes), mib(given_back), mib(cached_after_trim));
  std::printf("reactor: %" PRIu64 " waits armed, %" PRIu64 " on host functions, %" PRIu64 " completed, %" PRIu64
              " faulted\n",
              rc.armed, rc.fallbacks, rc.completed, rc.faulted);

  if (o.inject_every != 0) {
    std::printf("corruptions injected %" PRIu64 ", wrong results %" PRIu64 ": %s\n", tot.injected, tot.wrong,
                tot.injected == tot.wrong ? "each one caught, and nothing else" : "MISMATCH");
    if (tot.injected == 0 || tot.injected != tot.wrong) pass = false;
  }
  if (tot.wrong != 0) {
    std::printf("FAIL: %" PRIu64 " of %" PRIu64 " results wrong\n", tot.wrong, tot.checks);
    pass = false;
  } else {
    std::printf("results: every one right (%" PRIu64 ")\n", tot.checks);
  }
  if (tot.checks == 0) {
    std::printf("FAIL: no round completed\n");
    pass = false;
  }

  const bool exact = outstanding == 0 && tag_drift.empty() && snap.total.allocations == tot.allocations &&
                     cached_after_trim == 0 && base_after_trim == 0;
  std::printf("bytes exact: %s (after reap_pending: bytes_outstanding %zu; Statistics current bytes 0 for every "
              "tag:%s; Statistics allocations %" PRIu64 " = the soak's %" PRIu64 ": %s; after trim: cached %zu, "
              "base outstanding %zu)\n",
              exact ? "yes" : "NO", outstanding, tag_drift.empty() ? " yes" : tag_drift.c_str(),
              snap.total.allocations, tot.allocations, snap.total.allocations == tot.allocations ? "yes" : "NO",
              cached_after_trim, base_after_trim);
  if (!exact) pass = false;

  // Growth from the first sample at or after 20% of the run to the last one taken while
  // the workers ran.
  const double from = 0.2 * static_cast<double>(o.seconds);
  const Sample* baseline = nullptr;
  for (const Sample& s : samples) {
    if (s.elapsed >= from) {
      baseline = &s;
      break;
    }
  }
  if (baseline == nullptr || baseline == &samples.back()) {
    std::printf("growth: not measured (fewer than two samples after 20%% of the run: raise --seconds or lower "
                "--sample-seconds)\n");
  } else {
    // The device memory this process holds is the pool's reserved memory (and a context's
    // fixed share); cuMemGetInfo counts every process on the device, so it is shown, not
    // bounded. Of the reserved memory, `used` is what allocations occupy (the users'
    // blocks, the caching layer's, frees the GPU has not reached yet); the rest is the
    // pool's own free memory, which it keeps up to the release threshold and which grows
    // when it cannot place a request in its free ranges. `used` against its peak says
    // whether the stack held more, or the pool placed the same load less tightly.
    const Sample& a = *baseline;
    const Sample& b = last_running;
    const double rss_growth = mib_signed(b.rss, a.rss);
    const double reserved = mib_signed(b.pool.reserved, a.pool.reserved);
    const double used = mib_signed(b.pool.used, a.pool.used);
    const double cached = mib_signed(b.cached, a.cached);
    const bool rss_ok = rss_growth <= static_cast<double>(o.max_rss_growth_mib);
    const bool dev_ok = reserved <= static_cast<double>(o.max_device_growth_mib);
    std::printf("growth from t=%.1f s to t=%.1f s: host RSS %+.1f MiB (%.1f -> %.1f; bound %" PRIu64
                " MiB): %s; the pool's reserved memory %+.1f MiB (%.1f -> %.1f; bound %" PRIu64 " MiB): %s\n",
                a.elapsed, b.elapsed, rss_growth, mib(a.rss), mib(b.rss), o.max_rss_growth_mib, rss_ok ? "ok" : "GREW",
                reserved, mib(a.pool.reserved), mib(b.pool.reserved), o.max_device_growth_mib, dev_ok ? "ok" : "GREW");
    std::printf("of the reserved memory's growth: used %+.1f MiB (%.1f -> %.1f; the caching layer's cached bytes %+.1f, "
                "the rest %+.1f), the pool's free memory %+.1f MiB; the pool's peaks: used %.1f -> %.1f MiB, reserved "
                "%.1f -> %.1f MiB; the device's used memory (every process) %+.1f MiB (%.1f -> %.1f)\n",
                used, mib(a.pool.used), mib(b.pool.used), cached, used - cached, reserved - used, mib(a.pool.used_high),
                mib(b.pool.used_high), mib(a.pool.reserved_high), mib(b.pool.reserved_high),
                mib_signed(b.device_used, a.device_used), mib(a.device_used), mib(b.device_used));
    if (!rss_ok) std::printf("FAIL: host resident memory grew by more than %" PRIu64 " MiB\n", o.max_rss_growth_mib);
    if (!dev_ok) {
      std::printf("FAIL: the pool's reserved memory grew by more than %" PRIu64 " MiB\n", o.max_device_growth_mib);
    }
    pass = pass && rss_ok && dev_ok;
  }
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
