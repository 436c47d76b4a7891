// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;

namespace {
result<int> parse_positive(int v) {
  if (v <= 0) return error{errc::invalid_argument, "value must be positive, got " + std::to_string(v)};
  return v;
}
result<int> doubled(int v) {
  auto r = parse_positive(v);
  if (!r) return std::move(r).error();
  return *r * 2;
}
}  // namespace

TEST_CASE("result holds a value or an error, and propagates", "[core][result]") {
  auto good = doubled(21);
  REQUIRE(good.has_value());
  CHECK(*good == 42);

  auto bad = doubled(-1);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.error().message() == "value must be positive, got -1");
  CHECK(bad.error().what() == "invalid_argument: value must be positive, got -1");
  CHECK(bad.error().driver_status() == 0);

  result<void> fine = ok();
  CHECK(fine.has_value());
  result<void> failed = error{errc::double_free, "freed twice"};
  CHECK_FALSE(failed);
  CHECK(failed.error().code() == errc::double_free);

  result<std::string> moved = std::string(100, 'x');
  std::string s = std::move(moved).value();
  CHECK(s.size() == 100);
}

TEST_CASE("result copies and moves between value and error states", "[core][result]") {
  const error e{errc::out_of_memory, std::string(64, 'e'), 2};
  auto is_e = [](const auto& r) {
    return !r && r.error().code() == errc::out_of_memory && r.error().message() == std::string(64, 'e') &&
           r.error().driver_status() == 2;
  };

  SECTION("std::string: copy and move, both ways") {
    result<std::string> v = std::string(100, 'v');
    result<std::string> b = e;
    b = v;  // error <- value (copy)
    REQUIRE(b);
    CHECK(*b == std::string(100, 'v'));
    CHECK(*v == std::string(100, 'v'));
    result<std::string> err = e;
    b = err;  // value <- error (copy)
    CHECK(is_e(b));
    CHECK(is_e(err));
    b = std::move(v);  // error <- value (move)
    REQUIRE(b);
    CHECK(b->size() == 100);
    b = std::move(err);  // value <- error (move)
    CHECK(is_e(b));
    result<std::string> c = b;  // copy-construct an error
    CHECK(is_e(c));
    result<std::string> d = std::move(c);  // move-construct an error
    CHECK(is_e(d));
    d = result<std::string>(e);  // error <- error
    CHECK(is_e(d));
    d = std::string("x");  // error <- value, through the converting constructor
    result<std::string> f = d;
    f = std::string("yz");  // value <- value
    CHECK(*d == "x");
    CHECK(*f == "yz");
  }

  SECTION("std::vector<int>") {
    result<std::vector<int>> v = std::vector<int>{1, 2, 3};
    result<std::vector<int>> copy = v;
    CHECK(*copy == std::vector<int>{1, 2, 3});
    copy = e;
    CHECK(is_e(copy));
    copy = v;
    CHECK(copy->size() == 3);
    result<std::vector<int>> moved = std::move(copy);
    CHECK(*moved == std::vector<int>{1, 2, 3});
    moved = result<std::vector<int>>(e);
    CHECK(is_e(moved));
  }

  SECTION("move-only std::unique_ptr") {
    static_assert(!std::is_copy_constructible_v<result<std::unique_ptr<int>>>);
    static_assert(!std::is_copy_assignable_v<result<std::unique_ptr<int>>>);
    static_assert(std::is_nothrow_move_constructible_v<result<std::unique_ptr<int>>>);
    static_assert(std::is_nothrow_move_assignable_v<result<std::unique_ptr<int>>>);
    result<std::unique_ptr<int>> p = std::make_unique<int>(7);
    result<std::unique_ptr<int>> q = e;
    q = std::move(p);  // error <- value
    REQUIRE(q);
    CHECK(**q == 7);
    q = result<std::unique_ptr<int>>(e);  // value <- error
    CHECK(is_e(q));
    result<std::unique_ptr<int>> r = std::move(q);
    CHECK(is_e(r));
    r = std::make_unique<int>(8);
    std::unique_ptr<int> out = std::move(r).value();
    CHECK(*out == 8);
  }

  SECTION("result<void>") {
    static_assert(std::is_nothrow_move_constructible_v<result<void>>);
    static_assert(std::is_nothrow_move_assignable_v<result<void>>);
    result<void> good = ok();
    result<void> bad = e;
    result<void> x = bad;  // copy-construct an error
    CHECK(is_e(x));
    x = good;  // error <- success (copy)
    CHECK(x);
    x = bad;  // success <- error (copy)
    CHECK(is_e(x));
    x = ok();  // error <- success (move)
    CHECK(x);
    x = std::move(bad);  // success <- error (move)
    CHECK(is_e(x));
    x = result<void>(e);  // error <- error
    CHECK(is_e(x));
    result<void> y = std::move(x);
    CHECK(is_e(y));
    xlogrt::error taken = std::move(y).error();
    CHECK(taken.code() == errc::out_of_memory);
  }
}

TEST_CASE("every error code has a distinct name", "[core][result]") {
  std::unordered_set<std::string> names;
  for (int c = 1; c <= static_cast<int>(errc::user_defined); ++c) {
    auto n = to_string(static_cast<errc>(c));
    CHECK(n != "unknown");
    CHECK(names.insert(std::string(n)).second);
  }
}

TEST_CASE("driver statuses become named errors with the failing call", "[core][status]") {
  auto e = status::driver_failure(status::out_of_memory, "cuMemAllocAsync", {},
                                  "allocating 64 bytes on ordinal 0");
  CHECK(e.code() == errc::out_of_memory);
  CHECK(e.driver_status() == 2);
  CHECK(e.message() ==
        "cuMemAllocAsync failed with CUDA_ERROR_OUT_OF_MEMORY (2) while allocating 64 bytes on ordinal 0");
  auto other = status::driver_failure(12345, "cuStreamCreate");
  CHECK(other.code() == errc::driver_error);
  CHECK(other.message() == "cuStreamCreate failed with status 12345");
  CHECK(status::driver_failure(status::deinitialized, "x").code() == errc::shutting_down);
}

TEST_CASE("ids compare by value; DEFAULT and UNTAGGED are zero", "[core][ids]") {
  CHECK(StreamId::DEFAULT == StreamId{0});
  CHECK(StreamId{1} != StreamId::DEFAULT);
  CHECK(StreamId{1} < StreamId{2});
  CHECK(AllocTag::UNTAGGED.value == 0);
  BlockId none;
  CHECK_FALSE(none.valid());
  BlockId a{1, 5, 0}, b{1, 5, 1};
  CHECK(a.valid());
  CHECK(a != b);  // same slot, next generation: a different block
  CHECK(a.to_string() == "1#5.0");
  CHECK(reads(Access::Read));
  CHECK_FALSE(writes(Access::Read));
  CHECK(writes(Access::Write));
  CHECK_FALSE(reads(Access::Write));
  CHECK((reads(Access::ReadWrite) && writes(Access::ReadWrite)));
}

TEST_CASE("DeviceBlock is move-only and a moved-from block is empty", "[core][block]") {
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<DeviceBlock>);
  STATIC_REQUIRE_FALSE(std::is_copy_assignable_v<DeviceBlock>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<DeviceBlock>);

  CHECK(DeviceBlock{}.empty());
  DeviceBlock a{0x1000, 256, StreamId{3}, 1, AllocTag{9}, BlockId{7, 2, 4}};
  CHECK_FALSE(a.empty());
  CHECK(a.ptr() == 0x1000);
  CHECK(a.as<float>() == reinterpret_cast<float*>(0x1000));

  DeviceBlock b = std::move(a);
  CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the contract under test
  CHECK(a.ptr() == 0);
  CHECK(a.bytes() == 0);
  CHECK(b.bytes() == 256);
  CHECK(b.alloc_stream() == StreamId{3});
  CHECK(b.device_ordinal() == 1);
  CHECK(b.tag() == AllocTag{9});
  CHECK(b.id() == BlockId{7, 2, 4});

  DeviceBlock c;
  c = std::move(b);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move)
  CHECK(c.ptr() == 0x1000);
}
