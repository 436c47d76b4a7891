// SPDX-License-Identifier: Apache-2.0
#pragma once

// AsyncCuda's members defined out of line (resource/async_cuda.hpp): create; the
// accounting of queued frees (bytes_outstanding, queued_free_bytes, retire, reap_pending, reap_now,
// poll_pending); the slow paths of allocate, deallocate and recycle_block
// (insert_general, free_general, recycle_general, recycle_moving, end_life); the frees a
// stream capture defers (capturing, defer_free, queue_deferred); and cross-stream use
// tracking (prepare_block_use, tracked, resolve, wait_for, note_use, finish,
// kept_lazily). The hot paths stay in the class. What each does, and the invariants of
// the tracking, are told there.
//
// Out-of-line definitions: resource/async_cuda.hpp includes this header at its end,
// after the class; it is not meant to be included on its own.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/device/capture_windows.hpp"
#include "xlogrt/device/event_pool.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/status.hpp"
#include "xlogrt/resource/block_table.hpp"
#include "xlogrt/resource/detail/request.hpp"

namespace xlogrt {

template <Driver D>
inline result<AsyncCuda<D>> AsyncCuda<D>::create(std::shared_ptr<StreamPool<D>> streams,
                                                 AsyncCudaOptions options) noexcept {
  const auto& dev = *streams->device();
  if (!dev.info().memory_pools) {
    return status::driver_failure(status::not_supported, "cuMemAllocFromPoolAsync", {},
                                  "opening ordinal " + std::to_string(dev.ordinal()) +
                                      ": the device has no stream-ordered memory pools (use DirectCuda)");
  }
  if (auto r = dev.make_current(); !r) return std::move(r).error();
  if (auto r = dev.driver().mempool_set_release_threshold(dev.mempool(), options.release_threshold); !r) {
    return std::move(r).error();
  }
  AsyncCuda a(std::move(streams));
  if (auto r = a.state_->events.reserve(options.reserve_events); !r) return std::move(r).error();
  if (options.small_pool_bytes != 0) {
    if constexpr (creates_pools) {
      auto pool = dev.driver().mempool_create(dev.handle());
      if (!pool) return std::move(pool).error();
      a.state_->small_pool = *pool;  // destroyed with the state from here on
      if (auto r = dev.driver().mempool_set_release_threshold(*pool, options.release_threshold); !r) {
        return std::move(r).error();
      }
      a.small_pool_ = *pool;
      a.small_max_ = options.small_pool_bytes;
    } else {
      return error{errc::invalid_argument, "AsyncCudaOptions::small_pool_bytes needs a driver that creates "
                                           "memory pools (mempool_create): set it to 0 on this one"};
    }
  }
  return a;
}

template <Driver D>
inline std::size_t AsyncCuda<D>::bytes_outstanding() const noexcept {
  // Live first: a free counts its bytes queued before the table drops them, so a free
  // racing the two reads is counted twice for a moment, never missed.
  const std::size_t live = state_->table.live_bytes();
  return live + queued_free_bytes();
}

template <Driver D>
inline std::size_t AsyncCuda<D>::queued_free_bytes() const noexcept {
  std::size_t sum = 0;
  const std::size_t n = streams_->size();
  for (std::size_t i = 0; i < n; ++i) {
    // A reap racing this may have retired more than the queued count read here.
    const std::uint64_t r = state_->retired[i].load(std::memory_order_relaxed);
    const std::uint64_t q = state_->queued(i, std::memory_order_relaxed);
    sum += q > r ? static_cast<std::size_t>(q - r) : 0;
  }
  return sum;
}

template <Driver D>
inline result<void> AsyncCuda<D>::reap_pending() noexcept {
  if (auto r = make_current(); !r) return r;
  std::optional<detail::RelaxedCapture<D>> relaxed;  // its calls stay legal during a capture
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  return reap_now();
}

template <Driver D>
inline result<std::size_t> AsyncCuda<D>::poll(StreamId named) noexcept {
  std::unique_lock lock(state_->poll_mu, std::try_to_lock);
  if (!lock.owns_lock()) return std::size_t{0};
  std::optional<detail::RelaxedCapture<D>> relaxed;  // its calls stay legal during a capture
  if (detail::capture_windows_open()) [[unlikely]] relaxed.emplace(driver());
  if (auto r = queue_deferred(); !r) return std::move(r).error();
  std::size_t freed = 0;
  const std::size_t n = streams_->size();
  for (std::size_t i = 0; i < n; ++i) {
    Mark& m = state_->marks[i];
    if (m.armed) {
      auto reached = driver().event_query(m.event);
      if (!reached) return std::move(reached).error();
      if (!*reached) continue;  // the stream has not got there yet: look again next time
      freed += retire(i, m.at);
      m.armed = false;
    }
    // Acquire pairs with count_queued's release: the frees counted were queued before
    // the event is recorded below.
    const std::uint64_t seen = state_->queued(i, std::memory_order_acquire);
    if (seen <= state_->retired[i].load(std::memory_order_relaxed)) continue;
    const StreamId id{static_cast<std::uint32_t>(i)};
    if (id != named && !streams_->owned(id)) continue;  // no call on a stream that may be gone
    const stream_t s = streams_->at(id);
    if (capturing(s)) continue;  // a query, or an event recorded into the capture, would break it
    auto idle = driver().stream_query(s);
    if (!idle) return std::move(idle).error();
    if (*idle) {  // every free counted in `seen` has run
      freed += retire(i, seen);
      continue;
    }
    if (!m.has_event) {
      auto e = state_->events.acquire();
      if (!e) return std::move(e).error();
      m.event = *e;
      m.has_event = true;
    }
    if (auto r = driver().event_record(m.event, s); !r) return std::move(r).error();
    m.at = seen;
    m.armed = true;
  }
  return freed;
}

template <Driver D>
inline result<void> AsyncCuda<D>::prepare_block_use(BlockId id, StreamId use, Access access) noexcept {
  auto s = streams_->get(use);
  if (!s) return std::move(s).error();
  if (quiet_on(id, use)) return ok();
  return tracked(id, nullptr, [&](Track& t) -> result<void> {
    if (t.write.stream != use && !t.write_waited(use)) {
      if (auto w = wait_for(t, *s, t.write); !w) return w;
      t.mark_write_waited(use);
    }
    if (writes(access)) {
      for (Use& rd : t.reads) {
        if (rd.stream == use) continue;
        if (auto w = wait_for(t, *s, rd); !w) return w;
      }
    }
    return ok();
  });
}

template <Driver D>
inline std::size_t AsyncCuda<D>::retire(std::size_t i, std::uint64_t to) noexcept {
  std::atomic<std::uint64_t>& retired = state_->retired[i];
  std::uint64_t done = retired.load(std::memory_order_relaxed);
  while (done < to && !retired.compare_exchange_weak(done, to, std::memory_order_relaxed)) {
  }
  if (done >= to) return 0;
  state_->retired_total.fetch_add(to - done, std::memory_order_release);
  return static_cast<std::size_t>(to - done);
}

template <Driver D>
result<DeviceBlock> AsyncCuda<D>::insert_general(std::uint64_t ptr, std::size_t bytes, StreamId stream, stream_t s,
                                                 AllocTag tag) noexcept {
  auto id = state_->table.insert(ptr, bytes, tag, [stream](Track& t) noexcept { t.start(stream); });
  if (!id) [[unlikely]] {
    (void)driver().mem_free_async(ptr, s);
    return std::move(id).error();
  }
  return DeviceBlock{ptr, bytes, stream, ordinal_, tag, *id};
}

template <Driver D>
result<void> AsyncCuda<D>::free_general(DeviceBlock&& b) noexcept {
  if (auto r = detail::check_block(b, device_ordinal()); !r) return r;
  auto s = streams_->get(b.alloc_stream());
  if (!s) return std::move(s).error();
  const stream_t a = *s;
  if (detail::capture_windows_open() && capturing(a)) return defer_free(std::move(b));
  auto r = state_->table.erase_if(b.id(), &b, [&](Track& t) -> result<void> {
    if (auto w = t.for_each_other([&](Use& u) { return wait_for(t, a, u); }); !w) return w;
    return queue_free<false>(t, b, a);
  });
  if (!r) return r;
  DeviceBlock gone = std::move(b);
  if (Cadence::due(gone.bytes())) (void)poll(gone.alloc_stream());
  return ok();
}

template <Driver D>
inline result<void> AsyncCuda<D>::reap_now() noexcept {
  if (auto r = queue_deferred(); !r) return r;
  const std::size_t n = streams_->size();
  // Adopted streams' frees: the `seen` of each, retired after one device synchronisation.
  std::array<std::uint64_t, MAX_STREAMS> adopted_seen{};
  bool adopted_pending = false;
  for (std::size_t i = 0; i < n; ++i) {
    // Acquire pairs with count_queued's release: every free counted in `seen` was
    // queued before the synchronisation below.
    const std::uint64_t seen = state_->queued(i, std::memory_order_acquire);
    std::atomic<std::uint64_t>& retired = state_->retired[i];
    std::uint64_t done = retired.load(std::memory_order_relaxed);
    if (seen == done) continue;
    const StreamId id{static_cast<std::uint32_t>(i)};
    if (!streams_->owned(id)) {
      adopted_seen[i] = seen;
      adopted_pending = true;
      continue;
    }
    auto s = streams_->get(id);
    if (!s) return std::move(s).error();
    if (capturing(*s)) continue;
    if (auto r = driver().stream_synchronize(*s); !r) return r;
    retire(i, seen);
  }
  if (adopted_pending && !detail::capture_windows_open()) {
    if (auto r = driver().ctx_synchronize(); !r) return r;
    for (std::size_t i = 0; i < n; ++i) {
      if (adopted_seen[i] != 0) retire(i, adopted_seen[i]);
    }
  }
  return ok();
}

template <Driver D>
inline bool AsyncCuda<D>::capturing(stream_t s) const noexcept {
  auto info = driver().stream_capture_info(s);
  return info && info->status != CaptureStatus::none;
}

template <Driver D>
result<void> AsyncCuda<D>::defer_free(DeviceBlock&& b) noexcept {
  return state_->deferred.defer(state_->table, std::move(b));
}

template <Driver D>
inline result<void> AsyncCuda<D>::queue_deferred() noexcept {
  // free_general defers a block again while its stream still captures.
  return state_->deferred.drain([this](DeviceBlock&& b) { return free_general(std::move(b)); });
}

template <Driver D>
result<DeviceBlock> AsyncCuda<D>::recycle_general(DeviceBlock& b, StreamId to, Park park) noexcept {
  if (auto r = detail::check_block(b, device_ordinal()); !r) return std::move(r).error();
  auto s = streams_->get(b.alloc_stream());
  if (!s) return std::move(s).error();
  if (!streams_->contains(to)) return streams_->unknown(to);
  const stream_t a = *s;
  if (b.id().generation == BlockTable<Track>::LAST_GENERATION) [[unlikely]] return recycle_moving(b, to, a, park);
  auto id = state_->table.renew(
      b.id(), &b,
      [&](Track& t) -> result<void> {
        if (auto r = end_life(t, b, to, a); !r) return r;
        t.start(to);
        return ok();
      },
      park);
  if (!id) return std::move(id).error();
  DeviceBlock next{b.ptr(), b.bytes(), to, ordinal_, b.tag(), *id};
  DeviceBlock gone = std::move(b);
  return next;
}

template <Driver D>
result<DeviceBlock> AsyncCuda<D>::recycle_moving(DeviceBlock& b, StreamId to, stream_t a, Park park) noexcept {
  auto fresh = state_->table.insert(b.ptr(), b.bytes(), b.tag(), [to](Track& t) noexcept { t.start(to); });
  if (!fresh) return std::move(fresh).error();
  if (park.to) (void)state_->table.park(*fresh);  // its id is not known to anyone yet
  auto r = state_->table.erase_if(b.id(), &b, [&](Track& t) { return end_life(t, b, to, a); }, park.from);
  if (!r) {
    (void)state_->table.erase_if(*fresh, nullptr, [](Track&) { return ok(); }, park.to);
    return std::move(r).error();
  }
  DeviceBlock next{b.ptr(), b.bytes(), to, ordinal_, b.tag(), *fresh};
  DeviceBlock gone = std::move(b);
  return next;
}

template <Driver D>
inline result<void> AsyncCuda<D>::end_life(Track& t, const DeviceBlock& b, StreamId to, stream_t a) noexcept {
  if (t.alloc_stream != b.alloc_stream()) {
    return error{errc::foreign_block, "block " + b.id().to_string() + " names stream " +
                                          std::to_string(b.alloc_stream().value) + ", not its alloc stream " +
                                          std::to_string(t.alloc_stream.value)};
  }
  if (to != b.alloc_stream() && !t.alone()) {
    return error{errc::invalid_argument, "block " + b.id().to_string() +
                                             " has uses on other streams: it can move to stream " +
                                             std::to_string(to.value) + " only once renewed on its own"};
  }
  if (auto w = t.for_each_other([&](Use& u) { return wait_for(t, a, u); }); !w) return w;
  t.release_events(state_->events);
  return ok();
}

template <Driver D>
template <class F>
inline result<void> AsyncCuda<D>::tracked(BlockId id, const DeviceBlock* block, F&& f) noexcept {
  return state_->table.with(id, Lookup::use, [&](Track& t) -> result<void> {
    result<void> r = f(t);
    t.refresh_quiet();
    return r;
  }, block);
}

template <Driver D>
inline result<void> AsyncCuda<D>::resolve(Track& t, Use& u) noexcept {
  if (u.recorded) return ok();
  if (!u.has_event) {
    if (!t.spare.empty()) {
      u.event = t.spare.back();
      t.spare.pop_back();
    } else {
      auto e = state_->events.acquire();
      if (!e) return std::move(e).error();
      u.event = *e;
    }
    u.has_event = true;
  }
  auto s = streams_->get(u.stream);
  if (!s) return std::move(s).error();
  if (auto r = driver().event_record(u.event, *s); !r) return r;
  u.recorded = true;
  return ok();
}

template <Driver D>
inline result<void> AsyncCuda<D>::wait_for(Track& t, stream_t waiter, Use& u) noexcept {
  if (auto r = resolve(t, u); !r) return r;
  return driver().stream_wait_event(waiter, u.event);
}

template <Driver D>
inline result<void> AsyncCuda<D>::note_use(Track& t, Use& u) noexcept {
  u.recorded = false;
  if (u.stream == t.alloc_stream) return ok();
  return resolve(t, u);
}

template <Driver D>
inline result<void> AsyncCuda<D>::finish(BlockId id, StreamId use, Access access, const DeviceBlock* block) noexcept {
  if (!streams_->contains(use)) return streams_->unknown(use);
  return tracked(id, block, [&](Track& t) -> result<void> {
    if (writes(access)) {
      const bool same = t.write.stream == use;
      Use next = same ? t.write : Use{.stream = use};
      result<void> n = note_use(t, next);  // on failure `next` is lazy: kept all the same
      if (!same) t.keep(t.write, state_->events);
      for (const Use& rd : t.reads) t.keep(rd, state_->events);
      t.reads.clear();
      t.write = next;
      t.waited = 0;
      return kept_lazily(std::move(n), use);
    }
    for (Use& rd : t.reads) {
      if (rd.stream == use) return kept_lazily(note_use(t, rd), use);
    }
    Use fresh{.stream = use};
    result<void> n = note_use(t, fresh);
    try {
      t.spilled = true;
      t.reads.push_back(fresh);
    } catch (...) {
      t.keep(fresh, state_->events);
      return error{errc::out_of_memory, "host memory exhausted recording a use of block " + id.to_string() +
                                            " on stream " + std::to_string(use.value) +
                                            ": the use is not recorded; synchronise that stream before the "
                                            "block's free or its next use on another stream"};
    }
    return kept_lazily(std::move(n), use);
  });
}

template <Driver D>
inline result<void> AsyncCuda<D>::kept_lazily(result<void> n, StreamId use) noexcept {
  if (n) return n;
  const error& e = n.error();
  return error{e.code(),
               e.message() + "; the use is recorded all the same: its event is recorded on stream " +
                   std::to_string(use.value) + " when the free or another stream must wait for it",
               e.driver_status()};
}

}  // namespace xlogrt
