// SPDX-License-Identifier: Apache-2.0
#pragma once

// The calling thread's stripe: what Budget and Statistics use to spread their counters
// over cache lines, so that threads allocating at once do not write one shared line.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace xlogrt::detail {

/// Stripes are laid out this far apart. 128, not 64: adjacent-line prefetchers (Intel's
/// spatial prefetcher pairs 64-byte lines) make two threads on neighbouring lines
/// contend as if they shared one.
inline constexpr std::size_t STRIPE_ALIGN = 128;

/// The calling thread's ticket: a number taken once per thread, on its first call, from
/// a process-wide count, so threads started one after another get consecutive tickets
/// and, modulo any stripe count, distinct stripes until there are more threads than
/// stripes. A striped structure uses `thread_ticket() & (stripes - 1)` (a power of two).
/// A stripe is not owned: two threads may share one (more threads than stripes), so
/// stripes are still written with atomic read-modify-writes, which are cheap on a line
/// no other thread writes. A thread that exits leaves its contributions in its stripe;
/// a later thread with the same stripe continues from them, so sums stay exact.
///
/// Thread-safe; lock-free.
inline std::uint32_t thread_ticket() noexcept {
  static constinit std::atomic<std::uint32_t> next{0};
  thread_local const std::uint32_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine;
}

/// The calling thread's stripe among `stripes` (a power of two).
inline std::uint32_t thread_stripe(std::uint32_t stripes) noexcept { return thread_ticket() & (stripes - 1); }

}  // namespace xlogrt::detail
