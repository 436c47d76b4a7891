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
// Layout. SHARDS shards, each with its own slot storage and free lists. A BlockId's index
// is `local << SHARD_BITS | shard`. Each slot has its own spin lock and a tag word
// (generation and liveness): using or freeing a block locks that block only, so threads
// working on different blocks never meet on a lock, wherever the blocks came from. Slots
// live in chunks that double in size and never move, and a slot's generation grows each
// time it is freed, so an id of a freed block never matches a newer block in the same
// slot; a slot in its last generation is retired for good when freed, so the generation
// never wraps.
//
// Owned shards. A thread whose ticket (detail::thread_ticket: live threads hold distinct
// ones) is below OWNED owns shard [ticket]: it inserts there, and the blocks it frees
// itself go back to the shard's `local` free list, which only it touches, with no lock
// and no read-modify-write. A block freed by another thread goes to the shard's `remote`
// list under the shard's lock; the owner takes that list when its own runs dry. Threads
// with larger tickets share the last shard, entirely under its lock. So a thread that
// allocates and frees its own blocks makes one atomic read-modify-write per pair (the
// block's lock, at the free).
//
// Cache lines. A pair runs between two driver calls, which evict much of what it read,
// so each distinct line it touches costs a miss: an insert + lookup + erase of a block
// touches the shard's first line (the table's id, the chunk pointers), its owner line
// (free list head, byte counts) and the block's slot, nothing else. The free lists are
// threaded through the free slots themselves (Slot::next_free), so taking or giving a
// slot touches no line but the slot's.
//
// Parked blocks. A caching layer keeps a freed block live in its slot (renew) and hands it
// to its next owner later; meanwhile the slot is *parked* (a bit of its tag word): every
// lookup of its id by a user (use, free, renewal) is refused as for a freed block, so a
// free forged with the id the layer holds cannot give the block a second owner. Only
// the operations that name the parked state (renew / erase_if with `parked`, unpark)
// reach it; unpark hands it to its next owner.
//
// Lock-free reads. peek() lets an owner read atomics it keeps in an entry without the
// slot's lock: it checks the slot's tag, runs the reader, and checks the tag again (a
// sequence lock whose sequence is the generation); a reader that raced a free or a reuse
// of the slot is refused, and the caller takes the locked path, which reports the error.
// The tag word and the orders the peek and its writers share are detail::SlotTag
// (detail/slot_tag.hpp), which the model tests run under Relacy; an entry's peeked
// atomics keep its contract (PeekProtocol::entry_read / entry_write).

#include <array>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstdint>
#include <memory>
#include <mutex>  // std::lock_guard
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/detail/slot_tag.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

/// What a caller wants a BlockId checked for; selects the error for a dead slot.
enum class Lookup : std::uint8_t {
  free,  ///< about to free the block: a dead slot is a double_free
  use,   ///< about to use the block: a dead slot is a stale_block
};

/// Whether a renewal starts from a parked block and leaves one (see "Parked blocks").
struct Park {
  bool from = false;
  bool to = false;
};

/// Thread-safe. Operations on different blocks take different locks; inserts by
/// different threads use different shards.
template <class Entry>
class BlockTable {
 public:
  static constexpr unsigned SHARD_BITS = 5;
  static constexpr std::uint32_t SHARDS = 1u << SHARD_BITS;
  /// Blocks one shard can hold at once (the index must stay below BlockId::NO_INDEX).
  static constexpr std::uint32_t MAX_PER_SHARD = (1u << (32 - SHARD_BITS)) - 1;
  /// The last generation a slot lives: a block freed in it retires the slot for good, and
  /// renew refuses it (see renew), so a generation never wraps to one an old id holds.
  static constexpr std::uint32_t LAST_GENERATION = 0xffffffffu;

  /// A table whose ids name a new process-unique owner (so a block handed to a resource
  /// that did not make it is recognised as foreign).
  BlockTable() noexcept : owner_(next_owner()) {
    for (Shard& s : shards_) s.owner = owner_;
  }
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;
  ~BlockTable() {
    for (Shard& s : shards_) {
      for (auto& c : s.chunks) delete[] c.load(std::memory_order_relaxed);
    }
  }

  std::uint32_t owner() const noexcept { return owner_; }

  /// Bytes of the live blocks. Each shard counts bytes added and freed on its owner's
  /// side and freed on the others' side, each written by one thread at a time (a plain
  /// load and store); the sum is exact once the writers have finished, a moment's view
  /// while they run (never missing a live block: a block is counted added before it is
  /// handed out, and freed after it is gone).
  std::size_t live_bytes() const noexcept {
    std::size_t sum = 0;  // wraps through "negative" partial sums to the exact total
    for (const Shard& s : shards_) {
      sum += s.added.load(std::memory_order_relaxed) - s.freed_local.load(std::memory_order_relaxed) -
             s.freed_remote.load(std::memory_order_relaxed);
    }
    return sum;
  }

  /// Stores a block of `ptr`, `bytes` and `tag` and returns its new id. `init` is the
  /// entry: an Entry to move in, or a `noexcept` callable that sets up the slot's entry in
  /// place (`init(Entry&)`; the entry holds whatever the slot's previous block left in it,
  /// see erase_if). Errors: out_of_memory (host memory, or the shard is full).
  template <class Init>
  result<BlockId> insert(std::uint64_t ptr, std::size_t bytes, AllocTag tag, Init&& init) noexcept {
    const std::uint32_t sh = home_shard();
    Shard& s = shards_[sh];
    std::uint32_t local = 0;
    if (sh < OWNED) {
      if (s.local == NONE && s.has_remote.load(std::memory_order_acquire)) {
        std::lock_guard lock(s.mu);
        s.local = std::exchange(s.remote, NONE);
        s.has_remote.store(false, std::memory_order_relaxed);
      }
      if (auto r = s.take(s.local, local); !r) return std::move(r).error();
      add(s.added, bytes);
    } else {
      std::lock_guard lock(s.mu);
      if (auto r = s.take(s.remote, local); !r) return std::move(r).error();
      add(s.added, bytes);
    }
    return publish(s, sh, local, ptr, bytes, tag, std::forward<Init>(init));
  }
  /// insert of an untagged block.
  template <class Init>
  result<BlockId> insert(std::uint64_t ptr, std::size_t bytes, Init&& init) noexcept {
    return insert(ptr, bytes, AllocTag{}, std::forward<Init>(init));
  }

  /// insert's fast form, for a thread with a shard of its own and a slot its own frees
  /// left there: no lock, no result. Returns an invalid id (having changed nothing) in
  /// every other case; the caller then takes insert.
  template <class Init>
  [[gnu::always_inline]] BlockId try_insert(std::uint64_t ptr, std::size_t bytes, AllocTag tag,
                                            Init&& init) noexcept {
    const std::uint32_t sh = home_shard();
    Shard& s = shards_[sh];
    const std::uint32_t local = s.local;
    if (sh >= OWNED || local == NONE) [[unlikely]] return BlockId{};
    s.local = s.at(local)->next_free;
    add(s.added, bytes);
    return publish(s, sh, local, ptr, bytes, tag, std::forward<Init>(init));
  }
  template <class Init>
  [[gnu::always_inline]] BlockId try_insert(std::uint64_t ptr, std::size_t bytes, Init&& init) noexcept {
    return try_insert(ptr, bytes, AllocTag{}, std::forward<Init>(init));
  }

  /// Runs `f(Entry&) -> result<void>` under the block's lock if `id` names a live block
  /// (and, when `block` is given, one whose pointer, size and stream match), and returns what f
  /// returns. Errors: foreign_block, double_free (Lookup::free) or stale_block
  /// (Lookup::use), or f's. The tag is not compared: a use does not depend on it (a free
  /// or a renewal compares it).
  template <class F>
  result<void> with(BlockId id, Lookup why, F&& f, const DeviceBlock* block = nullptr) noexcept {
    Slot* slot = nullptr;
    if (auto e = lock_live(id, why, block, slot, false); e) [[unlikely]] return std::move(*e);
    result<void> r = f(slot->entry);
    slot->mu.unlock();
    return r;
  }

  /// Without a lock: if `id` names a live block, returns `f(const Entry&)`, which may read
  /// only the entry's atomics, with detail::PeekProtocol::entry_read (and every store of
  /// them uses entry_write: see detail/slot_tag.hpp); returns false when it does not, or
  /// when the slot was freed or reused while f ran (the caller then takes the locked
  /// path, which says why).
  template <class F>
  bool peek(BlockId id, F&& f) const noexcept {
    const Slot* slot = slot_of(id);
    if (slot == nullptr) return false;
    return slot->tag.peek(tag_of(id.generation, true),
                          [&]() noexcept { return f(static_cast<const Entry&>(slot->entry)); });
  }

  /// Removes the live block `id` after `f(Entry&)` returns success; on f's failure the
  /// block stays live and f's error is returned. f runs under the block's lock (which no
  /// other block shares, so the driver calls of a free hold up only uses of that block).
  /// The entry itself stays in the slot, for the next insert to set up again (so the
  /// storage it owns, such as a vector's capacity, is reused rather than freed and made
  /// anew); f lets go of what the block held.
  /// `parked`: `id` names a parked block (its holder erases it).
  template <class F>
  result<void> erase_if(BlockId id, const DeviceBlock* block, F&& f, bool parked = false) noexcept {
    Slot* slot = nullptr;
    if (auto e = lock_live(id, Lookup::free, block, slot, true, parked); e) [[unlikely]] return std::move(*e);
    if (result<void> r = f(slot->entry); !r) [[unlikely]] {
      slot->mu.unlock();
      return r;
    }
    retire(id, slot);
    return ok();
  }

  /// erase_if's fast form: with `f(Entry&) -> bool`, and no result. Returns true when the
  /// block was removed; false, having changed nothing (but what f did), when `id` names
  /// no live block (matching `block`) or f returned false. The caller then takes
  /// erase_if, which says why.
  template <class F>
  [[gnu::always_inline]] bool try_erase(BlockId id, const DeviceBlock* block, F&& f) noexcept {
    Slot* slot = lock_if_live(id, block);
    if (slot == nullptr) [[unlikely]] return false;
    if (!f(slot->entry)) [[unlikely]] {
      slot->mu.unlock();
      return false;
    }
    retire(id, slot);
    return true;
  }

  /// Gives the live block `id` a new life in its own slot: after `f(Entry&) -> result<void>`
  /// succeeds under the block's lock, the slot's generation grows (so `id` is stale from
  /// then on, exactly as after a free) but the slot stays live, keeping its pointer, size
  /// and bytes, and the new id is returned. On f's failure nothing changes but what f did.
  /// A caching layer reuses memory this way without letting an old id reach the new owner.
  /// `block` is compared as for a free, its tag included; the new life keeps the tag
  /// (a caching layer that hands the block to an owner under another tag says so with
  /// unpark).
  /// A block whose generation is LAST_GENERATION cannot be renewed in its slot (the next
  /// generation would wrap): renew refuses it before f runs, with out_of_memory naming
  /// the slot; the owner moves the block to a new slot instead (erase_if, then insert).
  /// Errors: as for erase_if (double_free for a dead slot), or f's.
  /// `park`: from a parked block (park.from) and/or to one (park.to).
  template <class F>
  result<BlockId> renew(BlockId id, const DeviceBlock* block, F&& f, Park park = {}) noexcept {
    Slot* slot = nullptr;
    if (auto e = lock_live(id, Lookup::free, block, slot, true, park.from); e) [[unlikely]] return std::move(*e);
    if (id.generation == LAST_GENERATION) [[unlikely]] {
      slot->mu.unlock();
      return error{errc::out_of_memory, "block " + id.to_string() +
                                            " is in its slot's last generation: it cannot be renewed there"};
    }
    if (result<void> r = f(slot->entry); !r) [[unlikely]] {
      slot->mu.unlock();
      return std::move(r).error();
    }
    return reborn(id, slot, park.to);
  }

  /// renew's fast form, with `f(Entry&) -> bool`: an invalid id, having changed nothing
  /// (but what f did), when `id` names no live block (matching `block`) or f declined.
  template <class F>
  [[gnu::always_inline]] BlockId try_renew(BlockId id, const DeviceBlock* block, F&& f, Park park = {}) noexcept {
    Slot* slot = lock_if_live(id, block, true, park.from);
    if (slot == nullptr) [[unlikely]] return BlockId{};
    if (id.generation == LAST_GENERATION || !f(slot->entry)) [[unlikely]] {
      slot->mu.unlock();
      return BlockId{};
    }
    return reborn(id, slot, park.to);
  }

  /// Hands the parked block `id` to its next owner under `tag`: live again, its id the
  /// same, so lookups find it from now on. Only the holder of the parked id (the caching
  /// layer) may call it. False, changing nothing, when `id` names no parked block.
  /// Without a lock when the tag stays (no one else writes a parked slot, and lookups
  /// read its tag word atomically); with the slot's lock when it changes.
  [[gnu::always_inline]] bool unpark(BlockId id, AllocTag tag) noexcept {
    Slot* slot = const_cast<Slot*>(slot_of(id));
    if (slot == nullptr) [[unlikely]] return false;
    const std::uint64_t parked = tag_of(id.generation, true) | PARKED;
    if (slot->tag.load(std::memory_order_acquire) != parked) [[unlikely]] return false;
    if (slot->alloc_tag != tag.value) [[unlikely]] {
      slot = lock_if_live(id, nullptr, false, true);
      if (slot == nullptr) return false;
      slot->alloc_tag = tag.value;
      slot->tag.publish(tag_of(id.generation, true));
      slot->mu.unlock();
      return true;
    }
    slot->tag.publish(tag_of(id.generation, true));
    return true;
  }

  /// Parks the live block `id` (see the header): its holder keeps it for a later unpark.
  /// False, changing nothing, when `id` names no live block.
  bool park(BlockId id) noexcept {
    Slot* slot = lock_if_live(id, nullptr, false);
    if (slot == nullptr) return false;
    slot->tag.store(tag_of(id.generation, true) | PARKED, std::memory_order_release);
    slot->mu.unlock();
    return true;
  }

  /// For tests: gives the live block `id` generation `generation` in its slot (so a test
  /// reaches LAST_GENERATION without 2^32 reuses) and returns its id from then on; `id`
  /// is stale afterwards. An invalid id when `id` names no live block.
  BlockId set_generation_for_testing(BlockId id, std::uint32_t generation) noexcept {
    Slot* slot = lock_if_live(id, nullptr);
    if (slot == nullptr) return BlockId{};
    slot->tag.store(tag_of(generation, true), std::memory_order_release);
    slot->mu.unlock();
    return BlockId{id.owner, id.index, generation};
  }

  /// Calls f(const Entry&) for every live block, under its lock (tests and diagnostics).
  template <class F>
  void for_each(F&& f) const {
    for (const Shard& s : shards_) {
      const std::uint32_t n = s.used.load(std::memory_order_acquire);
      for (std::uint32_t i = 0; i < n; ++i) {
        const Slot& slot = *s.at(i);
        std::lock_guard lock(slot.mu);
        if (slot.tag.load(std::memory_order_acquire) & 1u) f(slot.entry);
      }
    }
  }

 private:
  // Chunk k holds BASE << k slots and starts at local index BASE * (2^k - 1).
  static constexpr std::uint32_t BASE = 256;
  static constexpr std::size_t MAX_CHUNKS = 24;  // BASE * (2^24 - 1) > MAX_PER_SHARD

  /// The end of a free list.
  static constexpr std::uint32_t NONE = 0xffffffffu;

  struct alignas(64) Slot {
    detail::SlotTag<> tag;        // generation << 1 | live (| PARKED); 0 until first used
    mutable detail::SpinLock mu;  // guards the rest while the block is live
    union {
      std::uint32_t next_free = NONE;  // while free: the next slot of its free list
      std::uint32_t alloc_tag;         // while live: the block's AllocTag
    };
    std::uint64_t ptr = 0;
    std::size_t bytes = 0;
    Entry entry{};
  };

  /// The tag word's bit of a parked slot (live too): no lookup of a user matches it.
  static constexpr std::uint64_t PARKED = std::uint64_t{1} << 63;

  static constexpr std::uint64_t tag_of(std::uint32_t gen, bool live) noexcept {
    return std::uint64_t{gen} << 1 | (live ? 1u : 0u);
  }
  static constexpr std::uint32_t generation(std::uint64_t tag) noexcept {
    return static_cast<std::uint32_t>(tag >> 1);
  }
  /// The chunk of a local index, and the offset in it.
  static constexpr std::pair<std::size_t, std::uint32_t> locate(std::uint32_t local) noexcept {
    if (local < BASE) [[likely]] return {0, local};
    const auto k = static_cast<std::size_t>(std::bit_width(local / BASE + 1) - 1);
    return {k, local - BASE * ((1u << k) - 1)};
  }

  /// Adds to a counter that only one thread writes at a time.
  [[gnu::always_inline]] static void add(std::atomic<std::size_t>& c, std::size_t n) noexcept {
    (void)detail::owned_add(c, n, std::memory_order_relaxed, true);
  }

  struct alignas(64) Shard {
    // Read by every lookup (the first chunks share this line); written when the shard grows.
    std::uint32_t owner = 0;             // the table's owner_, here so lookups need no other line
    std::atomic<std::uint32_t> used{0};  // slots made (published after they are)
    std::array<std::atomic<Slot*>, MAX_CHUNKS> chunks{};
    // The inserting side: the owner (without a lock), or for the shared shard whoever
    // holds `mu`.
    alignas(64) std::uint32_t local = NONE;   // free slots the owner freed itself
    std::uint32_t grown = 0;                  // slots made (== used)
    std::atomic<std::size_t> added{0};        // bytes inserted
    std::atomic<std::size_t> freed_local{0};  // bytes freed into `local`
    // The others' side, under `mu`.
    alignas(64) detail::SpinLock mu;
    std::uint32_t remote = NONE;  // free slots freed by other threads
    std::atomic<std::size_t> freed_remote{0};
    std::atomic<bool> has_remote{false};

    Slot* at(std::uint32_t local_index) const noexcept {
      const auto [k, off] = locate(local_index);
      return chunks[k].load(std::memory_order_acquire) + off;
    }
    /// By the inserting side: a free slot from the list whose head is `list`, else a new one.
    result<void> take(std::uint32_t& list, std::uint32_t& out) noexcept {
      if (list != NONE) {
        out = list;
        list = at(out)->next_free;
        return ok();
      }
      if (auto r = grow(); !r) return r;
      out = grown++;
      used.store(grown, std::memory_order_release);
      return ok();
    }
    /// By the inserting side: makes sure slot `grown` exists.
    result<void> grow() noexcept {
      if (grown >= MAX_PER_SHARD) {
        return error{errc::out_of_memory, "the block table is full: " + std::to_string(MAX_PER_SHARD) +
                                              " live blocks in one shard"};
      }
      const auto [k, off] = locate(grown);
      if (off != 0) return ok();
      Slot* c = new (std::nothrow) Slot[std::size_t{BASE} << k];
      if (c == nullptr) return error{errc::out_of_memory, "host memory exhausted growing the block table"};
      chunks[k].store(c, std::memory_order_release);
      return ok();
    }
  };

  /// Ends the life of the block in `slot` (locked by the caller, which lets go of it here)
  /// and gives the slot back to one of its shard's free lists; a slot whose generation is
  /// LAST_GENERATION is retired for good instead (its next generation would wrap, and an
  /// id freed 2^32 lives ago would name the new block).
  [[gnu::always_inline]] void retire(BlockId id, Slot* slot) noexcept {
    const std::size_t bytes = slot->bytes;
    const bool spent = id.generation == LAST_GENERATION;
    slot->tag.end(tag_of(spent ? id.generation : id.generation + 1, false));
    slot->mu.unlock();
    // Back to one of its shard's free lists. next_free is read only by whoever takes the
    // slot from that list (the owner, or a holder of the shard's lock).
    const std::uint32_t sh = id.index & (SHARDS - 1);
    Shard& s = shards_[sh];
    if (sh < OWNED && sh == home_shard()) {
      if (!spent) [[likely]] slot->next_free = std::exchange(s.local, id.index >> SHARD_BITS);
      add(s.freed_local, bytes);
    } else {
      std::lock_guard g(s.mu);
      if (!spent) [[likely]] slot->next_free = std::exchange(s.remote, id.index >> SHARD_BITS);
      add(s.freed_remote, bytes);
      s.has_remote.store(true, std::memory_order_release);
    }
  }

  /// The next life of the live block in `slot` (locked by the caller, which lets go of it
  /// here): a new generation, still live. Release: a lookup that acquires the new
  /// generation sees what f wrote into the entry.
  [[gnu::always_inline]] BlockId reborn(BlockId id, Slot* slot, bool park) noexcept {
    const std::uint32_t gen = id.generation + 1;
    slot->tag.publish(tag_of(gen, true) | (park ? PARKED : 0));
    slot->mu.unlock();
    return BlockId{id.owner, id.index, gen};
  }

  /// Fills free slot `local` of shard `sh` (taken by the caller) and publishes it.
  template <class Init>
  [[gnu::always_inline]] BlockId publish(Shard& s, std::uint32_t sh, std::uint32_t local, std::uint64_t ptr,
                                         std::size_t bytes, AllocTag tag, Init&& init) noexcept {
    // No lock: a free slot is no one else's. A lookup with an old id of the slot finds
    // its generation stale and reads nothing else; the new id is not known before this
    // returns; and the release store of the tag publishes the fields to lookups (which
    // load it with acquire) and to peek.
    Slot& slot = *s.at(local);
    const std::uint32_t gen = generation(slot.tag.load(std::memory_order_relaxed));
    slot.ptr = ptr;
    slot.bytes = bytes;
    slot.alloc_tag = tag.value;  // next_free was read when the slot was taken
    if constexpr (std::is_nothrow_invocable_v<Init&, Entry&>) {
      init(slot.entry);
    } else {
      static_assert(std::is_nothrow_assignable_v<Entry&, Init&&>, "init: an Entry, or noexcept init(Entry&)");
      slot.entry = std::forward<Init>(init);
    }
    slot.tag.publish(tag_of(gen, true));
    return BlockId{s.owner, (local << SHARD_BITS) | sh, gen};
  }

  /// One sequence for every BlockTable<Entry> (a static member of the template would
  /// give each Entry type a sequence of its own, and two tables the same owner).
  static std::uint32_t next_owner() noexcept { return detail::next_block_owner(); }

  /// Shards owned by one thread each (the last shard is shared).
  static constexpr std::uint32_t OWNED = SHARDS - 1;

  /// The calling thread's shard: its own while its ticket is below OWNED, else the shared one.
  static std::uint32_t home_shard() noexcept { return detail::owned_slot(OWNED); }

  /// The slot `id` names, or nullptr when `id` is another table's or its chunk has not
  /// been made. A slot of a made chunk that the shard has not handed out yet reads as dead
  /// (tag 0), so lookups refuse it without reading `used` (lookup_error tells the two apart).
  [[gnu::always_inline]] const Slot* slot_of(BlockId id) const noexcept {
    const Shard& s = shards_[id.index & (SHARDS - 1)];
    if (id.owner != s.owner) [[unlikely]] return nullptr;
    const auto [k, off] = locate(id.index >> SHARD_BITS);
    if (k >= MAX_CHUNKS) [[unlikely]] return nullptr;  // no index reaches it; said for the optimiser
    const Slot* chunk = s.chunks[k].load(std::memory_order_acquire);
    if (chunk == nullptr) [[unlikely]] return nullptr;
    return chunk + off;
  }

  /// Whether `block` is the live block in `slot` (locked): the same pointer, size and
  /// (when `tag_too`) tag, and, for an Entry with a StreamId member `alloc_stream`, the
  /// same alloc stream (a block rebuilt with other fields is forged: a free on another
  /// stream would not wait for the real one, a free under another tag would skew the
  /// counts above).
  static bool matches(const Slot& slot, const DeviceBlock& block, bool tag_too) noexcept {
    if (block.ptr() != slot.ptr || block.bytes() != slot.bytes) return false;
    if (tag_too && block.tag().value != slot.alloc_tag) return false;
    if constexpr (requires(const Entry& e) { { e.alloc_stream } -> std::convertible_to<StreamId>; }) {
      return block.alloc_stream() == slot.entry.alloc_stream;
    } else {
      return true;
    }
  }

  /// The live slot of `id` (matching `block` when given), locked: the caller unlocks it.
  /// Null, with nothing locked, when there is none. The lock is taken and given by hand,
  /// not by a std::unique_lock, whose "owns" flag the pair would store and test again.
  /// `parked`: a parked slot is wanted (and only such a one), else a live one that is not.
  [[gnu::always_inline]] Slot* lock_if_live(BlockId id, const DeviceBlock* block, bool tag_too = true,
                                            bool parked = false) noexcept {
    Slot* slot = const_cast<Slot*>(slot_of(id));
    if (slot == nullptr) [[unlikely]] return nullptr;
    slot->mu.lock();
    // Acquire: pairs with insert's release store (insert fills a free slot without its lock).
    if (slot->tag.load(std::memory_order_acquire) != (tag_of(id.generation, true) | (parked ? PARKED : 0)) ||
        (block && !matches(*slot, *block, tag_too))) [[unlikely]] {
      slot->mu.unlock();
      return nullptr;
    }
    return slot;
  }

  /// lock_if_live, with the reason on failure.
  std::optional<error> lock_live(BlockId id, Lookup why, const DeviceBlock* block, Slot*& slot,
                                 bool tag_too = true, bool parked = false) noexcept {
    slot = lock_if_live(id, block, tag_too, parked);
    if (slot == nullptr) [[unlikely]] return refused(id, why);
    return std::nullopt;
  }

  /// Why lock_if_live refused `id`, read under the slot's lock. A refusal stands: a
  /// generation only grows, and a live block's pointer, size, tag and stream do not
  /// change (a renewal that changes the stream changes the generation too).
  [[gnu::cold, gnu::noinline]] error refused(BlockId id, Lookup why) const {
    const Slot* slot = slot_of(id);
    if (slot == nullptr) return lookup_error(id, why, nullptr);
    std::lock_guard lock(slot->mu);
    return lookup_error(id, why, slot);
  }

  /// Why lock_live() refused `id` (`slot`: the slot it names, locked; null when there is none).
  [[gnu::cold, gnu::noinline]] error lookup_error(BlockId id, Lookup why, const Slot* slot) const {
    if (id.owner != owner_) {
      return error{errc::foreign_block, "block " + id.to_string() +
                                            " was not allocated by this resource (owner " +
                                            std::to_string(owner_) + ")"};
    }
    const Shard& s = shards_[id.index & (SHARDS - 1)];
    if (slot == nullptr || (id.index >> SHARD_BITS) >= s.used.load(std::memory_order_acquire)) {
      return error{errc::foreign_block, "block " + id.to_string() + " names no slot of this resource"};
    }
    if (slot->tag.load(std::memory_order_acquire) != tag_of(id.generation, true)) {
      if (why == Lookup::free) {
        return error{errc::double_free, "block " + id.to_string() + " was already freed"};
      }
      return error{errc::stale_block, "block " + id.to_string() + " has been freed; its id is stale"};
    }
    return error{errc::foreign_block, "block " + id.to_string() +
                                          " does not match the allocation of that id (pointer, size, stream or tag differs)"};
  }

  std::uint32_t owner_;
  std::array<Shard, SHARDS> shards_;
};

}  // namespace xlogrt
