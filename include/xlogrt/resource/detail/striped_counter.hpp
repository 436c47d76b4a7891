// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace xlogrt::detail {

/// A signed byte counter split over cache-line-padded stripes, so that many threads
/// adding to it do not fight over one line. value() sums the stripes: exact once the
/// adders have finished, a moment's snapshot while they run.
///
/// Thread-safe; lock-free.
class StripedCounter {
 public:
  void add(std::int64_t v) noexcept {
    stripes_[stripe()].v.fetch_add(v, std::memory_order_relaxed);
  }
  std::int64_t value() const noexcept {
    std::int64_t sum = 0;
    for (const auto& s : stripes_) sum += s.v.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  static constexpr std::size_t STRIPES = 16;
  struct alignas(64) Stripe {
    std::atomic<std::int64_t> v{0};
  };
  static std::size_t stripe() noexcept {
    static thread_local const std::size_t mine =
        std::hash<const void*>{}(&mine) / alignof(std::max_align_t);
    return mine % STRIPES;
  }
  std::array<Stripe, STRIPES> stripes_{};
};

/// A process-unique serial per resource instance: the `owner` of its BlockIds, so a
/// block handed to a resource that did not make it is recognised as foreign.
inline std::uint32_t next_owner_serial() noexcept {
  static std::atomic<std::uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xlogrt::detail
