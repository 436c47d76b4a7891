// SPDX-License-Identifier: Apache-2.0
// A decorator written the way a user would write one, composed with the shipped ones.

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>
#include <xlogrt/resource/adaptor.hpp>
#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

// ---- the user's code --------------------------------------------------------------------

/// Refuses any single request larger than a cap; everything else is Adaptor's forwarding.
template <DeviceMemoryResource Up>
struct MaxRequest : Adaptor<Up> {
  MaxRequest(Up up, std::size_t cap) : Adaptor<Up>(std::move(up)), cap(cap) {}
  std::size_t cap;

  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    if (bytes > cap) {
      return error{errc::invalid_argument, "request of " + std::to_string(bytes) + " bytes exceeds the cap"};
    }
    return this->upstream().allocate(bytes, s, t);
  }
};

/// Hides one forwarded capability: a stack above it cannot recycle through it.
template <DeviceMemoryResource Up>
struct NoRecycling : Adaptor<Up> {
  using Adaptor<Up>::Adaptor;
  result<DeviceBlock> recycle_block(DeviceBlock&, StreamId) noexcept = delete;
};

// Adaptor forwards each capability exactly when the upstream has it.
static_assert(!TrackingResource<MaxRequest<PlainSpy>> && !DriverResource<MaxRequest<PlainSpy>>);
static_assert(TrackingResource<MaxRequest<TrackingSpy>> && !RecyclingResource<MaxRequest<TrackingSpy>>);
static_assert(RecyclingResource<MaxRequest<AsyncCuda<SimDriver>>> && DriverResource<MaxRequest<AsyncCuda<SimDriver>>>);
static_assert(SynchronousFree<MaxRequest<DirectCuda<SimDriver>>> && !SynchronousFree<MaxRequest<AsyncCuda<SimDriver>>>);
static_assert(TrackingResource<NoRecycling<AsyncCuda<SimDriver>>> && !RecyclingResource<NoRecycling<AsyncCuda<SimDriver>>>);

// Over the real driver, at the top of a DeviceRuntime: the decorator passes tracking and
// the driver members through. Compiled, not run (the host suite has no GPU).
using RealStack = Budget<MaxRequest<AsyncCuda<CudaDriver>>>;
static_assert(TrackingResource<RealStack> && DriverResource<RealStack> && RecyclingResource<RealStack>);
[[maybe_unused]] result<std::size_t> owned_runtime_on_cuda() {
  auto drv = CudaDriver::open();
  if (!drv) return std::move(drv).error();
  auto pool = StreamPool<CudaDriver>::open(**drv, 0, 2);
  if (!pool) return std::move(pool).error();
  auto base = AsyncCuda<CudaDriver>::create(*pool);
  if (!base) return std::move(base).error();
  auto made = DeviceRuntime<RealStack>::create(*pool, RealStack(MaxRequest(std::move(*base), 1 << 20)));
  if (!made) return std::move(made).error();
  auto& rt = *made;
  auto b = rt.allocate(4096, StreamId{1});
  if (!b) return std::move(b).error();
  if (auto r = rt.record_block_use(*b, StreamId{0}); !r) return std::move(r).error();
  if (auto r = rt.stack().make_current(); !r) return std::move(r).error();
  const std::size_t n = b->bytes();
  if (auto r = rt.deallocate(std::move(*b)); !r) return std::move(r).error();
  return n;
}

// ---- the test ------------------------------------------------------------------------------

TEST_CASE("a user-defined decorator composes with the shipped ones", "[user_decorator]") {
  constexpr std::uint32_t ord = 11;
  using Base = Logging<TrackingSpy, RingSink>;
  using Stack = Budget<MaxRequest<Statistics<Base>>>;
  STATIC_REQUIRE(TrackingResource<Stack>);
  STATIC_REQUIRE_FALSE(TrackingResource<Budget<MaxRequest<Statistics<Logging<PlainSpy, NullSink>>>>>);

  TrackingSpy spy(ord);
  auto st = spy.state();
  Stack stack{MaxRequest{Statistics<Base>{Base{std::move(spy), RingSink(64)}}, 4096},
              BudgetOptions{.limit_bytes = 10000}};

  auto a = stack.allocate(4000, StreamId{1}, AllocTag{2});
  REQUIRE(a.has_value());
  auto too_big = stack.allocate(5000, StreamId{1}, AllocTag{2});
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().code() == errc::invalid_argument);
  CHECK(device_budget(ord)->in_use == 4000);  // the budget rolled back its charge
  REQUIRE(stack.record_block_use(*a, StreamId{3}).has_value());
  CHECK(st->records == 1);

  auto& stats = stack.upstream().upstream();
  CHECK(stats.snapshot().of(AllocTag{2}).current_bytes == 4000);
  CHECK(stats.snapshot().of(AllocTag{2}).failed == 0);  // refused above Statistics: never seen

  REQUIRE(stack.deallocate(std::move(*a)).has_value());
  REQUIRE(stack.reap_pending().has_value());
  CHECK(device_budget(ord)->in_use == 0);
  const auto log = stats.upstream().sink().records();
  REQUIRE(log.size() == 2);
  CHECK(log[0].action == LogAction::allocate);
  CHECK(log[1].action == LogAction::free);

  // And it goes behind AnyResource like any stack.
  AnyResource any{MaxRequest<PlainSpy>{PlainSpy(ord), 16}};
  CHECK(any.allocate(17, StreamId{0}, AllocTag{}).error().code() == errc::invalid_argument);
  CHECK(any.record_block_use(DeviceBlock{}, StreamId{0}).error().code() == errc::stream_misuse);
}
