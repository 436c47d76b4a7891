// SPDX-License-Identifier: Apache-2.0
#pragma once

// GraphPools<Up>: allocation through CUDA stream capture. While a capture window is open,
// requests on the capturing streams it admits come from a graph pool, memory the eager
// code never receives while a graph may still use it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/resource/detail/request.hpp"
#include "xlogrt/resource/find_layer.hpp"

namespace xlogrt {

/// Names a graph pool: PyTorch's MempoolId_t (a pair), so that the bridge passes torch's
/// ids through; GraphPools::new_pool() makes fresh ones ({0, n}).
struct GraphPoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  friend constexpr bool operator==(GraphPoolId, GraphPoolId) = default;
  friend constexpr auto operator<=>(GraphPoolId, GraphPoolId) = default;
  std::string to_string() const { return "(" + std::to_string(first) + ", " + std::to_string(second) + ")"; }
};

/// What the graph pools hold (GraphPools::graph_stats).
struct GraphPoolStats {
  std::size_t pools = 0;           ///< pools not yet given back
  std::size_t held_bytes = 0;      ///< memory they hold (taken from the stack below)
  std::size_t live_bytes = 0;      ///< of which handed out and not freed
  std::size_t live_blocks = 0;
  std::size_t open_windows = 0;    ///< begin_allocate_to_pool calls not yet ended
  std::size_t deferred_frees = 0;  ///< eager frees kept until their stream's capture ends
};

/// The capture-aware layer of a stack: a decorator over a DriverResource.
///
/// Why. A captured graph replays its kernels at every launch, long after the capture, on
/// the memory the capture saw. A block handed to a capturing stream must therefore stay
/// with the graph for the graph's life: a cache that took it back at its free and handed it
/// to eager code would let each replay write over the eager code's data. And the driver
/// calls a stack makes on a capturing stream (a query, a synchronisation, an event
/// recorded into the capture and queried later, a free) would become part of the graph or
/// invalidate the capture.
///
/// Capture windows. begin_allocate_to_pool(pool, filter) opens a window (PyTorch calls it
/// just before cudaStreamBeginCapture, end_allocate_to_pool just after
/// cudaStreamEndCapture); while it is open, a request on a stream the filter admits (by
/// default: any stream that is capturing) comes from `pool`:
/// - a free block of the pool that fits (the smallest that fits, at most twice the request
///   or 1 MiB more), else new memory: a block of the stack below, taken on a stream of this
///   layer's own that never captures, with the calling thread's capture mode relaxed (so
///   the driver calls this makes, synchronising that stream included, are legal even
///   during a global-mode capture), and ready on every stream once this returns;
/// - freed, a pool's block goes back to its pool, never below: later captures into the
///   same pool may reuse it (graphs sharing a pool are replayed in the order they were
///   captured, PyTorch's rule), eager code never does. A block a window's capture used on
///   another stream (record_block_use) is kept out of the pool until the window ends, so
///   no later allocation of the same capture reuses it before the branch that read it;
/// - the pool's memory goes back below when the pool is released as many times as windows
///   were opened on it (each graph releases its pool when destroyed) and its blocks are
///   freed, after a device-wide synchronisation (the last replays must have run), and only
///   while no window is open anywhere (the synchronisation would break a capture).
/// While a window is open, the free of an eager block (not a pool's) whose alloc stream
/// is capturing is deferred until the window ends, as PyTorch's cudaMallocAsync backend
/// defers it: queued inside the capture, the free would be a node of the graph.
///
/// Tracking under capture. For a pool's block, prepare/finish/record_block_use order
/// nothing with events (an event recorded into a capture cannot be waited on outside it,
/// nor one recorded outside waited on inside): the pool's memory is reused only by later
/// captures into the same pool, and by eager code only after the device-wide
/// synchronisation above. For an eager block used on a capturing stream, prepare makes no
/// wait and finish/record record nothing: a replay runs after whatever precedes its launch
/// on the launch stream. The ordering belongs to each launch, where it is ordinary
/// cross-stream use: prepare_block_use on the launch stream before it, record_block_use
/// after it, and the block is not handed out again before that replay has read it. The
/// caller keeps an eager block a graph reads alive until the graph is destroyed
/// (PyTorch's rule for static inputs).
///
/// Cost outside capture: one relaxed load per allocate, one comparison per free; tracking
/// calls one relaxed load more. Thread-safe: pools and windows are under one mutex, taken
/// only while a window is open or for a pool's block.
template <class Up>
  requires DriverResource<Up>
class GraphPools : public Adaptor<Up> {
  using D = typename Up::driver_type;

 public:
  using Adaptor<Up>::upstream;
  /// Which streams a window admits (false: the request goes to the stack below).
  using Filter = std::function<bool(StreamId)>;

  /// The layer has the StreamPool of the stack's base resource (AsyncCuda, DirectCuda:
  /// streams()) make it a stream of its own when the first window opens.
  static_assert(!std::is_same_v<decltype(find_streams(std::declval<Up&>())), const void*>,
                "GraphPools: the stack's base resource has no streams()");
  explicit GraphPools(Up up) : Adaptor<Up>(std::move(up)), state_(std::make_unique<State>(*find_streams(upstream()))) {}
  GraphPools(GraphPools&&) noexcept = default;
  GraphPools& operator=(GraphPools&&) = delete;  // the replaced state would have to give back
  ~GraphPools() {
    if (state_) give_back_all();
  }

  /// A pool id no other new_pool() call of the process returns.
  static GraphPoolId new_pool() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return GraphPoolId{0, next.fetch_add(1, std::memory_order_relaxed)};
  }

  /// Opens a window: requests on streams `filter` admits (empty: every capturing stream)
  /// come from `pool` until end_allocate_to_pool(pool). Creates the pool on first use, and
  /// counts one use of it (release_pool gives it back). Call it before the capture
  /// begins. Errors: the driver's, creating the layer's stream; out_of_memory.
  result<void> begin_allocate_to_pool(GraphPoolId pool, Filter filter = {}) noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    if (auto r = own_stream(); !r) return r;
    try {
      st.windows.reserve(st.windows.size() + 1);  // so that the push below cannot fail
      ++st.pools[pool].uses;
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted opening a capture window"};
    }
    st.windows.push_back(Window{pool, std::move(filter)});
    detail::capture_window_count().fetch_add(1, std::memory_order_relaxed);
    st.open.fetch_add(1, std::memory_order_relaxed);
    return ok();
  }

  /// Closes the window begin_allocate_to_pool(pool) opened (the oldest, if several): its
  /// deferred frees are queued where their stream no longer captures, and the blocks its
  /// capture used across streams go back to the pool. Call it after the capture ends.
  /// Errors: invalid_argument when no window of `pool` is open; the first error of a
  /// deferred free (the others are still queued).
  result<void> end_allocate_to_pool(GraphPoolId pool) noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    auto w = std::find_if(st.windows.begin(), st.windows.end(), [&](const Window& x) { return x.pool == pool; });
    if (w == st.windows.end()) {
      return error{errc::invalid_argument, "end_allocate_to_pool: no capture window of graph pool " +
                                               pool.to_string() + " is open"};
    }
    st.windows.erase(w);
    st.open.fetch_sub(1, std::memory_order_relaxed);
    detail::capture_window_count().fetch_sub(1, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < st.slots.size(); ++i) {
      Slot& s = st.slots[i];
      if (s.state == Slot::held && s.pool == pool && !window_of(s.pool)) to_pool(i);
    }
    return settle();
  }

  /// Counts one use of `pool` ended (a graph that captured into it is destroyed). At zero
  /// uses the pool's free memory goes back below (see the class comment), and each of its
  /// blocks does when freed. Errors: invalid_argument for a pool with no use left; the
  /// driver's, synchronising.
  result<void> release_pool(GraphPoolId pool) noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    auto it = st.pools.find(pool);
    if (it == st.pools.end() || it->second.uses == 0) {
      return error{errc::invalid_argument, "release_pool: graph pool " + pool.to_string() +
                                               " has no use left to release"};
    }
    if (--it->second.uses == 0) {
      for (auto& [bytes, i] : it->second.free) st.slots[i].state = Slot::returning;
      it->second.free.clear();
    }
    return settle();
  }

  /// Whether `b` is a block of a graph pool of this layer.
  bool owns(const DeviceBlock& b) const noexcept { return b.id().owner == state_->owner; }

  GraphPoolStats graph_stats() const {
    const State& st = *state_;
    std::lock_guard lock(st.mu);
    GraphPoolStats s;
    s.pools = st.pools.size();
    s.open_windows = st.windows.size();
    s.deferred_frees = st.deferred.size();
    for (const Slot& x : st.slots) {
      if (x.state == Slot::empty) continue;
      s.held_bytes += x.seg.bytes();
      if (x.state == Slot::live) {
        s.live_bytes += x.bytes;
        ++s.live_blocks;
      }
    }
    return s;
  }

  // ---- the resource contract --------------------------------------------------------

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (state_->open.load(std::memory_order_relaxed) != 0) [[unlikely]] return allocate_in_window(bytes, stream, tag);
    return upstream().allocate(bytes, stream, tag);
  }

  result<void> deallocate(DeviceBlock&& b) noexcept {
    if (owns(b)) [[unlikely]] return free_pooled(std::move(b));
    if (state_->open.load(std::memory_order_relaxed) != 0 && !b.empty()) [[unlikely]] {
      if (capturing(b.alloc_stream())) return defer(std::move(b));
    }
    return upstream().deallocate(std::move(b));
  }

  /// Also settles what a window's end could not (a deferred free whose capture had not
  /// ended, memory of a released pool while a window was open).
  result<void> reap_pending() noexcept {
    {
      std::lock_guard lock(state_->mu);
      if (auto r = settle(); !r) return r;
    }
    return upstream().reap_pending();
  }

  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept
    requires TrackingResource<Up>
  {
    if (owns(b)) [[unlikely]] return pooled_use(b.id(), use, &b);
    if (state_->open.load(std::memory_order_relaxed) != 0 && capturing(use)) [[unlikely]] return ok();
    return upstream().record_block_use(b, use);
  }

  result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    if (id.owner == state_->owner) [[unlikely]] return pooled_check(id);
    if (state_->open.load(std::memory_order_relaxed) != 0 && capturing(use)) [[unlikely]] return ok();
    return upstream().prepare_block_use(id, use, a);
  }

  result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    if (id.owner == state_->owner) [[unlikely]] return pooled_use(id, use, nullptr);
    if (state_->open.load(std::memory_order_relaxed) != 0 && capturing(use)) [[unlikely]] return ok();
    return upstream().finish_block_use(id, use, a);
  }

  // A pool's block is not the stack's to recycle: a caching layer goes below this one.
  result<DeviceBlock> recycle_block(DeviceBlock&, StreamId, Recycle = Recycle::live) noexcept = delete;
  bool unpark_block(BlockId, AllocTag) noexcept = delete;

 private:
  /// One block of a graph pool: `seg`, the stack's block that holds its memory, handed out
  /// as a block of `bytes` under this layer's owner, slot index and generation.
  struct Slot {
    enum State : std::uint8_t {
      empty,      ///< no memory (a slot to reuse)
      live,       ///< handed out
      free,       ///< in its pool's free list
      held,       ///< freed during its window after a use on another stream: pooled at the end
      returning,  ///< its pool is released: goes below at the next settle
    };
    DeviceBlock seg;
    GraphPoolId pool;
    std::size_t bytes = 0;
    AllocTag tag;
    StreamId stream;
    std::uint32_t generation = 0;
    State state = empty;
    bool crossed = false;  // used on a stream other than its own since handed out
  };
  struct Pool {
    std::size_t uses = 0;
    std::multimap<std::size_t, std::uint32_t> free;  // segment bytes -> slot
  };
  struct Window {
    GraphPoolId pool;
    Filter filter;
  };
  struct State {
    explicit State(std::shared_ptr<StreamPool<D>> s) : streams(std::move(s)) {}
    std::shared_ptr<StreamPool<D>> streams;
    const std::uint32_t owner = detail::next_block_owner();
    std::atomic<std::uint32_t> open{0};  // windows.size(), read without the lock
    mutable std::mutex mu;
    std::vector<Window> windows;
    std::map<GraphPoolId, Pool> pools;
    std::vector<Slot> slots;
    std::vector<std::uint32_t> empty_slots;
    std::vector<DeviceBlock> deferred;  // eager frees of capturing streams
    std::optional<StreamId> own;        // the layer's stream, which never captures
    typename D::stream_t own_handle{};
  };

  bool capturing(StreamId s) noexcept {
    auto h = upstream().stream_handle(s);
    if (!h) return false;
    auto info = this->driver().stream_capture_info(*h);
    return info && info->status != CaptureStatus::none;
  }

  /// The pool a window admits `stream` to. Under the lock.
  std::optional<GraphPoolId> route(StreamId stream) noexcept {
    for (Window& w : state_->windows) {
      bool admit = false;
      if (w.filter) {
        try {
          admit = w.filter(stream);
        } catch (...) {
          admit = false;
        }
      } else {
        admit = capturing(stream);
      }
      if (admit) return w.pool;
    }
    return std::nullopt;
  }

  bool window_of(GraphPoolId pool) const noexcept {
    for (const Window& w : state_->windows) {
      if (w.pool == pool) return true;
    }
    return false;
  }

  [[gnu::noinline]] result<DeviceBlock> allocate_in_window(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    State& st = *state_;
    std::unique_lock lock(st.mu);
    if (bytes == 0 || !upstream().stream_handle(stream)) {  // the stack's own error, in its order
      lock.unlock();
      return upstream().allocate(bytes, stream, tag);
    }
    const auto pool = route(stream);
    if (!pool) {
      lock.unlock();
      return upstream().allocate(bytes, stream, tag);
    }
    Pool& p = st.pools[*pool];
    constexpr std::size_t SLACK = std::size_t{1} << 20;
    auto fit = p.free.lower_bound(bytes);
    std::uint32_t i = 0;
    if (fit != p.free.end() && fit->first - bytes <= std::max(bytes, SLACK)) {
      i = fit->second;
      p.free.erase(fit);
    } else {
      auto seg = take_segment(bytes, tag);
      if (!seg) return std::move(seg).error();
      auto slot = new_slot();
      if (!slot) {
        (void)give_back(std::move(*seg));
        return std::move(slot).error();
      }
      i = *slot;
      st.slots[i].seg = std::move(*seg);
      st.slots[i].pool = *pool;
    }
    Slot& s = st.slots[i];
    s.state = Slot::live;
    s.bytes = bytes;
    s.tag = tag;
    s.stream = stream;
    s.crossed = false;
    ++s.generation;
    return DeviceBlock{s.seg.ptr(), bytes, stream, upstream().device_ordinal(), tag, BlockId{st.owner, i, s.generation}};
  }

  /// New memory for a pool: a block of the stack below on the layer's own stream, ready
  /// on every stream when this returns. Under the lock.
  result<DeviceBlock> take_segment(std::size_t bytes, AllocTag tag) noexcept {
    State& st = *state_;
    detail::RelaxedCapture relaxed(this->driver());
    auto seg = upstream().allocate(bytes, *st.own, tag);
    if (!seg) return seg;
    if (auto r = this->driver().stream_synchronize(st.own_handle); !r) {
      (void)upstream().deallocate(std::move(*seg));
      return std::move(r).error();
    }
    return seg;
  }

  result<std::uint32_t> new_slot() noexcept {
    State& st = *state_;
    try {
      if (!st.empty_slots.empty()) {
        const std::uint32_t i = st.empty_slots.back();
        st.empty_slots.pop_back();
        return i;
      }
      st.slots.emplace_back();
      return static_cast<std::uint32_t>(st.slots.size() - 1);
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted adding a graph pool block"};
    }
  }

  /// The layer's own stream, made by the StreamPool (which owns it) on the first window.
  /// Under the lock.
  result<void> own_stream() noexcept {
    State& st = *state_;
    if (st.own) return ok();
    detail::RelaxedCapture relaxed(this->driver());
    auto id = st.streams->create_owned();
    if (!id) return std::move(id).error();
    auto h = st.streams->get(*id);
    if (!h) return std::move(h).error();
    st.own = *id;
    st.own_handle = *h;
    return ok();
  }

  /// The slot of a pool's block `id`, checked live (against `b` where given). Under the lock.
  result<std::uint32_t> live_slot(BlockId id, const DeviceBlock* b) const noexcept {
    const State& st = *state_;
    if (id.index >= st.slots.size() || st.slots[id.index].generation != id.generation) {
      return error{errc::stale_block, "graph pool block " + id.to_string() + " is no longer allocated"};
    }
    const Slot& s = st.slots[id.index];
    if (s.state != Slot::live) {
      return error{errc::double_free, "graph pool block " + id.to_string() + " was already freed"};
    }
    if (b && (b->ptr() != s.seg.ptr() || b->bytes() != s.bytes || b->tag() != s.tag ||
              b->alloc_stream() != s.stream)) {
      return error{errc::foreign_block, "block " + id.to_string() +
                                            " does not match the graph pool block of that id (pointer, size, "
                                            "tag or stream differs)"};
    }
    return id.index;
  }

  [[gnu::noinline]] result<void> free_pooled(DeviceBlock&& b) noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    auto i = live_slot(b.id(), &b);
    if (!i) return std::move(i).error();
    DeviceBlock gone = std::move(b);
    Slot& s = st.slots[*i];
    auto p = st.pools.find(s.pool);
    if (p == st.pools.end() || p->second.uses == 0) {
      s.state = Slot::returning;
      return settle();
    }
    if (s.crossed && window_of(s.pool)) {
      s.state = Slot::held;
      return ok();
    }
    to_pool(*i);
    return ok();
  }

  /// Puts slot i in its pool's free list. Under the lock.
  void to_pool(std::uint32_t i) noexcept {
    Slot& s = state_->slots[i];
    try {
      state_->pools[s.pool].free.emplace(s.seg.bytes(), i);
      s.state = Slot::free;
    } catch (...) {
      s.state = Slot::returning;  // the list cannot grow: the memory goes below instead
    }
  }

  result<void> pooled_check(BlockId id) noexcept {
    std::lock_guard lock(state_->mu);
    auto i = live_slot(id, nullptr);
    if (!i) return std::move(i).error();
    return ok();
  }

  result<void> pooled_use(BlockId id, StreamId use, const DeviceBlock* b) noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    auto i = live_slot(id, b);
    if (!i) return std::move(i).error();
    if (!upstream().stream_handle(use)) return upstream().stream_handle(use).error();
    if (use != st.slots[*i].stream) st.slots[*i].crossed = true;
    return ok();
  }

  result<void> defer(DeviceBlock&& b) noexcept {
    std::lock_guard lock(state_->mu);
    try {
      state_->deferred.push_back(std::move(b));
    } catch (...) {
      return error{errc::out_of_memory, "host memory exhausted deferring a free during stream capture: the block "
                                        "is still live; free it again after the capture ends"};
    }
    return ok();
  }

  /// Queues the deferred frees whose stream no longer captures and, while no window is
  /// open in the process, gives back what released pools hold. Under the lock.
  result<void> settle() noexcept {
    State& st = *state_;
    result<void> first = ok();
    std::vector<DeviceBlock> still;
    for (DeviceBlock& b : st.deferred) {
      if (capturing(b.alloc_stream())) {
        try {
          still.push_back(std::move(b));
          continue;
        } catch (...) {
        }
      }
      if (auto r = upstream().deallocate(std::move(b)); !r && first) first = std::move(r);
    }
    st.deferred = std::move(still);
    if (detail::capture_windows_open()) return first;
    bool any = false;
    for (const Slot& s : st.slots) any = any || s.state == Slot::returning;
    if (!any) return first;
    if (auto r = upstream().make_current(); !r) return r;
    {
      detail::RelaxedCapture relaxed(this->driver());
      if (auto r = this->driver().ctx_synchronize(); !r) return r;  // the last replays have run
    }
    for (std::uint32_t i = 0; i < st.slots.size(); ++i) {
      Slot& s = st.slots[i];
      if (s.state != Slot::returning) continue;
      if (auto r = give_back(std::move(s.seg)); !r && first) first = std::move(r);
      s.state = Slot::empty;
      try {
        st.empty_slots.push_back(i);
      } catch (...) {
      }
    }
    for (auto it = st.pools.begin(); it != st.pools.end();) {
      it = it->second.uses == 0 && !holds(it->first) ? st.pools.erase(it) : std::next(it);
    }
    return first;
  }

  bool holds(GraphPoolId pool) const noexcept {
    for (const Slot& s : state_->slots) {
      if (s.state != Slot::empty && s.pool == pool) return true;
    }
    return false;
  }

  result<void> give_back(DeviceBlock&& seg) noexcept { return upstream().deallocate(std::move(seg)); }

  /// At destruction: every pool's memory goes back.
  void give_back_all() noexcept {
    State& st = *state_;
    std::lock_guard lock(st.mu);
    if (!detail::process_exiting()) {
      if (!st.windows.empty()) detail::capture_window_count().fetch_sub(st.windows.size(), std::memory_order_relaxed);
      st.windows.clear();
      st.open.store(0, std::memory_order_relaxed);
      for (Slot& s : st.slots) {
        if (s.state != Slot::empty) s.state = Slot::returning;
      }
      for (auto& [id, p] : st.pools) p.uses = 0;
      (void)settle();  // the layer's stream is the StreamPool's: the layers below may still cache on it
    }
  }

  std::unique_ptr<State> state_;
};

}  // namespace xlogrt
