// SPDX-License-Identifier: Apache-2.0
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>
#include <unordered_set>

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

TEST_CASE("every error code has a distinct name", "[core][result]") {
  std::unordered_set<std::string> names;
  for (int c = 1; c <= static_cast<int>(errc::sink_failure); ++c) {
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
