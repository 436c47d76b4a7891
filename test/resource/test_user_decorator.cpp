// SPDX-License-Identifier: Apache-2.0
// A decorator written the way a user would write one, composed with the shipped ones.

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

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

// ---- the order of errors: bad input before a decorator's own refusal ---------------------

namespace {

/// MaxRequest as it should be written: the base's checks before its own refusal.
template <DeviceMemoryResource Up>
struct CheckedMaxRequest : MaxRequest<Up> {
  using MaxRequest<Up>::MaxRequest;
  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    if (bytes > this->cap) XLOGRT_TRY(check_request(this->upstream(), bytes, s));
    return MaxRequest<Up>::allocate(bytes, s, t);
  }
};

std::shared_ptr<StreamPool<SimDriver>> two_streams(SimDriver& sim) {
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());
  return *pool;
}

AsyncCuda<SimDriver> base_on(const std::shared_ptr<StreamPool<SimDriver>>& streams) {
  auto a = AsyncCuda<SimDriver>::create(streams);
  REQUIRE(a.has_value());
  return std::move(*a);
}

// The code of each request that is bad input and also over the decorator's cap.
template <class Stack>
std::vector<errc> bad_input_codes(Stack& stack) {
  std::vector<errc> codes;
  for (auto [bytes, stream] : {std::pair{std::size_t{0}, StreamId{0}}, std::pair{std::size_t{1} << 62, StreamId{0}},
                               std::pair{std::size_t{8} << 20, StreamId{99}}}) {
    auto r = stack.allocate(bytes, stream, AllocTag{});
    REQUIRE_FALSE(r);
    codes.push_back(r.error().code());
  }
  return codes;
}

}  // namespace

TEST_CASE("check_request gives the base's answer without allocating", "[user_decorator]") {
  SimDriver sim;
  auto streams = two_streams(sim);
  Budget<AsyncCuda<SimDriver>> stack(base_on(streams));
  CHECK(check_request(stack, 0, StreamId{0}).error().code() == errc::zero_bytes);
  CHECK(check_request(stack, std::size_t{1} << 62, StreamId{99}).error().code() == errc::too_large);
  CHECK(check_request(stack, 64, StreamId{99}).error().code() == errc::unknown_stream);
  CHECK(check_request(stack, 64, StreamId{1}).has_value());
  CHECK(sim.calls("cuMemAllocFromPoolAsync") == 0);
  CHECK(stack.bytes_outstanding() == 0);
  // A stack that exposes no stream pool: zero_bytes alone, the rest left to its allocate.
  AnyResource erased(base_on(streams));
  CHECK(check_request(erased, 0, StreamId{0}).error().code() == errc::zero_bytes);
  CHECK(check_request(erased, 64, StreamId{99}).has_value());
}

TEST_CASE("a decorator that calls check_request names bad input first; one that does not, hides it",
          "[user_decorator]") {
  SimDriver sim;
  auto streams = two_streams(sim);
  const std::vector<errc> expected{errc::zero_bytes, errc::too_large, errc::unknown_stream};
  CheckedMaxRequest<AsyncCuda<SimDriver>> checked(base_on(streams), 1);
  CHECK(bad_input_codes(checked) == expected);
  MaxRequest<AsyncCuda<SimDriver>> unchecked(base_on(streams), 1);  // the bug the call prevents
  CHECK(bad_input_codes(unchecked) != expected);
  // Budget, a shipped decorator that refuses for a reason of its own, keeps the order.
  Budget<AsyncCuda<SimDriver>> budget(base_on(streams), BudgetOptions{.limit_bytes = 1 << 20});
  CHECK(bad_input_codes(budget) == expected);
}
