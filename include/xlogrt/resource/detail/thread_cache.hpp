// SPDX-License-Identifier: Apache-2.0
#pragma once

// The per-thread part of the caching layer (resource/cached.hpp): one ThreadCache per
// thread and Cached instance, reached through a thread_local slot, and the bins it holds.
//
// A ThreadCache is shared (shared_ptr) by the thread's list of caches and the instance's
// registry, so whichever goes first leaves the other a valid object: a thread that exits
// marks its caches `orphaned` (the instance sweeps them into its depots), an instance
// that is destroyed marks them `detached` (the threads drop them on their next lookup).
// Everything a ThreadCache holds is used by its owner under its OwnerClaim, or by a
// reclaimer that holds the claim. Its counters are written by the owner alone, with or
// without the claim; they are atomics only so that statistics can take a moment's view
// of them from any thread.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "xlogrt/core/ids.hpp"
#include "xlogrt/resource/detail/cache_claim.hpp"

namespace xlogrt::detail {

/// Streams a cache distinguishes (StreamPool's MAX_STREAMS; Cached checks they agree).
inline constexpr std::size_t CACHE_STREAMS = 256;
/// The most blocks one bin (one thread, stream and size class) holds.
inline constexpr std::uint32_t MAX_BIN_BLOCKS = 16;

/// A cached block: the upstream's pointer and id; its bytes, stream and ordinal are
/// implied by where it is kept, and its tag is the last owner's.
struct CachedEntry {
  std::uint64_t ptr = 0;
  BlockId id{};
  AllocTag tag{};
};

/// The blocks of one size class that one thread keeps for one stream, newest last.
struct CacheBin {
  std::atomic<std::uint32_t> n{0};  ///< written by whoever holds the claim (a load and a store)
  /// The bin overflowed without its owner taking a block from it since the overflow
  /// before: the owner frees blocks of this stream and class that another thread
  /// allocates, and the bin passes all of them on each time it fills (a sink). Written by
  /// the owner under the claim; read by other threads as a moment's view.
  std::atomic<bool> sink{false};
  std::array<CachedEntry, MAX_BIN_BLOCKS> items{};
  /// Allocations the owner served from this bin (CacheStats::hits). Written by the owner
  /// alone; an atomic only so that statistics can take a moment's view.
  std::atomic<std::uint64_t> hits{0};
  /// `hits` when the bin last overflowed: the same at the next overflow, and the owner
  /// took nothing from the bin in between. The owner's alone.
  std::uint64_t hits_at_overflow = 0;
};

/// Adds to a counter that only the holder of a claim writes.
[[gnu::always_inline]] inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct ThreadCache {
  ThreadCache(std::uint64_t serial_, std::uint32_t classes_) noexcept : serial(serial_), classes(classes_) {}
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;
  ~ThreadCache() {
    for (auto& s : streams) delete[] s.load(std::memory_order_relaxed);
  }

  /// The bins of `stream` (one per class), made on first use; null when host memory ran
  /// out. By the holder of the claim. Release: statistics read the bins' counts.
  CacheBin* bins_of(std::uint32_t stream) noexcept {
    CacheBin* b = streams[stream].load(std::memory_order_relaxed);
    if (b == nullptr) [[unlikely]] {
      b = new (std::nothrow) CacheBin[classes];
      streams[stream].store(b, std::memory_order_release);
    }
    return b;
  }

  /// Takes the newest of the `n` (> 0) blocks of `bin`, one of this cache's bins, out of
  /// the cache; `size`: the bin's class bytes. By the holder of the claim.
  [[gnu::always_inline]] CachedEntry pop(CacheBin& bin, std::uint32_t n, std::size_t size) noexcept {
    const CachedEntry e = bin.items[n - 1];
    bin.n.store(n - 1, std::memory_order_relaxed);
    held.store(held.load(std::memory_order_relaxed) - size, std::memory_order_relaxed);
    return e;
  }

  /// Allocations the owner served from its bins (CacheStats::hits): a moment's view.
  std::uint64_t bin_hits() const noexcept {
    std::uint64_t sum = 0;
    for (const auto& sb : streams) {
      const CacheBin* bins = sb.load(std::memory_order_acquire);
      if (bins == nullptr) continue;
      for (std::uint32_t c = 0; c < classes; ++c) sum += bins[c].hits.load(std::memory_order_relaxed);
    }
    return sum;
  }

  OwnerClaim<> claim;
  const std::uint64_t serial;   ///< the instance's (see Cached's State)
  const std::uint32_t classes;  ///< bins per stream
  alignas(64) std::array<std::atomic<CacheBin*>, CACHE_STREAMS> streams{};
  // The owner's counters (see CacheStats).
  alignas(64) std::atomic<std::uint64_t> depot_hits{0};
  std::atomic<std::size_t> held{0};  ///< bytes in its bins (CachedOptions::thread_bytes)
  std::atomic<std::uint64_t> requested{0};
  std::atomic<std::uint64_t> granted{0};
  std::atomic<bool> orphaned{false};  ///< its thread has exited
  std::atomic<bool> detached{false};  ///< its instance is gone
};

/// The calling thread's caches, one per Cached instance it used.
struct ThreadCaches {
  std::vector<std::shared_ptr<ThreadCache>> mine;
  ThreadCaches() = default;
  ThreadCaches(const ThreadCaches&) = delete;
  ThreadCaches& operator=(const ThreadCaches&) = delete;
  ~ThreadCaches();
};

/// The cache the calling thread used last, for the lookup of the hot path (trivially
/// constructed and destroyed: reading it is one thread-local load).
struct LastThreadCache {
  std::uint64_t serial = 0;  ///< 0: none (instances are numbered from 1)
  ThreadCache* cache = nullptr;
  /// The thread's caches are gone (a thread_local destructor that runs after theirs
  /// may still allocate or free: it then takes the slow paths, without a cache).
  bool exited = false;
};

inline thread_local ThreadCaches thread_caches;
inline thread_local LastThreadCache last_thread_cache;

inline ThreadCaches::~ThreadCaches() {
  last_thread_cache = {0, nullptr, true};
  for (auto& c : mine) c->orphaned.store(true, std::memory_order_release);
}

/// A process-unique serial for a new Cached instance.
inline std::uint64_t next_cache_serial() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace xlogrt::detail
