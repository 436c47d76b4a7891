// SPDX-License-Identifier: Apache-2.0
#pragma once

// The rest of Cached's members defined out of line (resource/cached.hpp): create's
// checks of the options, the slow paths of allocate and deallocate (allocate_general,
// keep_general, local_general, hand_out, count), and the figures (bytes_outstanding,
// stats, cached_bytes_locked).
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
#include <string>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/cache_nvtx.hpp"
#include "xlogrt/resource/detail/size_class.hpp"
#include "xlogrt/resource/detail/thread_cache.hpp"

namespace xlogrt {

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline result<Cached<Upstream, Protocol>> Cached<Upstream, Protocol>::create(
    Upstream upstream, CachedOptions options) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::size_t Cached<Upstream, Protocol>::bytes_outstanding() const noexcept {
  const std::size_t all = upstream().bytes_outstanding();
  std::size_t cached = 0;
  {
    std::lock_guard lock(state_->registry_mu);
    cached = cached_bytes_locked(nullptr);
  }
  return all > cached ? all - cached : 0;
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline CacheStats Cached<Upstream, Protocol>::stats() const {
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
      s.hits += tc->bin_hits();
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
detail::ThreadCache* Cached<Upstream, Protocol>::local_general(State& st) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
void Cached<Upstream, Protocol>::keep_general(State& st, detail::ThreadCache* tc, std::uint32_t s, std::uint32_t c,
                                              const detail::CachedEntry& e) noexcept {
  const std::size_t size = detail::class_bytes(c);
  if (tc->held.load(std::memory_order_relaxed) + size > st.options.thread_bytes) {
    spill_bins(st, *tc, detail::CACHE_STREAMS, ALL_CLASSES);
    if (size > st.options.thread_bytes) return depot_put(st, s, c, &e, 1, true);
  }
  detail::CacheBin* bins = tc->bins_of(s);
  if (bins == nullptr) return depot_put(st, s, c, &e, 1, true);
  detail::CacheBin& bin = bins[c];
  std::uint32_t n = bin.n.load(std::memory_order_relaxed);
  if (n >= st.bin_cap[c]) {
    // A bin its owner took nothing from since it last overflowed is a sink (see
    // CacheBin::sink): all of it goes, so that the blocks reach the thread that
    // allocates them in one batch and none waits here for the next overflow. A bin its
    // owner also takes from keeps half, for the owner's next allocations.
    const std::uint64_t hits = bin.hits.load(std::memory_order_relaxed);
    const bool sink = hits == bin.hits_at_overflow;
    const std::uint32_t keep = sink ? 0 : n / 2;
    depot_put(st, s, c, &bin.items[keep], n - keep, true);
    tc->held.store(tc->held.load(std::memory_order_relaxed) - (n - keep) * size, std::memory_order_relaxed);
    n = keep;
    bin.hits_at_overflow = hits;
    bin.sink.store(sink, std::memory_order_relaxed);
  }
  bin.items[n] = e;
  bin.n.store(n + 1, std::memory_order_relaxed);
  detail::bump(tc->held, size);
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
result<DeviceBlock> Cached<Upstream, Protocol>::allocate_general(
    std::size_t bytes, StreamId stream, AllocTag tag, detail::ThreadCache* tc) noexcept {
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

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline void Cached<Upstream, Protocol>::count(detail::ThreadCache* tc,
                                              std::atomic<std::uint64_t> detail::ThreadCache::*mine,
                                              std::atomic<std::uint64_t>& shared, std::uint64_t n) noexcept {
  if (tc != nullptr) {
    detail::bump(tc->*mine, n);
  } else {
    shared.fetch_add(n, std::memory_order_relaxed);
  }
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::optional<DeviceBlock> Cached<Upstream, Protocol>::hand_out(
    const detail::CachedEntry& e, std::size_t size, StreamId stream, AllocTag tag) noexcept {
  if (!upstream().unpark_block(e.id, tag)) [[unlikely]] {
    dropped(*state_);
    return std::nullopt;
  }
  return DeviceBlock{e.ptr, size, stream, ordinal_, tag, e.id};
}

template <class Upstream, class Protocol>
  requires RecyclingResource<Upstream> && DriverResource<Upstream>
inline std::size_t Cached<Upstream, Protocol>::cached_bytes_locked(
    std::vector<std::size_t>* per_class) const noexcept {
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

}  // namespace xlogrt
