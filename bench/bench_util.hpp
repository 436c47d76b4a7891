// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the benchmarks share: the driver they run on (the GPU when there is one, else
// SimDriver, saying so), timing and percentiles, the interleaved runner (warm-up, a
// fresh random order each round, paired ratios) and markdown tables.

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <xlogrt/driver/cuda_driver.hpp>
#include <xlogrt/sim/sim_driver.hpp>

namespace xlogrt::bench {

inline double now_ns() {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

/// The q-quantile (0..1) of `v` (sorted in place).
inline double quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Summary {
  double median = 0;
  double p99 = 0;
};
inline Summary summarize(std::vector<double> v) { return {quantile(v, 0.5), quantile(v, 0.99)}; }

inline const char* build_type() {
#if defined(__OPTIMIZE__) && defined(NDEBUG)
  return "optimised, NDEBUG";
#elif defined(__OPTIMIZE__)
  return "optimised, assertions on";
#else
  return "unoptimised (debug)";
#endif
}

/// "16 host cores, g++ 12.2, optimised": the machine and build line of every table.
inline std::string machine_line() {
  std::string s = std::to_string(std::thread::hardware_concurrency()) + " host cores, ";
#if defined(__clang__)
  s += "clang " __clang_version__;
#elif defined(__GNUC__)
  s += "g++ " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__);
#endif
  s += ", ";
  s += build_type();
  return s;
}

/// The host CPU's model name (/proc/cpuinfo), or "unknown CPU".
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

// ---- the driver ------------------------------------------------------------------------

/// Returns `run(driver, where)` on the GPU when CudaDriver opens and sees a device, else
/// on SimDriver, saying so: those figures measure the simulator, not a GPU. The GPU's
/// `where` is "the GPU (CudaDriver)", the simulator's "SimDriver".
template <class F>
int on_gpu_or_sim(F&& run);

/// The same, with a SimDriver of `config` made for the run (a manual executor, a
/// smaller device, no hazard checker) in place of the process-wide one; `sim_where`
/// names it in the figures' heading.
template <class F>
int on_gpu_or_sim(F&& run, const SimConfig& config, const char* sim_where);

namespace detail {
/// CudaDriver when it opens and sees at least one device; else prints why not.
inline CudaDriver* open_gpu() {
  auto cuda = CudaDriver::open();
  if (!cuda) {
    std::printf("no GPU here (%s): measuring SimDriver, figures are the simulator's\n", cuda.error().what().c_str());
    return nullptr;
  }
  if (auto n = (*cuda)->device_count(); !n || *n <= 0) {
    std::printf("no GPU here (the CUDA driver sees no device): measuring SimDriver, figures are the simulator's\n");
    return nullptr;
  }
  return *cuda;
}
}  // namespace detail

template <class F>
int on_gpu_or_sim(F&& run) {
  if (CudaDriver* gpu = detail::open_gpu()) return run(*gpu, "the GPU (CudaDriver)");
  auto sim = SimDriver::open();
  if (!sim) return std::printf("SimDriver: %s\n", sim.error().what().c_str()), 1;
  return run(**sim, "SimDriver");
}

template <class F>
int on_gpu_or_sim(F&& run, const SimConfig& config, const char* sim_where) {
  if (CudaDriver* gpu = detail::open_gpu()) return run(*gpu, "the GPU (CudaDriver)");
  SimDriver sim(config);
  return run(sim, sim_where);
}

// ---- the interleaved runner --------------------------------------------------------------

/// Calls `sample(k)` for every k in [0, n), `rounds` times, each round in a fresh random
/// order (fixed seed), so that each variant follows every other equally often: a variant
/// run right after another pays for the state that one leaves the driver in. Rotating a
/// fixed order is not enough: it keeps who follows whom.
template <class F>
void shuffled_rounds(std::size_t n, int rounds, F&& sample) {
  std::mt19937 rng(42);
  std::vector<std::size_t> order(n);
  for (int r = 0; r < rounds; ++r) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t k : order) sample(k);
  }
}

/// The samples of n variants measured in the same rounds: ns[k][r] is variant k's
/// figure in round r, so two variants' samples of one round were taken within a few
/// microseconds of each other.
struct Samples {
  std::vector<std::vector<double>> ns;

  Summary summary(std::size_t k) const { return summarize(ns[k]); }
  /// The ratio of the medians of variant k and variant `base`.
  double ratio(std::size_t k, std::size_t base) const { return summary(k).median / summary(base).median; }
  /// The median of the per-round ratios of variant k to variant `base`: each sample
  /// against its baseline's sample of the same round, which cancels the host's slower
  /// drifts (a raw driver pair has moved by 2x within one run).
  double paired_ratio(std::size_t k, std::size_t base) const {
    std::vector<double> r(std::min(ns[k].size(), ns[base].size()));
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = ns[k][i] / ns[base][i];
    return summarize(std::move(r)).median;
  }
};

/// Measures n variants interleaved: each is warmed up once (`body(k, per_sample)`, then
/// `settle(k)`), then `rounds` rounds in a fresh random order (shuffled_rounds), each
/// sample timing `body(k, per_sample)` and dividing by `per_sample`; `settle(k)` runs
/// untimed after every sample (a stream synchronised, frees reaped).
template <class Body, class Settle>
Samples interleaved(std::size_t n, int rounds, int per_sample, Body&& body, Settle&& settle) {
  Samples s{std::vector<std::vector<double>>(n)};
  for (std::size_t k = 0; k < n; ++k) {  // warm-up: pools grown, events reserved, code paged in
    body(k, per_sample);
    settle(k);
  }
  shuffled_rounds(n, rounds, [&](std::size_t k) {
    const double t0 = now_ns();
    body(k, per_sample);
    const double t1 = now_ns();
    s.ns[k].push_back((t1 - t0) / per_sample);
    settle(k);
  });
  return s;
}

// ---- tables --------------------------------------------------------------------------------

/// printf into a std::string, for table cells.
[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char* f, ...) {
  va_list a, b;
  va_start(a, f);
  va_copy(b, a);
  const int n = std::vsnprintf(nullptr, 0, f, a);
  va_end(a);
  std::string s(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, f, b);
  va_end(b);
  return s;
}

/// A markdown table, printed as it goes (a long bench shows each row when measured):
/// the constructor prints the title (a "## " heading, when given) and the header, row()
/// one row, the destructor the blank line after it. With `right_aligned`, every column
/// but the first is right-aligned (columns of figures).
class Table {
 public:
  Table(const std::string& title, std::initializer_list<std::string> columns, bool right_aligned = false)
      : columns_(columns.size()) {
    if (!title.empty()) std::printf("## %s\n\n", title.c_str());
    print_header(columns.begin(), columns.end(), right_aligned);
  }
  Table(const std::string& title, const std::vector<std::string>& columns, bool right_aligned = false)
      : columns_(columns.size()) {
    if (!title.empty()) std::printf("## %s\n\n", title.c_str());
    print_header(columns.begin(), columns.end(), right_aligned);
  }
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table() { std::printf("\n"); }

  /// One row; each cell a std::string or a C string (fmt() makes numbers into cells).
  template <class... Cells>
  void row(const Cells&... cells) {
    std::printf("|");
    (print_cell(cells), ...);
    std::printf("\n");
  }
  void row(const std::vector<std::string>& cells) {
    std::printf("|");
    for (const auto& c : cells) print_cell(c);
    std::printf("\n");
  }

 private:
  template <class It>
  void print_header(It first, It last, bool right_aligned) {
    std::printf("|");
    for (It i = first; i != last; ++i) std::printf(" %s |", i->c_str());
    std::printf("\n|");
    for (std::size_t i = 0; i < columns_; ++i) {
      std::printf("%s|", right_aligned && i > 0 ? "---:" : "---");
    }
    std::printf("\n");
  }
  static void print_cell(const std::string& c) { std::printf(" %s |", c.c_str()); }
  static void print_cell(const char* c) { std::printf(" %s |", c); }

  std::size_t columns_;
};

/// Keeps the calling thread on core `core` modulo the host's cores (best effort: Linux
/// only, and ignored when the core is not ours). Returns that core, or -1 when it did
/// not try.
inline int pin_to_core(int core) {
#if defined(__linux__)
  const int n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core % n, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  return core % n;
#else
  (void)core;
  return -1;
#endif
}

}  // namespace xlogrt::bench
