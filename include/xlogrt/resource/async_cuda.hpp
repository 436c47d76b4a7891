// SPDX-License-Identifier: Apache-2.0
#pragma once

// AsyncCuda<D>: stream-ordered allocation from the device's memory pool, with
// cross-stream use tracking.

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/resource/block_table.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/resource/detail/deferred_frees.hpp"
#include "xlogrt/resource/detail/poll_cadence.hpp"
#include "xlogrt/resource/detail/recycle_alone.hpp"
#include "xlogrt/resource/detail/request.hpp"
#include "xlogrt/resource/detail/slot_tag.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

struct AsyncCudaOptions {
  /// Bytes the device's pool keeps cached across synchronisations
  /// (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD). The default keeps everything, as RMM's and
  /// PyTorch's caching allocators do; lower it to give memory back to other processes.
  std::uint64_t release_threshold = std::numeric_limits<std::uint64_t>::max();
  /// Events created up front, so the tracking hot path never creates one.
  std::size_t reserve_events = 64;
  /// Requests of up to this many bytes come from a pool of their own (cuMemPoolCreate,
  /// with the same release threshold), the rest from the device's default pool; 0: one
  /// pool for all. A caching layer above keeps small blocks for long: in the pool of the
  /// large ones each such block would split the free range it sits in, and the pool
  /// would grow to place large requests it could otherwise have placed there. Needs a
  /// driver with mempool_create (CudaDriver, SimDriver).
  std::size_t small_pool_bytes = 0;
};

/// The production base resource: cuMemAllocFromPoolAsync / cuMemFreeAsync on the
/// device's default pool, and cross-stream use tracking, so that no block is freed (and
/// handed to someone else) while another stream still uses it.
///
/// Accounting: bytes_outstanding() counts a block from allocate until reap_pending() has
/// seen its queued free complete: the block table's live bytes plus each stream's
/// queued-but-not-retired bytes. deallocate raises its stream's `queued` count (in the
/// calling thread's row); reap_pending sums the rows, synchronises the stream (the device,
/// for adopted streams), and raises `retired` to what it read (a free queued after the
/// read stays pending; concurrent reapers never retire twice). poll_pending retires frees
/// without waiting: it records an event on each stream with frees queued since its last
/// look and, on a later look, retires what was queued before an event the device has
/// reached. deallocate runs it every 256 frees of a thread and every 32 MiB a thread frees
/// (detail::PollCadence), so a program that never reaps still sees true figures;
/// retired_bytes() is the running total of both, for a layer above (Budget) that credits
/// what comes back.
///
/// Adopted streams (StreamPool::owned is false) belong to a caller who may destroy them
/// at any time, and a call on a destroyed stream's handle is undefined in CUDA (it
/// crashes in cuEventRecord). So the resource calls on an adopted stream's handle only in
/// a call that names the stream (allocate and deallocate on it, a use on it): the poll
/// records its event there only when a free on that stream polls, and reap waits for its
/// frees with one device synchronisation.
///
/// Tracking, per block (state kept in the block table, under the block's own lock):
/// - the last write: the allocation itself on the alloc stream A at first, then the
///   latest write, each with the stream it ran on;
/// - one read per distinct stream since that write.
/// prepare_block_use(id, s, access) makes s wait for the last write when it ran on
/// another stream (once per stream and write, for streams 0-31; again each time for
/// higher ones), and, when `access` writes, for every read
/// on another stream. finish_block_use(id, s, access) records the use. A use's event is
/// recorded on its stream at finish — except on the alloc stream A, whose uses are
/// already ordered before the free: their event is recorded only when another stream
/// must wait for them (so single-stream code makes no event call at all). deallocate
/// makes A wait for every use on another stream, then queues the free on A.
/// Events come from the resource's EventPool and are re-recorded in place; a block keeps
/// the events of its ended uses for its next ones and gives them all back when freed.
///
/// Same-stream fast path. While every use of a block since its last write ran on the
/// alloc stream and none has been recorded ("quiet"), a use on the alloc stream needs
/// neither a wait nor an event nor any change of state: prepare and finish then only
/// check the id, without a lock (BlockTable::peek reads the block's `quiet_stream`
/// atomic, which every locked change of the state refreshes).
///
/// Contexts: every driver call on the hot paths (allocate, deallocate, prepare, finish)
/// names its stream, pool or event, which carry their context, so these paths do not
/// make the device's context current (that would cost a cuCtxGetCurrent per call); the
/// calls that need a current context (creating an event when the pool is empty, the
/// pool's attributes) make it current first. test/resource/test_conformance_gpu.cpp
/// checks this on a real GPU from a thread that has no current context at all.
///
/// Stream capture (CUDA graphs). No call of this resource makes a driver call that would
/// invalidate a capture: poll_pending and reap_pending leave a capturing stream alone (its
/// queued frees stay pending until the capture ends), and while a capture window is open
/// (detail::capture_windows_open: a GraphPools layer above has begun allocating to a graph
/// pool) a free whose alloc stream captures is deferred, the block staying live, and queued
/// by the first poll_pending or reap_pending that finds the capture ended: queued inside the
/// capture, the free would become a node of the graph and free the memory at every replay.
/// An allocation on a capturing stream is a graph memory node (cuMemAllocFromPoolAsync
/// under capture); a layer above routes those to a graph pool instead (GraphPools).
///
/// Thread-safe. Calls on different blocks take different locks; allocations by different
/// threads use different shards of the block table; the live-byte counts are per shard,
/// and each thread counts its queued frees (per stream) in a row of its own. Move-only; a
/// moved-from AsyncCuda may only be destroyed.
template <Driver D>
class AsyncCuda {
 public:
  using driver_type = D;
  using stream_t = typename D::stream_t;
  using event_t = typename D::event_t;
  static constexpr bool supports_block_use_tracking = true;
  /// Whether the driver creates memory pools, which AsyncCudaOptions::small_pool_bytes needs.
  static constexpr bool creates_pools =
      requires(D& d, typename D::device_t dev, typename D::mempool_t p) { d.mempool_create(dev); d.mempool_destroy(p); };

  /// Errors: driver_error (status not_supported) when the device has no memory pools;
  /// driver errors setting the release threshold or reserving events.
  static result<AsyncCuda> create(std::shared_ptr<StreamPool<D>> streams,
                                  AsyncCudaOptions options = {}) noexcept;

  /// The common case, on a thread with a block table shard of its own, makes no result
  /// but the one it returns; the rest (bad input, a driver failure, a new slot) is out of
  /// line.
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (!detail::valid_request(*streams_, device_bytes_, bytes, stream)) [[unlikely]] {
      return detail::request_error(*streams_, bytes, stream);
    }
    const stream_t s = streams_->at(stream);
    std::uint64_t ptr = 0;
    if (auto r = driver().mem_alloc_async(bytes, bytes <= small_max_ ? small_pool_ : pool_, s); r) [[likely]] {
      ptr = *r;
    } else {
      return std::move(r).error();
    }
    const BlockId id = state_->table.try_insert(ptr, bytes, tag, [stream](Track& t) noexcept { t.start(stream); });
    if (!id.valid()) [[unlikely]] return insert_general(ptr, bytes, stream, s, tag);
    return DeviceBlock{ptr, bytes, stream, ordinal_, tag, id};
  }

  /// Queues the free on the block's alloc stream after every tracked use on other
  /// streams. On error the block is left with the caller, untouched, and still live.
  ///
  /// The common case, a block used on its alloc stream only (nothing to wait for, no
  /// event held), makes no result but the one it returns; every other case, bad input
  /// included, goes to free_general, which also says why a block was refused. Forced
  /// inline, as GCC inlines allocate by itself: out of line, the pair would pay for the
  /// call, its saved registers and the spills around the driver call.
  [[gnu::always_inline]] result<void> deallocate(DeviceBlock&& b) noexcept {
    if (!detail::valid_block(b, ordinal_) || !streams_->contains(b.alloc_stream()) ||
        detail::capture_windows_open()) [[unlikely]] {
      return free_general(std::move(b));
    }
    const stream_t a = streams_->at(b.alloc_stream());
    result<void> queued;  // the driver's error, if the free could not be queued
    const bool freed = state_->table.try_erase(b.id(), &b, [&](Track& t) __attribute__((always_inline)) {
      if (!t.alone()) [[unlikely]] return false;
      queued = queue_free<true>(t, b, a);
      return queued.has_value();
    });
    if (!freed) [[unlikely]] return queued ? free_general(std::move(b)) : std::move(queued);
    const StreamId freed_on = b.alloc_stream();
    DeviceBlock gone = std::move(b);
    if (Cadence::due(gone.bytes())) [[unlikely]] (void)poll(freed_on);
    return ok();
  }

  /// Ends `b`'s life as deallocate would, but keeps its memory: every tracked use on
  /// another stream is ordered before the alloc stream (which waits for their events), the
  /// block's events go back, and its id goes stale; the memory comes back as a new block
  /// of the same pointer, bytes and tag, with no uses, whose alloc stream is `to`. The
  /// bytes stay live. This is the RecyclingResource member a caching layer builds on.
  /// - `to == b.alloc_stream()`: safe at once, by stream order, as a free followed by an
  ///   allocation on that stream would be. A block used on that stream only makes no
  ///   driver call.
  /// - `to` another stream: for a block with no use since its last renewal (a cached
  ///   one). @pre every work on the block is known complete on the GPU (the caller saw an
  ///   event recorded on the alloc stream after the renewal complete); no driver call.
  ///   Errors: invalid_argument when the block has uses on other streams.
  /// `b` is checked as a free checks it (pointer, size, alloc stream and tag); the new
  /// block carries `b`'s tag. On error `b` stays with the caller, untouched.
  /// `how`: whether `b` is parked and the new block is to be (Recycle; a caching layer
  /// parks what it keeps, so that no one else can use or free it).
  result<DeviceBlock> recycle_block(DeviceBlock& b, StreamId to, Recycle how = Recycle::live) noexcept {
    const Park park{how == Recycle::parked, how != Recycle::live};
    DeviceBlock next = detail::recycle_alone(state_->table, *streams_, ordinal_, b, to, park);
    if (next.empty()) [[unlikely]] return recycle_general(b, to, park);
    return next;
  }

  /// Hands the parked block `id` (recycle_block's Recycle::park) to its next owner under
  /// `tag`: live again, the tag its next free or recycle must name. Only the holder of
  /// the parked id may call it. False, changing nothing, when `id` names no parked block
  /// of this resource.
  [[gnu::always_inline]] bool unpark_block(BlockId id, AllocTag tag) noexcept { return state_->table.unpark(id, tag); }

  std::size_t bytes_outstanding() const noexcept;

  /// The part of bytes_outstanding() that is frees queued and not yet retired (the rest
  /// is the block table's live bytes, cached blocks parked in it included). A moment's
  /// view: a free or a reap racing the call may or may not be counted.
  std::size_t queued_free_bytes() const noexcept;

  /// Waits for every free queued so far and retires its bytes, except on a stream that is
  /// capturing (synchronising it would invalidate the capture: its frees stay pending), and
  /// queues the frees deferred by a capture that has ended. The pool's own streams are
  /// synchronised one by one; frees queued on adopted streams (which their owners may
  /// have destroyed) are waited for by one synchronisation of the device, not made while
  /// a capture window is open. Safe to call from many
  /// threads at once: each reaper retires at most what it saw queued before its own
  /// synchronisation, and never what another reaper has already retired.
  result<void> reap_pending() noexcept;

  /// Retires, without waiting, the queued frees the device has been seen to reach, and
  /// returns their bytes. Per stream with frees not yet retired: when the event recorded
  /// at the last look has been reached, the frees queued before it retire; then, if frees
  /// were queued since, an idle stream (cuStreamQuery) retires them at once, and a busy
  /// one gets the event recorded after them, for the next look; a capturing stream is
  /// left alone, and so is an adopted stream (StreamPool::owned): its owner may have
  /// destroyed it, so its frees get their event when a later free on it (a call that
  /// names it) polls, or retire at reap_pending. First, the frees a capture deferred are
  /// queued once it has ended. One poll at a time: a call that finds another thread
  /// polling returns 0 at once. Errors: the driver's (what was retired before stays so).
  result<std::size_t> poll_pending() noexcept { return poll(StreamId{static_cast<std::uint32_t>(MAX_STREAMS)}); }

  /// The bytes of every free retired so far (by reap_pending or poll_pending): a count
  /// that only grows.
  std::uint64_t retired_bytes() const noexcept { return state_->retired_total.load(std::memory_order_acquire); }

  /// When deallocate polls: every Cadence::EVERY_FREES frees of a thread, and every
  /// Cadence::EVERY_BYTES it frees.
  using Cadence = detail::PollCadence<AsyncCuda>;

  std::uint32_t device_ordinal() const noexcept { return ordinal_; }

  /// The pools blocks come from: the device's default one, and the pool of the blocks of
  /// up to small_pool_bytes (the default one again when there is none).
  typename D::mempool_t pool() const noexcept { return pool_; }
  typename D::mempool_t small_pool() const noexcept { return small_pool_; }

  // ---- tracking -------------------------------------------------------------------

  /// Work touching `block` was enqueued on `use`; the free will wait for it. The simple
  /// form of prepare/finish: it orders nothing before the work, only the free after it.
  result<void> record_block_use(const DeviceBlock& block, StreamId use) noexcept {
    if (auto r = detail::check_block(block, device_ordinal()); !r) return r;
    return finish(block.id(), use, Access::Read, &block);
  }

  /// Call BEFORE enqueuing work on `use` that touches block `id` with `access`.
  result<void> prepare_block_use(BlockId id, StreamId use, Access access) noexcept;

  /// Call AFTER enqueuing work on `use` that touches block `id` with `access`.
  ///
  /// Failure. When the use's event cannot be recorded (a driver error recording it, or no
  /// event to be had), the use is recorded all the same, as one whose event is recorded
  /// when the free or a use on another stream must wait for it: the block stays safe to
  /// free and to use, the error reports the failing driver, and the caller need do
  /// nothing (calling finish again is harmless). Only host memory running out, for a
  /// block's first read on `use`, leaves the use unrecorded (out_of_memory says so): the
  /// caller must then order the free after that stream itself (synchronise it). Errors:
  /// unknown_stream, stale_block, foreign_block (nothing recorded); a driver error, as
  /// above; out_of_memory, as above.
  result<void> finish_block_use(BlockId id, StreamId use, Access access) noexcept {
    // The stream first: a block that is not quiet marks itself with a value no stream of
    // the pool has, which an unchecked StreamId could hold.
    if (!streams_->contains(use)) [[unlikely]] return streams_->unknown(use);
    if (quiet_on(id, use)) return ok();
    return finish(id, use, access, nullptr);
  }

  // ---- DriverResource -------------------------------------------------------------

  D& driver() const noexcept { return streams_->driver(); }
  result<stream_t> stream_handle(StreamId s) const noexcept { return streams_->get(s); }
  result<void> make_current() const noexcept { return streams_->device()->make_current(); }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return streams_; }

  /// For tests: gives the live block `id` generation `generation` in its block table slot
  /// (see BlockTable::set_generation_for_testing) and returns its new id; `id` is stale
  /// afterwards.
  BlockId set_generation_for_testing(BlockId id, std::uint32_t generation) noexcept {
    return state_->table.set_generation_for_testing(id, generation);
  }

  /// Frees deferred because their alloc stream was capturing, not yet queued.
  std::size_t deferred_frees() const {
    return state_->deferred.size();
  }

  /// Live blocks (diagnostics and tests).
  std::size_t live_blocks() const {
    std::size_t n = 0;
    state_->table.for_each([&](const Track&) { ++n; });
    return n;
  }

 private:
  // The members declared here without a body are defined in detail/async_cuda_impl.hpp,
  // included at the end of this header; the hot paths (allocate, deallocate,
  // recycle_block and the quiet check of the tracking calls) stay here, in the class.
  // Each of those members is inline, as it was when defined in the class: its definition
  // says so, or, for a noinline one, its declaration here (GCC wants the keyword beside
  // the attribute).

  /// One use of a block on a stream. `event` is valid (recorded after the use) only
  /// when `recorded`; `has_event` says whether an event object is held for re-recording.
  struct Use {  // 16 bytes: the event first, then the rest packed behind it
    event_t event{};
    StreamId stream{};
    bool has_event = false;
    bool recorded = false;
  };
  struct Track {
    static constexpr std::uint32_t NOT_QUIET = 0xffffffffu;  // no pool has that many streams
    /// Sets up the entry of a new block on `alloc` (the slot's previous block emptied
    /// reads and spare, and kept their capacity). Before the slot is published.
    void start(StreamId alloc) noexcept {
      alloc_stream = alloc;
      write = Use{.stream = alloc};
      waited = 0;
      // entry_write (a release), not relaxed, although the slot is not published yet: a
      // peek with the id of the slot's previous block that loads this value must also
      // see that block's end (detail/slot_tag.hpp), or it would pass with a stale id.
      quiet_stream.store(alloc.value, detail::PeekProtocol::entry_write);
    }
    // Layout: what a block used on one stream only touches (these first 32 bytes) shares
    // the slot's first cache line with its tag, lock, pointer and size; the vectors, in
    // the next line, are read only once `spilled` says they ever held anything.
    StreamId alloc_stream{};
    // alloc_stream while the block is quiet (see the class comment), NOT_QUIET otherwise.
    // Written under the slot's lock after each change of the other fields; read by peek.
    std::atomic<std::uint32_t> quiet_stream{NOT_QUIET};
    Use write{};                // the last write (at first: the allocation, on alloc_stream)
    std::uint32_t waited = 0;   // streams (ids < 32) that already waited for `write`
    bool spilled = false;       // reads or spare hold (or held) something for this block
    std::vector<Use> reads;     // one per distinct stream since that write
    std::vector<event_t> spare;  // events of ended uses, for the block's next ones

    /// Whether a use on alloc_stream would change nothing: the last write and every read
    /// since are lazy uses on alloc_stream, and no stream waited for them.
    bool quiet() const noexcept {
      if (write.stream != alloc_stream || write.recorded || waited != 0) return false;
      if (!spilled) return true;
      for (const Use& r : reads) {
        if (r.stream != alloc_stream || r.recorded) return false;
      }
      return true;
    }
    void refresh_quiet() noexcept {
      // Release: pairs with quiet_on's acquire, for the order of the slot's tag checks.
      quiet_stream.store(quiet() ? alloc_stream.value : NOT_QUIET, detail::PeekProtocol::entry_write);
    }

    /// Whether the free needs nothing but the free itself: no use on another stream to
    /// wait for, and no event to give back.
    bool alone() const noexcept {
      return write.stream == alloc_stream && !write.has_event && !spilled;
    }
    bool write_waited(StreamId s) const noexcept { return s.value < 32 && (waited >> s.value & 1u); }
    void mark_write_waited(StreamId s) noexcept {
      if (s.value < 32) waited |= std::uint32_t{1} << s.value;
    }
    /// Calls f(Use&) for each use on a stream other than the alloc stream (what the free
    /// must wait for), stopping at the first error.
    template <class F>
    [[gnu::always_inline]] result<void> for_each_other(F&& f) {
      if (write.stream != alloc_stream) [[unlikely]] {
        if (auto r = f(write); !r) return r;
      }
      if (!spilled) [[likely]] return ok();
      for (Use& r : reads) {
        if (r.stream == alloc_stream) continue;
        if (auto e = f(r); !e) return e;
      }
      return ok();
    }
    /// Keeps the event of an ended use for this block's next use: a block used across
    /// streams again and again then never goes back to the shared pool.
    void keep(const Use& u, EventPool<D>& pool) noexcept {
      if (!u.has_event) return;
      try {
        spilled = true;
        spare.push_back(u.event);
      } catch (...) {
        pool.release(u.event);
      }
    }
    // Inlined into deallocate: a block used on one stream holds no event, and the rest
    // is out of line, away from the free's hot code.
    [[gnu::always_inline]] void release_events(EventPool<D>& pool) noexcept {
      if (write.has_event) [[unlikely]] pool.release(write.event);
      write = Use{};
      if (spilled) [[unlikely]] release_spilled(pool);
    }
    [[gnu::noinline]] void release_spilled(EventPool<D>& pool) noexcept {
      for (Use& r : reads) {
        if (r.has_event) pool.release(r.event);
      }
      for (event_t e : spare) pool.release(e);
      reads.clear();
      spare.clear();
      spilled = false;
    }
  };
  static constexpr std::size_t MAX_STREAMS = StreamPool<D>::MAX_STREAMS;
  /// Bytes of the frees one thread queued on each stream (a monotonic count).
  struct alignas(detail::STRIPE_ALIGN) QueuedRow {
    std::array<std::atomic<std::uint64_t>, MAX_STREAMS> bytes{};
  };
  /// Rows of queued bytes: one per thread whose ticket is below OWNED_ROWS (written
  /// with a plain load and store, no read-modify-write), the last shared by the rest.
  static constexpr std::uint32_t OWNED_ROWS = 31;

  /// poll_pending's look at one stream: an event recorded after the frees queued up to `at`.
  struct Mark {
    event_t event{};
    std::uint64_t at = 0;
    bool has_event = false;
    bool armed = false;
  };

  /// A stream's queued frees are two monotonic byte counts: queued (the sum of the rows,
  /// raised by deallocate) and retired (raised by reap_pending or poll_pending to a queued
  /// sum it read before seeing the stream reach it).
  struct State {
    explicit State(std::shared_ptr<Device<D>> dev) : device(dev), events(std::move(dev)) {}
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    ~State() {
      for (const Mark& m : marks) {
        if (m.has_event) events.release(m.event);  // the pool destroys it
      }
      if constexpr (requires(D& d, typename D::mempool_t p) { d.mempool_destroy(p); }) {
        // Blocks still allocated from it stay valid: the driver frees the pool after them.
        if (small_pool && !detail::process_exiting()) (void)device->driver().mempool_destroy(*small_pool);
      }
    }
    std::shared_ptr<Device<D>> device;
    std::optional<typename D::mempool_t> small_pool;  // AsyncCudaOptions::small_pool_bytes' pool
    BlockTable<Track> table;
    EventPool<D> events;
    std::array<QueuedRow, OWNED_ROWS + 1> rows{};
    std::array<std::atomic<std::uint64_t>, MAX_STREAMS> retired{};
    std::atomic<std::uint64_t> retired_total{0};
    std::mutex poll_mu;                // poll_pending, and the marks under it
    std::array<Mark, MAX_STREAMS> marks{};
    detail::DeferredFrees deferred;     // frees deferred by a capture (live in the table)

    /// Release: pairs with reap_pending's acquire (the free was queued before this).
    void count_queued(std::uint32_t stream, std::uint64_t bytes) noexcept {
      const std::uint32_t row = detail::owned_slot(OWNED_ROWS);
      detail::owned_add(rows[row].bytes[stream], bytes, std::memory_order_release, row < OWNED_ROWS);
    }
    /// The bytes queued on `stream` so far, by every thread.
    std::uint64_t queued(std::size_t stream, std::memory_order order) const noexcept {
      std::uint64_t sum = 0;
      for (const QueuedRow& r : rows) sum += r.bytes[stream].load(order);
      return sum;
    }
  };

  explicit AsyncCuda(std::shared_ptr<StreamPool<D>> streams)
      : streams_(std::move(streams)),
        state_(std::make_unique<State>(streams_->device())),
        pool_(streams_->device()->mempool()),
        small_pool_(pool_),
        device_bytes_(streams_->device()->info().total_bytes),
        ordinal_(streams_->device()->ordinal()) {}

  /// Raises stream i's retired count to `to` (never lowers it) and returns the bytes it
  /// added, which also go to the running total.
  std::size_t retire(std::size_t i, std::uint64_t to) noexcept;

  /// allocate's rest, once the driver has handed out `ptr`: a new slot of the block table.
  [[gnu::noinline]] inline result<DeviceBlock> insert_general(std::uint64_t ptr, std::size_t bytes, StreamId stream,
                                                              stream_t s, AllocTag tag) noexcept;

  /// deallocate in full: checks `b`, makes the alloc stream wait for the uses on other
  /// streams, queues the free and gives back the events the block held.
  [[gnu::noinline]] inline result<void> free_general(DeviceBlock&& b) noexcept;

  /// reap_pending's synchronisations and retirements.
  result<void> reap_now() noexcept;
  /// poll_pending, recording events on the pool's own streams and on `named` (a stream
  /// the calling thread's call names, so alive) alone.
  result<std::size_t> poll(StreamId named) noexcept;

  /// Whether `s` is capturing (or its capture was invalidated and has not ended): a driver
  /// call on it other than an enqueue would break or fail the capture. A failed query
  /// says no: the call it guards then reports the driver's error itself.
  bool capturing(stream_t s) const noexcept;

  /// Keeps the free of `b` (live, checked, its alloc stream capturing) for the first
  /// poll_pending or reap_pending after the capture. A block the table no longer knows is
  /// refused now, as the free would refuse it.
  [[gnu::cold, gnu::noinline]] inline result<void> defer_free(DeviceBlock&& b) noexcept;

  /// Queues the deferred frees whose alloc stream no longer captures.
  result<void> queue_deferred() noexcept;

  /// recycle_block in full: checks `b` and `to`, and orders the uses on other streams
  /// before the alloc stream, as free_general does.
  [[gnu::noinline]] inline result<DeviceBlock> recycle_general(DeviceBlock& b, StreamId to, Park park) noexcept;

  /// recycle_block of a block in its slot's last generation, which the slot cannot renew:
  /// the same, into a new slot. The new slot is taken first, so that a failure leaves `b`
  /// as it was.
  [[gnu::cold, gnu::noinline]] inline result<DeviceBlock> recycle_moving(DeviceBlock& b, StreamId to, stream_t a,
                                                                        Park park) noexcept;

  /// What a recycle does to the old life of `b` (under its lock): checks that it may move
  /// to `to`, makes the alloc stream `a` wait for the uses on other streams, and lets go of
  /// its events.
  result<void> end_life(Track& t, const DeviceBlock& b, StreamId to, stream_t a) noexcept;

  /// Both frees' last step, under the block's lock once every use on another stream is
  /// waited for: queues the free on `a`, lets go of the block's events and counts its
  /// bytes pending, before the table stops counting them live (a concurrent
  /// bytes_outstanding() may count them twice for a moment, never miss them). `Alone`:
  /// the caller found t.alone(), so there are no events to give back (and the checks
  /// for them, with the out-of-line release they guard, would keep the fast path from
  /// being inlined).
  template <bool Alone>
  [[gnu::always_inline]] result<void> queue_free(Track& t, const DeviceBlock& b, stream_t a) noexcept {
    if (auto f = driver().mem_free_async(b.ptr(), a); !f) [[unlikely]] return f;
    if constexpr (Alone) {
      t.write = Use{};
    } else {
      t.release_events(state_->events);
    }
    state_->count_queued(b.alloc_stream().value, b.bytes());
    return ok();
  }

  /// Whether a use of `id` on `use` is on the alloc stream of a quiet block (no lock).
  bool quiet_on(BlockId id, StreamId use) const noexcept {
    return state_->table.peek(id, [use](const Track& t) noexcept {
      return t.quiet_stream.load(detail::PeekProtocol::entry_read) == use.value;
    });
  }

  /// Runs f(Track&) under the block's lock, then refreshes its quiet mark.
  template <class F>
  result<void> tracked(BlockId id, const DeviceBlock* block, F&& f) noexcept;

  /// Records `u`'s event on its stream now (a lazy use on the alloc stream).
  result<void> resolve(Track& t, Use& u) noexcept;

  result<void> wait_for(Track& t, stream_t waiter, Use& u) noexcept;

  /// Updates `u` for a new use on its stream: recorded now, or left lazy on the alloc
  /// stream. The event object is kept and re-recorded.
  result<void> note_use(Track& t, Use& u) noexcept;

  result<void> finish(BlockId id, StreamId use, Access access, const DeviceBlock* block) noexcept;

  /// finish's result when its event could not be recorded (a driver error): the use is
  /// kept as a lazy one, whose event is recorded on its stream when the free or another
  /// stream must wait for it (later in that stream than the use, so it orders after it).
  static result<void> kept_lazily(result<void> n, StreamId use) noexcept;

  std::shared_ptr<StreamPool<D>> streams_;
  std::unique_ptr<State> state_;
  // Fixed for the device's life and read by every allocate and deallocate: copies here
  // keep those on this object's line instead of the device's.
  typename D::mempool_t pool_{};
  typename D::mempool_t small_pool_{};  // pool_ when there is no small pool
  std::size_t small_max_ = 0;           // 0: none (no request has 0 bytes)
  std::size_t device_bytes_ = 0;
  std::uint32_t ordinal_ = 0;
};

}  // namespace xlogrt

// The members defined out of line (see the private section).
#include "xlogrt/resource/detail/async_cuda_impl.hpp"
