// SPDX-License-Identifier: Apache-2.0
// docs/architecture.md, "Building an owned runtime": a DeviceRuntime around a stack of
// one's own, outside the singleton table, on SimDriver (CudaDriver is the same code with
// the driver of `CudaDriver::open()`).
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include <cstdio>

using namespace xlogrt;

// [owned]
// The stack: a 64 MiB budget over stream-ordered allocation with cross-stream tracking.
template <Driver D>
using Stack = Budget<AsyncCuda<D>>;

// Builds the stack on the runtime's streams; an error is passed on as it is.
template <Driver D>
result<Stack<D>> make_stack(const std::shared_ptr<StreamPool<D>>& streams) {
  XLOGRT_TRY_ASSIGN(auto base, AsyncCuda<D>::create(streams));  // allocates from the device's pool
  return Stack<D>(std::move(base), BudgetOptions{.limit_bytes = std::size_t{64} << 20});
}

template <Driver D>
result<DeviceRuntime<Stack<D>>> open_runtime(D& driver, std::uint32_t ordinal) {
  // The ordinal (its primary context and pool), 4 streams StreamId{0..3}, the stack on
  // them, and the check that the parts agree.
  return DeviceRuntime<Stack<D>>::open(driver, ordinal, 4, make_stack<D>);
}
// [/owned]

// [default]
// The default stack, owned: StackBuilder reads the environment as try_get does.
template <Driver D>
result<DeviceRuntime<DefaultStackOn<D>>> open_default(D& driver, std::uint32_t ordinal) {
  return DeviceRuntime<DefaultStackOn<D>>::open(driver, ordinal);  // 8 streams
}
// [/default]

int main() {
  // [main]
  SimDriver sim(SimConfig{.devices = 1});  // outlives every runtime built on it
  auto rt = open_runtime(sim, 0);
  if (!rt) return std::puts(rt.error().what().c_str()), 1;
  auto block = rt->allocate(std::size_t{1} << 20, StreamId{0}, AllocTag{1});
  auto refused = rt->allocate(std::size_t{128} << 20, StreamId{0}, AllocTag{2});  // over the budget
  if (!block || refused) return 1;
  std::printf("1 MiB allocated; 128 MiB refused: %s\n", refused.error().what().c_str());
  if (!rt->deallocate(std::move(*block)) || !rt->reap_pending()) return 1;
  std::printf("after reap_pending: %zu bytes outstanding\n", rt->bytes_outstanding());
  // [/main]
  if (refused.error().code() != errc::out_of_budget || rt->bytes_outstanding() != 0) return 1;

  auto def = open_default(sim, 0);
  if (!def) return std::puts(def.error().what().c_str()), 1;
  auto b = def->allocate(4096, StreamId{3}, AllocTag{3});
  if (!b || !def->deallocate(std::move(*b))) return 1;
  std::printf("the default stack, owned: %zu bytes outstanding\n", def->bytes_outstanding());
  return 0;
}
