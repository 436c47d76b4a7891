// SPDX-License-Identifier: Apache-2.0
#pragma once

// The budget ledger: one byte budget per device, charged by every Budget stack on it.
//
// What is shared, and why. A device's memory is one pool however many stacks allocate
// from it: the torch bridge's stack and an application's owned runtime on GPU 0 of one
// process compete for the same bytes, so a cap on GPU 0 must count both. The ledger is
// therefore per device, not per stack: every Budget on a device charges that device's
// one ledger, and set_device_budget caps them all together, the last limit set winning.
//
// What is a device: a (machine, ordinal) pair.
// - The process's own devices are one machine. They are the ones CudaDriver reaches (it
//   has one instance per process) and the ones a resource that reaches no driver names
//   (an upstream over cudaMalloc, a test spy: its ordinal can only mean one of the
//   process's GPUs). `set_device_budget(ordinal, limit)` names them.
// - A driver whose every instance is a machine of its own says so with
//   `machine_serial()` (MachinePerInstance). Each SimDriver simulates devices with their
//   own memory, so two SimDrivers are two machines: their ordinals 0 have independent
//   ledgers, and a limit on one is nothing to the other. Name one with
//   `set_device_budget(sim, ordinal, limit)`. Two stacks over one SimDriver and one
//   ordinal share its ledger, as two stacks on one GPU do.
// A machine is identified by its serial, not by the driver's address: a SimDriver
// destroyed and another built at the same address is a new machine with a new serial,
// so it cannot inherit the old one's limit, as an address key would let it.
//
// Cost. A Budget resolves its device's ledger once, when it is built (an index into the
// process's table, or a lock and a map lookup for a simulated machine) and keeps a
// pointer to it: allocate and deallocate go to the ledger's stripes with no lookup.
//
// Lifetime. The process's table is constant-initialised and never destroyed (usable at
// exit). A simulated machine's ledger lives while a Budget holds it; after that only its
// limit is kept, if it has one (detail::MachineLedgers says what that costs).

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/resource/detail/budget_ledger.hpp"

namespace xlogrt {

/// The budget of one device: its limit and the bytes charged against it.
/// Not thread-safe: a value, owned by one thread at a time.
struct BudgetUsage {
  std::size_t limit = 0;   ///< SIZE_MAX when no limit was set
  std::size_t in_use = 0;  ///< charged by every Budget on the device
};

/// A driver each of whose instances is a machine of its own (SimDriver): machine_serial()
/// is unique in the process, never reused and never 0. Other drivers (CudaDriver) reach
/// the process's own devices.
template <class D>
concept MachinePerInstance = requires(const D& d) {
  { d.machine_serial() } noexcept -> std::same_as<std::uint64_t>;
};

namespace detail {

/// The machine a driver instance reaches (see the header comment).
template <class D>
std::uint64_t machine_of(const D& driver) noexcept {
  if constexpr (MachinePerInstance<D>) {
    return driver.machine_serial();
  } else {
    return PROCESS_MACHINE;
  }
}

/// A Budget's hold on its device's ledger, resolved once at construction. slot() is
/// nullptr when the device has none: an ordinal beyond BUDGET_ORDINALS, or a simulated
/// machine's ledger the host could not allocate (unavailable() says which). Moving hands
/// the hold over. Not thread-safe: construction and moves happen-before use.
class LedgerLease {
 public:
  LedgerLease(std::uint64_t machine, std::uint32_t ordinal) noexcept : machine_(machine), ordinal_(ordinal) {
    if (ordinal >= BUDGET_ORDINALS) return;
    if (machine == PROCESS_MACHINE) {
      slot_ = budget_slot(ordinal);
    } else if (auto* table = MachineLedgers::instance()) {
      slot_ = table->acquire(machine, ordinal);
    }
  }
  LedgerLease(LedgerLease&& o) noexcept
      : slot_(std::exchange(o.slot_, nullptr)), machine_(o.machine_), ordinal_(o.ordinal_) {}
  LedgerLease(const LedgerLease&) = delete;
  LedgerLease& operator=(const LedgerLease&) = delete;
  LedgerLease& operator=(LedgerLease&&) = delete;
  ~LedgerLease() {
    if (slot_ != nullptr && machine_ != PROCESS_MACHINE) MachineLedgers::instance()->release(machine_, ordinal_);
  }

  BudgetSlot* slot() const noexcept { return slot_; }

  /// Why slot() is nullptr.
  error unavailable() const {
    return ordinal_ >= BUDGET_ORDINALS ? bad_budget_ordinal(ordinal_) : no_ledger_memory(machine_, ordinal_);
  }

 private:
  BudgetSlot* slot_ = nullptr;
  std::uint64_t machine_;
  std::uint32_t ordinal_;
};

inline result<void> set_machine_budget(std::uint64_t machine, std::uint32_t ordinal, std::size_t limit_bytes) noexcept {
  if (ordinal >= BUDGET_ORDINALS) return bad_budget_ordinal(ordinal);
  if (machine == PROCESS_MACHINE) {
    BudgetSlot* slot = budget_slot(ordinal);
    std::lock_guard lock(slot->mu);
    slot->set_limit_locked(limit_bytes);
    return ok();
  }
  auto* table = MachineLedgers::instance();
  if (table == nullptr || !table->set_limit(machine, ordinal, limit_bytes)) return no_ledger_memory(machine, ordinal);
  return ok();
}

inline result<BudgetUsage> machine_budget(std::uint64_t machine, std::uint32_t ordinal) noexcept {
  if (ordinal >= BUDGET_ORDINALS) return bad_budget_ordinal(ordinal);
  if (machine == PROCESS_MACHINE) {
    const BudgetSlot* slot = budget_slot(ordinal);
    return BudgetUsage{slot->limit.load(std::memory_order_relaxed), slot->in_use()};
  }
  auto* table = MachineLedgers::instance();
  if (table == nullptr) return BudgetUsage{std::numeric_limits<std::size_t>::max(), 0};
  const auto [limit, in_use] = table->usage(machine, ordinal);
  return BudgetUsage{limit, in_use};
}

}  // namespace detail

/// Sets the byte budget of the process's device `ordinal` (CUDA's, and that of resources
/// reaching no driver): every Budget stack on it, existing or future, checks its next
/// allocation against it. The last call wins. Lowering the limit below what is in use
/// revokes nothing; allocations are refused until enough is freed. Credit that stacks had
/// reserved under the old limit and not charged is revoked, so none of it is usable
/// beyond the new limit. A SimDriver's devices are not the process's: use the overload
/// that names the driver. Errors: invalid_ordinal. Thread-safe. (Takes the device's
/// lock, as a refill does.)
inline result<void> set_device_budget(std::uint32_t ordinal, std::size_t limit_bytes) noexcept {
  return detail::set_machine_budget(detail::PROCESS_MACHINE, ordinal, limit_bytes);
}

/// Sets the byte budget of device `ordinal` of the machine `driver` reaches, as above: a
/// SimDriver's own device, or the process's for CudaDriver. Errors: invalid_ordinal,
/// out_of_memory (the host could not keep a simulated device's limit). Thread-safe.
template <Driver D>
result<void> set_device_budget(const D& driver, std::uint32_t ordinal, std::size_t limit_bytes) noexcept {
  return detail::set_machine_budget(detail::machine_of(driver), ordinal, limit_bytes);
}

/// Removes the limit of the process's device `ordinal` (what is in use is still
/// counted). Errors: invalid_ordinal.
inline result<void> clear_device_budget(std::uint32_t ordinal) noexcept {
  return set_device_budget(ordinal, std::numeric_limits<std::size_t>::max());
}

/// Removes the limit of device `ordinal` of the machine `driver` reaches. Errors:
/// invalid_ordinal, out_of_memory.
template <Driver D>
result<void> clear_device_budget(const D& driver, std::uint32_t ordinal) noexcept {
  return set_device_budget(driver, ordinal, std::numeric_limits<std::size_t>::max());
}

/// The limit of the process's device `ordinal` and what every Budget on it has charged
/// (the sum of its stripes: exact once the threads allocating on it are quiescent).
/// Errors: invalid_ordinal. Thread-safe; lock-free.
inline result<BudgetUsage> device_budget(std::uint32_t ordinal) noexcept {
  return detail::machine_budget(detail::PROCESS_MACHINE, ordinal);
}

/// The same for device `ordinal` of the machine `driver` reaches. Errors:
/// invalid_ordinal. Thread-safe. (A simulated machine's ledgers are looked up under a
/// lock.)
template <Driver D>
result<BudgetUsage> device_budget(const D& driver, std::uint32_t ordinal) noexcept {
  return detail::machine_budget(detail::machine_of(driver), ordinal);
}

}  // namespace xlogrt
