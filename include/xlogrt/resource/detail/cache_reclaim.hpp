// SPDX-License-Identifier: Apache-2.0
#pragma once

// How Cached (resource/cached.hpp) gives cached blocks back to the upstream: give_back
// (one block's stream-ordered free), trim's body under the registry lock, the sweep of
// exited threads' caches into the depots, the eviction of a larger idle block before a
// miss of a shared class, and the destructor.
//
// Out-of-line definitions: resource/cached.hpp includes this header at its end, after
// the class; it is not meant to be included on its own.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/size_class.hpp"
#include "xlogrt/resource/detail/thread_cache.hpp"

namespace xlogrt {

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline Cached<Upstream, Protocol>::~Cached() {
  if (!state_) return;
  (void)trim();
  for (auto& d : state_->depots) {
    Depot* p = d.load(std::memory_order_relaxed);
    if (p != nullptr && p->has_event) (void)upstream().driver().event_destroy(p->event);
  }
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::sweep_orphans_locked(State& st) noexcept {
  std::erase_if(st.caches, [&](const std::shared_ptr<detail::ThreadCache>& tc) {
    if (!tc->orphaned.load(std::memory_order_acquire)) return false;
    tc->claim.claim();
    drain(st, *tc, [&](std::uint32_t s, std::uint32_t c, const detail::CachedEntry& e) { depot_put(st, s, c, &e); });
    st.retired_hits.fetch_add(tc->bin_hits(), std::memory_order_relaxed);
    st.retired_depot_hits.fetch_add(tc->depot_hits.load(std::memory_order_relaxed), std::memory_order_relaxed);
    st.retired_requested.fetch_add(tc->requested.load(std::memory_order_relaxed), std::memory_order_relaxed);
    st.retired_granted.fetch_add(tc->granted.load(std::memory_order_relaxed), std::memory_order_relaxed);
    tc->detached.store(true, std::memory_order_release);
    tc->claim.release();
    return true;
  });
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
template <class F>
inline void Cached<Upstream, Protocol>::drain(State& st, detail::ThreadCache& tc, F&& f) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline bool Cached<Upstream, Protocol>::give_back(State& st, std::uint32_t s, std::uint32_t c,
                                                  detail::CachedEntry& e, bool via_first) noexcept {
  const std::size_t size = detail::class_bytes(c);
  if (st.marks.on()) st.marks.released(e.ptr);
  if (!upstream().unpark_block(e.id, e.tag)) [[unlikely]] {
    dropped(st);
    return true;
  }
  DeviceBlock b{e.ptr, size, StreamId{s}, ordinal_, e.tag, e.id};
  bool freed = false;
  if (via_first) {  // the device has run everything queued on `s` before the block was cached
    if (auto moved = upstream().recycle_block(b, StreamId{0}, Recycle::live)) {
      b = std::move(*moved);
      freed = upstream().deallocate(std::move(b)).has_value();
    }
  } else {
    freed = upstream().deallocate(std::move(b)).has_value();
  }
  if (!freed) [[unlikely]] {  // `b` is as it was before the refused call
    const StreamId on = b.alloc_stream();
    auto again = upstream().recycle_block(b, on, Recycle::park);
    if (!again) {
      dropped(st);
      return true;
    }
    e = detail::CachedEntry{again->ptr(), again->id(), again->tag()};
    if (st.marks.on()) {  // still cached: watched again
      st.marks.fresh(e.ptr, size);
      st.marks.cached(e.ptr);
    }
    if (on.value != s) {  // kept by the first stream's depot, where its block now is
      depot_put(st, on.value, c, &e, 1, true);
      return true;
    }
    return false;
  }
  st.trimmed_blocks.fetch_add(1, std::memory_order_relaxed);
  st.trimmed_bytes.fetch_add(size, std::memory_order_relaxed);
  return true;
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::evict_larger(State& st, StreamId stream, std::uint32_t c) noexcept {
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
      depot_put(st, stream.value, k, &*e, 1, true);  // refused: kept
    }
    return;
  }
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::size_t Cached<Upstream, Protocol>::trim_locked(State& st) noexcept {
  st.trims.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t before = st.trimmed_bytes.load(std::memory_order_relaxed);
  sweep_orphans_locked(st);
  // An adopted stream's blocks go back through the pool's first stream, after one
  // synchronisation of the device (made when the first such block comes, and never in a
  // capture window, when they stay): the stream may be gone.
  int synced = -1;
  const auto give = [&](std::uint32_t s, std::uint32_t c, detail::CachedEntry& e) {
    if (!adopted(s)) return give_back(st, s, c, e);
    if (synced < 0) {
      synced = !detail::capture_windows_open() && upstream().make_current().has_value() &&
               upstream().driver().ctx_synchronize().has_value();
    }
    return synced == 1 && give_back(st, s, c, e, true);
  };
  for (const auto& tc : st.caches) {
    tc->claim.claim();
    drain(st, *tc, [&](std::uint32_t s, std::uint32_t c, const detail::CachedEntry& e) {
      detail::CachedEntry x = e;
      if (!give(s, c, x)) depot_put(st, s, c, &x);
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
          if (!give(s, c, e)) depot_put(st, s, c, &e);
        }
      }
    }
  }
  return static_cast<std::size_t>(st.trimmed_bytes.load(std::memory_order_relaxed) - before);
}

}  // namespace xlogrt
