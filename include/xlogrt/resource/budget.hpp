// SPDX-License-Identifier: Apache-2.0
#pragma once

// Budget<Up>: caps the bytes every stack on one device holds, by charging the device's
// ledger (resource/budget_ledger.hpp says what a device is and what is shared).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/adaptor.hpp"
#include "xlogrt/resource/budget_ledger.hpp"
#include "xlogrt/resource/request_checks.hpp"
#include "xlogrt/resource/detail/archetypes.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

/// Not thread-safe: a value, owned by one thread at a time.
struct BudgetOptions {
  /// When set, the constructor sets the limit of the stack's device (set_device_budget):
  /// the limit belongs to the device, not to this stack, and the last one set wins. Leave
  /// it unset in every stack but the one that configures the device (DefaultStack sets it
  /// from XLOGRT_BUDGET_BYTES), or set it once with set_device_budget before building
  /// stacks.
  std::optional<std::size_t> limit_bytes;
};

/// Caps the bytes every stack on one device holds.
///
/// Every Budget on a device charges the device's one ledger (budget_ledger.hpp): a stack
/// built by a library and one built by the application on the same device share the
/// limit; stacks on two SimDrivers do not. The ledger is resolved once, at construction:
/// the device is the upstream's driver's machine (DriverResource) or, for an upstream
/// that reaches no driver, the process's, and the ordinal is the upstream's. An
/// allocation is charged before it reaches the upstream and given back if the upstream
/// fails. When the charge does not fit, Budget reaps its upstream's queued frees
/// (reap_pending), credits what they gave back, and tries once more; then it fails with
/// out_of_budget, naming the ordinal, the request, the limit and what is in use.
///
/// When a free is credited (the invariant "in use >= bytes the device still holds for the
/// Budgets of this device" is exact, never approximate):
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
/// Frees queued by *another* stack on the device are reaped by that stack, not by this
/// one's pressure path.
///
/// Destruction gives back everything this Budget charged: its queued frees (reaped first,
/// best effort) and its blocks still live. A block still live when its stack goes is
/// lost to its holder (no resource can free it any more: its id names a resource that is
/// gone), and charging it for ever would shrink the device's budget for every later
/// stack on it, with no way to get the bytes back; the budget caps what live
/// stacks hold. To count this stack's share without a shared line on the fast path, the
/// bytes it holds charged are striped per stack like `pending` (`charged_`: + at a
/// successful allocate, - when a queued free is credited or a synchronous free returns),
/// summed only by the destructor. A move hands the counts to the new object.
///
/// Protocol. The device's ledger is striped (detail/budget_ledger.hpp has its protocol):
/// a thread charges and credits the stripe of its ticket, with no read-modify-write on a
/// line shared by all threads on the fast path.
/// - `pending` (this stack's queued frees) is striped the same way, per stack: raised
///   with a release fetch_add after the upstream's deallocate has queued the free, and
///   emptied stripe by stripe with acquire exchanges before the upstream reap: the pair
///   makes the queued free (the upstream's own bookkeeping of it) happen-before the
///   reap that the reaping thread then runs, so that reap is sure to see it.
///
/// Thread-safe. (The fast paths take no lock; a refill, a reclaim or a large return of
/// credit takes the device's spin lock; construction and destruction of a stack on a
/// simulated machine take the lock of the machines' ledgers. The budget's own
/// bookkeeping; the upstream keeps its own guarantees.) Construction and moves
/// happen-before use.
template <DeviceMemoryResource Upstream>
class Budget : public Adaptor<Upstream> {
 public:
  using Adaptor<Upstream>::upstream;

  explicit Budget(Upstream up, BudgetOptions options = {}) noexcept(
      std::is_nothrow_move_constructible_v<Upstream>)
      : Adaptor<Upstream>(std::move(up)), lease_(ledger_of(upstream())) {
    if constexpr (RetiringResource<Upstream>) seen_retired_.store(upstream().retired_bytes(), std::memory_order_relaxed);
    if (options.limit_bytes && lease_.slot() != nullptr) {
      std::lock_guard lock(lease_.slot()->mu);
      lease_.slot()->set_limit_locked(*options.limit_bytes);
    }
  }
  Budget(Budget&& o) noexcept(std::is_nothrow_move_constructible_v<Upstream>)
      : Adaptor<Upstream>(std::move(o)), lease_(std::move(o.lease_)),
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
  /// the device's budget (see the class comment).
  ~Budget() {
    if (pending_credit() != 0) (void)reap_pending();
    const std::size_t left = charged_bytes();
    if (left != 0 && lease_.slot() != nullptr) lease_.slot()->credit(stripe(), static_cast<std::int64_t>(left));
  }

  /// Errors: out_of_budget (after one reap and retry), invalid_ordinal (an upstream
  /// ordinal beyond BUDGET_ORDINALS), out_of_memory (the host could not allocate a
  /// simulated device's ledger when the stack was built), and whatever the upstream
  /// returns.
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (bytes == 0) return upstream().allocate(bytes, stream, tag);  // the upstream names it
    if (lease_.slot() == nullptr) return lease_.unavailable();
    detail::BudgetStripe& st = stripe();
    if (!charge(st, bytes)) {
      // Bad input (no stream of the device, more than the device has) before too big.
      XLOGRT_TRY(check_request(upstream(), bytes, stream));
      // What the device has already reached comes back without waiting; only then a reap.
      if (!(poll_pending() && charge(st, bytes))) {
        auto reaped = reap_pending();
        if (!charge(st, bytes)) return over_budget(bytes, stream, tag, reaped);
      }
    }
    auto b = upstream().allocate(bytes, stream, tag);
    if (!b) {
      lease_.slot()->credit(st, static_cast<std::int64_t>(bytes));
      return b;
    }
    if (b->bytes() > bytes) {
      lease_.slot()->charge_forced(st, static_cast<std::int64_t>(b->bytes() - bytes));
    } else if (b->bytes() < bytes) {
      lease_.slot()->credit(st, static_cast<std::int64_t>(bytes - b->bytes()));
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

  /// Bytes this stack holds charged against the device's budget: its live blocks and
  /// its frees not yet credited (exact once the threads that allocate and free through
  /// it have finished; a moment's view while they run). What its destruction gives back.
  std::size_t charged_bytes() const noexcept {
    std::size_t sum = 0;  // wraps through "negative" stripes (a block freed by another thread) to the total
    for (const auto& c : charged_) sum += c.v.load(std::memory_order_relaxed);
    return sum;
  }

  /// The device's budget (see device_budget()).
  BudgetUsage usage() const noexcept {
    if (lease_.slot() == nullptr) return {};
    return {lease_.slot()->limit.load(std::memory_order_relaxed), lease_.slot()->in_use()};
  }

 private:
  /// Stripes of this stack's pending count (a power of two).
  static constexpr std::uint32_t PENDING_STRIPES = 16;
  struct alignas(detail::STRIPE_ALIGN) PendingStripe {
    std::atomic<std::size_t> v{0};
  };

  /// The ledger of the upstream's device (see the class comment).
  static detail::LedgerLease ledger_of(Upstream& up) noexcept {
    if constexpr (DriverResource<Upstream>) {
      return detail::LedgerLease(detail::machine_of(up.driver()), up.device_ordinal());
    } else {
      return detail::LedgerLease(detail::PROCESS_MACHINE, up.device_ordinal());
    }
  }

  detail::BudgetStripe& stripe() const noexcept {
    return lease_.slot()->stripes[detail::thread_stripe(detail::BUDGET_STRIPES)];
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

  /// Returns `n` bytes this stack had charged to the device's budget.
  void give_back(std::size_t n) noexcept {
    if (n == 0 || lease_.slot() == nullptr) return;
    lease_.slot()->credit(stripe(), static_cast<std::int64_t>(n));
    charged_[detail::thread_stripe(PENDING_STRIPES)].v.fetch_sub(n, std::memory_order_relaxed);
  }

  bool charge(detail::BudgetStripe& st, std::size_t n) noexcept {
    if (n > static_cast<std::size_t>(detail::BUDGET_UNLIMITED)) {
      // No stripe arithmetic for such a request: it fits only when there is no limit.
      if (lease_.slot()->limit.load(std::memory_order_relaxed) != std::numeric_limits<std::size_t>::max()) return false;
      lease_.slot()->charge_forced(st, static_cast<std::int64_t>(n));
      return true;
    }
    const auto m = static_cast<std::int64_t>(n);
    return st.try_charge(m) || lease_.slot()->charge_slow(st, m);
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

  detail::LedgerLease lease_;  // this stack's device's ledger, resolved once at construction
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
