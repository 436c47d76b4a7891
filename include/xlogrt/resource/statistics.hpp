// SPDX-License-Identifier: Apache-2.0
#pragma once

// Statistics<Up>: per-tag and total counts of what a stack allocates and frees.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/decorator.hpp"

namespace xlogrt {

/// The figures of one tag, or of all tags together, at one snapshot.
/// Not thread-safe: a value, owned by one thread at a time.
struct AllocationCounters {
  std::size_t current_bytes = 0;   ///< allocated and not yet deallocated
  std::size_t peak_bytes = 0;      ///< the largest current_bytes has been
  std::size_t total_bytes = 0;     ///< allocated since construction (cumulative)
  std::size_t freed_bytes = 0;     ///< deallocated since construction
  std::uint64_t current_count = 0; ///< blocks allocated and not yet deallocated
  std::uint64_t allocations = 0;   ///< successful allocations since construction
  std::uint64_t frees = 0;         ///< successful deallocations since construction
  std::uint64_t failed = 0;        ///< allocations the upstream refused
  friend bool operator==(const AllocationCounters&, const AllocationCounters&) = default;
};

/// One snapshot: the total, and each tag that has seen an allocation or a failure.
/// Not thread-safe: a value, owned by one thread at a time.
struct StatisticsSnapshot {
  struct Tagged {
    AllocTag tag;
    AllocationCounters counters;
  };
  AllocationCounters total;
  std::vector<Tagged> tags;  ///< by increasing tag; tags >= tag_slots are folded in `other`
  std::optional<AllocationCounters> other;  ///< all tags >= tag_slots, if any was seen

  /// The counters of `t` among `tags` (zero when the tag has not been seen or is folded
  /// into `other`).
  AllocationCounters of(AllocTag t) const noexcept {
    for (const auto& e : tags) {
      if (e.tag == t) return e.counters;
    }
    return AllocationCounters{};
  }
};

/// Not thread-safe: a value, owned by one thread at a time.
struct StatisticsOptions {
  /// Tags 0 .. tag_slots-1 are counted one by one; larger tags share one `other` entry.
  /// Each slot is one cache line.
  std::uint32_t tag_slots = 64;
};

/// Counts, per tag and in total: current, peak and cumulative bytes; allocations, frees,
/// blocks live; allocations the upstream refused. A block counts from a successful
/// allocate to the deallocate that consumes it (a queued async free is already "freed"
/// here; the stack's bytes_outstanding() is the figure that waits for the reap; a block
/// DebugGuard frees while reporting a corrupted guard is freed).
///
/// Cheap enough to leave on: no lock. An allocate does a few relaxed atomic additions
/// on its tag's cache line and one addition (plus a rare compare-exchange for a new
/// peak) on the total's line; tags on different lines do not contend.
///
/// snapshot() is consistent: each figure comes from one read of each counter, taken in
/// an order that keeps every invariant — current = total - freed and never negative,
/// current_count = allocations - frees, peak >= current, total = the sum of the tags —
/// even while other threads allocate (it is then the view of a moment, per counter, not
/// a stop of the world). Once the threads are quiescent it is exact.
///
/// Memory orders: frees are counted with release additions and snapshot() reads the
/// free counters with acquire loads *before* the allocation counters. A free of a block
/// happens after that block's allocation was counted (the block reached the freeing
/// thread through the caller's own synchronisation), so every free the snapshot sees has
/// its allocation seen too, and no figure goes negative. Peaks use the value returned by
/// the `live` fetch_add (the modification order of one atomic defines "the largest
/// value"), then a relaxed compare-exchange max.
///
/// Thread-safe; lock-free. Construction and moves happen-before use.
template <DeviceMemoryResource Upstream>
class Statistics : public detail::Forwarding<Statistics<Upstream>, Upstream> {
 public:
  static constexpr bool supports_block_use_tracking = Upstream::supports_block_use_tracking;
  static constexpr bool frees_synchronously = SynchronousFree<Upstream>;

  explicit Statistics(Upstream upstream, StatisticsOptions options = {})
      : up_(std::move(upstream)), state_(std::make_unique<State>(options.tag_slots)) {}

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    auto b = up_.allocate(bytes, stream, tag);
    Entry& e = state_->entry(tag);
    if (!b) {
      e.failed.fetch_add(1, std::memory_order_relaxed);
      return b;
    }
    const std::size_t n = b->bytes();
    e.allocated_bytes.fetch_add(n, std::memory_order_relaxed);
    e.allocations.fetch_add(1, std::memory_order_relaxed);
    raise_peak(e, e.live.fetch_add(n, std::memory_order_relaxed) + n);
    raise_peak(state_->all, state_->all.live.fetch_add(n, std::memory_order_relaxed) + n);
    return b;
  }

  result<void> deallocate(DeviceBlock&& block) noexcept {
    const std::size_t n = block.bytes();
    const AllocTag tag = block.tag();
    const bool was_live = !block.empty();
    auto r = up_.deallocate(std::move(block));
    if (!was_live || !block.empty()) return r;  // not freed (see Budget::deallocate)
    Entry& e = state_->entry(tag);
    e.live.fetch_sub(n, std::memory_order_relaxed);
    state_->all.live.fetch_sub(n, std::memory_order_relaxed);
    e.freed_bytes.fetch_add(n, std::memory_order_release);
    e.frees.fetch_add(1, std::memory_order_release);
    return r;
  }

  std::size_t bytes_outstanding() const noexcept { return up_.bytes_outstanding(); }
  result<void> reap_pending() noexcept { return up_.reap_pending(); }
  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }

  /// The figures now. Allocates the snapshot's vector; not for the hot path.
  StatisticsSnapshot snapshot() const {
    StatisticsSnapshot s;
    const State& st = *state_;
    for (std::uint32_t i = 0; i <= st.slots; ++i) {
      const AllocationCounters c = read(st.entries[i]);
      if (c.allocations == 0 && c.failed == 0) continue;
      if (i == st.slots) {
        s.other = c;
      } else {
        s.tags.push_back({AllocTag{i}, c});
      }
      s.total.current_bytes += c.current_bytes;
      s.total.total_bytes += c.total_bytes;
      s.total.freed_bytes += c.freed_bytes;
      s.total.current_count += c.current_count;
      s.total.allocations += c.allocations;
      s.total.frees += c.frees;
      s.total.failed += c.failed;
    }
    const std::size_t peak = st.all.peak.load(std::memory_order_relaxed);
    s.total.peak_bytes = peak > s.total.current_bytes ? peak : s.total.current_bytes;
    return s;
  }

  // ---- upstream (the optional capabilities are forwarded by detail::Forwarding) ----

  Upstream& upstream() noexcept { return up_; }
  const Upstream& upstream() const noexcept { return up_; }

 private:
  struct alignas(64) Entry {
    std::atomic<std::size_t> live{0};  // current bytes, for the peak
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> allocated_bytes{0};
    std::atomic<std::size_t> freed_bytes{0};
    std::atomic<std::uint64_t> allocations{0};
    std::atomic<std::uint64_t> frees{0};
    std::atomic<std::uint64_t> failed{0};
  };
  struct State {
    explicit State(std::uint32_t n) : slots(n), entries(new Entry[std::size_t{n} + 1]) {}
    Entry& entry(AllocTag t) noexcept { return entries[t.value < slots ? t.value : slots]; }
    std::uint32_t slots;
    std::unique_ptr<Entry[]> entries;  // [slots] is `other`
    Entry all;                         // live and peak of all tags together
  };

  static void raise_peak(Entry& e, std::size_t now) noexcept {
    std::size_t p = e.peak.load(std::memory_order_relaxed);
    while (now > p && !e.peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }

  static AllocationCounters read(const Entry& e) noexcept {
    AllocationCounters c;
    c.frees = e.frees.load(std::memory_order_acquire);
    c.freed_bytes = e.freed_bytes.load(std::memory_order_acquire);
    c.allocations = e.allocations.load(std::memory_order_relaxed);
    c.total_bytes = e.allocated_bytes.load(std::memory_order_relaxed);
    c.failed = e.failed.load(std::memory_order_relaxed);
    // A free counted in `frees` but whose allocation's count is still in flight on
    // another thread cannot happen (see the class comment); the guards are for a caller
    // that frees a block before the allocating call has returned, which the contract
    // forbids, so they only keep figures sane.
    if (c.allocations < c.frees) c.allocations = c.frees;
    if (c.total_bytes < c.freed_bytes) c.total_bytes = c.freed_bytes;
    c.current_bytes = c.total_bytes - c.freed_bytes;
    c.current_count = c.allocations - c.frees;
    const std::size_t peak = e.peak.load(std::memory_order_relaxed);
    c.peak_bytes = peak > c.current_bytes ? peak : c.current_bytes;
    return c;
  }

  [[no_unique_address]] Upstream up_;
  std::unique_ptr<State> state_;
};

static_assert(DeviceMemoryResource<Statistics<detail::PlainArchetype>>);
static_assert(!TrackingResource<Statistics<detail::PlainArchetype>>);
static_assert(TrackingResource<Statistics<detail::TrackingArchetype>>);
static_assert(DriverResource<Statistics<detail::DriverArchetype>>);

}  // namespace xlogrt
