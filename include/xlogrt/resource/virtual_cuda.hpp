// SPDX-License-Identifier: Apache-2.0
#pragma once

// VirtualCuda<D>: a base resource over the CUDA virtual memory API. Blocks are carved
// best-fit from one reserved address range; physical pages are mapped under them on
// demand and given back when idle.

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/resource/block_table.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/deferred_frees.hpp"
#include "xlogrt/resource/detail/poll_cadence.hpp"
#include "xlogrt/resource/detail/recycle_alone.hpp"
#include "xlogrt/resource/detail/request.hpp"
#include "xlogrt/resource/detail/slot_tag.hpp"
#include "xlogrt/resource/detail/virtual_ranges.hpp"

namespace xlogrt {

struct VirtualCudaOptions {
  /// Bytes of address space reserved (cuMemAddressReserve) for the device's blocks,
  /// rounded up to the granularity. 0: twice the device's memory, or once if the driver
  /// refuses that much. The range costs no memory; it bounds what can be live at once,
  /// holes included.
  std::uint64_t reserve_bytes = 0;
  /// Every block starts at a multiple of this (a power of two, at least 256: what
  /// cudaMalloc guarantees), and takes its size rounded up to it. Small blocks share
  /// physical pages this way, with no driver call.
  std::size_t alignment = 512;
  /// Bytes of idle physical memory (pages no live or pending block touches, mapped or
  /// not) kept for later blocks; poll_pending and reap_pending give back what is above
  /// it. The default keeps everything, as AsyncCuda's pool does; trim() gives back all.
  std::uint64_t release_threshold = std::numeric_limits<std::uint64_t>::max();
  /// Before creating a physical page, take an idle mapped one from a free range
  /// elsewhere (unmapped there, mapped here): the footprint follows the live bytes
  /// rather than the address space's holes. false: new pages are created while the
  /// device has room, and idle ones are taken only under pressure.
  bool remap_idle = true;
  /// Blocks of at most this many bytes (what a caching layer above keeps: Cached's
  /// max_block_bytes) are carved from a region of their own, the last eighth of the
  /// reserved range, and larger ones from the rest, so that the small blocks a cache
  /// holds share pages with one another rather than keep pages mapped among the large
  /// blocks. A request whose region has no room takes the other's. 0: one region.
  std::size_t small_block_bytes = std::size_t{1} << 20;
  /// Events created up front, so the tracking hot path never creates one.
  std::size_t reserve_events = 64;
  /// FOR TESTS ONLY: a freed range becomes reusable on every stream at once, not only on
  /// its own stream until its free is known complete. This breaks the stream-ordered
  /// safety on purpose, so that a test can show the hazard checker catches the reuse.
  bool unsafe_cross_stream_reuse_for_testing = false;
};

/// What VirtualCuda holds (VirtualCuda::stats). Bytes, at one moment, under the arena lock.
struct VirtualStats {
  std::uint64_t reserved_bytes = 0;   ///< the address range
  std::uint64_t granularity = 0;      ///< the size of a physical page
  std::uint64_t small_region_bytes = 0;  ///< the end of the range kept for small blocks (0: none)
  std::uint64_t mapped_bytes = 0;     ///< physical pages mapped in the range
  std::uint64_t physical_bytes = 0;   ///< mapped pages plus idle unmapped ones kept (spare)
  std::uint64_t used_bytes = 0;       ///< live and pending blocks, each rounded to the alignment
  std::uint64_t pending_bytes = 0;    ///< freed ranges not yet reusable on other streams
  std::uint64_t free_ranges = 0;      ///< ranges reusable on every stream
  std::uint64_t peak_physical_bytes = 0;  ///< the largest physical_bytes so far
  std::uint64_t pages_created = 0;    ///< cuMemCreate calls that succeeded
  std::uint64_t pages_unmapped = 0;   ///< idle pages unmapped (to map elsewhere, or to release)
  std::uint64_t pages_released = 0;   ///< cuMemRelease calls that succeeded
};

/// A base resource over the CUDA virtual memory API (VirtualMemoryDriver), beside
/// AsyncCuda: the same contract (DriverResource, TrackingResource, RecyclingResource,
/// RetiringResource), so Cached, Budget, Logging, Statistics and GraphPools sit on it
/// unchanged.
///
/// Address space. create() reserves one range (VirtualCudaOptions::reserve_bytes) on the
/// device. Its bytes are, at any moment, exactly one of: live (a block of the block
/// table), pending on a stream S (freed on S, the free not yet known complete), or free
/// (reusable on every stream). Free ranges, and each stream's pending ones, are kept
/// best-fit and coalesced (detail::FreeRanges), at the option's alignment; an allocation
/// on S takes the best fit among the free ranges and S's pending ones. The range is cut
/// in two regions at a page boundary: the last eighth for blocks of at most
/// small_block_bytes, the rest for larger ones. No free range crosses the boundary, an
/// allocation searches its own region first and the other only when its own has no
/// room, so the small blocks a cache keeps live pack onto pages of their own and the
/// large blocks' pages go idle when the large blocks are freed. The cost: one block
/// can be no larger than the large region (7/8 of the range).
///
/// Physical pages. The range is cut in pages of the device's minimum granularity (2 MiB
/// on the H200). Each page is mapped to a physical allocation of its own (cuMemCreate of
/// one page) the first time a block touches it, and read-write access is granted to the
/// runs of pages mapped together (cuMemSetAccess). A block of many pages is thus served
/// by pages that need not be contiguous in the device's memory (stitching), and small
/// blocks share pages. Invariants: every page a live or pending block touches is mapped,
/// with access granted before the block is handed out; a page is *idle* when it lies
/// inside one free range; only idle pages are unmapped. The footprint (physical_bytes)
/// is the mapped pages plus the spare ones (unmapped, kept to be mapped again).
///
/// Stream-ordered reuse. A free makes the block's alloc stream A wait for every tracked
/// use on another stream (as AsyncCuda's free does), then puts its range pending on A,
/// tagged with A's free count. Reusable on A at once (stream order puts the new owner's
/// work after the old one's); on other streams once the range retires: poll_pending
/// records an event on A after the frees it counted and retires them when the event is
/// reached (or at once when cuStreamQuery finds A idle), reap_pending synchronises. The
/// host has then seen the work complete, which is also what makes a page safe to unmap:
/// cuMemUnmap does not wait for work still using the range. Adopted streams
/// (StreamPool::owned false) get no driver call outside a call naming them: their
/// events are recorded only when a free or an allocation on that stream polls, and
/// reap_pending waits for them with one device synchronisation.
///
/// Memory goes back. trim() reaps, unmaps every idle page and releases every physical
/// page not mapped (device free memory rises by what it returns); poll_pending and
/// reap_pending do the same for what exceeds release_threshold. When cuMemCreate fails
/// for lack of memory, the allocation retires what the device has finished, takes idle
/// pages from other free ranges, and tries again before it refuses with out_of_memory,
/// whose message says how much the resource holds.
///
/// Stream capture. An allocation on a capturing stream is refused (stream_misuse): a
/// graph would keep using the address after the block's free, and mapping calls inside
/// a capture are not the graph's. Put GraphPools above (the default stack does): it
/// serves capturing streams from a graph pool. A free whose alloc stream captures while
/// a capture window is open is deferred, as AsyncCuda defers it, and the mapping and
/// polling calls run with the thread's capture mode relaxed while windows are open.
///
/// Tracking (prepare/finish/record_block_use, recycle_block, unpark_block) follows
/// AsyncCuda's rules exactly: the last write and one read per stream since, events
/// recorded lazily on the alloc stream, a lock-free check for quiet blocks.
///
/// Lifetime. The resource's destructor, when no block is live and the process is not
/// exiting, synchronises the device and unmaps, releases and frees everything; with
/// blocks still live it leaves the range mapped (their memory stays valid).
///
/// Thread-safe. Blocks are tracked in a sharded BlockTable (per-block locks); the address
/// space and the pages are guarded by one mutex, which allocate, deallocate (after its
/// waits), poll and trim take: with a caching layer above, these run on its misses only.
/// Move-only; a moved-from VirtualCuda may only be destroyed.
template <VirtualMemoryDriver D>
class VirtualCuda {
 public:
  using driver_type = D;
  using stream_t = typename D::stream_t;
  using event_t = typename D::event_t;
  using phys_t = typename D::phys_t;
  static constexpr bool supports_block_use_tracking = true;

  /// Errors: invalid_argument for an alignment that is not a power of two of at least
  /// 256 or above the granularity; driver errors (not_supported on a device without
  /// virtual memory management) reading the granularity or reserving the range.
  static result<VirtualCuda> create(std::shared_ptr<StreamPool<D>> streams, VirtualCudaOptions options = {}) noexcept;

  /// Errors: zero_bytes, too_large, unknown_stream; stream_misuse on a capturing stream;
  /// out_of_memory when the address range has no room (reserve_bytes) or the device no
  /// physical page after the retries; the driver's errors mapping pages. On error nothing
  /// is live and every page mapped on the way stays accounted (idle).
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept;

  /// Makes the alloc stream wait for every tracked use on other streams, then puts the
  /// range pending on it. On error the block is left with the caller, untouched and live.
  result<void> deallocate(DeviceBlock&& b) noexcept;

  /// As AsyncCuda::recycle_block (the RecyclingResource contract): the memory stays
  /// live and keeps its pages; no arena call. The common case (a block used on its alloc
  /// stream only, as a cache's blocks are) is AsyncCuda's, inline (detail::recycle_alone);
  /// every other case, bad input included, goes to recycle_general.
  [[gnu::always_inline]] result<DeviceBlock> recycle_block(DeviceBlock& b, StreamId to,
                                                           Recycle how = Recycle::live) noexcept {
    const Park park{how == Recycle::parked, how != Recycle::live};
    DeviceBlock next = detail::recycle_alone(state_->table, *streams_, ordinal_, b, to, park);
    if (next.empty()) [[unlikely]] return recycle_general(b, to, park);
    return next;
  }

  [[gnu::always_inline]] bool unpark_block(BlockId id, AllocTag tag) noexcept { return state_->table.unpark(id, tag); }

  /// Live bytes plus freed bytes not yet retired (requested sizes, as AsyncCuda counts).
  std::size_t bytes_outstanding() const noexcept {
    return state_->table.live_bytes() + static_cast<std::size_t>(state_->pending_requested.load(std::memory_order_acquire));
  }

  /// Waits for every free so far and retires it (capturing streams left alone, adopted
  /// streams by one device synchronisation outside capture windows), queues the frees a
  /// capture deferred, then gives back idle memory above release_threshold.
  result<void> reap_pending() noexcept;

  /// Retires, without waiting, the frees the device has been seen to reach; their bytes.
  /// Then gives back idle memory above release_threshold. One poll at a time.
  result<std::size_t> poll_pending() noexcept { return poll(StreamId{static_cast<std::uint32_t>(MAX_STREAMS)}); }

  std::uint64_t retired_bytes() const noexcept { return state_->retired_total.load(std::memory_order_acquire); }

  /// When deallocate polls: every Cadence::EVERY_FREES frees of a thread, and every
  /// Cadence::EVERY_BYTES it frees (as AsyncCuda's).
  using Cadence = detail::PollCadence<VirtualCuda>;

  /// reap_pending, then unmaps every idle page and releases every physical page that is
  /// not mapped. Returns the bytes of physical memory released. Errors: the driver's
  /// (what was released before stays so).
  result<std::size_t> trim() noexcept;

  VirtualStats stats() const;
  /// Bytes of physical memory held: the mapped pages and the spare ones (stats()'s
  /// physical_bytes, read alone).
  std::uint64_t physical_bytes() const {
    std::lock_guard lock(state_->mu);
    return state_->physical_bytes();
  }

  std::uint32_t device_ordinal() const noexcept { return ordinal_; }
  /// The start of the reserved range (blocks lie in [base, base + reserved_bytes)).
  std::uint64_t base() const noexcept { return state_->base; }

  // ---- tracking -------------------------------------------------------------------

  result<void> record_block_use(const DeviceBlock& block, StreamId use) noexcept {
    if (auto r = detail::check_block(block, device_ordinal()); !r) return r;
    return finish(block.id(), use, Access::Read, &block);
  }
  result<void> prepare_block_use(BlockId id, StreamId use, Access access) noexcept;
  result<void> finish_block_use(BlockId id, StreamId use, Access access) noexcept {
    if (!streams_->contains(use)) [[unlikely]] return streams_->unknown(use);
    if (quiet_on(id, use)) return ok();
    return finish(id, use, access, nullptr);
  }

  // ---- DriverResource -------------------------------------------------------------

  D& driver() const noexcept { return streams_->driver(); }
  result<stream_t> stream_handle(StreamId s) const noexcept { return streams_->get(s); }
  result<void> make_current() const noexcept { return streams_->device()->make_current(); }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return streams_; }

  BlockId set_generation_for_testing(BlockId id, std::uint32_t generation) noexcept {
    return state_->table.set_generation_for_testing(id, generation);
  }
  std::size_t deferred_frees() const {
    return state_->deferred.size();
  }
  std::size_t live_blocks() const {
    std::size_t n = 0;
    state_->table.for_each([&](const Track&) { ++n; });
    return n;
  }

 private:
  static constexpr std::size_t MAX_STREAMS = StreamPool<D>::MAX_STREAMS;

  /// One use of a block on a stream (as AsyncCuda's): `event` holds a recording of the
  /// use only when `recorded`; `has_event` says an event object is held.
  struct Use {
    event_t event{};
    StreamId stream{};
    bool has_event = false;
    bool recorded = false;
  };
  /// A block's tracking state, under its slot's lock (see AsyncCuda's Track: the same
  /// rules, the same quiet mark).
  struct Track {
    static constexpr std::uint32_t NOT_QUIET = 0xffffffffu;
    void start(StreamId alloc) noexcept {
      alloc_stream = alloc;
      write = Use{.stream = alloc};
      waited = 0;
      quiet_stream.store(alloc.value, detail::PeekProtocol::entry_write);
    }
    StreamId alloc_stream{};
    std::atomic<std::uint32_t> quiet_stream{NOT_QUIET};
    Use write{};
    std::uint32_t waited = 0;  // streams (ids < 32) that already waited for `write`
    std::vector<Use> reads;    // one per distinct stream since that write
    std::vector<event_t> spare;

    bool quiet() const noexcept {
      if (write.stream != alloc_stream || write.recorded || waited != 0) return false;
      for (const Use& r : reads) {
        if (r.stream != alloc_stream || r.recorded) return false;
      }
      return true;
    }
    void refresh_quiet() noexcept {
      quiet_stream.store(quiet() ? alloc_stream.value : NOT_QUIET, detail::PeekProtocol::entry_write);
    }
    bool alone() const noexcept { return write.stream == alloc_stream && !write.has_event && reads.empty() && spare.empty(); }
    bool write_waited(StreamId s) const noexcept { return s.value < 32 && (waited >> s.value & 1u); }
    void mark_write_waited(StreamId s) noexcept {
      if (s.value < 32) waited |= std::uint32_t{1} << s.value;
    }
    template <class F>
    result<void> for_each_other(F&& f) {
      if (write.stream != alloc_stream) {
        if (auto r = f(write); !r) return r;
      }
      for (Use& r : reads) {
        if (r.stream == alloc_stream) continue;
        if (auto e = f(r); !e) return e;
      }
      return ok();
    }
    void keep(const Use& u, EventPool<D>& pool) noexcept {
      if (!u.has_event) return;
      try {
        spare.push_back(u.event);
      } catch (...) {
        pool.release(u.event);
      }
    }
    void release_events(EventPool<D>& pool) noexcept {
      if (write.has_event) pool.release(write.event);
      write = Use{};
      for (Use& r : reads) {
        if (r.has_event) pool.release(r.event);
      }
      for (event_t e : spare) pool.release(e);
      reads.clear();
      spare.clear();
    }
  };

  /// A physical page of the range: mapped to `phys`, and accessible once access is granted.
  struct Page {
    phys_t phys{};
    bool mapped = false;
    bool access = false;
  };

  /// One stream's freed ranges and poll mark.
  struct StreamFrees {
    detail::FreeRanges pending;  // freed here, not yet known complete
    std::uint64_t seq = 0;       // frees so far
    std::uint64_t queued = 0;    // their requested bytes
    std::uint64_t retired_seq = 0;
    std::uint64_t retired = 0;   // requested bytes of the frees retired
    event_t event{};             // poll's mark: recorded after the frees up to mark_seq
    std::uint64_t mark_seq = 0;
    std::uint64_t mark_bytes = 0;
    bool has_event = false;
    bool armed = false;
  };

  struct State {
    explicit State(std::shared_ptr<Device<D>> dev) : device(dev), events(std::move(dev)) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State();

    std::shared_ptr<Device<D>> device;
    BlockTable<Track> table;
    EventPool<D> events;
    VirtualCudaOptions options;
    std::atomic<std::uint64_t> pending_requested{0};  // queued minus retired, all streams
    std::atomic<std::uint64_t> retired_total{0};

    mutable std::mutex mu;  // the arena: everything below down to the deferred frees
    std::uint64_t base = 0;
    std::uint64_t size = 0;
    std::uint64_t granularity = 0;
    detail::FreeRanges free;
    std::array<StreamFrees, MAX_STREAMS> frees{};
    std::vector<Page> pages;
    std::set<std::uint64_t> mapped;  // indices of the mapped pages
    std::vector<phys_t> spare;       // physical pages mapped nowhere, kept
    std::uint64_t carving = 0;       // bytes of the pages of the block map_range_locked is mapping
    std::uint64_t barren_slack = 0;  // mapped minus used bytes when a search for idle pages last found none
    VirtualStats counts;             // the peak and the page counters

    std::mutex poll_mu;  // one poll at a time
    detail::DeferredFrees deferred;  // frees deferred by a capture (live in the table)

    std::uint64_t physical_bytes() const noexcept { return (mapped.size() + spare.size()) * granularity; }
    std::uint64_t used_bytes() const noexcept { return size - free.bytes(); }
  };

  explicit VirtualCuda(std::shared_ptr<StreamPool<D>> streams)
      : streams_(std::move(streams)),
        state_(std::make_unique<State>(streams_->device())),
        device_bytes_(streams_->device()->info().total_bytes),
        ordinal_(streams_->device()->ordinal()) {}

  std::uint64_t round(std::size_t bytes) const noexcept {
    const std::uint64_t a = state_->options.alignment;
    return (static_cast<std::uint64_t>(bytes) + a - 1) & ~(a - 1);
  }

  // Arena (with state_->mu held).
  /// Maps and grants access to every page [offset, offset + bytes) touches.
  result<void> map_range_locked(std::uint64_t offset, std::uint64_t bytes) noexcept;
  /// A physical page to map: a spare one, an idle one taken from a free range (when
  /// remap_idle, or under pressure), or a new one.
  result<phys_t> page_for_locked(std::uint64_t wanted) noexcept;
  /// Unmaps up to `want` idle pages into the spare list; how many. Not `thorough`: skips
  /// the search when the slack (mapped minus used bytes) has not grown since a search
  /// that found nothing.
  result<std::uint64_t> harvest_locked(std::uint64_t want, bool thorough) noexcept;
  /// Releases spare pages until physical minus used bytes is at most `keep`.
  result<std::size_t> release_locked(std::uint64_t keep) noexcept;
  /// Retires stream i's pending frees up to sequence `seq` (whose requested bytes come
  /// to `bytes`, cumulative); the requested bytes retired.
  std::uint64_t retire_locked(std::size_t i, std::uint64_t seq, std::uint64_t bytes) noexcept;
  /// Puts a freed range pending on stream i (or free, for the test option).
  result<void> queue_free_locked(std::size_t i, std::uint64_t offset, std::uint64_t rounded,
                                 std::uint64_t requested) noexcept;

  result<std::size_t> poll(StreamId named) noexcept;
  result<std::size_t> poll_locked(StreamId named) noexcept;
  result<void> reap_now() noexcept;
  bool capturing(stream_t s) const noexcept {
    auto info = driver().stream_capture_info(s);
    return info && info->status != CaptureStatus::none;
  }
  result<void> defer_free(DeviceBlock&& b) noexcept;
  result<void> queue_deferred() noexcept;
  /// recycle_block in full: checks `b` and `to`, orders the uses on other streams
  /// before the alloc stream, and renews the block (recycle_moving in its slot's last
  /// generation).
  [[gnu::noinline]] inline result<DeviceBlock> recycle_general(DeviceBlock& b, StreamId to, Park park) noexcept;
  result<DeviceBlock> recycle_moving(DeviceBlock& b, StreamId to, stream_t a, Park park) noexcept;
  result<void> end_life(Track& t, const DeviceBlock& b, StreamId to, stream_t a) noexcept;

  bool quiet_on(BlockId id, StreamId use) const noexcept {
    return state_->table.peek(id, [use](const Track& t) noexcept {
      return t.quiet_stream.load(detail::PeekProtocol::entry_read) == use.value;
    });
  }
  template <class F>
  result<void> tracked(BlockId id, const DeviceBlock* block, F&& f) noexcept {
    return state_->table.with(id, Lookup::use, [&](Track& t) -> result<void> {
      result<void> r = f(t);
      t.refresh_quiet();
      return r;
    }, block);
  }
  result<void> resolve(Track& t, Use& u) noexcept;
  result<void> wait_for(Track& t, stream_t waiter, Use& u) noexcept;
  result<void> note_use(Track& t, Use& u) noexcept;
  result<void> finish(BlockId id, StreamId use, Access access, const DeviceBlock* block) noexcept;

  std::shared_ptr<StreamPool<D>> streams_;
  std::unique_ptr<State> state_;
  std::size_t device_bytes_ = 0;
  std::uint32_t ordinal_ = 0;
};

}  // namespace xlogrt

#include "xlogrt/resource/detail/virtual_cuda_impl.hpp"
