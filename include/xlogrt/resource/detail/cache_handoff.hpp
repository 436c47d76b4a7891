// SPDX-License-Identifier: Apache-2.0
#pragma once

// How Cached (resource/cached.hpp) hands cached blocks on without a driver wait: from
// another thread's bin for the same stream (take_from_threads; a bin that passes its
// blocks on by itself, a sink, is left alone), and to another stream
// once the event a depot recorded shows their frees complete (spill_other_bins and
// spill_bins move a thread's blocks to their streams' depots; take_across takes them;
// advance marks and promotes them). The protocol and its safety argument are in
// cached.hpp's header comment ("Stream safety"); CachedProtocol is its test seam.
//
// Out-of-line definitions: resource/cached.hpp includes this header at its end, after
// the class; it is not meant to be included on its own.

#include <algorithm>
#include <array>
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
    State& st, detail::ThreadCache* self, StreamId stream, std::uint32_t c, AllocTag tag) noexcept {
  const std::size_t size = detail::class_bytes(c);
  // One block for the caller and up to half a bin for its next calls, as take_own_depot
  // refills, but never more than half of what the other bin holds.
  std::array<detail::CachedEntry, detail::MAX_BIN_BLOCKS> got;
  std::uint32_t taken = 0;
  {
    std::lock_guard lock(st.registry_mu);
    for (const auto& other : st.caches) {
      if (other.get() == self) continue;
      // A moment's view: the claim below reads the count again. A sink passes its blocks
      // on by itself (CacheBin::sink): taking them would only move them ahead of the
      // batch they are part of, and cost its owner a trip to the depot while claimed.
      detail::CacheBin* bins = other->streams[stream.value].load(std::memory_order_acquire);
      if (bins == nullptr || bins[c].n.load(std::memory_order_relaxed) == 0 ||
          bins[c].sink.load(std::memory_order_relaxed)) {
        continue;
      }
      other->claim.claim();
      const std::uint32_t n = bins[c].n.load(std::memory_order_relaxed);
      const std::uint32_t take = std::min((n + 1) / 2, 1 + st.bin_cap[c] / 2);
      for (std::uint32_t k = n; taken < take; --k) got[taken++] = other->pop(bins[c], k, size);
      other->claim.release();
      if (taken != 0) break;
    }
  }
  if (taken == 0) return std::nullopt;
  // The rest into the caller's bin, as far as it has room; beyond that, to the depot.
  std::uint32_t kept = 1;
  if (taken > 1 && self != nullptr && self->claim.enter()) {
    if (detail::CacheBin* bins = self->bins_of(stream.value)) {
      detail::CacheBin& bin = bins[c];
      for (std::uint32_t n = bin.n.load(std::memory_order_relaxed); kept < taken && n < st.bin_cap[c]; ++kept, ++n) {
        bin.items[n] = got[kept];
        bin.n.store(n + 1, std::memory_order_relaxed);
        detail::bump(self->held, size);
      }
    }
    self->claim.leave();
  }
  if (kept < taken) depot_put(st, stream.value, c, &got[kept], taken - kept, true);
  return hand_out(got[0], size, stream, tag);
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
