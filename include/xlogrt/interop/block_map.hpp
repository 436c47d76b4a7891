// SPDX-License-Identifier: Apache-2.0
#pragma once

// BlockMap: device pointer -> DeviceBlock, for the bridges whose callers hand back a bare
// pointer (cuda::mr's deallocate, Thrust's allocator, PyTorch's free function).

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <unordered_map>
#include <utility>

#include "xlogrt/core/block.hpp"

namespace xlogrt {

/// The live blocks of a pointer-level bridge, keyed by device pointer. Each entry is the
/// block, the size its caller asked for (a caching stack's block may be larger) and a
/// word of the owner's (PointerResource keeps the streams whose use of the block the free
/// must wait for).
///
/// Common path without a lock: an open-addressed table of `capacity` slots (a power of
/// two), linear probing over at most PROBES slots. A slot's key is EMPTY (never used),
/// TOMBSTONE (used, now free) or a pointer. insert() claims an EMPTY or TOMBSTONE slot
/// with a compare-exchange on its key and then writes the block; take() finds the key,
/// moves the entry out and stores TOMBSTONE with release, so the next thread to claim
/// the slot (acquire) sees the slot's block moved out. A key never returns to EMPTY, so
/// a probe that reaches EMPTY has seen every slot its key could be in. A block whose
/// probe window is full goes to an overflow map under a mutex; lookups take that mutex
/// only while the overflow is non-empty.
///
/// Visibility of the block itself: the thread that takes or finds a pointer got that
/// pointer from the thread that inserted it, through the caller's own synchronisation
/// (the pointer is the allocation's result), so it sees the block written before.
///
/// Thread-safe: any number of threads insert, find and take different pointers at once.
/// One pointer is live at most once (the device allocator does not hand it out again
/// before it is taken and freed); find() and take() of the same pointer must not race.
class BlockMap {
 public:
  static constexpr std::size_t PROBES = 32;

  /// `capacity` slots, rounded up to a power of two (at least PROBES).
  explicit BlockMap(std::size_t capacity = std::size_t{1} << 14)
      : mask_(std::bit_ceil(capacity < PROBES ? PROBES : capacity) - 1),
        slots_(new Slot[mask_ + 1]) {}

  BlockMap(const BlockMap&) = delete;
  BlockMap& operator=(const BlockMap&) = delete;

  /// A filed block, the bytes asked for, and its owner's word.
  struct Entry {
    DeviceBlock block;
    std::size_t requested = 0;
    std::uint64_t uses = 0;
  };

  /// Files `e` under its block's pointer. Returns false (and leaves `e` with the caller)
  /// for an empty block, a pointer already present, or an overflow map that cannot grow.
  bool insert(Entry&& e) noexcept {
    DeviceBlock& b = e.block;
    const std::uint64_t key = b.ptr();
    if (b.empty() || key <= TOMBSTONE) return false;
    for (std::size_t i = 0, h = home(key); i < PROBES; ++i, h = (h + 1) & mask_) {
      Slot& s = slots_[h];
      std::uint64_t k = s.key.load(std::memory_order_relaxed);
      if (k == key) return false;
      if (k > TOMBSTONE) continue;
      // Acquire pairs with take()'s release: the slot's previous block was moved out.
      if (s.key.compare_exchange_strong(k, key, std::memory_order_acquire, std::memory_order_relaxed)) {
        s.entry = std::move(e);
        return true;
      }
      if (k == key) return false;
    }
    std::lock_guard lock(overflow_mu_);
    try {
      auto [it, fresh] = overflow_.try_emplace(key);
      if (!fresh) return false;
      it->second = std::move(e);
    } catch (const std::bad_alloc&) {
      return false;
    }
    overflow_size_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  /// insert() of a block asked for with `requested` bytes (0: the block's), with a zero
  /// word; on false `b` is left with the caller.
  bool insert(DeviceBlock&& b, std::size_t requested = 0) noexcept {
    const std::size_t asked = requested != 0 ? requested : b.bytes();
    Entry e{std::move(b), asked, 0};
    if (insert(std::move(e))) return true;
    b = std::move(e.block);
    return false;
  }

  /// The entry of `ptr`, still filed; null when `ptr` is not a live pointer of the map.
  Entry* find(std::uint64_t ptr) noexcept {
    if (Slot* s = slot_of(ptr)) return &s->entry;
    if (overflow_size_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard lock(overflow_mu_);
    auto it = overflow_.find(ptr);
    return it == overflow_.end() ? nullptr : &it->second;  // stable: node-based map
  }

  /// Removes and returns the entry of `ptr`; nullopt when it is not a live pointer.
  std::optional<Entry> take(std::uint64_t ptr) noexcept {
    if (Slot* s = slot_of(ptr)) {
      Entry e = std::move(s->entry);
      s->key.store(TOMBSTONE, std::memory_order_release);
      return e;
    }
    if (overflow_size_.load(std::memory_order_relaxed) == 0) return std::nullopt;
    std::lock_guard lock(overflow_mu_);
    auto it = overflow_.find(ptr);
    if (it == overflow_.end()) return std::nullopt;
    Entry e = std::move(it->second);
    overflow_.erase(it);
    overflow_size_.fetch_sub(1, std::memory_order_relaxed);
    return e;
  }

  /// Slots of the lock-free table.
  std::size_t capacity() const noexcept { return mask_ + 1; }
  /// Blocks that did not fit their probe window (diagnostics; racy while others insert).
  std::size_t overflowed() const noexcept { return overflow_size_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint64_t EMPTY = 0;
  static constexpr std::uint64_t TOMBSTONE = 1;

  struct Slot {
    std::atomic<std::uint64_t> key{EMPTY};
    Entry entry;
  };

  /// Device allocations are at least 256-byte aligned: drop those bits, then mix.
  std::size_t home(std::uint64_t ptr) const noexcept {
    return static_cast<std::size_t>(((ptr >> 8) * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }

  Slot* slot_of(std::uint64_t ptr) noexcept {
    if (ptr <= TOMBSTONE) return nullptr;
    for (std::size_t i = 0, h = home(ptr); i < PROBES; ++i, h = (h + 1) & mask_) {
      const std::uint64_t k = slots_[h].key.load(std::memory_order_relaxed);
      if (k == ptr) return &slots_[h];
      if (k == EMPTY) return nullptr;
    }
    return nullptr;
  }

  std::size_t mask_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<std::size_t> overflow_size_{0};
  std::mutex overflow_mu_;
  std::unordered_map<std::uint64_t, Entry> overflow_;
};

}  // namespace xlogrt
