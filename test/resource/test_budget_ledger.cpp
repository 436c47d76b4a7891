// SPDX-License-Identifier: Apache-2.0
// The budget ledger (resource/budget_ledger.hpp): one ledger per device, a device being
// (machine, ordinal). Two stacks on one device share its ledger; two SimDrivers are two
// machines, so their ordinals 0 do not; a SimDriver built where a destroyed one stood is
// a new machine; the process's devices (no driver, or CudaDriver) are none of these.

#include <catch2/catch.hpp>

#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <optional>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/budget_ledger.hpp>
#include <xlogrt/runtime/device_runtime.hpp>
#include <xlogrt/sim/sim_driver.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t NO_LIMIT = std::numeric_limits<std::size_t>::max();

using Stack = Budget<AsyncCuda<SimDriver>>;

/// A Budget stack on `ordinal` of `sim`, with its own stream pool.
Stack stack_on(SimDriver& sim, std::uint32_t ordinal, BudgetOptions options = {}) {
  auto pool = StreamPool<SimDriver>::open(sim, ordinal, 2);
  REQUIRE(pool.has_value());
  auto base = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(base.has_value());
  return Stack(std::move(*base), options);
}

/// architecture.md's owned runtime: a 64 MiB budget over AsyncCuda, or no limit of its own.
result<DeviceRuntime<Stack>> owned_runtime(SimDriver& sim, std::optional<std::size_t> limit) {
  auto streams = StreamPool<SimDriver>::open(sim, 0, 4);
  if (!streams) return std::move(streams).error();
  auto base = AsyncCuda<SimDriver>::create(*streams);
  if (!base) return std::move(base).error();
  return DeviceRuntime<Stack>::create(*streams, Stack(std::move(*base), BudgetOptions{.limit_bytes = limit}));
}

}  // namespace

TEST_CASE("two owned runtimes over two SimDrivers have independent budgets", "[sim][budget]") {
  // Issue #32: the second stack, with no limit of its own, was refused out_of_budget by
  // the first one's 64 MiB, set on "ordinal 0" of the whole process.
  SimDriver first_machine{SimConfig{.devices = 1}}, second_machine{SimConfig{.devices = 1}};
  auto first = owned_runtime(first_machine, 64 * MiB);
  auto second = owned_runtime(second_machine, std::nullopt);
  REQUIRE(first.has_value());
  REQUIRE(second.has_value());

  auto big = second->allocate(128 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE(big.has_value());  // the second machine's ordinal 0 has no limit
  CHECK(second->stack().usage().limit == NO_LIMIT);
  CHECK(second->stack().usage().in_use == 128 * MiB);

  auto refused = first->allocate(128 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::out_of_budget);
  CHECK(first->stack().usage().limit == 64 * MiB);
  CHECK(first->stack().usage().in_use == 0);  // the second machine's 128 MiB are not charged here
  auto fits = first->allocate(32 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE(fits.has_value());
  CHECK(second->stack().usage().in_use == 128 * MiB);  // nor the first's there

  REQUIRE(first->deallocate(std::move(*fits)).has_value());
  REQUIRE(second->deallocate(std::move(*big)).has_value());
  REQUIRE(first->reap_pending().has_value());
  REQUIRE(second->reap_pending().has_value());
  CHECK(first->stack().usage().in_use == 0);
  CHECK(second->stack().usage().in_use == 0);
}

TEST_CASE("two stacks over one SimDriver and ordinal share its ledger; its other ordinal does not",
          "[sim][budget]") {
  SimDriver sim{SimConfig{}};
  Stack a = stack_on(sim, 0, BudgetOptions{.limit_bytes = MiB});
  Stack b = stack_on(sim, 0);  // no limit of its own: the device's applies
  Stack other = stack_on(sim, 1);
  CHECK(device_budget(sim, 0)->limit == MiB);
  CHECK(b.usage().limit == MiB);
  CHECK(other.usage().limit == NO_LIMIT);

  auto x = a.allocate(768 * 1024, StreamId{0}, AllocTag{1});
  REQUIRE(x.has_value());
  CHECK(b.usage().in_use == 768 * 1024);  // a's charge, seen through b
  CHECK(device_budget(sim, 0)->in_use == 768 * 1024);
  auto refused = b.allocate(512 * 1024, StreamId{0}, AllocTag{2});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::out_of_budget);
  auto far = other.allocate(8 * MiB, StreamId{0}, AllocTag{3});  // ordinal 1: another device
  REQUIRE(far.has_value());
  CHECK(device_budget(sim, 0)->in_use == 768 * 1024);

  // A limit set through either names the device: the last one wins for both.
  REQUIRE(set_device_budget(sim, 0, 2 * MiB).has_value());
  CHECK(a.usage().limit == 2 * MiB);
  auto now_fits = b.allocate(512 * 1024, StreamId{0}, AllocTag{2});
  REQUIRE(now_fits.has_value());

  REQUIRE(a.deallocate(std::move(*x)).has_value());
  REQUIRE(b.deallocate(std::move(*now_fits)).has_value());
  REQUIRE(other.deallocate(std::move(*far)).has_value());
  for (Stack* s : {&a, &b, &other}) REQUIRE(s->reap_pending().has_value());
  CHECK(device_budget(sim, 0)->in_use == 0);
  CHECK(device_budget(sim, 1)->in_use == 0);
}

TEST_CASE("a SimDriver built where a destroyed one stood does not inherit its ledger", "[sim][budget]") {
  // The same address, on purpose: a ledger keyed by the driver's address would hand the
  // old machine's limit and charges to the new one.
  struct alignas(SimDriver) Storage {
    std::byte bytes[sizeof(SimDriver)];
  };
  auto storage = std::make_unique<Storage>();
  auto* old_machine = new (storage->bytes) SimDriver(SimConfig{.devices = 1});
  REQUIRE(set_device_budget(*old_machine, 0, MiB).has_value());
  {
    Stack s = stack_on(*old_machine, 0);
    auto refused = s.allocate(2 * MiB, StreamId{0}, AllocTag{1});
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code() == errc::out_of_budget);
  }
  const std::uint64_t old_serial = old_machine->machine_serial();
  old_machine->~SimDriver();

  auto* new_machine = new (storage->bytes) SimDriver(SimConfig{.devices = 1});
  REQUIRE(static_cast<void*>(new_machine) == static_cast<void*>(old_machine));
  CHECK(new_machine->machine_serial() != old_serial);
  CHECK(device_budget(*new_machine, 0)->limit == NO_LIMIT);
  {
    Stack s = stack_on(*new_machine, 0);
    auto fits = s.allocate(2 * MiB, StreamId{0}, AllocTag{1});
    REQUIRE(fits.has_value());
    REQUIRE(s.deallocate(std::move(*fits)).has_value());
    REQUIRE(s.reap_pending().has_value());
  }
  new_machine->~SimDriver();
}

TEST_CASE("the process's devices and a SimDriver's are different devices", "[sim][budget]") {
  constexpr std::uint32_t ord = 12;  // the process's ordinal 12 is this test's
  struct ClearAtEnd {
    ~ClearAtEnd() { (void)clear_device_budget(ord); }
  } clear;
  REQUIRE(set_device_budget(ord, 4096).has_value());
  SimDriver sim{SimConfig{.devices = ord + 1}};
  CHECK(device_budget(sim, ord)->limit == NO_LIMIT);

  Stack on_sim = stack_on(sim, ord);
  auto big = on_sim.allocate(MiB, StreamId{0}, AllocTag{1});
  REQUIRE(big.has_value());  // the process's 4 KiB limit is not the simulated device's
  CHECK(device_budget(ord)->in_use == 0);

  // A resource that reaches no driver charges the process's device.
  Budget<SyncSpy> driverless{SyncSpy(ord)};
  auto refused = driverless.allocate(8192, StreamId{0}, AllocTag{1});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::out_of_budget);
  CHECK(device_budget(sim, ord)->in_use == MiB);

  REQUIRE(on_sim.deallocate(std::move(*big)).has_value());
  REQUIRE(on_sim.reap_pending().has_value());
}

TEST_CASE("a simulated device's ledger goes with its last stack; only a limit is remembered", "[sim][budget]") {
  auto* table = detail::MachineLedgers::instance();
  REQUIRE(table != nullptr);
  const std::size_t before = table->entries();
  std::uint64_t serial = 0;
  {
    SimDriver sim{SimConfig{}};
    serial = sim.machine_serial();
    {
      Stack s = stack_on(sim, 0);
      CHECK(table->entries() == before + 1);
      auto x = s.allocate(4096, StreamId{0}, AllocTag{1});
      REQUIRE(x.has_value());
      REQUIRE(s.deallocate(std::move(*x)).has_value());
    }
    CHECK(table->entries() == before);  // no stack and no limit: nothing kept

    Stack limited = stack_on(sim, 1, BudgetOptions{.limit_bytes = MiB});
    CHECK(table->entries() == before + 1);
  }
  // The limit outlives the stack (it is the device's), as a node of its own.
  CHECK(table->entries() == before + 1);
  CHECK(table->usage(serial, 1).first == MiB);
  REQUIRE(detail::set_machine_budget(serial, 1, NO_LIMIT).has_value());
  CHECK(table->entries() == before);
}

TEST_CASE("ordinals beyond the ledgers are named, for a SimDriver's devices too", "[sim][budget]") {
  SimDriver sim{SimConfig{}};
  CHECK(set_device_budget(sim, BUDGET_ORDINALS, 1).error().code() == errc::invalid_ordinal);
  CHECK(device_budget(sim, 99).error().code() == errc::invalid_ordinal);
  CHECK(clear_device_budget(sim, BUDGET_ORDINALS).error().code() == errc::invalid_ordinal);
}
