// SPDX-License-Identifier: Apache-2.0
#pragma once

// detail::DeferredFrees: the frees a base resource (AsyncCuda, VirtualCuda) defers while
// their alloc stream captures. A deferred block stays live in the resource's block table
// (its memory valid, its uses tracked); drain() hands every deferred block to a free
// again once the resource looks, and a free that still finds its stream capturing
// defers it again.
//
// Thread-safe: one mutex guards the list; `pending` lets drain() return without it when
// nothing is deferred (the common case, checked on every poll and reap).

#include <atomic>
#include <cstddef>
#include <mutex>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/result.hpp"

namespace xlogrt::detail {

class DeferredFrees {
 public:
  /// Checks `b` in `table` as its free would (the table's erase_if, declined once the
  /// checks pass) and keeps it. Errors: the table's for a block it refuses; out_of_memory
  /// when the list cannot grow. On error the block is left with the caller, live.
  template <class Table>
  result<void> defer(Table& table, DeviceBlock&& b) noexcept {
    bool valid = false;
    auto checked = table.erase_if(b.id(), &b, [&](auto&) -> result<void> {
      valid = true;
      return error{errc::cancelled, "deferred"};
    });
    if (!valid) return checked;
    try {
      std::lock_guard lock(mu_);
      blocks_.push_back(std::move(b));
      pending_.store(true, std::memory_order_release);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted deferring a free during stream capture: the block "
                                        "is still live; free it again after the capture ends"};
    }
    return ok();
  }

  /// Frees every deferred block with `free` (DeviceBlock&& -> result<void>), which may
  /// defer it again. Returns the first error; the other blocks are still freed.
  template <class Free>
  result<void> drain(Free&& free) noexcept {
    if (!pending_.load(std::memory_order_acquire)) return ok();
    std::vector<DeviceBlock> todo;
    {
      std::lock_guard lock(mu_);
      todo.swap(blocks_);
      pending_.store(false, std::memory_order_relaxed);
    }
    result<void> first = ok();
    for (DeviceBlock& b : todo) {
      auto r = free(std::move(b));
      if (!r && first) first = std::move(r);
    }
    return first;
  }

  std::size_t size() const {
    std::lock_guard lock(mu_);
    return blocks_.size();
  }

 private:
  mutable std::mutex mu_;             // blocks_, and pending_'s changes
  std::vector<DeviceBlock> blocks_;   // live in the resource's table
  std::atomic<bool> pending_{false};  // blocks_ is not empty
};

}  // namespace xlogrt::detail
