// SPDX-License-Identifier: Apache-2.0
// result<T> in the shape of std::expected: checked value(), unchecked operator*, value_or,
// the monadic members; and open error categories.

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "xlogrt/core/error.hpp"
#include "xlogrt/core/result.hpp"

using namespace xlogrt;

namespace {

const error oom{errc::out_of_memory, "no room for 64 bytes", 2};

result<int> good(int v) { return v; }
result<int> bad() { return oom; }

}  // namespace

TEST_CASE("value() is checked: an error throws bad_result_access carrying it", "[core][result]") {
  result<int> r = good(5);
  CHECK(r.value() == 5);
  r.value() = 6;
  CHECK(*r == 6);
  const result<int>& cr = r;
  CHECK(cr.value() == 6);

  result<int> e = bad();
  REQUIRE_THROWS_AS(e.value(), bad_result_access);
  try {
    (void)std::as_const(e).value();
    FAIL("value() returned on an error");
  } catch (const bad_result_access& x) {
    CHECK(x.error().code() == errc::out_of_memory);
    CHECK(x.error().message() == "no room for 64 bytes");
    CHECK(x.error().driver_status() == 2);
    CHECK(std::string(x.what()) == "out_of_memory: no room for 64 bytes");
  }
  CHECK(!e);  // a checked access leaves the result as it was
  CHECK(e.error().code() == errc::out_of_memory);

  result<std::unique_ptr<int>> moved = error{errc::double_free, "twice"};
  try {
    (void)std::move(moved).value();
    FAIL("value() returned on an error");
  } catch (bad_result_access& x) {
    CHECK(x.error().code() == errc::double_free);
    xlogrt::error taken = std::move(x).error();
    CHECK(taken.message() == "twice");
  }
  result<std::unique_ptr<int>> held = std::make_unique<int>(9);
  std::unique_ptr<int> out = std::move(held).value();
  CHECK(*out == 9);

  result<void> fine = ok();
  CHECK_NOTHROW(fine.value());
  result<void> failed = error{errc::stream_fault, "context faulted"};
  CHECK_THROWS_AS(failed.value(), bad_result_access);
  CHECK_THROWS_AS(std::move(failed).value(), bad_result_access);

  // The unchecked accessors are the hot path's: noexcept, and value() is not.
  STATIC_REQUIRE(noexcept(*r));
  STATIC_REQUIRE(noexcept(r.operator->()));
  STATIC_REQUIRE(noexcept(*std::move(r)));
  STATIC_REQUIRE(noexcept(r.error()));
  STATIC_REQUIRE_FALSE(noexcept(r.value()));
  STATIC_REQUIRE_FALSE(noexcept(fine.value()));
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<bad_result_access>);
  STATIC_REQUIRE(std::is_base_of_v<std::exception, bad_result_access>);
}

TEST_CASE("operator* and operator-> read the value without a check", "[core][result]") {
  result<std::string> r = std::string("abc");
  CHECK(*r == "abc");
  CHECK(r->size() == 3);
  r->push_back('d');
  CHECK(*std::as_const(r) == "abcd");
  CHECK(std::as_const(r)->size() == 4);
  std::string s = *std::move(r);
  CHECK(s == "abcd");
}

TEST_CASE("has_value and operator bool agree", "[core][result]") {
  result<int> v = good(1);
  result<int> e = bad();
  CHECK(v.has_value());
  CHECK(static_cast<bool>(v));
  CHECK_FALSE(e.has_value());
  CHECK_FALSE(static_cast<bool>(e));
  STATIC_REQUIRE_FALSE(std::is_convertible_v<result<int>, bool>);  // explicit
  result<void> ve = oom;
  CHECK_FALSE(ve.has_value());
  CHECK_FALSE(static_cast<bool>(ve));
  STATIC_REQUIRE_FALSE(std::is_convertible_v<result<void>, bool>);
}

TEST_CASE("value_or: the value, or the fallback converted", "[core][result]") {
  CHECK(good(3).value_or(7) == 3);
  CHECK(bad().value_or(7) == 7);
  const result<std::string> cs = std::string("kept");
  CHECK(cs.value_or("fallback") == "kept");
  const result<std::string> ce = oom;
  CHECK(ce.value_or("fallback") == "fallback");
  CHECK(ce.error().code() == errc::out_of_memory);  // const&: the error is untouched

  result<std::unique_ptr<int>> p = std::make_unique<int>(4);
  auto taken = std::move(p).value_or(nullptr);
  REQUIRE(taken);
  CHECK(*taken == 4);
  result<std::unique_ptr<int>> none = oom;
  CHECK(std::move(none).value_or(nullptr) == nullptr);
}

TEST_CASE("and_then chains fallible calls and stops at the first error", "[core][result]") {
  int calls = 0;
  auto half = [&](int v) -> result<int> {
    ++calls;
    if (v % 2) return error{errc::invalid_argument, std::to_string(v) + " is odd"};
    return v / 2;
  };
  auto r = good(8).and_then(half).and_then(half);
  STATIC_REQUIRE(std::is_same_v<decltype(r), result<int>>);
  REQUIRE(r);
  CHECK(*r == 2);
  CHECK(calls == 2);

  calls = 0;
  auto odd = good(6).and_then(half).and_then(half).and_then(half);
  REQUIRE_FALSE(odd);
  CHECK(odd.error().code() == errc::invalid_argument);
  CHECK(odd.error().message() == "3 is odd");
  CHECK(calls == 2);  // the third call never ran

  calls = 0;
  auto early = bad().and_then(half);
  REQUIRE_FALSE(early);
  CHECK(early.error().code() == errc::out_of_memory);
  CHECK(early.error().driver_status() == 2);
  CHECK(calls == 0);

  // Another type, from every value category.
  result<int> lv = good(42);
  auto as_string = [](const int& v) -> result<std::string> { return std::to_string(v); };
  CHECK(*lv.and_then(as_string) == "42");
  CHECK(*std::as_const(lv).and_then(as_string) == "42");
  result<std::unique_ptr<int>> p = std::make_unique<int>(5);
  auto deref = [](std::unique_ptr<int>&& q) -> result<int> { return *q; };
  CHECK(*std::move(p).and_then(deref) == 5);
  auto to_void = [](int) -> result<void> { return error{errc::cancelled, "stop"}; };
  CHECK(lv.and_then(to_void).error().code() == errc::cancelled);

  // result<void>: f takes nothing.
  result<void> done = ok();
  CHECK(*done.and_then([] { return good(1); }) == 1);
  result<void> failed = oom;
  auto never = failed.and_then([&] { ++calls; return good(1); });
  CHECK(calls == 0);
  CHECK(never.error().code() == errc::out_of_memory);
  CHECK(std::move(failed).and_then([] { return ok(); }).error().message() == "no room for 64 bytes");
}

TEST_CASE("transform maps the value, and passes an error on", "[core][result]") {
  auto twice = good(21).transform([](int v) { return v * 2; });
  STATIC_REQUIRE(std::is_same_v<decltype(twice), result<int>>);
  CHECK(*twice == 42);
  auto text = good(7).transform([](int v) { return std::to_string(v); });
  STATIC_REQUIRE(std::is_same_v<decltype(text), result<std::string>>);
  CHECK(*text == "7");

  int calls = 0;
  auto skipped = bad().transform([&](int v) { ++calls; return v; });
  CHECK(calls == 0);
  CHECK(skipped.error().code() == errc::out_of_memory);

  int seen = 0;
  auto side = good(3).transform([&](int v) { seen = v; });
  STATIC_REQUIRE(std::is_same_v<decltype(side), result<void>>);
  CHECK(side);
  CHECK(seen == 3);
  CHECK_FALSE(bad().transform([&](int) {}));

  const result<std::string> cs = std::string("xy");
  CHECK(*cs.transform([](const std::string& s) { return s.size(); }) == 2);
  result<std::unique_ptr<int>> p = std::make_unique<int>(8);
  CHECK(*std::move(p).transform([](std::unique_ptr<int>&& q) { return *q + 1; }) == 9);

  result<void> fine = ok();
  CHECK(*fine.transform([] { return 5; }) == 5);
  result<void> failed = oom;
  CHECK(failed.transform([] { return 5; }).error().code() == errc::out_of_memory);
  CHECK(std::move(failed).transform([] {}).error().code() == errc::out_of_memory);
}

TEST_CASE("or_else recovers from an error and leaves a value alone", "[core][result]") {
  int calls = 0;
  auto retry = [&](const error& e) -> result<int> {
    ++calls;
    if (e.is(errc::out_of_memory)) return 0;
    return e;
  };
  CHECK(*good(4).or_else(retry) == 4);
  CHECK(calls == 0);
  CHECK(*bad().or_else(retry) == 0);
  CHECK(calls == 1);
  result<int> other = error{errc::double_free, "again"};
  CHECK(other.or_else(retry).error().code() == errc::double_free);
  CHECK(std::move(other).or_else([](error&& e) -> result<int> { return std::move(e); }).error().message() ==
        "again");

  calls = 0;
  result<void> failed = oom;
  CHECK(failed.or_else([](const error&) { return ok(); }));
  CHECK(ok().or_else([&](const error&) { ++calls; return ok(); }));
  CHECK(calls == 0);
}

TEST_CASE("transform_error rewrites an error, keeping a value", "[core][result]") {
  auto context = [](const error& e) {
    return error{e.code(), "while growing the pool: " + e.message(), e.driver_status()};
  };
  auto wrapped = bad().transform_error(context);
  REQUIRE_FALSE(wrapped);
  CHECK(wrapped.error().code() == errc::out_of_memory);
  CHECK(wrapped.error().message() == "while growing the pool: no room for 64 bytes");
  CHECK(wrapped.error().driver_status() == 2);
  CHECK(*good(1).transform_error(context) == 1);

  result<void> failed = oom;
  CHECK(std::move(failed).transform_error(context).error().message() ==
        "while growing the pool: no room for 64 bytes");
  CHECK(ok().transform_error(context));
}

// ---- open error categories ---------------------------------------------------------------

namespace quota {

/// A user's own category: what a decorator of theirs refuses for.
struct Category final : xlogrt::error_category {
  std::string_view name() const noexcept override { return "quota"; }
  std::string_view message(int code) const noexcept override {
    switch (code) {
      case 1: return "over_quota";
      case 2: return "tenant_unknown";
    }
    return "unknown";
  }
};
inline constexpr Category category;

enum class errc { over_quota = 1, tenant_unknown };
constexpr const xlogrt::error_category& error_category_of(errc) noexcept { return category; }

}  // namespace quota

TEST_CASE("an error of xlogrt's own category", "[core][error]") {
  const error e{errc::stale_block, "block 3#7 was freed"};
  CHECK(e.category() == xlogrt_category());
  CHECK(e.category().name() == "xlogrt");
  CHECK(e.category().message(static_cast<int>(errc::stale_block)) == "stale_block");
  CHECK(e.code() == errc::stale_block);
  CHECK(e.value() == static_cast<int>(errc::stale_block));
  CHECK(e.is(errc::stale_block));
  CHECK_FALSE(e.is(errc::double_free));
  CHECK_FALSE(e.is(quota::errc::over_quota));
  CHECK(e.what() == "stale_block: block 3#7 was freed");
  CHECK(error_category_of(errc::zero_bytes) == xlogrt_category());
}

TEST_CASE("an error of a user's category names its category and code", "[core][error]") {
  const error e{quota::errc::over_quota, "tenant 3 holds 900 of its 1000 bytes, asked 200"};
  CHECK(e.category() == quota::category);
  CHECK_FALSE(e.category() == xlogrt_category());
  CHECK(e.value() == 1);
  CHECK(e.code() == errc::user_defined);  // not xlogrt's: never mistaken for one of its codes
  CHECK_FALSE(e.is(errc::invalid_argument));  // xlogrt's code 1: same int, other category
  CHECK(e.is(quota::errc::over_quota));
  CHECK_FALSE(e.is(quota::errc::tenant_unknown));
  CHECK(e.what() == "quota/over_quota: tenant 3 holds 900 of its 1000 bytes, asked 200");
  CHECK(e.driver_status() == 0);

  // By category and int, as a category without an enum would be used.
  const error by_int{quota::category, 2, "tenant 9 is not configured", 5};
  CHECK(by_int.is(quota::errc::tenant_unknown));
  CHECK(by_int.driver_status() == 5);
  CHECK(by_int.what() == "quota/tenant_unknown: tenant 9 is not configured");

  // It travels in a result like any error, and out through value().
  result<int> r = e;
  CHECK(r.error().is(quota::errc::over_quota));
  result<int> copied = r;
  CHECK(copied.error().category() == quota::category);
  try {
    (void)r.value();
    FAIL("value() returned on an error");
  } catch (const bad_result_access& x) {
    CHECK(std::string(x.what()) == "quota/over_quota: tenant 3 holds 900 of its 1000 bytes, asked 200");
  }
}

TEST_CASE("error stays cheap to move", "[core][error]") {
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<error>);
  STATIC_REQUIRE(std::is_nothrow_move_assignable_v<error>);
  STATIC_REQUIRE(sizeof(error) <= sizeof(std::string) + 2 * sizeof(void*));  // string, category, two ints
  STATIC_REQUIRE(std::is_trivially_destructible_v<quota::Category>);           // a constexpr object
}

namespace {

result<int> half(int x) {
  if (x % 2 != 0) return xlogrt::error{errc::invalid_argument, "odd"};
  return x / 2;
}

int calls = 0;
result<void> counted(bool fail) {
  ++calls;
  if (fail) return xlogrt::error{errc::out_of_memory, "counted"};
  return ok();
}

// A quarter through two halvings, the first error passed on as it is.
result<int> quarter(int x) {
  XLOGRT_TRY_ASSIGN(auto h, half(x));
  XLOGRT_TRY_ASSIGN(const int q, half(h));
  return q;
}

result<std::string> both(bool fail_first, bool fail_second) {
  XLOGRT_TRY(counted(fail_first));
  XLOGRT_TRY(counted(fail_second));
  std::string s;
  XLOGRT_TRY_ASSIGN(s, result<std::string>(std::string("done")));  // into a variable declared before
  return s;
}

}  // namespace

TEST_CASE("XLOGRT_TRY and XLOGRT_TRY_ASSIGN pass an error on and a value through, evaluating once",
          "[core][result]") {
  CHECK(quarter(12).value() == 3);
  auto odd = quarter(6);  // 6 halves to 3, which is odd: the second step's error
  REQUIRE_FALSE(odd);
  CHECK(odd.error().code() == errc::invalid_argument);
  CHECK(odd.error().message() == "odd");
  calls = 0;
  CHECK(both(false, false).value() == "done");
  CHECK(calls == 2);
  calls = 0;
  auto first = both(true, false);
  REQUIRE_FALSE(first);
  CHECK(first.error().code() == errc::out_of_memory);
  CHECK(calls == 1);  // the second call never ran
}
