// SPDX-License-Identifier: Apache-2.0
// A decorator written the way a user would write one, composed with the shipped ones.

#include <catch2/catch.hpp>

#include <atomic>
#include <memory>

#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/logging.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

// ---- the user's code --------------------------------------------------------------------

/// Refuses any single request larger than a cap. Thread-safe (no state of its own).
template <DeviceMemoryResource Up>
class MaxRequest {
 public:
  static constexpr bool supports_block_use_tracking = Up::supports_block_use_tracking;

  MaxRequest(Up up, std::size_t cap) : up_(std::move(up)), cap_(cap) {}

  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    if (bytes > cap_) {
      return error{errc::invalid_argument, "request of " + std::to_string(bytes) + " bytes exceeds the cap of " +
                                               std::to_string(cap_)};
    }
    return up_.allocate(bytes, s, t);
  }
  result<void> deallocate(DeviceBlock&& b) noexcept { return up_.deallocate(std::move(b)); }
  std::size_t bytes_outstanding() const noexcept { return up_.bytes_outstanding(); }
  result<void> reap_pending() noexcept { return up_.reap_pending(); }
  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }

  result<void> record_block_use(const DeviceBlock& b, StreamId s) noexcept
    requires TrackingResource<Up>
  {
    return up_.record_block_use(b, s);
  }
  result<void> prepare_block_use(BlockId id, StreamId s, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up_.prepare_block_use(id, s, a);
  }
  result<void> finish_block_use(BlockId id, StreamId s, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up_.finish_block_use(id, s, a);
  }

  Up& upstream() noexcept { return up_; }

 private:
  Up up_;
  std::size_t cap_;
};

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
