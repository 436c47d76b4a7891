// SPDX-License-Identifier: Apache-2.0
#pragma once

// BlockTable<Entry>: the live blocks of one resource, reached through generation-checked
// BlockIds.
//
// Every base resource keeps one, so that a double free, a forged or foreign block and a
// stale BlockId are recognised and refused with a named error instead of corrupting the
// device's memory; AsyncCuda keeps each block's cross-stream dependency state in its
// entry.
//
// Layout: SHARDS shards, each with its own spin lock (held for a few dozen instructions,
// and for the driver calls of one block's tracking), slot storage and free list. A
// BlockId's index is `local << SHARD_BITS | shard`. Inserting deals blocks round-robin
// over the shards from a per-thread start; every other operation locks only the shard of
// the block it names. Slots live in fixed-size chunks that are never moved, and a slot's
// generation grows each time it is freed, so an id of a freed block never matches a
// newer block in the same slot.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>  // std::lock_guard, std::unique_lock
#include <optional>
#include <string>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"

namespace xlogrt {

/// What a caller wants a BlockId checked for; selects the error for a dead slot.
enum class Lookup : std::uint8_t {
  free,  ///< about to free the block: a dead slot is a double_free
  use,   ///< about to use the block: a dead slot is a stale_block
};

/// Thread-safe. Operations on blocks of different shards never share a lock.
template <class Entry>
class BlockTable {
 public:
  static constexpr unsigned SHARD_BITS = 4;
  static constexpr std::uint32_t SHARDS = 1u << SHARD_BITS;

  /// A table whose ids name a new process-unique owner (so a block handed to a resource
  /// that did not make it is recognised as foreign).
  BlockTable() noexcept : owner_(next_owner()) {}
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  std::uint32_t owner() const noexcept { return owner_; }

  /// Bytes of the live blocks. Each shard's count changes under its lock (a plain
  /// load and store, no read-modify-write on the hot path); the sum is exact once the
  /// writers have finished, a moment's view while they run.
  std::size_t live_bytes() const noexcept {
    std::size_t sum = 0;
    for (const Shard& s : shards_) sum += s.live_bytes.load(std::memory_order_relaxed);
    return sum;
  }

  /// Stores `e` (for a block of `ptr` and `bytes`) and returns its new id.
  result<BlockId> insert(std::uint64_t ptr, std::size_t bytes, Entry e) noexcept {
    const std::uint32_t sh = next_shard();
    Shard& s = shards_[sh];
    std::lock_guard lock(s.mu);
    std::uint32_t local;
    if (!s.free.empty()) {
      local = s.free.back();
      s.free.pop_back();
    } else {
      local = s.used;
      if ((local >> CHUNK_BITS) >= s.chunks.size()) {
        try {
          s.chunks.push_back(std::make_unique<Slot[]>(CHUNK));
          s.free.reserve(std::size_t{s.chunks.size()} * CHUNK);  // erase never allocates
        } catch (...) {
          return error{errc::out_of_memory, "host memory exhausted growing the block table"};
        }
      }
      ++s.used;
    }
    Slot& slot = s.at(local);
    slot.live = true;
    slot.ptr = ptr;
    slot.bytes = bytes;
    slot.entry = std::move(e);
    s.add_live(static_cast<std::int64_t>(bytes));
    return BlockId{owner_, (local << SHARD_BITS) | sh, slot.generation};
  }

  /// Runs `f(Entry&) -> result<void>` under the block's shard lock if `id` names a live
  /// block (and, when `block` is given, one whose pointer and size match), and returns
  /// what f returns. Errors: foreign_block, double_free (Lookup::free) or stale_block
  /// (Lookup::use), or f's.
  template <class F>
  result<void> with(BlockId id, Lookup why, F&& f, const DeviceBlock* block = nullptr) noexcept {
    Shard* s;
    Slot* slot;
    std::unique_lock<detail::SpinLock> lock;
    if (auto e = find(id, why, block, s, slot, lock); e) return std::move(*e);
    return f(slot->entry);
  }

  /// Removes the live block `id` after `f(Entry&)` returns success; on f's failure the
  /// block stays live and f's error is returned. f runs WITHOUT the shard lock (it makes
  /// the driver calls of a free, which may wait on the driver's own locks): the slot is
  /// first marked as being freed, which makes it look freed to every other call (a
  /// concurrent free of a forged duplicate is a double_free, a use is stale_block), so f
  /// has the entry to itself; slot storage never moves.
  template <class F>
  result<void> erase_if(BlockId id, const DeviceBlock* block, F&& f) noexcept {
    Shard* s;
    Slot* slot;
    {
      std::unique_lock<detail::SpinLock> lock;
      if (auto e = find(id, Lookup::free, block, s, slot, lock); e) return std::move(*e);
      slot->freeing = true;
    }
    result<void> r = f(slot->entry);
    std::lock_guard lock(s->mu);
    slot->freeing = false;
    if (!r) return r;
    slot->live = false;
    s->add_live(-static_cast<std::int64_t>(slot->bytes));
    slot->entry = Entry{};
    ++slot->generation;
    s->free.push_back(id.index >> SHARD_BITS);  // capacity reserved when the slot was made
    return ok();
  }

  /// Calls f(const Entry&) for every live block (tests and diagnostics).
  template <class F>
  void for_each(F&& f) const {
    for (const Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      for (std::uint32_t i = 0; i < s.used; ++i) {
        const Slot& slot = s.at(i);
        if (slot.live && !slot.freeing) f(slot.entry);
      }
    }
  }

 private:
  static constexpr unsigned CHUNK_BITS = 10;
  static constexpr std::uint32_t CHUNK = 1u << CHUNK_BITS;

  struct Slot {
    Entry entry{};
    std::uint64_t ptr = 0;
    std::size_t bytes = 0;
    std::uint32_t generation = 0;
    bool live = false;
    bool freeing = false;  // erase_if's callback is running on it, without the lock
  };
  struct alignas(64) Shard {
    mutable detail::SpinLock mu;
    std::vector<std::unique_ptr<Slot[]>> chunks;
    std::vector<std::uint32_t> free;
    std::uint32_t used = 0;
    std::atomic<std::size_t> live_bytes{0};  // written under `mu` only
    void add_live(std::int64_t d) noexcept {
      live_bytes.store(live_bytes.load(std::memory_order_relaxed) + static_cast<std::size_t>(d),
                       std::memory_order_relaxed);
    }
    Slot& at(std::uint32_t local) noexcept { return chunks[local >> CHUNK_BITS][local & (CHUNK - 1)]; }
    const Slot& at(std::uint32_t local) const noexcept {
      return chunks[local >> CHUNK_BITS][local & (CHUNK - 1)];
    }
  };

  static std::uint32_t next_owner() noexcept {
    static std::atomic<std::uint32_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  /// Each thread deals its inserts round-robin over the shards, from a start of its own:
  /// threads allocating at once rarely meet on a lock, and the blocks one thread
  /// allocates (then hands to others to use) are spread over every shard.
  static std::uint32_t next_shard() noexcept {
    static thread_local std::uint32_t next = static_cast<std::uint32_t>(
        std::hash<const void*>{}(&next) / alignof(std::max_align_t));
    return next++ % SHARDS;
  }

  std::optional<error> find(BlockId id, Lookup why, const DeviceBlock* block, Shard*& s,
                            Slot*& slot, std::unique_lock<detail::SpinLock>& lock) noexcept {
    if (id.owner != owner_) {
      return error{errc::foreign_block, "block " + id.to_string() +
                                            " was not allocated by this resource (owner " +
                                            std::to_string(owner_) + ")"};
    }
    s = &shards_[id.index & (SHARDS - 1)];
    lock = std::unique_lock(s->mu);
    const std::uint32_t local = id.index >> SHARD_BITS;
    if (local >= s->used) {
      return error{errc::foreign_block, "block " + id.to_string() + " names no slot of this resource"};
    }
    slot = &s->at(local);
    if (!slot->live || slot->freeing || slot->generation != id.generation) {
      if (why == Lookup::free) {
        return error{errc::double_free, "block " + id.to_string() + " was already freed"};
      }
      return error{errc::stale_block, "block " + id.to_string() + " has been freed; its id is stale"};
    }
    if (block && (block->ptr() != slot->ptr || block->bytes() != slot->bytes)) {
      return error{errc::foreign_block, "block " + id.to_string() +
                                            " does not match the allocation of that id (pointer or size differs)"};
    }
    return std::nullopt;
  }

  std::uint32_t owner_;
  std::array<Shard, SHARDS> shards_;
};

}  // namespace xlogrt
