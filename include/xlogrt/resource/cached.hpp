// SPDX-License-Identifier: Apache-2.0
#pragma once

// Cached<Up>: a caching layer that keeps freed blocks on the host and hands them out
// again without a driver call.
//
// ---- How it works ----------------------------------------------------------------------
//
// Size classes. A request is rounded up to its size class (detail/size_class.hpp: four
// classes per power of two, so a block is less than 1.25 times its request, and less than
// 1.25 times that again for each larger class a shared class may take); a request
// whose class is above `max_block_bytes` (1 MiB) goes straight to the upstream at its
// exact size, as does every request when the layer is disabled: the layer caches small
// and mid-size blocks, where a driver call costs the most against the work, and leaves
// large ones to the pool, whose stream-ordered reuse wastes no memory on classes or
// idle blocks (see docs/design-notes.md for the measurements).
//
// Where a freed block waits. deallocate asks the upstream to recycle the block
// (RecyclingResource: the uses tracked on other streams are ordered before its alloc
// stream S, as a free would order them, and its id goes stale), then keeps the new block
// in the calling thread's bin for (S, class). A bin holds a few blocks; when it is full,
// half of it moves to S's depot, which every thread shares (under the depot's spin lock),
// or all of it when its thread took nothing from it since it last filled (a sink, below).
// An allocation on S takes from the thread's bin, else refills the bin from S's depot,
// else tries another stream's depot (below), else allocates from the upstream.
//
// Shared classes. Blocks above `thread_block_bytes` (64 KiB) have no bins: they go to and
// come from S's depot directly, so that the layer keeps one set of them for every thread,
// not one per thread. A request of a shared class that S's depot lacks takes a block up
// to `depot_larger_classes` (2) classes larger from it; failing that and another
// stream's completed blocks, it gives back the smallest idle block of S's depot up to 4
// times its size before it allocates (evict_larger), so that the pool can place the new
// block in that block's memory. Blocks of one class cannot serve another, so without
// these each shared class would keep, on each stream, the highest demand it has ever
// seen, and the layer would grow for as long as new peaks come.
//
// Stream safety. A block freed on S is handed out again on S at once: work enqueued on S
// after the allocation runs after everything the previous owner enqueued on S, and the
// recycle made S wait for the previous owner's uses on other streams. A block moves to
// another stream T only once its free is known complete on the GPU: a depot marks its
// blocks by recording an event on S (when a thread of another stream first wants them),
// and hands them to T only after a query finds that event complete; the upstream then
// moves the block to T (recycle_block(b, T)), with no driver call. A block is never
// handed across streams on a wait, so a stream held up for a long time keeps its blocks
// and another stream allocates fresh memory instead (the pattern of RMM issue 2490).
//
// Adopted streams. A stream the pool adopted (StreamPool::owned is false) may be
// destroyed by its owner at any time, and a call on its handle afterwards is undefined, so
// the layer calls on it only within a call that names it: another stream that wants its
// depot's blocks notes that they are wanted (Depot::wanted), and the next put into that
// depot by a free on the stream records the event; puts from other calls (spills of
// other streams' bins, the sweep of exited threads) keep all its blocks rather than give
// any back on its handle; trim gives them back through the pool's first stream after one
// device synchronisation. A stream destroyed without a word thus leaves its idle blocks
// here until a trim, or until its id is recycled (StreamPool).
//
// Threads. The hit path of a thread that allocates and frees on its own stream touches
// only its own ThreadCache (detail/thread_cache.hpp) and the block's own slot in the
// upstream's table: no lock, and no read-modify-write on a line another thread writes,
// but the upstream block's own lock (taken by the recycle) and the owner's announcement
// of OwnerClaim (detail/cache_claim.hpp), both on lines no other thread writes in that
// pattern. Before a miss of a bin class, a thread takes idle blocks of that class and
// stream from another thread's bin (half of them at most: one for the caller, the rest
// into its own bin), claiming that cache as trim does (take_from_threads): a bin keeps
// its blocks from every other thread, and without this each thread would end up holding
// its own set of every class on every stream.
//
// Frees by another thread (a producer allocates, a consumer frees: torch's autograd
// thread frees what the forward thread allocated). The block goes to the freeing
// thread's bin. A bin whose thread takes nothing from it between two times it fills is a
// sink (CacheBin::sink): it passes all its blocks to the depot each time, so the blocks
// reach the allocating thread a bin at a time, through one depot lock on each side per
// bin, and a pair costs each thread little more than the block's slot in the upstream's
// table. take_from_threads leaves sinks alone: their blocks are on their way to the
// depot, and taking them a claim at a time while the owner keeps freeing into the cache
// makes each claim wait on the owner and sends the owner's frees to the depot meanwhile.
// A producer that outruns the hand-off allocates instead, until the blocks in flight
// between the two threads cover the consumer's bin and the batches between bin and bin;
// then neither thread misses or claims. The pipeline so holds about two bins of blocks
// more than its users, and a sink keeps no more than any bin.
//
// Memory pressure. trim() gives every cached block back to the upstream: it claims each
// thread's cache in turn (OwnerClaim: the owner backs off to its slow path meanwhile),
// empties the depots, and frees each block, stream-ordered, on its stream. An upstream
// allocation that fails with out_of_memory or out_of_budget trims the cache and, when
// that gave anything back, is retried once; if the class still does not fit, the
// request itself is tried, unrounded (that block is not cached). So the layer never
// fails an allocation that would fit without it. Caches of threads that have exited are swept into the depots
// when a new thread's cache is made, and by trim().
//
// Where it sits. Over Budget (Cached<Budget<AsyncCuda>>): the budget then charges every
// byte the device holds for the stack, the cached ones included, and a request the
// budget refuses trims the cache and tries again. Under Statistics and Logging: those
// see and record every allocation the users make, hits included. The default stack is
// Statistics<GraphPools<Logging<Cached<Budget<AsyncCuda>>>>>: what a stream capture
// allocates is served by GraphPools and never reaches this layer.
//
// Accounting. bytes_outstanding() is the upstream's less the cached bytes: what the
// users hold plus the upstream's queued frees. The device memory the stack holds is
// bytes_outstanding() + stats().cached_bytes.
//
// Tracking. Blocks carry the upstream's ids, so prepare / finish / record_block_use go
// to the upstream unchanged. A cached block is *parked* upstream (Recycle::park): its id
// is live there but every use, free or recycle of it by anyone but the layer is
// refused as for a freed block, so a free forged with the id the layer holds gives the
// block no second owner. Handing it out unparks it (one store on the block's own slot,
// and that slot's lock only when the tag changes) under its new owner's tag, so a free
// is checked against the tag its owner got, and a block rebuilt under another tag is
// refused as the upstream refuses it.
//
// compute-sanitizer. A cached block is still the process's memory to the driver; with
// `nvtx_marks` the layer registers its blocks through the NVTX memory API, and memcheck
// reports a kernel that reads or writes a block while it is cached.
//
// Thread-safe. Move-only; a moved-from Cached may only be destroyed. Destroying it gives
// every cached block back to the upstream; no other call may run meanwhile.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/find_layer.hpp"
#include "xlogrt/resource/detail/archetypes.hpp"
#include "xlogrt/resource/detail/cache_nvtx.hpp"
#include "xlogrt/resource/detail/size_class.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/thread_cache.hpp"

namespace xlogrt {

struct CachedOptions {
  /// false: every call goes straight to the upstream (XLOGRT_CACHE=0 in the default
  /// stack, for compute-sanitizer runs and A/B comparisons).
  bool enabled = true;
  /// Requests whose size class is larger go straight to the upstream, uncached and at
  /// their exact size: the driver's pool serves them, and its stream-ordered reuse keeps
  /// cudaMallocAsync's footprint. 1 MiB: the layer's memory policy (docs/design-notes.md,
  /// "The caching layer's memory"). Cached large blocks (up to 1 GiB, before) made an
  /// LLM-serving trace hold 1.80 times its live bytes; with 1 MiB, 1.001 times. Requests
  /// above it pay the pool's pair (about 0.6 us on an H200) instead of a cache hit.
  std::size_t max_block_bytes = std::size_t{1} << 20;
  /// Blocks one thread keeps per stream and size class (1 .. 16) before half of them
  /// move to the stream's shared depot ...
  std::uint32_t bin_blocks = detail::MAX_BIN_BLOCKS;
  /// ... and bytes (a bin of larger blocks holds fewer, but always one).
  std::size_t bin_bytes = std::size_t{64} << 20;
  /// Blocks of classes up to this size are kept in the freeing thread's bins; larger ones
  /// (the shared classes) go straight to their stream's depot, which every thread shares.
  /// A thread's bins keep blocks no other thread can use, so bins of large blocks would
  /// keep one working set per thread; a depot costs a lock per call, small beside the
  /// work a block above 64 KiB carries. 0: every block goes through the depots.
  std::size_t thread_block_bytes = std::size_t{64} << 10;
  /// A request of a shared class that its stream's depot lacks takes a block up to this
  /// many classes larger from that depot (0 .. 4; a class is at most 1.25 times the one
  /// below) before it asks the upstream for new memory: some waste for fewer blocks.
  std::uint32_t depot_larger_classes = 2;
  /// Tell compute-sanitizer which blocks are cached, so that memcheck reports a kernel
  /// that touches one (XLOGRT_CACHE=nvtx in the default stack). Needs
  /// <xlogrt/resource/nvtx_marks.hpp> in the program. Costs a mutex and NVTX calls per
  /// allocation: for sanitizer runs.
  bool nvtx_marks = false;
  /// Bytes one thread keeps in all its bins together: a free that would pass it moves
  /// the thread's bins to their streams' depots first.
  std::size_t thread_bytes = std::size_t{512} << 20;
  /// Bytes all depots keep together: a block that would pass it is freed to the upstream
  /// (stream-ordered, on its stream) instead. With thread_bytes this bounds what the
  /// layer holds, however the work spreads over threads, streams and sizes:
  /// threads x thread_bytes + depot_bytes.
  std::size_t depot_bytes = std::size_t{2} << 30;
};

/// What a Cached layer did. Counts are cumulative; bytes are a moment's view.
struct CacheStats {
  std::uint64_t hits = 0;                ///< allocations served from the thread's own bin
  std::uint64_t depot_hits = 0;          ///< ... from its stream's depot
  std::uint64_t cross_stream_moves = 0;  ///< ... from another stream's depot, its free complete
  std::uint64_t from_other_threads = 0;  ///< ... from another thread's bin for the stream
  std::uint64_t misses = 0;              ///< allocations the upstream served (the cache had none)
  std::uint64_t bypasses = 0;            ///< requests above max_block_bytes (or with the layer off)
  std::uint64_t pressure_retries = 0;    ///< upstream failures retried after a trim
  std::uint64_t trims = 0;               ///< trim() calls, explicit or under pressure
  std::uint64_t trimmed_blocks = 0;      ///< blocks given back to the upstream (evictions included)
  std::uint64_t evictions = 0;           ///< misses that first gave back a larger idle block
  std::uint64_t exact_fallbacks = 0;     ///< requests served unrounded under pressure (the class did not fit)
  std::uint64_t dropped_blocks = 0;      ///< cached blocks the upstream refused to unpark (never, in a right program)
  std::uint64_t trimmed_bytes = 0;
  std::uint64_t requested_bytes = 0;     ///< sum of the requests the classes served
  std::uint64_t granted_bytes = 0;       ///< sum of the blocks handed out for them
  std::size_t cached_bytes = 0;          ///< bytes in bins and depots now
  /// cached bytes per size class (index: detail::class_of; bytes of a class:
  /// detail::class_bytes), as many as the layer has classes.
  std::vector<std::size_t> cached_bytes_per_class;

  /// Bytes handed out beyond what was asked for (internal fragmentation), cumulative.
  std::uint64_t waste_bytes() const noexcept { return granted_bytes - requested_bytes; }
  std::uint64_t allocations() const noexcept {
    return hits + depot_hits + cross_stream_moves + from_other_threads + misses;
  }
};

/// Steps of the cross-stream hand-off. A test seam: the hazard test derives a broken
/// layer from it (a block handed to another stream before its free is complete) and
/// requires SimDriver's checker to catch it. Production code never names it.
struct CachedProtocol {
  /// Hand a depot's blocks to another stream only once the event marking them is
  /// complete (false: as soon as they are marked).
  static constexpr bool wait_for_completion = true;
};

template <class Upstream, class Protocol = CachedProtocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
class Cached : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;

  /// Options out of range are clamped (bin_blocks to 1 .. 16, max_block_bytes to 1 TiB,
  /// depot_larger_classes to 4), and nvtx_marks stays off in a program without the NVTX
  /// marks; create() refuses them instead.
  explicit Cached(Upstream up, CachedOptions options = {})
      : Adaptor<Upstream>(std::move(up)), state_(std::make_unique<State>(options)), ordinal_(upstream().device_ordinal()) {}

  /// Errors: invalid_argument for bin_blocks outside 1 .. 16, bin_bytes of 0, a
  /// max_block_bytes above 1 TiB, a depot_larger_classes above 4, or nvtx_marks in a
  /// program that does not include <xlogrt/resource/nvtx_marks.hpp>; out_of_memory when
  /// host memory runs out.
  static result<Cached> create(Upstream upstream, CachedOptions options = {}) noexcept;
  Cached(Cached&&) noexcept = default;
  Cached& operator=(Cached&&) = delete;
  ~Cached();

  /// Errors: the upstream's (a cache hit cannot fail).
  [[gnu::always_inline]] result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    State& st = *state_;
    const std::uint32_t c = detail::class_of(bytes);
    if (c >= st.thread_classes || bytes == 0 || stream.value >= detail::CACHE_STREAMS) [[unlikely]] {
      return allocate_general(bytes, stream, tag, local(st));
    }
    detail::ThreadCache* tc = local(st);
    if (tc != nullptr && tc->claim.enter()) [[likely]] {
      detail::CacheBin* bins = tc->streams[stream.value].load(std::memory_order_relaxed);
      if (bins != nullptr) [[likely]] {
        detail::CacheBin& bin = bins[c];
        const std::uint32_t n = bin.n.load(std::memory_order_relaxed);
        if (n != 0) [[likely]] {
          const std::size_t size = detail::class_bytes(c);
          const detail::CachedEntry e = tc->pop(bin, n, size);
          detail::bump(bin.hits);
          detail::bump(tc->requested, bytes);
          detail::bump(tc->granted, size);
          tc->claim.leave();
          if (st.marks.on()) [[unlikely]] st.marks.handed(e.ptr, size);
          if (upstream().unpark_block(e.id, tag)) [[likely]] return DeviceBlock{e.ptr, size, stream, ordinal_, tag, e.id};
          dropped(st);
          return allocate_general(bytes, stream, tag, tc);
        }
      }
      tc->claim.leave();
    }
    return allocate_general(bytes, stream, tag, tc);
  }

  /// Keeps the block for the next allocation of its class on its stream (see the header
  /// comment). Errors: the upstream's recycle errors (empty_block, double_free,
  /// foreign_block, a driver error making the stream wait); the block then stays with
  /// the caller, live.
  [[gnu::always_inline]] result<void> deallocate(DeviceBlock&& b) noexcept {
    State& st = *state_;
    const std::size_t n = b.bytes();
    const std::uint32_t c = detail::class_of(n);
    const std::uint32_t s = b.alloc_stream().value;
    if (c >= st.classes || detail::class_bytes(c) != n || s >= detail::CACHE_STREAMS) [[unlikely]] {
      return upstream().deallocate(std::move(b));
    }
    auto next = upstream().recycle_block(b, b.alloc_stream(), Recycle::park);
    if (!next) [[unlikely]] return std::move(next).error();
    const detail::CachedEntry e{next->ptr(), next->id(), next->tag()};
    if (st.marks.on()) [[unlikely]] st.marks.cached(e.ptr);
    detail::ThreadCache* tc = c < st.thread_classes ? local(st) : nullptr;
    if (tc != nullptr && tc->claim.enter()) [[likely]] {
      detail::CacheBin* bins = tc->streams[s].load(std::memory_order_relaxed);
      if (bins != nullptr) [[likely]] {
        detail::CacheBin& bin = bins[c];
        const std::uint32_t k = bin.n.load(std::memory_order_relaxed);
        if (k < st.bin_cap[c] && tc->held.load(std::memory_order_relaxed) + n <= st.options.thread_bytes) [[likely]] {
          bin.items[k] = e;
          bin.n.store(k + 1, std::memory_order_relaxed);
          detail::bump(tc->held, n);
          tc->claim.leave();
          return ok();
        }
      }
      keep_general(st, tc, s, c, e);
      tc->claim.leave();
      return ok();
    }
    depot_put(st, s, c, &e, 1, true);
    return ok();
  }

  std::size_t bytes_outstanding() const noexcept;
  std::uint32_t device_ordinal() const noexcept { return ordinal_; }

  /// Gives every cached block back to the upstream: stream-ordered frees, each on the
  /// block's stream, whose bytes the upstream counts until its reap_pending. Returns the
  /// bytes given back. A block the upstream refuses to free (a driver error) stays cached.
  std::size_t trim() noexcept {
    State& st = *state_;
    std::lock_guard lock(st.registry_mu);
    return trim_locked(st);
  }

  CacheStats stats() const;

  const CachedOptions& options() const noexcept { return state_->options; }

 private:
  // Defined out of line, under resource/detail/: the depots and their members in
  // cache_depot.hpp, the hand-off between threads and streams in cache_handoff.hpp, the
  // reclaim (give_back, trim, the sweep, eviction, the destructor) in cache_reclaim.hpp,
  // the rest in cached_impl.hpp; the hot paths stay here, in the class. Each of those
  // members is inline, as it was when defined in the class: its definition says so, or,
  // for a noinline one, its declaration here (GCC wants the keyword beside the attribute).

  using stream_t = typename Upstream::driver_type::stream_t;
  using event_t = typename Upstream::driver_type::event_t;
  /// The largest max_block_bytes honoured.
  static constexpr std::size_t MAX_CLASS_BYTES = std::size_t{1} << 40;
  /// The largest depot_larger_classes honoured (4 classes: at most twice the size).
  static constexpr std::uint32_t MAX_LARGER_CLASSES = 4;

  /// The blocks of one stream that threads gave up from their bins, by class. `fresh`:
  /// not yet marked; `marked`: marked by `event`, not yet known complete; `done`: their
  /// frees are complete on the GPU, so they may go to any stream. Guarded by a spin lock:
  /// a bin's refill or overflow holds it for a few stores, and a sleeping mutex made the
  /// producer / consumer pattern pay a futex wake-up per batch; the only driver calls
  /// under it are advance()'s event query and record.
  struct Depot;

  struct State {
    explicit State(const CachedOptions& o)
        : options(o), serial(detail::next_cache_serial()), marks(o.enabled && o.nvtx_marks) {
      const std::size_t ceiling = std::min(o.max_block_bytes, MAX_CLASS_BYTES);
      classes = !o.enabled || ceiling < detail::SMALLEST_CLASS ? 0 : detail::class_of(ceiling) + 1;
      if (classes != 0 && detail::class_bytes(classes - 1) > ceiling) --classes;
      thread_classes = o.thread_block_bytes < detail::SMALLEST_CLASS ? 0 : detail::class_of(o.thread_block_bytes) + 1;
      if (thread_classes != 0 && detail::class_bytes(thread_classes - 1) > o.thread_block_bytes) --thread_classes;
      thread_classes = std::min(thread_classes, classes);
      larger_classes = std::min(o.depot_larger_classes, MAX_LARGER_CLASSES);
      bin_cap.resize(classes);
      const std::uint32_t blocks = std::clamp<std::uint32_t>(o.bin_blocks, 1, detail::MAX_BIN_BLOCKS);
      for (std::uint32_t c = 0; c < classes; ++c) {
        const std::size_t fit = o.bin_bytes / detail::class_bytes(c);
        bin_cap[c] = static_cast<std::uint32_t>(std::clamp<std::size_t>(fit, 1, blocks));
      }
    }
    ~State() {
      for (auto& tc : caches) tc->detached.store(true, std::memory_order_release);
      for (auto& d : depots) delete d.load(std::memory_order_relaxed);
    }
    CachedOptions options;
    const std::uint64_t serial;
    std::uint32_t classes = 0;
    std::uint32_t thread_classes = 0;  // the classes kept in thread bins: the first ones
    std::uint32_t larger_classes = 0;  // depot_larger_classes, clamped
    std::vector<std::uint32_t> bin_cap;  // by class
    detail::NvtxMarks marks;

    mutable std::mutex registry_mu;  // guards caches; serialises reclaimers
    std::vector<std::shared_ptr<detail::ThreadCache>> caches;
    std::mutex depot_make_mu;
    std::array<std::atomic<Depot*>, detail::CACHE_STREAMS> depots{};
    std::atomic<std::uint32_t> depot_streams{0};  // depots exist below this stream
    // Bytes in every depot (written under their locks): a line of its own, so that the
    // hand-off's puts and takes do not take the lines every slow path reads from them.
    alignas(64) std::atomic<std::size_t> depot_held{0};

    // Slow-path counters (read-modify-writes: off the hit path).
    alignas(64) std::atomic<std::uint64_t> depot_hits{0}, moves{0}, steals{0}, misses{0}, bypasses{0}, pressure_retries{0};
    std::atomic<std::uint64_t> trims{0}, trimmed_blocks{0}, trimmed_bytes{0}, evictions{0};
    std::atomic<std::uint64_t> exact_fallbacks{0}, dropped{0};
    std::atomic<std::uint64_t> requested{0}, granted{0};
    // The counts of thread caches swept away.
    std::atomic<std::uint64_t> retired_hits{0}, retired_depot_hits{0}, retired_requested{0}, retired_granted{0};
  };

  /// The calling thread's cache of this instance; null when host memory ran out.
  [[gnu::always_inline]] detail::ThreadCache* local(State& st) noexcept {
    const detail::LastThreadCache& last = detail::last_thread_cache;
    if (last.serial == st.serial) [[likely]] return last.cache;
    return local_general(st);
  }

  [[gnu::noinline]] inline detail::ThreadCache* local_general(State& st) noexcept;

  /// Moves the blocks of exited threads' caches to the depots and forgets the caches.
  void sweep_orphans_locked(State& st) noexcept;

  /// Calls f(stream, class, entry) for every block of a claimed thread cache, emptying it.
  template <class F>
  static void drain(State& st, detail::ThreadCache& tc, F&& f) noexcept;

  /// The depot of stream `s`, made on first use; null when host memory ran out.
  static Depot* depot_of(State& st, std::uint32_t s) noexcept;

  /// Puts blocks into stream `s`'s depot, under one lock. Those beyond depot_bytes go
  /// back to the upstream first (a block the upstream refuses is kept after all), as
  /// does a block that cannot be kept because host memory ran out.
  /// `named`: `s` is the stream the current call names (the freed block's), so alive;
  /// otherwise an adopted stream's blocks are all kept (giving one back would call on a
  /// handle whose stream may be gone), and a depot that another stream wanted is marked
  /// only by a later named put.
  void depot_put(State& st, std::uint32_t s, std::uint32_t c, const detail::CachedEntry* e, std::size_t n = 1,
                 bool named = false) noexcept;

  /// Counts blocks of class `c` taken out of a depot (under its lock).
  static void depot_took(State& st, Depot& d, std::uint32_t c, std::size_t n) noexcept;

  /// Frees one cached block upstream (stream-ordered, on `s`, or on the first stream with
  /// `via_first`): unparks it, then frees it. False when the upstream refused the free: the block is parked again, `e` its
  /// new entry, for the caller to keep. True too when the block is gone from the layer
  /// otherwise (the upstream refused to unpark it, or to park it again: it stays live
  /// upstream).
  /// `via_first`: the device was synchronised since the block was cached, and its free is
  /// queued on the pool's first stream instead of `s` (an adopted stream that may be gone).
  bool give_back(State& st, std::uint32_t s, std::uint32_t c, detail::CachedEntry& e, bool via_first = false) noexcept;

  /// Whether `s` is a stream the pool adopted (StreamPool::owned): the layer calls on its
  /// handle only in a call that names it, or after synchronising the device.
  bool adopted(std::uint32_t s) noexcept {
    if constexpr (requires { (*find_streams(upstream()))->owned(StreamId{}); }) {
      return !(*find_streams(upstream()))->owned(StreamId{s});
    } else {
      return false;
    }
  }

  /// deallocate's rest, holding the claim: the thread's bins for `s` are not made yet,
  /// the bin is full (half of it moves to the depot first), or the thread keeps
  /// thread_bytes already (all its bins move to the depots first).
  [[gnu::noinline]] inline void keep_general(State& st, detail::ThreadCache* tc, std::uint32_t s, std::uint32_t c,
                                             const detail::CachedEntry& e) noexcept;

  /// allocate's rest: bad input and bypasses, then this stream's depot, another stream's
  /// completed blocks, the upstream, and a trim and retry under pressure.
  [[gnu::noinline]] inline result<DeviceBlock> allocate_general(std::size_t bytes, StreamId stream, AllocTag tag,
                                                                detail::ThreadCache* tc) noexcept;

  /// Adds `n` to a count: to the calling thread's own (a plain store on a line no other
  /// thread writes) when it has a cache, else to the shared one.
  static void count(detail::ThreadCache* tc, std::atomic<std::uint64_t> detail::ThreadCache::*mine,
                    std::atomic<std::uint64_t>& shared, std::uint64_t n = 1) noexcept;

  /// Cached block `e` as its next owner's, of `size` bytes on `stream` under `tag`:
  /// unparked upstream under that tag. Empty when the upstream refuses (`e` names no
  /// parked block: never while the layer's entries are right); the entry is then
  /// dropped, never handed out.
  std::optional<DeviceBlock> hand_out(const detail::CachedEntry& e, std::size_t size, StreamId stream,
                                      AllocTag tag) noexcept;

  /// Counts a cached entry the upstream refused to unpark, dropped.
  static void dropped(State& st) noexcept { st.dropped.fetch_add(1, std::memory_order_relaxed); }

  /// A block of class `c` from `stream`'s own depot, refilling the thread's bin with up
  /// to half a bin more.
  std::optional<DeviceBlock> take_own_depot(State& st, StreamId stream, std::uint32_t c, AllocTag tag,
                                            detail::ThreadCache* tc) noexcept;

  /// A block of thread-bin class `c` from another thread's bin for `stream`, claimed as
  /// trim claims a cache (the owner backs off to its slow path meanwhile), before a miss:
  /// a bin keeps its blocks from every other thread, and without this a thread would take
  /// new memory while another's bin holds an idle block of the class on the stream (the
  /// block was freed on `stream`, so it may be handed out there at once). Takes up to
  /// half of that bin (at most what take_own_depot takes): one block for the caller, the
  /// rest into the caller's bin (to the depot beyond its room). Sinks are left alone (see
  /// the header comment, "Frees by another thread").
  std::optional<DeviceBlock> take_from_threads(State& st, detail::ThreadCache* self, StreamId stream,
                                               std::uint32_t c, AllocTag tag) noexcept;

  /// How far above a miss's class evict_larger looks (8 classes: 4 times the size), so
  /// that the memory it frees is not much larger than the block placed in it.
  static constexpr std::uint32_t EVICT_CLASSES = 8;

  /// Before a miss of shared class `c` on `stream`: gives back the smallest block of that
  /// stream's depot from depot_larger_classes + 1 to EVICT_CLASSES classes above `c`
  /// (at most 4 times its size). The upstream frees it in stream order on `stream`, so
  /// the pool can place the new block in its memory at once, with no wait: the miss
  /// trades an idle block for the one it needs instead of adding one (see the header).
  void evict_larger(State& st, StreamId stream, std::uint32_t c) noexcept;

  /// Moves the calling thread's blocks of class `c` kept for other streams than `to` to
  /// their streams' depots, where take_across can mark them and, once their frees are
  /// complete, move them: a thread whose work changes streams reuses its own memory.
  void spill_other_bins(State& st, detail::ThreadCache* tc, std::uint32_t to, std::uint32_t c) noexcept;

  static constexpr std::uint32_t ALL_CLASSES = ~std::uint32_t{0};

  /// Moves a claimed thread cache's bins to their streams' depots, one depot lock per
  /// bin: those of class `c` (every class: ALL_CLASSES) of every stream but `keep`
  /// (CACHE_STREAMS: none kept).
  void spill_bins(State& st, detail::ThreadCache& tc, std::uint32_t keep, std::uint32_t c) noexcept;

  /// A block of class `c` from another stream's depot whose free is known complete,
  /// moved to `to`. Marks the depots it finds unmarked blocks in, for a later call.
  std::optional<DeviceBlock> take_across(State& st, StreamId to, std::uint32_t c, AllocTag tag) noexcept;

  /// Under d.mu: promotes the marked blocks once their event is complete, and marks the
  /// fresh ones when no mark is pending, if `may_record` (an event is recorded on `s`);
  /// else it notes that they are wanted (Depot::wanted). A driver error leaves the blocks
  /// where they are.
  void advance(Depot& d, StreamId s, bool may_record) noexcept;

  /// trim with the registry lock held.
  std::size_t trim_locked(State& st) noexcept;

  /// Bytes in every bin and depot (a moment's view), per class into `per_class` when
  /// given. The caller holds registry_mu (the list of thread caches).
  std::size_t cached_bytes_locked(std::vector<std::size_t>* per_class) const noexcept;

  std::unique_ptr<State> state_;
  std::uint32_t ordinal_ = 0;
};

}  // namespace xlogrt

// The members defined out of line (see the private section).
#include "xlogrt/resource/detail/cache_depot.hpp"
#include "xlogrt/resource/detail/cache_handoff.hpp"
#include "xlogrt/resource/detail/cache_reclaim.hpp"
#include "xlogrt/resource/detail/cached_impl.hpp"
