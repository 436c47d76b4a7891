// SPDX-License-Identifier: Apache-2.0
#pragma once

// OwnerClaim: how a thread's block cache is shared between its owner, which uses it on
// every allocate and deallocate, and a reclaimer (trim, memory pressure, the sweep of an
// exited thread's cache), which empties it a few times a run.
//
// ---- How it works ----------------------------------------------------------------------
//
// State. Two words on separate cache lines: busy_ (written by the owner only) and
// claimed_ (written by the reclaimer only). The owner's hot path therefore writes only a
// line no other thread writes in the steady state, and reads one no other thread writes
// until a reclaim begins.
//
// The owner, around each use of its cache:
//   enter:  busy_ = 1 (seq_cst); if claimed_ (seq_cst) is set: busy_ = 0 (release), and
//           the owner leaves the cache alone for this call (its slow path goes to the
//           shared depot or the upstream instead). The owner never waits.
//   leave:  busy_ = 0 (release).
// The reclaimer (one at a time; the caching layer's registry lock serialises them):
//   claim:   claimed_ = 1 (seq_cst); wait while busy_ (seq_cst) is set; the cache is now
//            the reclaimer's.
//   release: claimed_ = 0 (release).
//
// The race. Owner and reclaimer each write their word and then read the other's: the
// store-buffer (Dekker) pattern. With every one of those four accesses seq_cst they sit
// in one total order: whichever write comes first is seen by the other side's read, so
// either the owner sees the claim and backs off, or the reclaimer sees the owner inside
// and waits for its leave. Both never proceed at once. A release store of either word,
// or the owner reading claimed_ before announcing itself, lets both in (the read can
// pass the write), and test/model/test_cache_claim_model.cpp shows each weakening caught
// as a data race on the cache.
//
// Hand-offs. The owner's leave is a release store and the reclaimer's wait an acquire
// (seq_cst) load: what the owner wrote into the cache is visible to the reclaimer. The
// reclaimer's release of claimed_ and the owner's seq_cst read of it hand the emptied
// cache back. The owner's back-off store is a release too: the reclaimer may read that
// 0 rather than the previous leave's, and a relaxed store would not carry the cache's
// contents (a later store of one thread is no part of its earlier release's sequence).
//
// Cost. enter is one locked exchange (a seq_cst store on x86) and a load; leave a plain
// store. A reclaim costs the owner one slow-path call per claim. The reclaimer's wait
// pauses a little before it yields: most owner calls are a hit or a free of a few dozen
// nanoseconds, and a yield is a system call that costs more than the wait it ends.

#include <atomic>
#include <cstdint>

#include "xlogrt/core/atomics.hpp"

namespace xlogrt::detail {

/// The orders of the hand-off. A test seam: the model test derives mutants that weaken
/// one member and requires the model checker to catch them. Production code never names
/// it.
///
/// Thread-safe: constants only.
struct ClaimProtocol {
  static constexpr std::memory_order announce = std::memory_order_seq_cst;  ///< owner: busy_ = 1
  static constexpr std::memory_order check = std::memory_order_seq_cst;     ///< owner: read claimed_
  static constexpr std::memory_order leave = std::memory_order_release;     ///< owner: busy_ = 0
  static constexpr std::memory_order claim = std::memory_order_seq_cst;     ///< reclaimer: claimed_ = 1
  static constexpr std::memory_order release = std::memory_order_release;   ///< reclaimer: claimed_ = 0
  /// Owner: read claimed_ after announcing (false: read it first, then announce).
  static constexpr bool check_after_announce = true;
};

/// Who may use a cache that one thread owns. enter()/leave() by the owner only;
/// claim()/release() by one reclaimer at a time. Not movable.
///
/// Thread-safe as stated; lock-free for the owner (it never waits), blocking for the
/// reclaimer (it waits out one owner call at most).
/// @tparam Atomics  the atomics policy (core/atomics.hpp): its atomic<T>, and pause() and
///                  yield() for the reclaimer's wait. An owner's hit or free leaves within
///                  a few pauses, so the reclaimer pauses first; the wait may last a whole
///                  owner call (a driver call included), so after CLAIM_SPINS pauses it
///                  gives its core away rather than spin on.
template <class Atomics = StdAtomics, class Protocol = ClaimProtocol>
class OwnerClaim {
 public:
  OwnerClaim() = default;
  OwnerClaim(const OwnerClaim&) = delete;
  OwnerClaim& operator=(const OwnerClaim&) = delete;

  /// Owner: true when the cache is its own until leave(); false when a reclaimer holds
  /// it or is taking it (then the owner must not touch it, and must not call leave()).
  [[gnu::always_inline]] bool enter() noexcept {
    if constexpr (!Protocol::check_after_announce) {
      if (claimed_.load(Protocol::check) != 0) [[unlikely]] return false;
      busy_.store(1, Protocol::announce);
      return true;
    } else {
      busy_.store(1, Protocol::announce);
      if (claimed_.load(Protocol::check) == 0) [[likely]] return true;
      busy_.store(0, Protocol::leave);
      return false;
    }
  }
  [[gnu::always_inline]] void leave() noexcept { busy_.store(0, Protocol::leave); }

  /// Reclaimer: takes the cache, waiting while the owner is inside it.
  void claim() noexcept {
    claimed_.store(1, Protocol::claim);
    for (std::uint32_t spins = 0; busy_.load(std::memory_order_seq_cst) != 0; ++spins) {
      if (spins < CLAIM_SPINS) {
        Atomics::pause();
      } else {
        Atomics::yield();
      }
    }
  }
  /// Pauses before the reclaimer's wait yields (see Atomics above).
  static constexpr std::uint32_t CLAIM_SPINS = 64;
  /// Reclaimer: gives the cache back to its owner.
  void release() noexcept { claimed_.store(0, Protocol::release); }

 private:
  alignas(64) typename Atomics::template atomic<std::uint32_t> busy_{0};
  alignas(64) typename Atomics::template atomic<std::uint32_t> claimed_{0};
};

}  // namespace xlogrt::detail
