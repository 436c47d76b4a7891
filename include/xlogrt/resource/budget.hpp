// SPDX-License-Identifier: Apache-2.0
#pragma once

// Budget<Up>: one byte budget per device ordinal, shared by every stack of the process
// on that ordinal.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/detail/decorator.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

/// Ordinals the budget table covers (0 .. BUDGET_ORDINALS-1), as many as DeviceRuntime.
inline constexpr std::uint32_t BUDGET_ORDINALS = 16;

/// The budget of one ordinal: its limit and the bytes charged against it.
/// Not thread-safe: a value, owned by one thread at a time.
struct BudgetUsage {
  std::size_t limit = 0;   ///< SIZE_MAX when no limit was set
  std::size_t in_use = 0;  ///< charged by every Budget of the process on the ordinal
};

namespace detail {

/// Stripes of each ordinal's budget (a power of two). 64: as many threads as a large
/// host runs allocate without sharing one.
inline constexpr std::uint32_t BUDGET_STRIPES = 64;

/// `held` of every stripe while the ordinal has no limit: every charge fits.
inline constexpr std::int64_t BUDGET_UNLIMITED = std::numeric_limits<std::int64_t>::max();

/// One stripe of an ordinal's budget (see Budget's protocol block). Signed, wrapping:
/// a stripe that credits blocks charged on another stripe goes below zero.
struct alignas(STRIPE_ALIGN) BudgetStripe {
  std::atomic<std::int64_t> charged{0};  ///< charges minus credits made through this stripe
  std::atomic<std::int64_t> held{BUDGET_UNLIMITED};  ///< what it may charge up to; written under the lock
};

struct BudgetSlot {
  SpinLock mu;  ///< guards limit, reserved, chunk and every stripe's `held`
  std::atomic<std::size_t> limit{std::numeric_limits<std::size_t>::max()};
  std::int64_t reserved = 0;  ///< the sum of the stripes' `held` while limited
  std::int64_t chunk = 0;     ///< extra credit a refill hands a stripe
  /// A stripe whose unused credit passes this returns all but `chunk` of it (read
  /// without the lock on the free path).
  std::atomic<std::int64_t> return_above{0};
  BudgetStripe stripes[BUDGET_STRIPES];

  static constexpr std::int64_t wrap_add(std::int64_t a, std::int64_t b) noexcept {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  }

  /// The fast path: charges `n` to `st` if it fits under the stripe's `held`.
  static bool try_charge(BudgetStripe& st, std::int64_t n) noexcept {
    const std::int64_t v = wrap_add(st.charged.fetch_add(n, std::memory_order_seq_cst), n);
    if (v <= st.held.load(std::memory_order_seq_cst)) return true;
    st.charged.fetch_sub(n, std::memory_order_relaxed);
    return false;
  }

  /// Lowers `st.held` to what it has charged plus `keep`; returns the credit released.
  /// @pre mu is held and the ordinal is limited or becoming so.
  static std::int64_t trim(BudgetStripe& st, std::int64_t keep, bool* overshoot = nullptr) noexcept {
    const std::int64_t h = st.held.load(std::memory_order_relaxed);  // only we write it
    const std::int64_t target = wrap_add(st.charged.load(std::memory_order_seq_cst), keep);
    if (target >= h) return 0;
    st.held.store(target, std::memory_order_seq_cst);
    // A charger that read the old `held` made its fetch_add before our store (seq_cst),
    // so this load sees it: `held` never drops below what a passed check relies on.
    const std::int64_t c = st.charged.load(std::memory_order_seq_cst);
    std::int64_t final_held = target;
    if (c > target) {
      final_held = c < h ? c : h;
      st.held.store(final_held, std::memory_order_seq_cst);
      if (overshoot != nullptr) *overshoot = true;
    }
    return h - final_held;
  }

  /// @pre mu is held.
  void set_limit_locked(std::size_t limit_bytes) noexcept {
    limit.store(limit_bytes, std::memory_order_relaxed);
    if (limit_bytes >= static_cast<std::size_t>(BUDGET_UNLIMITED)) {
      for (auto& st : stripes) st.held.store(BUDGET_UNLIMITED, std::memory_order_seq_cst);
      reserved = 0;
      return_above.store(BUDGET_UNLIMITED, std::memory_order_relaxed);
      return;
    }
    const auto l = static_cast<std::int64_t>(limit_bytes);
    chunk = l / 256;
    return_above.store(std::max(l / 16, 2 * chunk), std::memory_order_relaxed);
    // Revoke every stripe's unused credit: what is charged stays charged (lowering the
    // limit revokes no allocation), credit cached under the old limit is gone.
    reserved = 0;
    for (auto& st : stripes) {
      (void)trim(st, 0);
      reserved = wrap_add(reserved, st.held.load(std::memory_order_relaxed));
    }
  }

  /// The slow path: refills `st` from the ordinal's free budget, reclaiming every
  /// stripe's unused credit before it gives up. Returns whether `n` was charged to `st`.
  bool charge_slow(BudgetStripe& st, std::int64_t n) noexcept {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::lock_guard lock(mu);
      if (st.held.load(std::memory_order_relaxed) == BUDGET_UNLIMITED) {
        // The limit was cleared since the fast path looked.
        st.charged.fetch_add(n, std::memory_order_relaxed);
        return true;
      }
      const auto l = static_cast<std::int64_t>(limit.load(std::memory_order_relaxed));
      if (n > l) return false;
      bool reclaimed = false, overshoot = false;
      for (;;) {
        const std::int64_t room = l - reserved;  // may be negative after a lowered limit
        if (room >= n) {
          const std::int64_t give = room - n >= chunk ? n + chunk : room;
          st.held.store(wrap_add(st.held.load(std::memory_order_relaxed), give), std::memory_order_seq_cst);
          reserved += give;
          if (try_charge(st, n)) return true;
          continue;  // a thread sharing the stripe took it; it was charged, so go on
        }
        if (reclaimed) break;
        for (auto& other : stripes) reserved -= trim(other, 0, &overshoot);
        reclaimed = true;
      }
      // A charger on another stripe was between its fetch_add and its check when we
      // read its stripe: its request counted for an instant. Look once more.
      if (!overshoot) return false;
      std::this_thread::yield();
    }
    return false;
  }

  /// Charges `n` beyond the limit if need be (an upstream that returned a larger block).
  void charge_forced(BudgetStripe& st, std::int64_t n) noexcept {
    std::lock_guard lock(mu);
    const std::int64_t h = st.held.load(std::memory_order_relaxed);
    if (h != BUDGET_UNLIMITED) {
      st.held.store(wrap_add(h, n), std::memory_order_seq_cst);
      reserved += n;
    }
    st.charged.fetch_add(n, std::memory_order_relaxed);
  }

  /// Credits `n` through `st`, and returns the stripe's unused credit above
  /// `return_above` to the ordinal.
  void credit(BudgetStripe& st, std::int64_t n) noexcept {
    const std::int64_t v = wrap_add(st.charged.fetch_sub(n, std::memory_order_relaxed), -n);
    const std::int64_t h = st.held.load(std::memory_order_relaxed);
    if (h == BUDGET_UNLIMITED || h - v <= return_above.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(mu);
    if (st.held.load(std::memory_order_relaxed) == BUDGET_UNLIMITED) return;
    // Keep a chunk, but only out of the free budget: after a lowered limit there is none.
    reserved -= trim(st, 0);
    const std::int64_t room = static_cast<std::int64_t>(limit.load(std::memory_order_relaxed)) - reserved;
    const std::int64_t keep = room < chunk ? room : chunk;
    if (keep > 0) {
      st.held.store(wrap_add(st.held.load(std::memory_order_relaxed), keep), std::memory_order_seq_cst);
      reserved += keep;
    }
  }

  /// Bytes charged: the sum of the stripes (exact once the threads that charge and
  /// credit are quiescent; meanwhile the view of a moment, never negative).
  std::size_t in_use() const noexcept {
    std::int64_t sum = 0;
    for (const auto& st : stripes) sum = wrap_add(sum, st.charged.load(std::memory_order_relaxed));
    return sum > 0 ? static_cast<std::size_t>(sum) : 0;
  }

  /// The stripes' credit (charged or not) while limited: never above the limit unless
  /// the limit was lowered below what is charged. 0 when unlimited.
  std::size_t reserved_bytes() noexcept {
    std::lock_guard lock(mu);
    return reserved > 0 ? static_cast<std::size_t>(reserved) : 0;
  }
};

/// The process-wide table, one slot per ordinal. Constant-initialised and trivially
/// destructible, so it is usable from any static initialiser or destructor, at exit
/// included. One table per process as long as xlogrt's inline functions are shared
/// between the shared objects that include it (the default visibility); a library built
/// with -fvisibility=hidden gets a table of its own.
inline BudgetSlot* budget_slot(std::uint32_t ordinal) noexcept {
  static constinit BudgetSlot table[BUDGET_ORDINALS];
  return ordinal < BUDGET_ORDINALS ? &table[ordinal] : nullptr;
}

inline error bad_budget_ordinal(std::uint32_t ordinal) {
  return error{errc::invalid_ordinal, "device ordinal " + std::to_string(ordinal) +
                                          " has no budget: budgets cover ordinals 0 to " +
                                          std::to_string(BUDGET_ORDINALS - 1)};
}

}  // namespace detail

/// Sets the byte budget of `ordinal` for the whole process: every Budget stack on that
/// ordinal, existing or future, checks its next allocation against it. The last call
/// wins. Lowering the limit below what is in use revokes nothing; allocations are refused
/// until enough is freed. Credit that stacks had reserved under the old limit and not
/// charged is revoked, so none of it is usable beyond the new limit. Errors:
/// invalid_ordinal. Thread-safe. (Takes the ordinal's lock, as a refill does.)
inline result<void> set_device_budget(std::uint32_t ordinal, std::size_t limit_bytes) noexcept {
  auto* slot = detail::budget_slot(ordinal);
  if (slot == nullptr) return detail::bad_budget_ordinal(ordinal);
  std::lock_guard lock(slot->mu);
  slot->set_limit_locked(limit_bytes);
  return ok();
}

/// Removes the limit of `ordinal` (what is in use is still counted). Errors: invalid_ordinal.
inline result<void> clear_device_budget(std::uint32_t ordinal) noexcept {
  return set_device_budget(ordinal, std::numeric_limits<std::size_t>::max());
}

/// The limit of `ordinal` and what every Budget of the process has charged against it
/// (the sum of its stripes: exact once the threads allocating on it are quiescent).
/// Errors: invalid_ordinal. Thread-safe; lock-free.
inline result<BudgetUsage> device_budget(std::uint32_t ordinal) noexcept {
  auto* slot = detail::budget_slot(ordinal);
  if (slot == nullptr) return detail::bad_budget_ordinal(ordinal);
  return BudgetUsage{slot->limit.load(std::memory_order_relaxed), slot->in_use()};
}

/// Not thread-safe: a value, owned by one thread at a time.
struct BudgetOptions {
  /// When set, the constructor calls set_device_budget(ordinal, *limit_bytes): the limit
  /// belongs to the ordinal, not to this stack, and the last one set wins. Leave it unset
  /// in every stack but the one that configures the process (DefaultStack sets it from
  /// XLOGRT_BUDGET_BYTES), or set it once with set_device_budget before building stacks.
  std::optional<std::size_t> limit_bytes;
};

/// Caps the bytes the whole process holds on one device ordinal.
///
/// Every Budget on ordinal N charges the same budget: a stack built by a library and one
/// built by the application share the limit. An allocation is charged before it reaches
/// the upstream and given back if the upstream fails. When the charge does not fit,
/// Budget reaps its upstream's queued frees (reap_pending), credits what they gave back,
/// and tries once more; then it fails with out_of_budget, naming the ordinal, the
/// request, the limit and what is in use.
///
/// When a free is credited (the invariant "in use >= bytes the device still holds for the
/// Budgets of this ordinal" is exact, never approximate):
/// - over an upstream that says `frees_synchronously` (the memory is back with the driver
///   when deallocate returns) the free is credited as deallocate returns;
/// - otherwise (AsyncCuda: cuMemFreeAsync queues the free on a stream) the bytes of a
///   successful deallocate move to this stack's `pending` count and stay charged. Our
///   reap_pending takes the pending count *before* calling the upstream's reap_pending,
///   and credits exactly that much once the upstream reap has succeeded: every free in
///   the count was queued before the reap began, so the reap has seen it complete. A free
///   queued while the reap runs stays pending for the next one; a failed reap puts the
///   count back. A queued free therefore counts against the budget until it is known to
///   be complete, exactly as the contract's bytes_outstanding counts it.
/// Bytes are counted as blocks report them (`DeviceBlock::bytes()`); a DebugGuard below a
/// Budget adds guard bytes the budget does not see, so put Budget right above the base.
/// Frees queued by *another* stack on the ordinal are reaped by that stack, not by this
/// one's pressure path.
///
/// Destruction gives back everything this Budget charged: its queued frees (reaped first,
/// best effort) and its blocks still live. A block still live when its stack goes is
/// lost to its holder (no resource can free it any more: its id names a resource that is
/// gone), and charging it for ever would shrink the ordinal's budget for every later
/// stack of the process, with no way to get the bytes back; the budget caps what live
/// stacks hold. To count this stack's share without a shared line on the fast path, the
/// bytes it holds charged are striped per stack like `pending` (`charged_`: + at a
/// successful allocate, - when a queued free is credited or a synchronous free returns),
/// summed only by the destructor. A move hands the counts to the new object.
///
/// Protocol (no read-modify-write on a line shared by all threads on the fast path).
/// Each ordinal has BUDGET_STRIPES stripes; a thread uses the stripe of its ticket
/// (detail::thread_stripe). A stripe has `charged` (charges minus credits made through
/// it; a stripe that frees blocks charged elsewhere goes negative) and `held` (the
/// credit it may charge up to). In use is the sum of `charged`; the cap is
/// "sum of held <= limit" (`reserved`, kept under the ordinal's spin lock, which guards
/// every write of `held`), and each stripe keeps charged <= held for every charge that
/// passed. With no limit, `held` is BUDGET_UNLIMITED and every check passes.
/// - Charge (fast): fetch_add `charged`, then load `held`; over it, fetch_sub back and
///   take the slow path. Both seq_cst (free on x86: a locked add is already a full
///   fence): they pair with the trim below. Credit: fetch_sub `charged`, relaxed (a
///   credit only makes room; a reader that misses it holds more back, never less).
/// - Refill (slow, under the lock): the stripe's `held` grows by the request plus a
///   chunk (limit/256) while the sum stays within the limit. When it does not fit,
///   every stripe is trimmed to what it has charged (credit stranded in the stripe of
///   another thread, or of one that has exited, comes back) and the refill is tried
///   again; only then does the charge fail. A request that fits in limit - in use
///   therefore never fails for lack of credit in the stripes. The one exception is a
///   race for the last free bytes: a charger on another stripe counts for the instant
///   between its fetch_add and its check, so a reclaim that saw such an overshoot looks
///   once more before failing.
/// - Trim (under the lock): store `held` = charged + keep, then read `charged` again
///   and raise `held` to it if it grew. seq_cst: a charger that read the old `held`
///   made its fetch_add before our store, so the second read sees it and `held` never
///   drops below a charge that passed. Why not a compare-exchange on `charged` against
///   `held`: the trim lowers `held` while a charger holds its old value, and a
///   compare-exchange that sees `charged` come back to the same number (ABA) would pass.
/// - A credit that leaves a stripe more than limit/16 of unused credit returns all but a
///   chunk, and the chunk only while the sum is below the limit (so a thread that
///   allocates and frees the same sizes never takes the lock, and no stripe keeps credit
///   beyond a lowered limit).
///   set_device_budget trims every stripe to what it has charged: the new limit applies
///   to all credit from then on.
/// - `pending` (this stack's queued frees) is striped the same way, per stack: raised
///   with a release fetch_add after the upstream's deallocate has queued the free, and
///   emptied stripe by stripe with acquire exchanges before the upstream reap: the pair
///   makes the queued free (the upstream's own bookkeeping of it) happen-before the
///   reap that the reaping thread then runs, so that reap is sure to see it.
///
/// Thread-safe. (The fast paths take no lock; a refill, a reclaim or a large return of
/// credit takes the ordinal's spin lock. The budget's own bookkeeping; the upstream keeps
/// its own guarantees.) Construction and moves happen-before use.
template <DeviceMemoryResource Upstream>
class Budget : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;

  explicit Budget(Upstream up, BudgetOptions options = {}) noexcept(
      std::is_nothrow_move_constructible_v<Upstream>)
      : Adaptor<Upstream>(std::move(up)), slot_(detail::budget_slot(upstream().device_ordinal())) {
    if constexpr (RetiringResource<Upstream>) seen_retired_.store(upstream().retired_bytes(), std::memory_order_relaxed);
    if (options.limit_bytes && slot_ != nullptr) {
      std::lock_guard lock(slot_->mu);
      slot_->set_limit_locked(*options.limit_bytes);
    }
  }
  Budget(Budget&& o) noexcept(std::is_nothrow_move_constructible_v<Upstream>)
      : Adaptor<Upstream>(std::move(o)), slot_(o.slot_),
        seen_retired_(o.seen_retired_.load(std::memory_order_relaxed)) {
    for (std::uint32_t i = 0; i < PENDING_STRIPES; ++i) {
      pending_[i].v.store(o.pending_[i].v.exchange(0, std::memory_order_acq_rel), std::memory_order_relaxed);
      charged_[i].v.store(o.charged_[i].v.exchange(0, std::memory_order_acq_rel), std::memory_order_relaxed);
    }
  }
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;
  Budget& operator=(Budget&&) = delete;

  /// Frees still queued when the stack is destroyed are reaped (best effort); then all
  /// this stack still has charged (blocks live, frees whose reap failed) is given back to
  /// the ordinal's budget (see the class comment).
  ~Budget() {
    if (pending_credit() != 0) (void)reap_pending();
    const std::size_t left = charged_bytes();
    if (left != 0 && slot_ != nullptr) slot_->credit(stripe(), static_cast<std::int64_t>(left));
  }

  /// Errors: out_of_budget (after one reap and retry), invalid_ordinal (an upstream
  /// ordinal beyond BUDGET_ORDINALS), and whatever the upstream returns.
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (bytes == 0) return upstream().allocate(bytes, stream, tag);  // the upstream names it
    if (slot_ == nullptr) return detail::bad_budget_ordinal(upstream().device_ordinal());
    detail::BudgetStripe& st = stripe();
    if (!charge(st, bytes)) {
      // A request that names no stream of the device is bad input before it is too big.
      if constexpr (DriverResource<Upstream>) {
        if (auto h = upstream().stream_handle(stream); !h) return std::move(h).error();
      }
      // What the device has already reached comes back without waiting; only then a reap.
      if (!(poll_pending() && charge(st, bytes))) {
        auto reaped = reap_pending();
        if (!charge(st, bytes)) return over_budget(bytes, stream, tag, reaped);
      }
    }
    auto b = upstream().allocate(bytes, stream, tag);
    if (!b) {
      slot_->credit(st, static_cast<std::int64_t>(bytes));
      return b;
    }
    if (b->bytes() > bytes) {
      slot_->charge_forced(st, static_cast<std::int64_t>(b->bytes() - bytes));
    } else if (b->bytes() < bytes) {
      slot_->credit(st, static_cast<std::int64_t>(bytes - b->bytes()));
    }
    charged_[detail::thread_stripe(PENDING_STRIPES)].v.fetch_add(b->bytes(), std::memory_order_relaxed);
    return b;
  }

  /// Errors: whatever the upstream returns. Whether the block was freed is read from the
  /// block, not from the result: the upstream consumes (empties) exactly the blocks it
  /// frees, and DebugGuard frees a block whose guard it reports corrupted.
  result<void> deallocate(DeviceBlock&& block) noexcept {
    const std::size_t n = block.bytes();
    const bool was_live = !block.empty();
    auto r = upstream().deallocate(std::move(block));
    if (was_live && block.empty()) {
      if constexpr (SynchronousFree<Upstream>) {
        give_back(n);
      } else {
        pending_[detail::thread_stripe(PENDING_STRIPES)].v.fetch_add(n, std::memory_order_release);
        settle();  // the upstream may have retired frees while queuing this one
      }
    }
    return r;
  }

  /// Retires what the upstream can retire without waiting (its poll_pending, where it has
  /// one) and credits it. Returns whether that succeeded; a failure changes nothing.
  bool poll_pending() noexcept {
    if constexpr (RetiringResource<Upstream>) {
      if (!upstream().poll_pending()) return false;
      settle();
    }
    return true;
  }


  /// Reaps the upstream and credits the frees it has seen complete.
  result<void> reap_pending() noexcept {
    std::size_t taken = 0;
    for (auto& p : pending_) {
      if (p.v.load(std::memory_order_relaxed) != 0) taken += p.v.exchange(0, std::memory_order_acquire);
    }
    auto r = upstream().reap_pending();
    if (!r) {
      if (taken != 0) pending_[detail::thread_stripe(PENDING_STRIPES)].v.fetch_add(taken, std::memory_order_relaxed);
      return r;
    }
    give_back(taken);
    // Every retirement so far is covered by the credit above (or stays pending for the
    // next reap): settle must not credit it again.
    if constexpr (RetiringResource<Upstream>) (void)see_retired(upstream().retired_bytes());
    return ok();
  }


  /// Bytes this stack has freed that are still charged, waiting for a reap.
  std::size_t pending_credit() const noexcept {
    std::size_t sum = 0;
    for (const auto& p : pending_) sum += p.v.load(std::memory_order_relaxed);
    return sum;
  }

  /// Bytes this stack holds charged against the ordinal's budget: its live blocks and
  /// its frees not yet credited (exact once the threads that allocate and free through
  /// it have finished; a moment's view while they run). What its destruction gives back.
  std::size_t charged_bytes() const noexcept {
    std::size_t sum = 0;  // wraps through "negative" stripes (a block freed by another thread) to the total
    for (const auto& c : charged_) sum += c.v.load(std::memory_order_relaxed);
    return sum;
  }

  /// The ordinal's budget (see device_budget()).
  BudgetUsage usage() const noexcept {
    if (slot_ == nullptr) return {};
    return {slot_->limit.load(std::memory_order_relaxed), slot_->in_use()};
  }

 private:
  /// Stripes of this stack's pending count (a power of two).
  static constexpr std::uint32_t PENDING_STRIPES = 16;
  struct alignas(detail::STRIPE_ALIGN) PendingStripe {
    std::atomic<std::size_t> v{0};
  };

  detail::BudgetStripe& stripe() const noexcept {
    return slot_->stripes[detail::thread_stripe(detail::BUDGET_STRIPES)];
  }

  /// Credits the bytes the upstream retired since the last look, taken from this stack's
  /// pending count (never more than it holds: a retirement whose free this stack has not
  /// counted yet stays pending, for the next reap). The total credited never exceeds what
  /// the upstream retired.
  void settle() noexcept {
    if constexpr (RetiringResource<Upstream>) {
      std::size_t want = static_cast<std::size_t>(see_retired(upstream().retired_bytes()));
      if (want == 0) return;
      std::size_t taken = 0;
      for (auto& p : pending_) {
        std::size_t v = p.v.load(std::memory_order_relaxed);
        while (v != 0 && want != 0) {
          const std::size_t t = v < want ? v : want;
          if (p.v.compare_exchange_weak(v, v - t, std::memory_order_acquire, std::memory_order_relaxed)) {
            taken += t;
            want -= t;
            break;
          }
        }
        if (want == 0) break;
      }
      give_back(taken);
    }
  }

  /// Raises seen_retired_ to `now`; returns by how much (0 when it was there already).
  std::uint64_t see_retired(std::uint64_t now) noexcept {
    std::uint64_t seen = seen_retired_.load(std::memory_order_relaxed);
    do {
      if (now <= seen) return 0;
    } while (!seen_retired_.compare_exchange_weak(seen, now, std::memory_order_relaxed));
    return now - seen;
  }

  /// Returns `n` bytes this stack had charged to the ordinal's budget.
  void give_back(std::size_t n) noexcept {
    if (n == 0 || slot_ == nullptr) return;
    slot_->credit(stripe(), static_cast<std::int64_t>(n));
    charged_[detail::thread_stripe(PENDING_STRIPES)].v.fetch_sub(n, std::memory_order_relaxed);
  }

  bool charge(detail::BudgetStripe& st, std::size_t n) noexcept {
    if (n > static_cast<std::size_t>(detail::BUDGET_UNLIMITED)) {
      // No stripe arithmetic for such a request: it fits only when there is no limit.
      if (slot_->limit.load(std::memory_order_relaxed) != std::numeric_limits<std::size_t>::max()) return false;
      slot_->charge_forced(st, static_cast<std::int64_t>(n));
      return true;
    }
    const auto m = static_cast<std::int64_t>(n);
    return detail::BudgetSlot::try_charge(st, m) || slot_->charge_slow(st, m);
  }

  error over_budget(std::size_t bytes, StreamId stream, AllocTag tag, const result<void>& reaped) const {
    const auto u = usage();
    std::string m = "ordinal " + std::to_string(upstream().device_ordinal()) + ": a request of " +
                    std::to_string(bytes) + " bytes (stream " + std::to_string(stream.value) +
                    ", tag " + std::to_string(tag.value) + ") does not fit in the budget of " +
                    std::to_string(u.limit) + " bytes with " + std::to_string(u.in_use) +
                    " bytes in use";
    if (reaped) {
      m += ", even after reaping queued frees; free memory or raise the budget (set_device_budget)";
    } else {
      m += "; reaping queued frees failed: " + reaped.error().what();
    }
    return error{errc::out_of_budget, std::move(m)};
  }

  detail::BudgetSlot* slot_;
  PendingStripe pending_[PENDING_STRIPES];
  PendingStripe charged_[PENDING_STRIPES];  // this stack's charge, striped (see the class comment)
  std::atomic<std::uint64_t> seen_retired_{0};  // the upstream's retired_bytes() at the last settle
};

static_assert(DeviceMemoryResource<Budget<detail::PlainArchetype>>);
static_assert(!TrackingResource<Budget<detail::PlainArchetype>>);
static_assert(TrackingResource<Budget<detail::TrackingArchetype>>);
static_assert(DriverResource<Budget<detail::DriverArchetype>>);
static_assert(!DriverResource<Budget<detail::TrackingArchetype>>);

}  // namespace xlogrt
