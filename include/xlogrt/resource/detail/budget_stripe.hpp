// SPDX-License-Identifier: Apache-2.0
#pragma once

// BudgetStripe: one stripe of a device's budget ledger, and the race its two sides run.
// A charger checks its charge against the stripe's credit without a lock; the holder of
// the ledger's lock trims that credit (to hand it to another stripe, or because the
// limit fell). The ledger of a whole device (BudgetSlot: the limit, the refill, the
// stripes' sum) is resource/detail/budget_ledger.hpp.
//
// State. `charged`: charges minus credits made through the stripe (signed and wrapping:
// a stripe that frees blocks charged elsewhere goes below zero). `held`: the credit the
// stripe may charge up to; only the ledger's lock holder writes it.
//
// Invariant. Every charge that passed is covered by `held` from the moment it passed:
// charged <= held, counting the passed charges only. With the ledger's "sum of held <=
// limit", the stripes' charges never pass the limit, and the credit a trim releases is
// credit no passed charge relies on.
//
// The race (Protocol names each order):
//   charge (any thread of the stripe, no lock):
//     fetch_add(charged, n) [charge]; read held [check]; over it: fetch_sub back, and the
//     caller takes the ledger's slow path.
//   trim (the lock holder): h = held; target = charged + keep; if target < h:
//     held = target [lower]; c = charged [recount]; if c > target: held = min(c, h).
// The charger writes `charged` and then reads `held`; the trimmer writes `held` and then
// reads `charged`: the store-buffer (Dekker) pattern. With all four accesses seq_cst
// they sit in one total order, so either the charger's check reads the lowered `held`
// (and the charge fails, or fits under it), or the trimmer's recount sees the charge
// and raises `held` back over it. A weaker order on either side lets the check read the
// old credit while the recount misses the charge: the trim then releases credit a
// passed charge uses, and the limit can be exceeded. test/model/test_budget_model.cpp
// shows the protocol holding and each weakening caught. (Cost: on x86 the fetch_add is
// a locked add, already a full fence, and a seq_cst load is a plain load.)
//
// Why not a compare-exchange of `charged` against `held` in the trim: it lowers `held`
// while a charger holds the old value, and a compare-exchange that sees `charged` come
// back to the same number (ABA: a charge and a credit) would pass.
//
// A credit (fetch_sub, relaxed) only makes room: a trim that misses it releases less
// credit than it could, never more.

#include <atomic>
#include <cstdint>
#include <limits>

#include "xlogrt/core/atomics.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt::detail {

/// `held` of every stripe while the device has no limit: every charge fits.
inline constexpr std::int64_t BUDGET_UNLIMITED = std::numeric_limits<std::int64_t>::max();

/// Two's-complement addition, without signed overflow (see `charged`).
constexpr std::int64_t wrap_add(std::int64_t a, std::int64_t b) noexcept {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}

/// The orders of a stripe's charge / trim race (see the header). A test seam: the model
/// test derives mutants that weaken one member and requires the model checker to catch
/// them. Production code never names it.
///
/// Thread-safe: constants only.
struct StripeProtocol {
  static constexpr std::memory_order charge = std::memory_order_seq_cst;   ///< charger: add to `charged`
  static constexpr std::memory_order check = std::memory_order_seq_cst;    ///< charger: read `held`
  static constexpr std::memory_order lower = std::memory_order_seq_cst;    ///< trimmer: lower `held`
  static constexpr std::memory_order recount = std::memory_order_seq_cst;  ///< trimmer: read `charged` again
  /// Trimmer: read `charged` again after lowering `held` (false: trust the first read).
  static constexpr bool recount_after_lower = true;
};

/// One stripe of a device's ledger. try_charge and credit from any thread; trim and
/// every write of `held` by the ledger's lock holder only.
///
/// Thread-safe as stated; lock-free.
/// @tparam Atomics   the atomics policy (core/atomics.hpp; the model test's Relacy one).
/// @tparam Protocol  the orders (StripeProtocol; the model test's mutants).
template <class Atomics = StdAtomics, class Protocol = StripeProtocol>
struct alignas(STRIPE_ALIGN) BasicBudgetStripe {
  typename Atomics::template atomic<std::int64_t> charged{0};  ///< charges minus credits made through this stripe
  typename Atomics::template atomic<std::int64_t> held{BUDGET_UNLIMITED};  ///< what it may charge up to

  /// The fast path: charges `n` if it fits under `held`; else changes nothing.
  bool try_charge(std::int64_t n) noexcept {
    const std::int64_t v = wrap_add(charged.fetch_add(n, Protocol::charge), n);
    if (v <= held.load(Protocol::check)) return true;
    charged.fetch_sub(n, std::memory_order_relaxed);
    return false;
  }

  /// Credits `n`; returns `charged` after it.
  std::int64_t credit(std::int64_t n) noexcept {
    return wrap_add(charged.fetch_sub(n, std::memory_order_relaxed), -n);
  }

  /// Lowers `held` to what the stripe has charged plus `keep`; returns the credit released.
  /// Sets *overshoot when a charge in flight raised `held` again (the caller may look once
  /// more before failing a request). @pre the caller holds the ledger's lock, and the
  /// device is limited or becoming so.
  std::int64_t trim(std::int64_t keep, bool* overshoot = nullptr) noexcept {
    const std::int64_t h = held.load(std::memory_order_relaxed);  // only the lock holder writes it
    const std::int64_t target = wrap_add(charged.load(std::memory_order_seq_cst), keep);
    if (target >= h) return 0;
    held.store(target, Protocol::lower);
    std::int64_t final_held = target;
    if constexpr (Protocol::recount_after_lower) {
      // A charger that read the old `held` made its fetch_add before our store (one total
      // order), so this load sees it: `held` never drops below what a passed check relies on.
      const std::int64_t c = charged.load(Protocol::recount);
      if (c > target) {
        final_held = c < h ? c : h;
        held.store(final_held, std::memory_order_seq_cst);
        if (overshoot != nullptr) *overshoot = true;
      }
    }
    // Wrapping: from an unlimited stripe (h = BUDGET_UNLIMITED) over a stripe whose charge
    // went below 0 (frees credited where others charged) the difference is no credit at all.
    return wrap_add(h, static_cast<std::int64_t>(0 - static_cast<std::uint64_t>(final_held)));
  }
};

/// The production stripe.
using BudgetStripe = BasicBudgetStripe<>;

}  // namespace xlogrt::detail
