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
// half of it moves to S's depot, which every thread shares (under the depot's spin lock). An
// allocation on S takes from the thread's bin, else refills the bin from S's depot,
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
// Threads. The hit path of a thread that allocates and frees on its own stream touches
// only its own ThreadCache (detail/thread_cache.hpp) and the block's own slot in the
// upstream's table: no lock, and no read-modify-write on a line another thread writes,
// but the upstream block's own lock (taken by the recycle) and the owner's announcement
// of OwnerClaim (detail/cache_claim.hpp), both on lines no other thread writes in that
// pattern. A block freed by another thread than the one that allocated it goes to the
// freeing thread's bin and, batched, through the depot to the allocating one. Before a
// miss of a bin class, a thread takes an idle block of that class and stream from
// another thread's bin, claiming that cache as trim does (take_from_threads): a bin keeps
// its blocks from every other thread, and without this each thread would end up holding
// its own set of every class on every stream.
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
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/detail/decorator.hpp"
#include "xlogrt/resource/detail/nvtx_marks.hpp"
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
  static result<Cached> create(Upstream upstream, CachedOptions options = {}) noexcept {
    auto bad = [](const std::string& why) { return error{errc::invalid_argument, "CachedOptions: " + why}; };
    if (options.bin_blocks < 1 || options.bin_blocks > detail::MAX_BIN_BLOCKS) {
      return bad("bin_blocks is " + std::to_string(options.bin_blocks) + ", not 1 to " +
                 std::to_string(detail::MAX_BIN_BLOCKS));
    }
    if (options.bin_bytes == 0) return bad("bin_bytes is 0");
    if (options.depot_larger_classes > MAX_LARGER_CLASSES) {
      return bad("depot_larger_classes is " + std::to_string(options.depot_larger_classes) + ", not 0 to " +
                 std::to_string(MAX_LARGER_CLASSES));
    }
    if (options.max_block_bytes > MAX_CLASS_BYTES) {
      return bad("max_block_bytes is " + std::to_string(options.max_block_bytes) + ", above 1 TiB");
    }
    if (options.enabled && options.nvtx_marks && detail::nvtx_mem_api.load(std::memory_order_acquire) == nullptr) {
      return bad("nvtx_marks is on, but the program has no NVTX marks: include <xlogrt/resource/nvtx_marks.hpp> "
                 "in one of its translation units");
    }
    try {
      return Cached(std::move(upstream), options);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted building a Cached layer"};
    }
  }
  Cached(Cached&&) noexcept = default;
  Cached& operator=(Cached&&) = delete;
  ~Cached() {
    if (!state_) return;
    (void)trim();
    for (auto& d : state_->depots) {
      Depot* p = d.load(std::memory_order_relaxed);
      if (p != nullptr && p->has_event) (void)upstream().driver().event_destroy(p->event);
    }
  }

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
          detail::bump(tc->hits);
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
    depot_put(st, s, c, &e);
    return ok();
  }

  std::size_t bytes_outstanding() const noexcept {
    const std::size_t all = upstream().bytes_outstanding();
    std::size_t cached = 0;
    {
      std::lock_guard lock(state_->registry_mu);
      cached = cached_bytes_locked(nullptr);
    }
    return all > cached ? all - cached : 0;
  }
  std::uint32_t device_ordinal() const noexcept { return ordinal_; }

  /// Gives every cached block back to the upstream: stream-ordered frees, each on the
  /// block's stream, whose bytes the upstream counts until its reap_pending. Returns the
  /// bytes given back. A block the upstream refuses to free (a driver error) stays cached.
  std::size_t trim() noexcept {
    State& st = *state_;
    std::lock_guard lock(st.registry_mu);
    return trim_locked(st);
  }

  CacheStats stats() const {
    State& st = *state_;
    CacheStats s;
    s.cached_bytes_per_class.assign(st.classes, 0);
    {
      std::lock_guard lock(st.registry_mu);
      s.hits = st.retired_hits.load(std::memory_order_relaxed);
      s.requested_bytes = st.retired_requested.load(std::memory_order_relaxed);
      s.granted_bytes = st.retired_granted.load(std::memory_order_relaxed);
      s.depot_hits = st.retired_depot_hits.load(std::memory_order_relaxed);
      for (const auto& tc : st.caches) {
        s.hits += tc->hits.load(std::memory_order_relaxed);
        s.depot_hits += tc->depot_hits.load(std::memory_order_relaxed);
        s.requested_bytes += tc->requested.load(std::memory_order_relaxed);
        s.granted_bytes += tc->granted.load(std::memory_order_relaxed);
      }
      s.cached_bytes = cached_bytes_locked(&s.cached_bytes_per_class);
    }
    s.depot_hits += st.depot_hits.load(std::memory_order_relaxed);
    s.cross_stream_moves = st.moves.load(std::memory_order_relaxed);
    s.from_other_threads = st.steals.load(std::memory_order_relaxed);
    s.misses = st.misses.load(std::memory_order_relaxed);
    s.bypasses = st.bypasses.load(std::memory_order_relaxed);
    s.pressure_retries = st.pressure_retries.load(std::memory_order_relaxed);
    s.trims = st.trims.load(std::memory_order_relaxed);
    s.trimmed_blocks = st.trimmed_blocks.load(std::memory_order_relaxed);
    s.trimmed_bytes = st.trimmed_bytes.load(std::memory_order_relaxed);
    s.evictions = st.evictions.load(std::memory_order_relaxed);
    s.exact_fallbacks = st.exact_fallbacks.load(std::memory_order_relaxed);
    s.dropped_blocks = st.dropped.load(std::memory_order_relaxed);
    s.requested_bytes += st.requested.load(std::memory_order_relaxed);
    s.granted_bytes += st.granted.load(std::memory_order_relaxed);
    return s;
  }

  const CachedOptions& options() const noexcept { return state_->options; }

 private:
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
  struct Depot {
    explicit Depot(std::uint32_t classes)
        : fresh(classes), marked(classes), done(classes), count(new std::atomic<std::uint32_t>[classes]{}) {}
    detail::SpinLock mu;
    event_t event{};
    bool has_event = false;  // `event` was created
    bool pending = false;    // `event` marks the `marked` lists and is not known complete
    std::vector<std::vector<detail::CachedEntry>> fresh, marked, done;
    std::unique_ptr<std::atomic<std::uint32_t>[]> count;  // blocks of each class here; written under mu
  };

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
    std::atomic<std::size_t> depot_held{0};       // bytes in every depot (written under their locks)

    // Slow-path counters (read-modify-writes: off the hit path).
    std::atomic<std::uint64_t> depot_hits{0}, moves{0}, steals{0}, misses{0}, bypasses{0}, pressure_retries{0};
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

  [[gnu::noinline]] detail::ThreadCache* local_general(State& st) noexcept {
    if (detail::last_thread_cache.exited) return nullptr;  // in the thread's own exit
    try {
      auto& mine = detail::thread_caches.mine;
      std::erase_if(mine, [](const auto& c) { return c->detached.load(std::memory_order_acquire); });
      detail::ThreadCache* found = nullptr;
      for (const auto& c : mine) {
        if (c->serial == st.serial) found = c.get();
      }
      if (found == nullptr) {
        auto made = std::make_shared<detail::ThreadCache>(st.serial, st.thread_classes);
        {
          std::lock_guard lock(st.registry_mu);
          sweep_orphans_locked(st);
          st.caches.push_back(made);
        }
        mine.push_back(made);
        found = made.get();
      }
      detail::last_thread_cache = {st.serial, found};
      return found;
    } catch (...) {
      return nullptr;
    }
  }

  /// Moves the blocks of exited threads' caches to the depots and forgets the caches.
  void sweep_orphans_locked(State& st) noexcept {
    std::erase_if(st.caches, [&](const std::shared_ptr<detail::ThreadCache>& tc) {
      if (!tc->orphaned.load(std::memory_order_acquire)) return false;
      tc->claim.claim();
      drain(st, *tc, [&](std::uint32_t s, std::uint32_t c, const detail::CachedEntry& e) { depot_put(st, s, c, &e); });
      st.retired_hits.fetch_add(tc->hits.load(std::memory_order_relaxed), std::memory_order_relaxed);
      st.retired_depot_hits.fetch_add(tc->depot_hits.load(std::memory_order_relaxed), std::memory_order_relaxed);
      st.retired_requested.fetch_add(tc->requested.load(std::memory_order_relaxed), std::memory_order_relaxed);
      st.retired_granted.fetch_add(tc->granted.load(std::memory_order_relaxed), std::memory_order_relaxed);
      tc->detached.store(true, std::memory_order_release);
      tc->claim.release();
      return true;
    });
  }

  /// Calls f(stream, class, entry) for every block of a claimed thread cache, emptying it.
  template <class F>
  static void drain(State& st, detail::ThreadCache& tc, F&& f) noexcept {
    for (std::uint32_t s = 0; s < detail::CACHE_STREAMS; ++s) {
      detail::CacheBin* bins = tc.streams[s].load(std::memory_order_acquire);
      if (bins == nullptr) continue;
      for (std::uint32_t c = 0; c < st.thread_classes; ++c) {
        const std::uint32_t n = bins[c].n.load(std::memory_order_relaxed);
        for (std::uint32_t i = 0; i < n; ++i) f(s, c, bins[c].items[i]);
        bins[c].n.store(0, std::memory_order_relaxed);
      }
    }
    tc.held.store(0, std::memory_order_relaxed);
  }

  /// The depot of stream `s`, made on first use; null when host memory ran out.
  static Depot* depot_of(State& st, std::uint32_t s) noexcept {
    Depot* d = st.depots[s].load(std::memory_order_acquire);
    if (d != nullptr) [[likely]] return d;
    std::lock_guard lock(st.depot_make_mu);
    d = st.depots[s].load(std::memory_order_relaxed);
    if (d != nullptr) return d;
    try {
      d = new Depot(st.classes);
    } catch (...) {
      return nullptr;
    }
    st.depots[s].store(d, std::memory_order_release);
    if (st.depot_streams.load(std::memory_order_relaxed) <= s) st.depot_streams.store(s + 1, std::memory_order_release);
    return d;
  }

  /// Puts blocks into stream `s`'s depot, under one lock. Those beyond depot_bytes go
  /// back to the upstream first (a block the upstream refuses is kept after all), as
  /// does a block that cannot be kept because host memory ran out.
  void depot_put(State& st, std::uint32_t s, std::uint32_t c, const detail::CachedEntry* e, std::size_t n = 1) noexcept {
    const std::size_t size = detail::class_bytes(c);
    // A soft bound: puts racing each other may pass it by their own blocks.
    const std::size_t held = st.depot_held.load(std::memory_order_relaxed);
    const std::size_t fit = held >= st.options.depot_bytes ? 0 : std::min(n, (st.options.depot_bytes - held) / size);
    // Kept: `refused` (a block beyond the bound whose free the upstream refused, parked
    // again), then e[from, n).
    std::optional<detail::CachedEntry> refused;
    std::size_t from = 0;
    while (from < n - fit && !refused) {
      detail::CachedEntry x = e[from++];
      if (!give_back(st, s, c, x)) refused = x;
    }
    std::size_t i = from, kept = 0;
    if (Depot* d = depot_of(st, s)) {
      std::lock_guard lock(d->mu);
      try {
        if (refused) {
          d->fresh[c].push_back(*refused);
          refused.reset();
          ++kept;
        }
        for (; i < n; ++i, ++kept) d->fresh[c].push_back(e[i]);
      } catch (...) {
      }
      d->count[c].store(d->count[c].load(std::memory_order_relaxed) + static_cast<std::uint32_t>(kept),
                        std::memory_order_relaxed);
    }
    st.depot_held.fetch_add(kept * size, std::memory_order_relaxed);
    if (refused) (void)give_back(st, s, c, *refused);  // host memory ran out: not kept
    for (; i < n; ++i) {
      detail::CachedEntry x = e[i];
      (void)give_back(st, s, c, x);
    }
  }

  /// Counts blocks of class `c` taken out of a depot (under its lock).
  static void depot_took(State& st, Depot& d, std::uint32_t c, std::size_t n) noexcept {
    d.count[c].store(d.count[c].load(std::memory_order_relaxed) - static_cast<std::uint32_t>(n), std::memory_order_relaxed);
    st.depot_held.fetch_sub(n * detail::class_bytes(c), std::memory_order_relaxed);
  }

  /// Frees one cached block upstream (stream-ordered, on `s`): unparks it, then frees
  /// it. False when the upstream refused the free: the block is parked again, `e` its
  /// new entry, for the caller to keep. True too when the block is gone from the layer
  /// otherwise (the upstream refused to unpark it, or to park it again: it stays live
  /// upstream).
  bool give_back(State& st, std::uint32_t s, std::uint32_t c, detail::CachedEntry& e) noexcept {
    const std::size_t size = detail::class_bytes(c);
    if (st.marks.on()) st.marks.released(e.ptr);
    if (!upstream().unpark_block(e.id, e.tag)) [[unlikely]] {
      dropped(st);
      return true;
    }
    DeviceBlock b{e.ptr, size, StreamId{s}, ordinal_, e.tag, e.id};
    if (!upstream().deallocate(std::move(b))) [[unlikely]] {
      auto again = upstream().recycle_block(b, StreamId{s}, Recycle::park);
      if (!again) {
        dropped(st);
        return true;
      }
      e = detail::CachedEntry{again->ptr(), again->id(), again->tag()};
      if (st.marks.on()) {  // still cached: watched again
        st.marks.fresh(e.ptr, size);
        st.marks.cached(e.ptr);
      }
      return false;
    }
    st.trimmed_blocks.fetch_add(1, std::memory_order_relaxed);
    st.trimmed_bytes.fetch_add(size, std::memory_order_relaxed);
    return true;
  }

  /// deallocate's rest, holding the claim: the thread's bins for `s` are not made yet,
  /// the bin is full (half of it moves to the depot first), or the thread keeps
  /// thread_bytes already (all its bins move to the depots first).
  [[gnu::noinline]] void keep_general(State& st, detail::ThreadCache* tc, std::uint32_t s, std::uint32_t c,
                                      const detail::CachedEntry& e) noexcept {
    const std::size_t size = detail::class_bytes(c);
    if (tc->held.load(std::memory_order_relaxed) + size > st.options.thread_bytes) {
      spill_bins(st, *tc, detail::CACHE_STREAMS, ALL_CLASSES);
      if (size > st.options.thread_bytes) return depot_put(st, s, c, &e);
    }
    detail::CacheBin* bins = tc->bins_of(s);
    if (bins == nullptr) return depot_put(st, s, c, &e);
    detail::CacheBin& bin = bins[c];
    std::uint32_t n = bin.n.load(std::memory_order_relaxed);
    if (n >= st.bin_cap[c]) {
      const std::uint32_t keep = n / 2;
      depot_put(st, s, c, &bin.items[keep], n - keep);
      tc->held.store(tc->held.load(std::memory_order_relaxed) - (n - keep) * size, std::memory_order_relaxed);
      n = keep;
    }
    bin.items[n] = e;
    bin.n.store(n + 1, std::memory_order_relaxed);
    detail::bump(tc->held, size);
  }

  /// allocate's rest: bad input and bypasses, then this stream's depot, another stream's
  /// completed blocks, the upstream, and a trim and retry under pressure.
  [[gnu::noinline]] result<DeviceBlock> allocate_general(std::size_t bytes, StreamId stream, AllocTag tag,
                                                         detail::ThreadCache* tc) noexcept {
    State& st = *state_;
    const std::uint32_t c = detail::class_of(bytes);
    if (bytes == 0 || c >= st.classes || stream.value >= detail::CACHE_STREAMS) {
      if (bytes != 0) st.bypasses.fetch_add(1, std::memory_order_relaxed);
      return upstream().allocate(bytes, stream, tag);  // which names bad input
    }
    if (auto h = upstream().stream_handle(stream); !h) return std::move(h).error();
    const std::size_t size = detail::class_bytes(c);
    std::optional<DeviceBlock> got = take_own_depot(st, stream, c, tag, tc);
    if (c >= st.thread_classes) {
      // Larger classes from the stream's own depot only: taken from other streams, larger
      // blocks leave the streams that use them, which then allocate more of them.
      const std::uint32_t last = std::min(c + st.larger_classes, st.classes - 1);
      for (std::uint32_t up = c + 1; !got && up <= last; ++up) got = take_own_depot(st, stream, up, tag, nullptr);
    }
    if (got) {
      count(tc, &detail::ThreadCache::depot_hits, st.depot_hits);
    } else if (spill_other_bins(st, tc, stream.value, c); (got = take_across(st, stream, c, tag)).has_value()) {
      st.moves.fetch_add(1, std::memory_order_relaxed);
    } else if (c < st.thread_classes && (got = take_from_threads(st, tc, stream, c, tag)).has_value()) {
      st.steals.fetch_add(1, std::memory_order_relaxed);
    }
    if (got) {
      if (st.marks.on()) st.marks.handed(got->ptr(), got->bytes());
    } else {
      if (c >= st.thread_classes) evict_larger(st, stream, c);
      auto b = upstream().allocate(size, stream, tag);
      auto pressure = [](const auto& r) {
        return !r && (r.error().code() == errc::out_of_memory || r.error().code() == errc::out_of_budget);
      };
      if (pressure(b)) {
        // No refusal the layer causes: every cached block goes back, the class is tried
        // again, and then the request itself, unrounded (a block of that size is not
        // cached: its free goes straight to the upstream).
        if (trim() > 0) {
          st.pressure_retries.fetch_add(1, std::memory_order_relaxed);
          b = upstream().allocate(size, stream, tag);
        }
        if (pressure(b) && size != bytes) {
          b = upstream().allocate(bytes, stream, tag);
          if (b) st.exact_fallbacks.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (!b) return b;
      st.misses.fetch_add(1, std::memory_order_relaxed);
      if (st.marks.on()) st.marks.fresh(b->ptr(), b->bytes());
      got.emplace(std::move(*b));
    }
    count(tc, &detail::ThreadCache::requested, st.requested, bytes);
    count(tc, &detail::ThreadCache::granted, st.granted, got->bytes());
    return std::move(*got);
  }

  /// Adds `n` to a count: to the calling thread's own (a plain store on a line no other
  /// thread writes) when it has a cache, else to the shared one.
  static void count(detail::ThreadCache* tc, std::atomic<std::uint64_t> detail::ThreadCache::*mine,
                    std::atomic<std::uint64_t>& shared, std::uint64_t n = 1) noexcept {
    if (tc != nullptr) {
      detail::bump(tc->*mine, n);
    } else {
      shared.fetch_add(n, std::memory_order_relaxed);
    }
  }

  /// Cached block `e` as its next owner's, of `size` bytes on `stream` under `tag`:
  /// unparked upstream under that tag. Empty when the upstream refuses (`e` names no
  /// parked block: never while the layer's entries are right); the entry is then
  /// dropped, never handed out.
  std::optional<DeviceBlock> hand_out(const detail::CachedEntry& e, std::size_t size, StreamId stream,
                                      AllocTag tag) noexcept {
    if (!upstream().unpark_block(e.id, tag)) [[unlikely]] {
      dropped(*state_);
      return std::nullopt;
    }
    return DeviceBlock{e.ptr, size, stream, ordinal_, tag, e.id};
  }

  /// Counts a cached entry the upstream refused to unpark, dropped.
  static void dropped(State& st) noexcept { st.dropped.fetch_add(1, std::memory_order_relaxed); }

  /// A block of class `c` from `stream`'s own depot, refilling the thread's bin with up
  /// to half a bin more.
  std::optional<DeviceBlock> take_own_depot(State& st, StreamId stream, std::uint32_t c, AllocTag tag,
                                            detail::ThreadCache* tc) noexcept {
    if (stream.value >= st.depot_streams.load(std::memory_order_acquire)) return std::nullopt;
    Depot* d = st.depots[stream.value].load(std::memory_order_acquire);
    if (d == nullptr || d->count[c].load(std::memory_order_relaxed) == 0) return std::nullopt;
    const bool mine = tc != nullptr && c < st.thread_classes && tc->claim.enter();  // a bin to refill
    detail::CacheBin* bins = mine ? tc->bins_of(stream.value) : nullptr;
    std::optional<detail::CachedEntry> e;
    {
      std::lock_guard lock(d->mu);
      // One for the caller, and up to half a bin for the next calls, as far as it has room.
      const std::uint32_t cap = st.bin_cap[c];
      const std::uint32_t room = bins != nullptr ? cap - std::min(bins[c].n.load(std::memory_order_relaxed), cap) : 0;
      std::uint32_t want = 1 + std::min(cap / 2, room);
      // Any list will do: every block here was freed on this stream.
      for (auto* list : {&d->done[c], &d->marked[c], &d->fresh[c]}) {
        while (want != 0 && !list->empty()) {
          const detail::CachedEntry x = list->back();
          list->pop_back();
          depot_took(st, *d, c, 1);
          --want;
          if (!e) {
            e = x;
          } else {
            const std::uint32_t n = bins[c].n.load(std::memory_order_relaxed);
            bins[c].items[n] = x;
            bins[c].n.store(n + 1, std::memory_order_relaxed);
            detail::bump(tc->held, detail::class_bytes(c));
          }
        }
      }
    }
    if (mine) tc->claim.leave();
    if (!e) return std::nullopt;
    return hand_out(*e, detail::class_bytes(c), stream, tag);
  }

  /// A block of thread-bin class `c` from another thread's bin for `stream`, claimed as
  /// trim claims a cache (the owner backs off to its slow path meanwhile), before a miss:
  /// a bin keeps its blocks from every other thread, and without this a thread would take
  /// new memory while another's bin holds an idle block of the class on the stream (the
  /// block was freed on `stream`, so it may be handed out there at once).
  std::optional<DeviceBlock> take_from_threads(State& st, const detail::ThreadCache* self, StreamId stream,
                                               std::uint32_t c, AllocTag tag) noexcept {
    std::optional<detail::CachedEntry> e;
    {
      std::lock_guard lock(st.registry_mu);
      for (const auto& other : st.caches) {
        if (other.get() == self) continue;
        detail::CacheBin* bins = other->streams[stream.value].load(std::memory_order_acquire);
        if (bins == nullptr || bins[c].n.load(std::memory_order_relaxed) == 0) continue;  // a moment's view
        other->claim.claim();
        if (const std::uint32_t n = bins[c].n.load(std::memory_order_relaxed); n != 0) {
          e = other->pop(bins[c], n, detail::class_bytes(c));
        }
        other->claim.release();
        if (e) break;
      }
    }
    if (!e) return std::nullopt;
    return hand_out(*e, detail::class_bytes(c), stream, tag);
  }

  /// How far above a miss's class evict_larger looks (8 classes: 4 times the size), so
  /// that the memory it frees is not much larger than the block placed in it.
  static constexpr std::uint32_t EVICT_CLASSES = 8;

  /// Before a miss of shared class `c` on `stream`: gives back the smallest block of that
  /// stream's depot from depot_larger_classes + 1 to EVICT_CLASSES classes above `c`
  /// (at most 4 times its size). The upstream frees it in stream order on `stream`, so
  /// the pool can place the new block in its memory at once, with no wait: the miss
  /// trades an idle block for the one it needs instead of adding one (see the header).
  void evict_larger(State& st, StreamId stream, std::uint32_t c) noexcept {
    if (stream.value >= st.depot_streams.load(std::memory_order_acquire)) return;
    Depot* d = st.depots[stream.value].load(std::memory_order_acquire);
    if (d == nullptr) return;
    const std::uint32_t last = std::min(c + EVICT_CLASSES, st.classes - 1);
    for (std::uint32_t k = c + st.larger_classes + 1; k <= last; ++k) {
      if (d->count[k].load(std::memory_order_relaxed) == 0) continue;
      std::optional<detail::CachedEntry> e;
      {
        std::lock_guard lock(d->mu);
        for (auto* list : {&d->fresh[k], &d->marked[k], &d->done[k]}) {
          if (list->empty()) continue;
          e = list->back();
          list->pop_back();
          depot_took(st, *d, k, 1);
          break;
        }
      }
      if (!e) continue;
      if (give_back(st, stream.value, k, *e)) {
        st.evictions.fetch_add(1, std::memory_order_relaxed);
      } else {
        depot_put(st, stream.value, k, &*e);  // refused: kept
      }
      return;
    }
  }

  /// Moves the calling thread's blocks of class `c` kept for other streams than `to` to
  /// their streams' depots, where take_across can mark them and, once their frees are
  /// complete, move them: a thread whose work changes streams reuses its own memory.
  void spill_other_bins(State& st, detail::ThreadCache* tc, std::uint32_t to, std::uint32_t c) noexcept {
    if (tc == nullptr || c >= st.thread_classes || !tc->claim.enter()) return;
    spill_bins(st, *tc, to, c);
    tc->claim.leave();
  }

  static constexpr std::uint32_t ALL_CLASSES = ~std::uint32_t{0};

  /// Moves a claimed thread cache's bins to their streams' depots, one depot lock per
  /// bin: those of class `c` (every class: ALL_CLASSES) of every stream but `keep`
  /// (CACHE_STREAMS: none kept).
  void spill_bins(State& st, detail::ThreadCache& tc, std::uint32_t keep, std::uint32_t c) noexcept {
    const std::uint32_t first = c == ALL_CLASSES ? 0 : c;
    const std::uint32_t last = c == ALL_CLASSES ? st.thread_classes : c + 1;
    for (std::uint32_t s = 0; s < detail::CACHE_STREAMS; ++s) {
      detail::CacheBin* bins = s == keep ? nullptr : tc.streams[s].load(std::memory_order_relaxed);
      if (bins == nullptr) continue;
      for (std::uint32_t k = first; k < last; ++k) {
        const std::uint32_t n = bins[k].n.load(std::memory_order_relaxed);
        if (n == 0) continue;
        depot_put(st, s, k, bins[k].items.data(), n);
        bins[k].n.store(0, std::memory_order_relaxed);
        tc.held.store(tc.held.load(std::memory_order_relaxed) - n * detail::class_bytes(k), std::memory_order_relaxed);
      }
    }
  }

  /// A block of class `c` from another stream's depot whose free is known complete,
  /// moved to `to`. Marks the depots it finds unmarked blocks in, for a later call.
  std::optional<DeviceBlock> take_across(State& st, StreamId to, std::uint32_t c, AllocTag tag) noexcept {
    const std::uint32_t n = st.depot_streams.load(std::memory_order_acquire);
    for (std::uint32_t s = 0; s < n; ++s) {
      if (s == to.value) continue;
      Depot* d = st.depots[s].load(std::memory_order_acquire);
      if (d == nullptr || d->count[c].load(std::memory_order_relaxed) == 0) continue;
      std::optional<detail::CachedEntry> e;
      {
        std::lock_guard lock(d->mu);
        advance(*d, StreamId{s});
        if (!d->done[c].empty()) {
          e = d->done[c].back();
          d->done[c].pop_back();
          depot_took(st, *d, c, 1);
        }
      }
      if (!e) continue;
      DeviceBlock b{e->ptr, detail::class_bytes(c), StreamId{s}, ordinal_, e->tag, e->id};
      auto moved = upstream().recycle_block(b, to, Recycle::parked);
      if (!moved) {
        depot_put(st, s, c, &*e);
        continue;
      }
      return hand_out(detail::CachedEntry{moved->ptr(), moved->id(), moved->tag()}, moved->bytes(), to, tag);
    }
    return std::nullopt;
  }

  /// Under d.mu: promotes the marked blocks once their event is complete, and marks the
  /// fresh ones when no mark is pending. A driver error leaves the blocks where they are.
  void advance(Depot& d, StreamId s) noexcept {
    auto& drv = upstream().driver();
    if (d.pending) {
      if constexpr (Protocol::wait_for_completion) {
        auto q = drv.event_query(d.event);
        if (!q || !*q) return;
      }
      for (std::size_t c = 0; c < d.marked.size(); ++c) {
        auto& from = d.marked[c];
        d.done[c].insert(d.done[c].end(), from.begin(), from.end());
        from.clear();
      }
      d.pending = false;
    }
    bool any = false;
    for (const auto& f : d.fresh) any = any || !f.empty();
    if (!any) return;
    if (!d.has_event) {
      if (!upstream().make_current()) return;
      auto e = drv.event_create();
      if (!e) return;
      d.event = *e;
      d.has_event = true;
    }
    auto h = upstream().stream_handle(s);
    if (!h || !drv.event_record(d.event, *h)) return;
    for (std::size_t c = 0; c < d.fresh.size(); ++c) {
      d.marked[c].insert(d.marked[c].end(), d.fresh[c].begin(), d.fresh[c].end());
      d.fresh[c].clear();
    }
    d.pending = true;
    if constexpr (!Protocol::wait_for_completion) advance(d, s);
  }

  /// trim with the registry lock held.
  std::size_t trim_locked(State& st) noexcept {
    st.trims.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t before = st.trimmed_bytes.load(std::memory_order_relaxed);
    sweep_orphans_locked(st);
    for (const auto& tc : st.caches) {
      tc->claim.claim();
      drain(st, *tc, [&](std::uint32_t s, std::uint32_t c, const detail::CachedEntry& e) {
        detail::CachedEntry x = e;
        if (!give_back(st, s, c, x)) depot_put(st, s, c, &x);
      });
      tc->claim.release();
    }
    // Each depot's lists are taken under its lock and freed outside it; a block the
    // upstream refuses goes back as a fresh one.
    const std::uint32_t n = st.depot_streams.load(std::memory_order_acquire);
    std::vector<detail::CachedEntry> taken;
    for (std::uint32_t s = 0; s < n; ++s) {
      Depot* d = st.depots[s].load(std::memory_order_acquire);
      if (d == nullptr) continue;
      for (std::uint32_t c = 0; c < st.classes; ++c) {
        for (int which = 0; which < 3 && d->count[c].load(std::memory_order_relaxed) != 0; ++which) {
          {
            std::lock_guard lock(d->mu);
            auto& list = which == 0 ? d->fresh[c] : which == 1 ? d->marked[c] : d->done[c];
            taken.clear();
            taken.swap(list);  // no allocation: the list keeps taken's old (empty) buffer
            depot_took(st, *d, c, taken.size());
          }
          for (detail::CachedEntry& e : taken) {
            if (!give_back(st, s, c, e)) depot_put(st, s, c, &e);
          }
        }
      }
    }
    return static_cast<std::size_t>(st.trimmed_bytes.load(std::memory_order_relaxed) - before);
  }

  /// Bytes in every bin and depot (a moment's view), per class into `per_class` when
  /// given. The caller holds registry_mu (the list of thread caches).
  std::size_t cached_bytes_locked(std::vector<std::size_t>* per_class) const noexcept {
    State& st = *state_;
    std::size_t sum = 0;
    auto add = [&](std::uint32_t c, std::size_t blocks) {
      sum += blocks * detail::class_bytes(c);
      if (per_class) (*per_class)[c] += blocks * detail::class_bytes(c);
    };
    for (const auto& tc : st.caches) {
      for (const auto& sb : tc->streams) {
        const detail::CacheBin* bins = sb.load(std::memory_order_acquire);
        if (bins == nullptr) continue;
        for (std::uint32_t c = 0; c < st.thread_classes; ++c) add(c, bins[c].n.load(std::memory_order_relaxed));
      }
    }
    const std::uint32_t n = st.depot_streams.load(std::memory_order_acquire);
    for (std::uint32_t s = 0; s < n; ++s) {
      const Depot* d = st.depots[s].load(std::memory_order_acquire);
      if (d == nullptr) continue;
      for (std::uint32_t c = 0; c < st.classes; ++c) add(c, d->count[c].load(std::memory_order_relaxed));
    }
    return sum;
  }

  std::unique_ptr<State> state_;
  std::uint32_t ordinal_ = 0;
};

}  // namespace xlogrt
