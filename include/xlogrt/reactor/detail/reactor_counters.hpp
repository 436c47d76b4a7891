// SPDX-License-Identifier: Apache-2.0
#pragma once

// Counters of the reactor that many threads bump: split over cache-line stripes picked by
// the calling thread, so that registrants on different threads do not share a line.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "xlogrt/core/atomics.hpp"

namespace xlogrt::detail {

/// An event count written by many threads; value() is exact once the writers are done,
/// a moment's snapshot while they run.
///
/// Thread-safe; lock-free.
class ReactorStripedCount {
 public:
  void add(std::uint64_t n = 1) noexcept {
    const std::size_t i = (static_cast<std::uint64_t>(StdAtomics::thread_hint()) * STRIPES) >> 32;
    stripes_[i].v.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t value() const noexcept {
    std::uint64_t sum = 0;
    for (const auto& s : stripes_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr std::size_t STRIPES = 8;
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> v{0};
  };
  std::array<Stripe, STRIPES> stripes_{};
};

}  // namespace xlogrt::detail
