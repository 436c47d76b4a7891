// SPDX-License-Identifier: Apache-2.0
#pragma once

// How Cached (resource/cached.hpp) hands cached blocks on without a driver wait: from
// another thread's bin for the same stream (take_from_threads), and to another stream
// once the event a depot recorded shows their frees complete (spill_other_bins and
// spill_bins move a thread's blocks to their streams' depots; take_across takes them;
// advance marks and promotes them). The protocol and its safety argument are in
// cached.hpp's header comment ("Stream safety"); CachedProtocol is its test seam.
//
// Out-of-line definitions: resource/cached.hpp includes this header at its end, after
// the class; it is not meant to be included on its own.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/size_class.hpp"
#include "xlogrt/resource/detail/thread_cache.hpp"

namespace xlogrt {

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::optional<DeviceBlock> Cached<Upstream, Protocol>::take_from_threads(
    State& st, const detail::ThreadCache* self, StreamId stream, std::uint32_t c, AllocTag tag) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::spill_other_bins(State& st, detail::ThreadCache* tc, std::uint32_t to,
                                                         std::uint32_t c) noexcept {
  if (tc == nullptr || c >= st.thread_classes || !tc->claim.enter()) return;
  spill_bins(st, *tc, to, c);
  tc->claim.leave();
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::spill_bins(State& st, detail::ThreadCache& tc, std::uint32_t keep,
                                                   std::uint32_t c) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::optional<DeviceBlock> Cached<Upstream, Protocol>::take_across(
    State& st, StreamId to, std::uint32_t c, AllocTag tag) noexcept {
  const std::uint32_t n = st.depot_streams.load(std::memory_order_acquire);
  for (std::uint32_t s = 0; s < n; ++s) {
    if (s == to.value) continue;
    Depot* d = st.depots[s].load(std::memory_order_acquire);
    if (d == nullptr || d->count[c].load(std::memory_order_relaxed) == 0) continue;
    std::optional<detail::CachedEntry> e;
    {
      std::lock_guard lock(d->mu);
      advance(*d, StreamId{s}, !adopted(s));  // an adopted stream may be gone: no call on it
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::advance(Depot& d, StreamId s, bool may_record) noexcept {
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
  if (!may_record) {
    d.wanted = true;
    return;
  }
  d.wanted = false;
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
  if constexpr (!Protocol::wait_for_completion) advance(d, s, may_record);
}

}  // namespace xlogrt
