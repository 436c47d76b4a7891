// SPDX-License-Identifier: Apache-2.0
//
// slot_table_ab: the SlotTable A/B of the reactor's wake-up and idle policies, and the
// SlotTable against a re-implementation of the reference design, side by side in one run.
//
//   slot_table_ab [threads=8] [registrations per thread=150000] [repetitions=3]
//
// The workload is the reference's: `threads` registrants each claim a slot (spinning
// while none is free; after 64 spins a waiting registrant yields, which changes nothing
// with a core per thread but keeps registrants from starving the scanner when threads
// outnumber cores), clear its flag, publish a token, set the flag at once (the device
// is instantaneous, so the scanner is the only consumer of work) and, by the unpark
// policy, wake the scanner: always, or only when publish() reports the idle-to-active
// transition. One scanner thread retires slots; when a pass finds nothing it either parks
// on an idle table (park) or spins (never-park). Saturated registrants never pause;
// bursty ones yield every 256 registrations. 1024 slots.
//
// Table 1 is the reference's table for xlogrt::SlotTable. Table 2 runs the same harness
// over ReferenceSlotTable, the reference design (a mutex-guarded vector as the free list,
// every word read on every pass, one armed-slot counter written by every publish),
// interleaved run by run with the SlotTable so that both see the same machine state.
// Each cell is the best of `repetitions` runs (the median is printed too), and the
// harness takes the idle transition from publish() and parks on is_idle(), as the
// reactor does, for both tables.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "xlogrt/core/atomics.hpp"
#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/slot_table.hpp"

#ifndef XLOGRT_BUILD_TYPE
#define XLOGRT_BUILD_TYPE "unknown"
#endif

namespace {

using xlogrt::HostFlags;
using xlogrt::StdAtomics;
using Token = std::size_t;

/// The reference design, faithfully: the free list is a vector under a mutex (popped by
/// claim, appended to by each scan pass that retired something), the scanner reads every
/// active word on every pass, and n_armed is incremented by every publish and decremented
/// once per pass. Same flags and same flag accesses as the SlotTable.
class ReferenceSlotTable {
 public:
  ReferenceSlotTable(std::size_t slots, HostFlags flags)
      : flags_(std::move(flags)),
        active_((slots + 63) / 64),
        payload_(slots),
        slots_(slots) {
    free_.reserve(slots);
    for (std::size_t s = slots; s-- > 0;) free_.push_back(s);
  }

  bool is_idle() const noexcept { return n_armed_.load(std::memory_order_acquire) == 0; }

  std::optional<std::size_t> claim() {
    std::lock_guard lock(free_mutex_);
    if (free_.empty()) return std::nullopt;
    const std::size_t s = free_.back();
    free_.pop_back();
    return s;
  }

  void reset_flag(std::size_t slot) noexcept {
    StdAtomics::store_flag(flags_.word(slot), 0, std::memory_order_release);
  }

  bool publish(std::size_t slot, Token t) noexcept {
    payload_[slot] = t;
    const bool was_idle = n_armed_.fetch_add(1, std::memory_order_acq_rel) == 0;
    active_[slot / 64].fetch_or(std::uint64_t{1} << (slot % 64), std::memory_order_release);
    return was_idle;
  }

  bool scan_once(std::vector<Token>& woken) {
    bool any_active = false;
    std::vector<std::size_t> retired;
    for (std::size_t w = 0; w < active_.size(); ++w) {
      std::uint64_t bits = active_[w].load(std::memory_order_acquire);
      if (bits == 0) continue;
      any_active = true;
      while (bits != 0) {
        const auto bit = static_cast<unsigned>(__builtin_ctzll(bits));
        bits &= bits - 1;
        const std::size_t slot = w * 64 + bit;
        if (slot >= slots_) break;
        if (StdAtomics::load_flag(flags_.word(slot), std::memory_order_acquire) == 1) {
          active_[w].fetch_and(~(std::uint64_t{1} << bit), std::memory_order_acq_rel);
          auto taken = std::exchange(payload_[slot], std::nullopt);
          retired.push_back(slot);
          if (taken) woken.push_back(*taken);
        }
      }
    }
    if (!retired.empty()) {
      const std::size_t n = retired.size();
      {
        std::lock_guard lock(free_mutex_);
        free_.insert(free_.end(), retired.begin(), retired.end());
      }
      n_armed_.fetch_sub(n, std::memory_order_acq_rel);
    }
    return any_active;
  }

  HostFlags& flags() noexcept { return flags_; }

 private:
  HostFlags flags_;
  std::vector<std::atomic<std::uint64_t>> active_;
  std::vector<std::optional<Token>> payload_;
  std::mutex free_mutex_;
  std::vector<std::size_t> free_;
  std::atomic<std::size_t> n_armed_{0};
  std::size_t slots_;
};

/// A thread parker with std::thread::park semantics: unpark() before park() makes the
/// next park() return at once; park() may return spuriously.
class Parker {
 public:
  void park() noexcept {
    if (state_.fetch_sub(1, std::memory_order_acquire) == NOTIFIED) return;  // 1 -> 0
    for (;;) {  // now PARKED (-1)
      state_.wait(PARKED, std::memory_order_relaxed);
      int expected = NOTIFIED;
      if (state_.compare_exchange_strong(expected, EMPTY, std::memory_order_acquire)) return;
    }
  }
  void unpark() noexcept {
    if (state_.exchange(NOTIFIED, std::memory_order_release) == PARKED) state_.notify_one();
  }

 private:
  static constexpr int PARKED = -1, EMPTY = 0, NOTIFIED = 1;
  std::atomic<int> state_{EMPTY};
};

enum class Unpark { always, empty_wake };
enum class Idle { park, never_park };

struct Config {
  Unpark unpark;
  Idle idle;
  const char* name;
};
constexpr Config CONFIGS[] = {
    {Unpark::always, Idle::park, "always+park"},
    {Unpark::empty_wake, Idle::park, "empty->wake+park"},
    {Unpark::always, Idle::never_park, "always+never-park"},
    {Unpark::empty_wake, Idle::never_park, "empty->wake+never-park"},
};

struct Run {
  double mops = 0;
  std::size_t unparks = 0;
  std::size_t scan_passes = 0;
};

constexpr std::size_t SLOTS = 1024;

template <class Table>
Run run_once(const Config& cfg, bool saturated, unsigned threads, std::size_t per_thread) {
  Table table(SLOTS, HostFlags(SLOTS));
  const std::size_t total = threads * per_thread;
  Parker parker;
  std::atomic<std::size_t> unparks{0}, done{0};
  std::size_t scan_passes = 0;

  std::thread scanner([&] {
    std::vector<Token> woken;
    woken.reserve(SLOTS);
    for (;;) {
      table.scan_once(woken);
      ++scan_passes;
      if (!woken.empty()) {
        const std::size_t d = done.fetch_add(woken.size(), std::memory_order_relaxed) + woken.size();
        woken.clear();
        if (d >= total) break;
        continue;
      }
      if (cfg.idle == Idle::park) {
        if (table.is_idle()) parker.park();
      } else {
        StdAtomics::pause();
      }
      if (done.load(std::memory_order_relaxed) >= total) break;
    }
  });

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        std::optional<std::size_t> slot;
        for (unsigned spins = 0; !(slot = table.claim()); ++spins) {
          if (spins < 64) {
            StdAtomics::pause();
          } else {
            std::this_thread::yield();  // let the scanner have the core
          }
        }
        table.reset_flag(*slot);
        const bool was_idle = table.publish(*slot, t * per_thread + i);
        StdAtomics::store_flag(table.flags().word(*slot), 1, std::memory_order_release);
        if (cfg.unpark == Unpark::always || was_idle) {
          unparks.fetch_add(1, std::memory_order_relaxed);
          parker.unpark();
        }
        if (!saturated && i % 256 == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& w : workers) w.join();
  while (done.load(std::memory_order_relaxed) < total) {  // a scanner parked at the end
    parker.unpark();
    StdAtomics::pause();
  }
  scanner.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {static_cast<double>(total) / secs / 1e6, unparks.load(), scan_passes};
}

struct Cell {
  std::vector<Run> runs;
  const Run& best() const {
    return *std::max_element(runs.begin(), runs.end(),
                             [](const Run& a, const Run& b) { return a.mops < b.mops; });
  }
  double median() const {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r.mops);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

unsigned arg(int argc, char** argv, int i, unsigned fallback) {
  if (argc <= i) return fallback;
  const long v = std::strtol(argv[i], nullptr, 10);
  return v > 0 ? static_cast<unsigned>(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned threads = arg(argc, argv, 1, 8);
  const std::size_t per_thread = arg(argc, argv, 2, 150000);
  const unsigned reps = arg(argc, argv, 3, 3);

  std::printf("slot_table_ab: %u threads x %zu registrations, %zu slots, best of %u\n", threads,
              per_thread, SLOTS, reps);
  std::printf("machine: %s, %u hardware threads; build: %s (%s), g++ %d.%d\n",
              xlogrt::bench::cpu_model().c_str(), std::thread::hardware_concurrency(), XLOGRT_BUILD_TYPE,
#if defined(NDEBUG)
              "NDEBUG",
#else
              "assertions on",
#endif
              __GNUC__, __GNUC_MINOR__);

  if (std::thread::hardware_concurrency() < threads + 1) {
    std::printf("note: %u registrants and a scanner share %u hardware threads: a never-park\n"
                "      scanner holds a core the registrants need, so those rows measure the\n"
                "      OS scheduler more than the table\n",
                threads, std::thread::hardware_concurrency());
  }

  struct Row {
    const char* regime;
    const Config* cfg;
    Cell slot, reference;
  };
  std::vector<Row> rows;
  for (const bool saturated : {true, false}) {
    for (const auto& cfg : CONFIGS) {
      Row row{saturated ? "saturated" : "bursty", &cfg, {}, {}};
      for (unsigned r = 0; r < reps; ++r) {  // interleaved, so drift hits both alike
        row.reference.runs.push_back(
            run_once<ReferenceSlotTable>(cfg, saturated, threads, per_thread));
        row.slot.runs.push_back(
            run_once<xlogrt::SlotTable<Token>>(cfg, saturated, threads, per_thread));
      }
      rows.push_back(std::move(row));
      std::fflush(stdout);
    }
  }

  using xlogrt::bench::fmt;
  std::printf("\n");
  {
    xlogrt::bench::Table t(fmt("Table 1: xlogrt::SlotTable (%u threads x %zu)", threads, per_thread),
                           {"regime", "config", "Mops/s (best)", "Mops/s (median)", "unparks", "scan passes"});
    for (const auto& row : rows) {
      const Run& b = row.slot.best();
      t.row(row.regime, row.cfg->name, fmt("%.2f", b.mops), fmt("%.2f", row.slot.median()), std::to_string(b.unparks),
            std::to_string(b.scan_passes));
    }
  }
  {
    xlogrt::bench::Table t("Table 2: reference design (mutex + vector free list, full scan) vs SlotTable",
                           {"regime", "config", "reference Mops/s", "SlotTable Mops/s", "ratio (best)",
                            "ratio (median)"});
    for (const auto& row : rows) {
      const double ref = row.reference.best().mops, mine = row.slot.best().mops;
      t.row(row.regime, row.cfg->name, fmt("%.2f", ref), fmt("%.2f", mine), fmt("%.2fx", mine / ref),
            fmt("%.2fx", row.slot.median() / row.reference.median()));
    }
  }
  return 0;
}
