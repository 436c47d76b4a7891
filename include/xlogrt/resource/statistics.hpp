// SPDX-License-Identifier: Apache-2.0
#pragma once

// Statistics<Up>: per-tag and total counts of what a stack allocates and frees.

#include <algorithm>
#include <atomic>
#include <bit>
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
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/detail/archetypes.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

/// The figures of one tag, or of all tags together, at one snapshot.
/// Not thread-safe: a value, owned by one thread at a time.
struct AllocationCounters {
  std::size_t current_bytes = 0;   ///< allocated and not yet deallocated
  std::size_t peak_bytes = 0;      ///< an upper bound of the largest current_bytes (see Statistics)
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
  /// The most tag slots (each is a cache line per stripe: 256 KiB a stripe at most).
  static constexpr std::uint32_t MAX_TAG_SLOTS = 4096;
  /// The most stripes.
  static constexpr std::uint32_t MAX_STRIPES = 256;
  /// Tags 0 .. tag_slots-1 are counted one by one; larger tags share one `other` entry.
  /// Each slot is one cache line per stripe. At most MAX_TAG_SLOTS.
  std::uint32_t tag_slots = 64;
  /// Stripes of the counters (rounded up to a power of two, at most 256); 0: 256. Threads
  /// with the smallest tickets own one each, the others share one more (counting there
  /// with read-modify-writes on lines every sharer writes); a stripe's memory
  /// ((tag_slots + 3) cache lines) is allocated the first time a thread uses it, so
  /// unused stripes cost a pointer each.
  std::uint32_t stripes = 0;
};

/// Counts, per tag and in total: current, peak and cumulative bytes; allocations, frees,
/// blocks live; allocations the upstream refused. A block counts from a successful
/// allocate to the deallocate that consumes it (a queued async free is already "freed"
/// here; the stack's bytes_outstanding() is the figure that waits for the reap; a block
/// DebugGuard frees while reporting a corrupted guard is freed).
///
/// Cheap enough to leave on, at any thread count: no lock, and no read-modify-write on a
/// line other threads write. The counters are striped, one cache line per tag per stripe
/// plus one for all tags, and snapshot() sums the stripes. A thread whose ticket
/// (detail::thread_ticket: live threads hold distinct ones, and exited threads' are
/// reused) is below the stripe count owns that stripe: an allocate is then four loads and
/// four stores there, no read-modify-write at all (a free the same). Further threads
/// share one more stripe, with relaxed additions.
///
/// snapshot() is consistent: each figure comes from one read of each counter, taken in
/// an order that keeps every invariant — current = total - freed and never negative,
/// current_count = allocations - frees, peak >= current, total = the sum of the tags —
/// even while other threads allocate (it is then the view of a moment, per counter, not
/// a stop of the world). Once the threads are quiescent it is exact (peak aside, below).
///
/// Memory orders: frees are counted with release additions and snapshot() reads the
/// free counters of every stripe with acquire loads *before* it reads any allocation
/// counter. A free of a block happens after that block's allocation was counted (the
/// block reached the freeing thread through the caller's own synchronisation), whichever
/// stripes the two were counted in, so every free the snapshot sees has its allocation
/// seen too, and no figure goes negative.
///
/// What peak_bytes means. With striped counters there is no one counter whose largest
/// value is "the peak", and keeping one (a shared live total and a compare-exchange per
/// allocation) is the contention this design removes. Each stripe keeps, per tag and for
/// all tags, a *mark*: at least its own live bytes (its allocated minus its freed, below
/// zero in a stripe that frees what others allocated), raised the moment the stripe's live
/// bytes pass it, and lowered at every EPOCH-th (64th) allocation or free of that tag in
/// that stripe to the largest live bytes the stripe reached since the previous such
/// point. The sum of the marks lives on one shared line per tag, touched only when a mark
/// moves; peak_bytes is the largest value that sum has taken (and never less than the
/// snapshot's current_bytes). So:
/// - peak_bytes is never below the true peak: at every moment each mark is at least its
///   stripe's live bytes, so the sum of the marks is at least the current bytes;
/// - it is exact when one thread allocates (one stripe moves; the others stay at their
///   marks), and more generally when the stripes reach their highs together;
/// - otherwise it can exceed the true peak by what the other stripes freed within their
///   last two epochs (a mark is the stripe's high since the start of the previous epoch,
///   so at most 2 x 64 of that stripe's own allocations and frees of the tag, or of all
///   tags for the total), and never by more than PEAK_SLACK per stripe: a free that
///   leaves its stripe's mark more than PEAK_SLACK above the stripe's live bytes drops
///   the mark to them (a thread that frees what others allocated, as torch's autograd
///   thread frees the forward pass's activations, has live bytes that fall free by free,
///   and two epochs of its large frees would otherwise stay in the sum). A thread that
///   frees its own blocks never makes its stripe count more than its own largest live
///   bytes.
/// Cost of the mark: none in a steady state (a thread that allocates and frees the same
/// sizes raises its mark once); one shared fetch_add each time a stripe's live bytes
/// set a new high within the epoch, and at most one per epoch to lower it, or one per
/// PEAK_SLACK bytes a stripe frees beyond its mark (a thread's pairs of blocks above
/// PEAK_SLACK pay two shared read-modify-writes a pair, beside a pair of the base's). A
/// thread whose live bytes rise without end (it allocates, others free) still adds to
/// the shared line once per allocation.
///
/// Thread-safe; lock-free. Construction and moves happen-before use.
template <DeviceMemoryResource Upstream>
class Statistics : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;

  /// Operations of one tag in one stripe between two lowerings of its mark.
  static constexpr std::uint64_t EPOCH = 64;
  /// The most a stripe's mark stays above its live bytes after a free (see the class
  /// comment): what peak_bytes may count beyond the true peak, per stripe.
  static constexpr std::int64_t PEAK_SLACK = std::int64_t{8} << 20;

  /// Options out of range are clamped (tag_slots to MAX_TAG_SLOTS, stripes to
  /// MAX_STRIPES); create() refuses them instead. Throws std::bad_alloc when host memory
  /// runs out (create() returns out_of_memory).
  explicit Statistics(Upstream up, StatisticsOptions options = {})
      : Adaptor<Upstream>(std::move(up)), state_(std::make_unique<State>(options)) {}

  /// Errors: invalid_argument for tag_slots above MAX_TAG_SLOTS or stripes above
  /// MAX_STRIPES; out_of_memory when host memory runs out.
  static result<Statistics> create(Upstream upstream, StatisticsOptions options = {}) noexcept {
    if (options.tag_slots > StatisticsOptions::MAX_TAG_SLOTS) {
      return error{errc::invalid_argument, "StatisticsOptions: tag_slots is " + std::to_string(options.tag_slots) +
                                               ", above " + std::to_string(StatisticsOptions::MAX_TAG_SLOTS)};
    }
    if (options.stripes > StatisticsOptions::MAX_STRIPES) {
      return error{errc::invalid_argument, "StatisticsOptions: stripes is " + std::to_string(options.stripes) +
                                               ", above " + std::to_string(StatisticsOptions::MAX_STRIPES)};
    }
    try {
      return Statistics(std::move(upstream), options);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted building a Statistics layer"};
    }
  }

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    auto b = upstream().allocate(bytes, stream, tag);
    State& st = *state_;
    const auto [stripe, owned] = st.stripe();
    const std::uint32_t i = st.index(tag);
    Entry& e = stripe[i];
    if (!b) {
      detail::owned_add(e.failed, 1, std::memory_order_relaxed, owned);
      return b;
    }
    const std::size_t n = b->bytes();
    Entry& all = stripe[st.slots + 1];
    const std::int64_t live = e.allocated(n, owned);
    const std::int64_t live_all = all.allocated(n, owned);
    raise_mark(e, st.shared[i], live);
    raise_mark(all, st.shared[st.slots + 1], live_all);
    if (detail::owned_add(e.allocations, 1, std::memory_order_relaxed, owned) % EPOCH == EPOCH - 1) {
      lower_mark(e, st.shared[i], live);
    }
    if (detail::owned_add(all.allocations, 1, std::memory_order_relaxed, owned) % EPOCH == EPOCH - 1) {
      lower_mark(all, st.shared[st.slots + 1], live_all);
    }
    return b;
  }

  result<void> deallocate(DeviceBlock&& block) noexcept {
    const std::size_t n = block.bytes();
    const AllocTag tag = block.tag();
    const bool was_live = !block.empty();
    auto r = upstream().deallocate(std::move(block));
    if (!was_live || !block.empty()) return r;  // not freed (see Budget::deallocate)
    State& st = *state_;
    const auto [stripe, owned] = st.stripe();
    const std::uint32_t i = st.index(tag);
    Entry& e = stripe[i];
    Entry& all = stripe[st.slots + 1];
    const std::int64_t live_all = all.freed(n, owned);
    const std::int64_t live = e.freed(n, owned);
    settle_mark(e, st.shared[i], live);
    settle_mark(all, st.shared[st.slots + 1], live_all);
    if (detail::owned_add(e.frees, 1, std::memory_order_release, owned) % EPOCH == EPOCH - 1) lower_mark(e, st.shared[i], live);
    if (detail::owned_add(all.frees, 1, std::memory_order_relaxed, owned) % EPOCH == EPOCH - 1) {
      lower_mark(all, st.shared[st.slots + 1], live_all);
    }
    return r;
  }


  /// The figures now. Allocates the snapshot's vector; not for the hot path.
  /// Starts every peak again from now (PyTorch's reset_peak_memory_stats): each stripe's
  /// mark drops to its live bytes and its epoch starts again, and each peak becomes the
  /// sum of the marks. Allocations racing the reset raise marks as usual, so the bound
  /// described above holds from here on.
  void reset_peak() noexcept {
    State& st = *state_;
    for (std::uint32_t k = 0; k <= st.count; ++k) {
      Entry* p = st.stripes[k].load(std::memory_order_acquire);
      if (p == nullptr) continue;
      for (std::uint32_t i = 0; i < st.slots + 2; ++i) {
        const std::int64_t live = Entry::live_of(p[i].allocated_bytes.load(std::memory_order_relaxed),
                                                 p[i].freed_bytes.load(std::memory_order_relaxed));
        p[i].high.store(live, std::memory_order_relaxed);
        lower_mark_to(p[i], st.shared[i], live);
      }
    }
    for (std::uint32_t i = 0; i < st.slots + 2; ++i) {
      st.shared[i].peak.store(st.shared[i].marks.load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }

  StatisticsSnapshot snapshot() const {
    StatisticsSnapshot s;
    const State& st = *state_;
    const std::uint32_t n = st.slots + 1;  // tags and `other`
    std::vector<AllocationCounters> c(n);
    std::vector<Entry*> stripes;
    for (std::uint32_t k = 0; k <= st.count; ++k) {
      if (Entry* p = st.stripes[k].load(std::memory_order_acquire)) stripes.push_back(p);
    }
    // Frees first, in every stripe (see the class comment).
    for (Entry* p : stripes) {
      for (std::uint32_t i = 0; i < n; ++i) {
        c[i].frees += p[i].frees.load(std::memory_order_acquire);
        c[i].freed_bytes += p[i].freed_bytes.load(std::memory_order_acquire);
      }
    }
    for (Entry* p : stripes) {
      for (std::uint32_t i = 0; i < n; ++i) {
        c[i].allocations += p[i].allocations.load(std::memory_order_relaxed);
        c[i].total_bytes += p[i].allocated_bytes.load(std::memory_order_relaxed);
        c[i].failed += p[i].failed.load(std::memory_order_relaxed);
      }
    }
    for (std::uint32_t i = 0; i < n; ++i) {
      finish(c[i], st.shared[i]);
      if (c[i].allocations == 0 && c[i].failed == 0) continue;
      if (i == st.slots) {
        s.other = c[i];
      } else {
        s.tags.push_back({AllocTag{i}, c[i]});
      }
      s.total.current_bytes += c[i].current_bytes;
      s.total.total_bytes += c[i].total_bytes;
      s.total.freed_bytes += c[i].freed_bytes;
      s.total.current_count += c[i].current_count;
      s.total.allocations += c[i].allocations;
      s.total.frees += c[i].frees;
      s.total.failed += c[i].failed;
    }
    const std::int64_t peak = st.shared[st.slots + 1].peak.load(std::memory_order_relaxed);
    s.total.peak_bytes = peak > 0 && static_cast<std::size_t>(peak) > s.total.current_bytes
                             ? static_cast<std::size_t>(peak)
                             : s.total.current_bytes;
    return s;
  }

 private:
  /// One tag (or all tags) in one stripe. Sizes wrap: a stripe that frees blocks
  /// allocated in another has freed more than it allocated; the sums are exact.
  struct alignas(64) Entry {
    std::atomic<std::size_t> allocated_bytes{0};
    std::atomic<std::size_t> freed_bytes{0};
    std::atomic<std::uint64_t> allocations{0};  // in the all-tags entry: its epoch only
    std::atomic<std::uint64_t> frees{0};        // in the all-tags entry: its epoch only
    std::atomic<std::uint64_t> failed{0};       // unused in the all-tags entry
    std::atomic<std::int64_t> high{0};  // the largest live bytes since the mark was last lowered
    std::atomic<std::int64_t> mark{0};  // this stripe's share of Shared::marks

    static std::int64_t live_of(std::size_t a, std::size_t f) noexcept { return static_cast<std::int64_t>(a - f); }
    /// Counts an allocation; returns the stripe's live bytes after it.
    std::int64_t allocated(std::size_t n, bool owned) noexcept {
      const std::size_t a = detail::owned_add(allocated_bytes, n, std::memory_order_relaxed, owned) + n;
      const std::int64_t live = live_of(a, freed_bytes.load(std::memory_order_relaxed));
      std::int64_t h = high.load(std::memory_order_relaxed);
      while (live > h && !high.compare_exchange_weak(h, live, std::memory_order_relaxed)) {
      }
      return live;
    }
    /// Counts a free (release: see the class comment); returns the live bytes after it.
    std::int64_t freed(std::size_t n, bool owned) noexcept {
      const std::size_t f = detail::owned_add(freed_bytes, n, std::memory_order_release, owned) + n;
      return live_of(allocated_bytes.load(std::memory_order_relaxed), f);
    }
  };
  /// Per tag (and for all tags): the sum of the stripes' marks and its largest value.
  struct alignas(64) Shared {
    std::atomic<std::int64_t> marks{0};
    std::atomic<std::int64_t> peak{0};
  };
  struct State {
    explicit State(const StatisticsOptions& o)
        : slots(std::min(o.tag_slots, StatisticsOptions::MAX_TAG_SLOTS)), count(stripe_count(o.stripes)),
          stripes(new std::atomic<Entry*>[count + 1]), shared(new Shared[std::size_t{slots} + 2]) {
      for (std::uint32_t k = 0; k < count; ++k) stripes[k].store(nullptr, std::memory_order_relaxed);
      stripes[count].store(new Entry[entries()], std::memory_order_relaxed);  // the shared one
    }
    ~State() {
      for (std::uint32_t k = 0; k <= count; ++k) delete[] stripes[k].load(std::memory_order_relaxed);
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    /// A stripe per thread by default: threads beyond the cores (a pool larger than the
    /// host, a runtime's helpers) would otherwise share one and contend on it.
    static std::uint32_t stripe_count(std::uint32_t asked) noexcept {
      const std::uint32_t want = asked == 0 ? StatisticsOptions::MAX_STRIPES : asked;
      return std::bit_ceil(std::min(want, StatisticsOptions::MAX_STRIPES));
    }
    /// Entries of a stripe: the tags, `other`, all tags, and one cache line of padding
    /// (new[] aligns the start to a line; the pad keeps the next allocation off ours).
    std::size_t entries() const noexcept { return std::size_t{slots} + 3; }
    std::uint32_t index(AllocTag t) const noexcept { return t.value < slots ? t.value : slots; }

    /// The calling thread's stripe, and whether the thread owns it. A thread whose ticket
    /// is below `count` owns stripe [ticket] (allocated on its first use) and writes it
    /// without read-modify-writes; other threads, and any thread when host memory is
    /// short, share stripe [count] (still exact).
    std::pair<Entry*, bool> stripe() noexcept {
      const std::uint32_t t = detail::owned_slot(count);
      if (t == count) [[unlikely]] return {stripes[count].load(std::memory_order_relaxed), false};
      std::atomic<Entry*>& slot = stripes[t];
      Entry* p = slot.load(std::memory_order_acquire);
      if (p != nullptr) [[likely]] return {p, true};
      p = new (std::nothrow) Entry[entries()];
      if (p == nullptr) return {stripes[count].load(std::memory_order_relaxed), false};
      // Release publishes the zeroed entries to snapshot(). Only this thread stores here.
      slot.store(p, std::memory_order_release);
      return {p, true};
    }

    std::uint32_t slots;
    std::uint32_t count;
    std::unique_ptr<std::atomic<Entry*>[]> stripes;
    std::unique_ptr<Shared[]> shared;  // [slots] is `other`, [slots + 1] all tags
  };

  /// Raises e's mark to `live` if it is below, adding the difference to the shared sum.
  static void raise_mark(Entry& e, Shared& g, std::int64_t live) noexcept {
    std::int64_t m = e.mark.load(std::memory_order_relaxed);
    while (live > m) {
      if (e.mark.compare_exchange_weak(m, live, std::memory_order_relaxed)) {
        const std::int64_t sum = g.marks.fetch_add(live - m, std::memory_order_relaxed) + (live - m);
        std::int64_t p = g.peak.load(std::memory_order_relaxed);
        while (sum > p && !g.peak.compare_exchange_weak(p, sum, std::memory_order_relaxed)) {
        }
        return;
      }
    }
  }

  /// After a free: drops e's mark to `live` (and the epoch's high with it) when it is more
  /// than PEAK_SLACK above.
  [[gnu::always_inline]] static void settle_mark(Entry& e, Shared& g, std::int64_t live) noexcept {
    if (e.mark.load(std::memory_order_relaxed) - live > PEAK_SLACK) [[unlikely]] drop_mark(e, g, live);
  }
  [[gnu::noinline]] static void drop_mark(Entry& e, Shared& g, std::int64_t live) noexcept {
    e.high.store(live, std::memory_order_relaxed);
    lower_mark_to(e, g, live, PEAK_SLACK);
  }

  /// At an epoch's end: lowers e's mark to the epoch's high (never below `live`, the
  /// live bytes now), and starts the next epoch from `live`.
  static void lower_mark(Entry& e, Shared& g, std::int64_t live) noexcept {
    const std::int64_t h = e.high.exchange(live, std::memory_order_relaxed);
    lower_mark_to(e, g, h > live ? h : live);
  }

  /// Lowers e's mark to `target` while it is more than `slack` above it, taking the
  /// difference off the shared sum (every lowering of a mark: the epoch's, the free's
  /// slack, reset_peak).
  static void lower_mark_to(Entry& e, Shared& g, std::int64_t target, std::int64_t slack = 0) noexcept {
    std::int64_t m = e.mark.load(std::memory_order_relaxed);
    while (m - target > slack) {
      if (e.mark.compare_exchange_weak(m, target, std::memory_order_relaxed)) {
        g.marks.fetch_sub(m - target, std::memory_order_relaxed);
        return;
      }
    }
  }

  static void finish(AllocationCounters& c, const Shared& g) noexcept {
    // A free counted in `frees` but whose allocation's count is still in flight on
    // another thread cannot happen (see the class comment); the guards are for a caller
    // that frees a block before the allocating call has returned, which the contract
    // forbids, so they only keep figures sane.
    if (c.allocations < c.frees) c.allocations = c.frees;
    if (c.total_bytes < c.freed_bytes) c.total_bytes = c.freed_bytes;
    c.current_bytes = c.total_bytes - c.freed_bytes;
    c.current_count = c.allocations - c.frees;
    const std::int64_t peak = g.peak.load(std::memory_order_relaxed);
    c.peak_bytes = peak > 0 && static_cast<std::size_t>(peak) > c.current_bytes ? static_cast<std::size_t>(peak)
                                                                               : c.current_bytes;
  }

  std::unique_ptr<State> state_;
};

static_assert(DeviceMemoryResource<Statistics<detail::PlainArchetype>>);
static_assert(!TrackingResource<Statistics<detail::PlainArchetype>>);
static_assert(TrackingResource<Statistics<detail::TrackingArchetype>>);
static_assert(DriverResource<Statistics<detail::DriverArchetype>>);

}  // namespace xlogrt
