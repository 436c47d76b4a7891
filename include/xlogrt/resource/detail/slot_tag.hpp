// SPDX-License-Identifier: Apache-2.0
#pragma once

// SlotTag: the tag word of a BlockTable slot (its generation, liveness and parked bit),
// and the lock-free peek that reads a live block's entry through it while another
// thread may free the block and reuse the slot.
//
// The peek is a sequence lock whose sequence is the tag: read the tag [check]; if it is
// the one the caller's id names, run the reader, which loads the entry's atomics
// [entry_read]; read the tag again [recheck]; the read counts only if the tag has not
// changed. The writers: a free stores the dead tag of the next generation [end]; an
// insert into the freed slot sets the entry up, storing its atomics [entry_write], and
// stores the new live tag [publish].
//
// Invariant. A peek that passes read values of the life its id names, never the next
// life's: a reused slot is never mistaken for the block that was freed from it.
//
// Why it holds. Say the reader loaded a value that the next life stored. That store is
// a release and the reader's load an acquire, so they synchronise; the free's dead tag
// happens before that store (the same thread, or one that took the slot from a free
// list through the shard's lock), so it happens before the reader's recheck, which
// therefore cannot read the old live tag: the peek fails. Both halves are needed. A
// relaxed store of the next life's entry (nothing orders the dead tag before it in
// another thread's view) or a relaxed load in the reader (the recheck can then be
// satisfied before it) lets the stale read pass; test/model/test_block_peek_model.cpp
// shows the protocol holding and each weakening caught. The tag's own orders are for the
// locked lookups (publish releases the entry to a lookup that acquires the tag) and cost
// nothing on x86, where every one of them is a plain load or store.
//
// So the reader and every writer of an entry atomic that a peek reads use the orders
// named here (AsyncCuda's quiet_stream does): PeekProtocol::entry_read in the reader,
// PeekProtocol::entry_write in every store.

#include <atomic>
#include <cstdint>

#include "xlogrt/core/atomics.hpp"

namespace xlogrt::detail {

/// The orders of the peek and its writers (see the header). A test seam: the model test
/// derives mutants that weaken one member and requires the model checker to catch them.
/// entry_read and entry_write are the contract of an entry's peeked atomics.
///
/// Thread-safe: constants only.
struct PeekProtocol {
  static constexpr std::memory_order check = std::memory_order_acquire;        ///< reader: first tag read
  static constexpr std::memory_order entry_read = std::memory_order_acquire;   ///< reader: an entry atomic
  static constexpr std::memory_order recheck = std::memory_order_acquire;      ///< reader: second tag read
  static constexpr std::memory_order end = std::memory_order_release;          ///< free: the dead tag
  static constexpr std::memory_order entry_write = std::memory_order_release;  ///< writer: an entry atomic
  static constexpr std::memory_order publish = std::memory_order_release;      ///< insert, renew: a live tag
  /// Reader: read the tag again after the entry (false: trust the first read).
  static constexpr bool recheck_after_read = true;
};

/// A slot's tag word. end() and publish() by the slot's writer (its lock holder, or the
/// thread that took the free slot); peek() and load() from any thread.
///
/// Thread-safe as stated; lock-free.
/// @tparam Atomics   the atomics policy (core/atomics.hpp; the model test's Relacy one).
/// @tparam Protocol  the orders (PeekProtocol; the model test's mutants).
template <class Atomics = StdAtomics, class Protocol = PeekProtocol>
class SlotTag {
 public:
  std::uint64_t load(std::memory_order order) const noexcept { return word_.load(order); }
  /// A change made under the slot's lock that is neither a free nor a new life (parking).
  void store(std::uint64_t tag, std::memory_order order) noexcept { word_.store(tag, order); }

  /// The block's life ended: `dead` is the next generation's dead tag.
  void end(std::uint64_t dead) noexcept { word_.store(dead, Protocol::end); }
  /// A life begins (or a parked block is handed on): its entry is set up.
  void publish(std::uint64_t live) noexcept { word_.store(live, Protocol::publish); }

  /// Without a lock: `read()` (-> bool, loading the entry's atomics with
  /// Protocol::entry_read) if the tag is `want`; false when it is not, or when it changed
  /// while `read` ran.
  template <class Read>
  [[gnu::always_inline]] bool peek(std::uint64_t want, Read&& read) const noexcept {
    if (word_.load(Protocol::check) != want) return false;
    const bool r = read();
    if constexpr (!Protocol::recheck_after_read) {
      return r;
    } else {
      return r && word_.load(Protocol::recheck) == want;
    }
  }

 private:
  typename Atomics::template atomic<std::uint64_t> word_{0};
};

}  // namespace xlogrt::detail
