// SPDX-License-Identifier: Apache-2.0
// A user decorator that refuses with an error code of its own category: the category and
// the code's name reach the error's text through the shipped decorators, AnyResource and
// a checked value(), and xlogrt's code() says user_defined rather than borrowing one of
// its own codes.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include <xlogrt/resource/any_resource.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/statistics.hpp>

#include "spies.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

// ---- the user's code --------------------------------------------------------------------

namespace tenants {

enum class errc { over_quota = 1 };

struct Category final : xlogrt::error_category {
  std::string_view name() const noexcept override { return "tenant_quota"; }
  std::string_view message(int code) const noexcept override {
    return code == static_cast<int>(errc::over_quota) ? "over_quota" : "unknown";
  }
};
inline constexpr Category category;
constexpr const xlogrt::error_category& error_category_of(errc) noexcept { return category; }

/// Refuses a request that would take the bytes it has handed out past a quota.
/// Thread-safe.
template <DeviceMemoryResource Up>
class Quota {
 public:
  static constexpr bool supports_block_use_tracking = false;

  Quota(Up up, std::size_t quota) : up_(std::move(up)), quota_(quota) {}

  result<DeviceBlock> allocate(std::size_t bytes, StreamId s, AllocTag t) noexcept {
    const std::size_t before = held_->fetch_add(bytes);
    if (before + bytes > quota_) {
      held_->fetch_sub(bytes);
      return error{errc::over_quota, "tag " + std::to_string(t.value) + " asked " + std::to_string(bytes) +
                                         " bytes with " + std::to_string(before) + " of " +
                                         std::to_string(quota_) + " held"};
    }
    auto b = up_.allocate(bytes, s, t);
    if (!b) held_->fetch_sub(bytes);
    return b;
  }
  result<void> deallocate(DeviceBlock&& b) noexcept {
    const std::size_t n = b.bytes();
    auto r = up_.deallocate(std::move(b));
    if (r) held_->fetch_sub(n);
    return r;
  }
  std::size_t bytes_outstanding() const noexcept { return up_.bytes_outstanding(); }
  result<void> reap_pending() noexcept { return up_.reap_pending(); }
  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }
  Up& upstream() noexcept { return up_; }

 private:
  Up up_;
  std::size_t quota_;
  std::unique_ptr<std::atomic<std::size_t>> held_ = std::make_unique<std::atomic<std::size_t>>(0);
};

}  // namespace tenants

// ---- the test ------------------------------------------------------------------------------

TEST_CASE("a user decorator refuses with its own error code, named in the message", "[user_decorator]") {
  constexpr std::uint32_t ord = 13;
  using Stack = Budget<Statistics<tenants::Quota<PlainSpy>>>;
  Stack stack{Statistics<tenants::Quota<PlainSpy>>{tenants::Quota<PlainSpy>{PlainSpy(ord), 1000}},
              BudgetOptions{.limit_bytes = 1 << 20}};

  auto a = stack.allocate(600, StreamId{1}, AllocTag{4});
  REQUIRE(a.has_value());
  auto refused = stack.allocate(500, StreamId{1}, AllocTag{4});
  REQUIRE_FALSE(refused);
  const error& e = refused.error();
  CHECK(e.category() == tenants::category);
  CHECK(e.is(tenants::errc::over_quota));
  CHECK(e.value() == 1);
  CHECK(e.code() == errc::user_defined);           // never mistaken for one of xlogrt's codes
  CHECK_FALSE(e.is(errc::invalid_argument));        // xlogrt's code 1
  CHECK(e.what() == "tenant_quota/over_quota: tag 4 asked 500 bytes with 600 of 1000 held");
  CHECK(device_budget(ord)->in_use == 600);         // Budget rolled its charge back
  CHECK(stack.upstream().snapshot().of(AllocTag{4}).failed == 1);  // Statistics counted it

  // A checked value() throws it, category and all.
  try {
    (void)stack.allocate(1000, StreamId{1}, AllocTag{4}).value();
    FAIL("value() returned on an error");
  } catch (const bad_result_access& x) {
    CHECK(x.error().is(tenants::errc::over_quota));
    CHECK(std::string(x.what()).rfind("tenant_quota/over_quota: tag 4 asked 1000 bytes", 0) == 0);
  }

  REQUIRE(stack.deallocate(std::move(*a)).has_value());
  REQUIRE(stack.reap_pending().has_value());
  CHECK(device_budget(ord)->in_use == 0);
  REQUIRE(clear_device_budget(ord).has_value());

  // Behind AnyResource, as a stack chosen at run time.
  AnyResource any{tenants::Quota<PlainSpy>{PlainSpy(ord), 16}};
  auto far = any.allocate(17, StreamId{0}, AllocTag{});
  REQUIRE_FALSE(far);
  CHECK(far.error().is(tenants::errc::over_quota));
  CHECK(far.error().what().rfind("tenant_quota/over_quota: ", 0) == 0);
}
