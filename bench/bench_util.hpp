// SPDX-License-Identifier: Apache-2.0
#pragma once

// Small helpers shared by the benchmarks: timing, percentiles and the table header.

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <random>
#include <numeric>
#include <thread>
#include <vector>

#include <xlogrt/driver/cuda_driver.hpp>
#include <xlogrt/driver/sim_driver.hpp>

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

/// Returns `run(driver, where)` on the GPU when CudaDriver opens, else on SimDriver,
/// saying so: those figures measure the simulator, not a GPU.
template <class F>
int on_gpu_or_sim(F&& run) {
  if (auto cuda = CudaDriver::open()) return run(**cuda, "the GPU (CudaDriver)");
  else std::printf("no GPU here (%s): measuring SimDriver, figures are the simulator's\n", cuda.error().what().c_str());
  auto sim = SimDriver::open();
  if (!sim) return std::printf("SimDriver: %s\n", sim.error().what().c_str()), 1;
  return run(**sim, "SimDriver");
}

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
