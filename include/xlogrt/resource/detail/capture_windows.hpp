// SPDX-License-Identifier: Apache-2.0
#pragma once

// The process-wide count of open capture windows, and the owner serials of block ids.
//
// A capture window is GraphPools::begin_allocate_to_pool .. end_allocate_to_pool: while
// one is open, some stream of the process may be capturing a CUDA graph, and the layers
// whose hot paths would otherwise call the driver on a block's stream (AsyncCuda's free)
// first ask whether that stream captures. The count is one relaxed load on those paths;
// zero (no window open: every program that never captures) keeps them as they were.

#include <atomic>
#include <cstdint>

namespace xlogrt::detail {

inline std::atomic<std::uint32_t>& capture_window_count() noexcept {
  static std::atomic<std::uint32_t> count{0};
  return count;
}

/// Whether a capture window is open anywhere in the process.
[[gnu::always_inline]] inline bool capture_windows_open() noexcept {
  return capture_window_count().load(std::memory_order_relaxed) != 0;
}

/// A new process-unique owner serial for the ids of a resource's blocks (BlockId::owner):
/// one sequence for every kind of block table, so that no two tables, of whatever entry
/// type, name their blocks with the same owner.
inline std::uint32_t next_block_owner() noexcept {
  static std::atomic<std::uint32_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xlogrt::detail
