// SPDX-License-Identifier: Apache-2.0
#pragma once

// Budget<Up>: one byte budget per device ordinal, shared by every stack of the process
// on that ordinal.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/decorator.hpp"

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

struct alignas(64) BudgetSlot {
  std::atomic<std::size_t> limit{std::numeric_limits<std::size_t>::max()};
  std::atomic<std::size_t> in_use{0};
};

/// The process-wide table, one slot per ordinal. Constant-initialised and trivially
/// destructible, so it is usable from any static initialiser or destructor, at exit
/// included. One table per process as long as xlogrt's inline functions are shared
/// between the shared objects that include it (the default visibility); a library built
/// with -fvisibility=hidden gets a table of its own.
inline BudgetSlot* budget_slot(std::uint32_t ordinal) noexcept {
  static BudgetSlot table[BUDGET_ORDINALS];
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
/// until enough is freed. Errors: invalid_ordinal. Thread-safe; lock-free.
inline result<void> set_device_budget(std::uint32_t ordinal, std::size_t limit_bytes) noexcept {
  auto* slot = detail::budget_slot(ordinal);
  if (slot == nullptr) return detail::bad_budget_ordinal(ordinal);
  slot->limit.store(limit_bytes, std::memory_order_relaxed);
  return ok();
}

/// Removes the limit of `ordinal` (what is in use is still counted). Errors: invalid_ordinal.
inline result<void> clear_device_budget(std::uint32_t ordinal) noexcept {
  return set_device_budget(ordinal, std::numeric_limits<std::size_t>::max());
}

/// The limit of `ordinal` and what every Budget of the process has charged against it.
/// Errors: invalid_ordinal. Thread-safe; lock-free.
inline result<BudgetUsage> device_budget(std::uint32_t ordinal) noexcept {
  auto* slot = detail::budget_slot(ordinal);
  if (slot == nullptr) return detail::bad_budget_ordinal(ordinal);
  return BudgetUsage{slot->limit.load(std::memory_order_relaxed),
                     slot->in_use.load(std::memory_order_relaxed)};
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
/// Every Budget on ordinal N charges the same counter: a stack built by a library and one
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
/// Lock-free protocol (the ordinal's `in_use` counter and this stack's `pending_`):
/// - `in_use` is charged by a compare-exchange loop that refuses to go past `limit`.
///   fetch_add-then-check would be simpler but overshoots for a moment, and a concurrent
///   request that fits would then be refused for another's excess. The loop only retries
///   when another thread changed `in_use`, so some thread always makes progress. Credits
///   are fetch_sub. All of these are relaxed: the counter guards a quantity, publishes no
///   data, and the total order of read-modify-writes on one atomic is all the cap needs.
///   `limit` is read relaxed: a new limit applies from the next charge that sees it.
/// - `pending_` is raised with a release fetch_add after the upstream's deallocate has
///   queued the free, and emptied with an acquire exchange before the upstream reap: the
///   pair makes the queued free (the upstream's own bookkeeping of it) happen-before the
///   reap that the reaping thread then runs, so that reap is sure to see it.
///
/// Thread-safe; lock-free. (The budget's own bookkeeping; the upstream keeps its own
/// guarantees.) Construction and moves happen-before use.
template <DeviceMemoryResource Upstream>
class Budget : public detail::Forwarding<Budget<Upstream>, Upstream> {
 public:
  static constexpr bool supports_block_use_tracking = Upstream::supports_block_use_tracking;
  static constexpr bool frees_synchronously = SynchronousFree<Upstream>;

  explicit Budget(Upstream upstream, BudgetOptions options = {}) noexcept(
      std::is_nothrow_move_constructible_v<Upstream>)
      : up_(std::move(upstream)), slot_(detail::budget_slot(up_.device_ordinal())) {
    if (options.limit_bytes && slot_ != nullptr) {
      slot_->limit.store(*options.limit_bytes, std::memory_order_relaxed);
    }
  }
  Budget(Budget&& o) noexcept(std::is_nothrow_move_constructible_v<Upstream>)
      : up_(std::move(o.up_)), slot_(o.slot_),
        pending_(o.pending_.exchange(0, std::memory_order_acq_rel)) {}
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;
  Budget& operator=(Budget&&) = delete;

  /// Frees still queued when the stack is destroyed are reaped (best effort) and
  /// credited; blocks still live stay charged, since the device still holds them.
  ~Budget() {
    if (pending_.load(std::memory_order_relaxed) != 0) (void)reap_pending();
  }

  /// Errors: out_of_budget (after one reap and retry), invalid_ordinal (an upstream
  /// ordinal beyond BUDGET_ORDINALS), and whatever the upstream returns.
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    if (bytes == 0) return up_.allocate(bytes, stream, tag);  // the upstream names it
    if (slot_ == nullptr) return detail::bad_budget_ordinal(up_.device_ordinal());
    if (!try_charge(bytes)) {
      auto reaped = reap_pending();
      if (!try_charge(bytes)) return over_budget(bytes, stream, tag, reaped);
    }
    auto b = up_.allocate(bytes, stream, tag);
    if (!b) {
      credit(bytes);
      return b;
    }
    if (b->bytes() > bytes) {
      slot_->in_use.fetch_add(b->bytes() - bytes, std::memory_order_relaxed);
    } else if (b->bytes() < bytes) {
      credit(bytes - b->bytes());
    }
    return b;
  }

  /// Errors: whatever the upstream returns. Whether the block was freed is read from the
  /// block, not from the result: the upstream consumes (empties) exactly the blocks it
  /// frees, and DebugGuard frees a block whose guard it reports corrupted.
  result<void> deallocate(DeviceBlock&& block) noexcept {
    const std::size_t n = block.bytes();
    const bool was_live = !block.empty();
    auto r = up_.deallocate(std::move(block));
    if (was_live && block.empty()) {
      if constexpr (frees_synchronously) {
        credit(n);
      } else {
        pending_.fetch_add(n, std::memory_order_release);
      }
    }
    return r;
  }

  std::size_t bytes_outstanding() const noexcept { return up_.bytes_outstanding(); }

  /// Reaps the upstream and credits the frees it has seen complete.
  result<void> reap_pending() noexcept {
    const std::size_t taken = pending_.exchange(0, std::memory_order_acquire);
    auto r = up_.reap_pending();
    if (!r) {
      if (taken != 0) pending_.fetch_add(taken, std::memory_order_relaxed);
      return r;
    }
    credit(taken);
    return ok();
  }

  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }

  /// Bytes this stack has freed that are still charged, waiting for a reap.
  std::size_t pending_credit() const noexcept { return pending_.load(std::memory_order_relaxed); }

  /// The ordinal's budget (see device_budget()).
  BudgetUsage usage() const noexcept {
    if (slot_ == nullptr) return {};
    return {slot_->limit.load(std::memory_order_relaxed), slot_->in_use.load(std::memory_order_relaxed)};
  }

  // ---- upstream (the optional capabilities are forwarded by detail::Forwarding) ----

  Upstream& upstream() noexcept { return up_; }
  const Upstream& upstream() const noexcept { return up_; }

 private:
  bool try_charge(std::size_t n) noexcept {
    const std::size_t limit = slot_->limit.load(std::memory_order_relaxed);
    std::size_t cur = slot_->in_use.load(std::memory_order_relaxed);
    do {
      if (n > limit || cur > limit - n) return false;
    } while (!slot_->in_use.compare_exchange_weak(cur, cur + n, std::memory_order_relaxed,
                                                  std::memory_order_relaxed));
    return true;
  }

  void credit(std::size_t n) noexcept {
    if (n != 0) slot_->in_use.fetch_sub(n, std::memory_order_relaxed);
  }

  error over_budget(std::size_t bytes, StreamId stream, AllocTag tag, const result<void>& reaped) const {
    const auto u = usage();
    std::string m = "ordinal " + std::to_string(up_.device_ordinal()) + ": a request of " +
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

  [[no_unique_address]] Upstream up_;
  detail::BudgetSlot* slot_;
  std::atomic<std::size_t> pending_{0};
};

static_assert(DeviceMemoryResource<Budget<detail::PlainArchetype>>);
static_assert(!TrackingResource<Budget<detail::PlainArchetype>>);
static_assert(TrackingResource<Budget<detail::TrackingArchetype>>);
static_assert(DriverResource<Budget<detail::DriverArchetype>>);
static_assert(!DriverResource<Budget<detail::TrackingArchetype>>);

}  // namespace xlogrt
