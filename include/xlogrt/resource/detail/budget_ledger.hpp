// SPDX-License-Identifier: Apache-2.0
#pragma once

// The budget ledger's implementation: one device's striped ledger (BudgetSlot), the
// process's table of them, and the table of the simulated machines' ledgers. The face,
// with what is shared and why, is xlogrt/resource/budget_ledger.hpp.
//
// Protocol of one device's ledger (no read-modify-write on a line shared by all threads
// on the fast path). Each device has BUDGET_STRIPES stripes; a thread uses the stripe of
// its ticket (detail::thread_stripe). A stripe (detail/budget_stripe.hpp) has `charged`
// (charges minus credits made through it; a stripe that frees blocks charged elsewhere
// goes negative) and `held` (the credit it may charge up to). In use is the sum of
// `charged`; the cap is "sum of held <= limit" (`reserved`, kept under the device's spin
// lock, which guards every write of `held`), and each stripe keeps charged <= held for
// every charge that passed. With no limit, `held` is BUDGET_UNLIMITED and every check
// passes.
// - Charge (fast, BudgetStripe::try_charge): fetch_add `charged`, then load `held`; over
//   it, fetch_sub back and take the slow path. Both seq_cst: they pair with the trim
//   (budget_stripe.hpp has the race, and test/model/test_budget_model.cpp checks it).
//   Credit: fetch_sub `charged`, relaxed (a credit only makes room; a reader that misses
//   it holds more back, never less).
// - Refill (slow, under the lock): the stripe's `held` grows by the request plus a
//   chunk (limit/256) while the sum stays within the limit. When it does not fit,
//   every stripe is trimmed to what it has charged (credit stranded in the stripe of
//   another thread, or of one that has exited, comes back) and the refill is tried
//   again; only then does the charge fail. A request that fits in limit - in use
//   therefore never fails for lack of credit in the stripes. The one exception is a
//   race for the last free bytes: a charger on another stripe counts for the instant
//   between its fetch_add and its check, so a reclaim that saw such an overshoot looks
//   once more before failing.
// - Trim (under the lock, BudgetStripe::trim): store `held` = charged + keep, then read
//   `charged` again and raise `held` to it if it grew. seq_cst: a charger that read the
//   old `held` made its fetch_add before our store, so the second read sees it and
//   `held` never drops below a charge that passed.
// - A credit that leaves a stripe more than limit/16 of unused credit returns all but a
//   chunk, and the chunk only while the sum is below the limit (so a thread that
//   allocates and frees the same sizes never takes the lock, and no stripe keeps credit
//   beyond a lowered limit).
//   set_device_budget trims every stripe to what it has charged: the new limit applies
//   to all credit from then on.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "xlogrt/core/error.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/detail/budget_stripe.hpp"
#include "xlogrt/resource/detail/spin_lock.hpp"
#include "xlogrt/resource/detail/stripes.hpp"

namespace xlogrt {

/// Ordinals a machine's ledgers cover (0 .. BUDGET_ORDINALS-1), as many as DeviceRuntime.
inline constexpr std::uint32_t BUDGET_ORDINALS = 16;

namespace detail {

/// Stripes of each device's ledger (a power of two). 64: as many threads as a large
/// host runs allocate without sharing one.
inline constexpr std::uint32_t BUDGET_STRIPES = 64;

/// One device's ledger: its limit and the stripes charged against it.
/// Thread-safe. (See the protocol block above.)
struct BudgetSlot {
  SpinLock mu;  ///< guards limit, reserved, chunk and every stripe's `held`
  std::atomic<std::size_t> limit{std::numeric_limits<std::size_t>::max()};
  std::int64_t reserved = 0;  ///< the sum of the stripes' `held` while limited
  std::int64_t chunk = 0;     ///< extra credit a refill hands a stripe
  /// A stripe whose unused credit passes this returns all but `chunk` of it (read
  /// without the lock on the free path).
  std::atomic<std::int64_t> return_above{0};
  BudgetStripe stripes[BUDGET_STRIPES];

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
      (void)st.trim(0);
      reserved = wrap_add(reserved, st.held.load(std::memory_order_relaxed));
    }
  }

  /// The slow path: refills `st` from the device's free budget, reclaiming every
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
          if (st.try_charge(n)) return true;
          continue;  // a thread sharing the stripe took it; it was charged, so go on
        }
        if (reclaimed) break;
        for (auto& other : stripes) reserved -= other.trim(0, &overshoot);
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
  /// `return_above` to the device.
  void credit(BudgetStripe& st, std::int64_t n) noexcept {
    const std::int64_t v = st.credit(n);
    const std::int64_t h = st.held.load(std::memory_order_relaxed);
    if (h == BUDGET_UNLIMITED || h - v <= return_above.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(mu);
    if (st.held.load(std::memory_order_relaxed) == BUDGET_UNLIMITED) return;
    // Keep a chunk, but only out of the free budget: after a lowered limit there is none.
    reserved -= st.trim(0);
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

/// The machine of the process's own devices (see budget_ledger.hpp): CUDA's, and those
/// of resources that reach no driver. No simulated machine has this number.
inline constexpr std::uint64_t PROCESS_MACHINE = 0;

/// The process's devices, one ledger per ordinal. Constant-initialised and trivially
/// destructible, so it is usable from any static initialiser or destructor, at exit
/// included, and a Budget on them resolves its ledger with no lock. One table per
/// process as long as xlogrt's inline functions are shared between the shared objects
/// that include it (the default visibility); a library built with -fvisibility=hidden
/// gets a table of its own.
inline BudgetSlot* budget_slot(std::uint32_t ordinal) noexcept {
  static constinit BudgetSlot table[BUDGET_ORDINALS];
  return ordinal < BUDGET_ORDINALS ? &table[ordinal] : nullptr;
}

inline error bad_budget_ordinal(std::uint32_t ordinal) {
  return error{errc::invalid_ordinal, "device ordinal " + std::to_string(ordinal) +
                                          " has no budget: budgets cover ordinals 0 to " +
                                          std::to_string(BUDGET_ORDINALS - 1)};
}

inline error no_ledger_memory(std::uint64_t machine, std::uint32_t ordinal) {
  return error{errc::out_of_memory, "simulated machine " + std::to_string(machine) + ", device ordinal " +
                                        std::to_string(ordinal) +
                                        ": the host could not allocate the device's budget ledger; free host "
                                        "memory and build the stack again"};
}

/// The ledgers of the simulated machines, keyed by (machine serial, ordinal). An entry
/// lives while a Budget holds its ledger or while its device has a limit: with neither,
/// there is nothing to remember and the entry goes. While no Budget holds it, an entry
/// keeps only its limit: the striped ledger (~8 KiB) is freed with its last holder,
/// since in use is 0 then (every Budget gives back all it charged when it goes). Should
/// bytes still be charged then (a bookkeeping bug), the ledger is kept, so that
/// device_budget keeps showing them rather than dropping them. So what a machine leaves
/// behind after its destruction is one small node per device it gave a limit, never
/// inherited by another machine (serials are never reused). Leaked on purpose, like the
/// runtime singletons: a Budget destroyed at exit may still release its ledger.
/// Thread-safe. (One mutex, taken when a Budget is built or destroyed and by the
/// machine-qualified set_device_budget / device_budget; never on an allocation.)
class MachineLedgers {
 public:
  /// nullptr only when the host could not allocate the table's first bytes.
  static MachineLedgers* instance() noexcept {
    static MachineLedgers* const table = new (std::nothrow) MachineLedgers;
    return table;
  }

  /// The ledger of (machine, ordinal), held until release(); nullptr when the host is
  /// out of memory. @pre ordinal < BUDGET_ORDINALS.
  BudgetSlot* acquire(std::uint64_t machine, std::uint32_t ordinal) noexcept {
    std::lock_guard lock(mu_);
    try {
      Entry& e = entries_[{machine, ordinal}];
      if (!e.slot) {
        e.slot.reset(new BudgetSlot);
        if (e.limit != UNLIMITED) {
          std::lock_guard slot_lock(e.slot->mu);
          e.slot->set_limit_locked(e.limit);
        }
      }
      ++e.holders;
      return e.slot.get();
    } catch (...) {
      forget_if_idle({machine, ordinal});
      return nullptr;
    }
  }

  /// A holder is done with the ledger of (machine, ordinal).
  void release(std::uint64_t machine, std::uint32_t ordinal) noexcept {
    std::lock_guard lock(mu_);
    auto it = entries_.find({machine, ordinal});
    if (it == entries_.end() || --it->second.holders != 0 || it->second.slot->in_use() != 0) return;
    it->second.limit = it->second.slot->limit.load(std::memory_order_relaxed);
    it->second.slot.reset();
    forget_if_idle(it->first);
  }

  /// Sets the limit of (machine, ordinal), held or not. False when the host is out of memory.
  bool set_limit(std::uint64_t machine, std::uint32_t ordinal, std::size_t limit) noexcept {
    std::lock_guard lock(mu_);
    try {
      Entry& e = entries_[{machine, ordinal}];
      if (e.slot) {
        std::lock_guard slot_lock(e.slot->mu);
        e.slot->set_limit_locked(limit);
      } else {
        e.limit = limit;
        forget_if_idle({machine, ordinal});
      }
      return true;
    } catch (...) {
      return false;
    }
  }

  /// The limit of (machine, ordinal) and what its holders have charged.
  std::pair<std::size_t, std::size_t> usage(std::uint64_t machine, std::uint32_t ordinal) noexcept {
    std::lock_guard lock(mu_);
    auto it = entries_.find({machine, ordinal});
    if (it == entries_.end()) return {UNLIMITED, 0};
    if (!it->second.slot) return {it->second.limit, 0};
    return {it->second.slot->limit.load(std::memory_order_relaxed), it->second.slot->in_use()};
  }

  /// Entries kept (held, or remembering a limit). For tests of the lifetime above.
  std::size_t entries() noexcept {
    std::lock_guard lock(mu_);
    return entries_.size();
  }

 private:
  static constexpr std::size_t UNLIMITED = std::numeric_limits<std::size_t>::max();
  using Key = std::pair<std::uint64_t, std::uint32_t>;
  struct Entry {
    std::size_t limit = UNLIMITED;     ///< the limit while no Budget holds the ledger
    std::size_t holders = 0;           ///< Budgets holding `slot`
    std::unique_ptr<BudgetSlot> slot;  ///< present while holders > 0 or bytes are charged
  };

  /// @pre mu_ is held.
  void forget_if_idle(const Key& k) noexcept {
    auto it = entries_.find(k);
    if (it != entries_.end() && !it->second.slot && it->second.limit == UNLIMITED) entries_.erase(it);
  }

  std::mutex mu_;
  std::map<Key, Entry> entries_;
};

}  // namespace detail
}  // namespace xlogrt
