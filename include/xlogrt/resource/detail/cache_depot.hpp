// SPDX-License-Identifier: Apache-2.0
#pragma once

// Cached's depots (resource/cached.hpp): the Depot type, one per stream and shared by
// every thread, and the members that make a stream's depot, put blocks into it, and take
// blocks out of it for the stream's own allocations. cached.hpp's header comment tells
// where depots sit in the layer and how their blocks reach other streams
// (detail/cache_handoff.hpp).
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
#include "xlogrt/resource/detail/size_class.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/thread_cache.hpp"

namespace xlogrt {

// One stream's depot: its lists and its lock are described where the class declares it.
template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
struct Cached<Upstream, Protocol>::Depot {
  explicit Depot(std::uint32_t classes)
      : fresh(classes), marked(classes), done(classes), count(new std::atomic<std::uint32_t>[classes]{}) {}
  detail::SpinLock mu;
  event_t event{};
  bool has_event = false;  // `event` was created
  bool pending = false;    // `event` marks the `marked` lists and is not known complete
  bool wanted = false;     // another stream found fresh blocks of this adopted stream unmarked
  std::vector<std::vector<detail::CachedEntry>> fresh, marked, done;
  std::unique_ptr<std::atomic<std::uint32_t>[]> count;  // blocks of each class here; written under mu
};

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline typename Cached<Upstream, Protocol>::Depot* Cached<Upstream, Protocol>::depot_of(
    State& st, std::uint32_t s) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::depot_put(State& st, std::uint32_t s, std::uint32_t c,
                                                  const detail::CachedEntry* e, std::size_t n, bool named) noexcept {
  const std::size_t size = detail::class_bytes(c);
  // A soft bound: puts racing each other may pass it by their own blocks.
  const std::size_t held = st.depot_held.load(std::memory_order_relaxed);
  const std::size_t fit = !named && adopted(s)       ? n
                          : held >= st.options.depot_bytes ? 0
                                                           : std::min(n, (st.options.depot_bytes - held) / size);
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
      d->fresh[c].insert(d->fresh[c].end(), e + i, e + n);  // all or none
      kept += n - i;
      i = n;
    } catch (...) {
    }
    if (named && d->wanted) advance(*d, StreamId{s}, true);
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::depot_took(State& st, Depot& d, std::uint32_t c, std::size_t n) noexcept {
  d.count[c].store(d.count[c].load(std::memory_order_relaxed) - static_cast<std::uint32_t>(n), std::memory_order_relaxed);
  st.depot_held.fetch_sub(n * detail::class_bytes(c), std::memory_order_relaxed);
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::optional<DeviceBlock> Cached<Upstream, Protocol>::take_own_depot(
    State& st, StreamId stream, std::uint32_t c, AllocTag tag, detail::ThreadCache* tc) noexcept {
  if (stream.value >= st.depot_streams.load(std::memory_order_acquire)) return std::nullopt;
  Depot* d = st.depots[stream.value].load(std::memory_order_acquire);
  if (d == nullptr || d->count[c].load(std::memory_order_relaxed) == 0) return std::nullopt;
  const bool mine = tc != nullptr && c < st.thread_classes && tc->claim.enter();  // a bin to refill
  detail::CacheBin* bins = mine ? tc->bins_of(stream.value) : nullptr;
  std::optional<detail::CachedEntry> e;
  std::uint32_t got = 0;
  {
    std::lock_guard lock(d->mu);
    // One for the caller, and up to half a bin for the next calls, as far as it has room.
    const std::uint32_t cap = st.bin_cap[c];
    const std::uint32_t room = bins != nullptr ? cap - std::min(bins[c].n.load(std::memory_order_relaxed), cap) : 0;
    const std::uint32_t wanted = 1 + std::min(cap / 2, room);
    std::uint32_t want = wanted;
    // Any list will do: every block here was freed on this stream.
    for (auto* list : {&d->done[c], &d->marked[c], &d->fresh[c]}) {
      while (want != 0 && !list->empty()) {
        const detail::CachedEntry x = list->back();
        list->pop_back();
        --want;
        if (!e) {
          e = x;
        } else {
          const std::uint32_t n = bins[c].n.load(std::memory_order_relaxed);
          bins[c].items[n] = x;
          bins[c].n.store(n + 1, std::memory_order_relaxed);
        }
      }
    }
    got = wanted - want;
    depot_took(st, *d, c, got);
  }
  if (got > 1) detail::bump(tc->held, (got - 1) * detail::class_bytes(c));  // into the bin
  if (mine) tc->claim.leave();
  if (!e) return std::nullopt;
  return hand_out(*e, detail::class_bytes(c), stream, tag);
}

}  // namespace xlogrt
