// SPDX-License-Identifier: Apache-2.0
// XLOGRT_BUDGET_BYTES and XLOGRT_LOG_FILE: parsed, or refused with a named error.

#include <catch2/catch.hpp>

#include <cstdlib>

#include <xlogrt/resource/env_config.hpp>

using namespace xlogrt;

TEST_CASE("byte sizes with K/M/G/T suffixes", "[env_config]") {
  CHECK(*parse_byte_size("1073741824") == 1073741824u);
  CHECK(*parse_byte_size("512M") == 512u << 20);
  CHECK(*parse_byte_size("8G") == std::size_t{8} << 30);
  CHECK(*parse_byte_size("8g") == std::size_t{8} << 30);
  CHECK(*parse_byte_size("2T") == std::size_t{2} << 40);
  CHECK(*parse_byte_size("64k") == 64u << 10);
  CHECK(*parse_byte_size(" 3 GiB ") == std::size_t{3} << 30);
  CHECK(*parse_byte_size("3GB") == std::size_t{3} << 30);
  CHECK(*parse_byte_size("100B") == 100u);

  for (const char* bad : {"", "  ", "G", "-1", "1.5G", "12Q", "8GG", "8 G B", "0", "0M",
                          "99999999999999999999", "20000000T", "0x100"}) {
    INFO(bad);
    auto r = parse_byte_size(bad, "XLOGRT_BUDGET_BYTES");
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains("XLOGRT_BUDGET_BYTES='") && Catch::Contains("suffix"));
  }
}

TEST_CASE("the environment's configuration", "[env_config]") {
  auto none = parse_env_config(nullptr, nullptr);
  REQUIRE(none.has_value());
  CHECK_FALSE(none->budget_bytes);
  CHECK_FALSE(none->log_file);
  auto empty = parse_env_config("", "");
  REQUIRE(empty.has_value());
  CHECK_FALSE(empty->budget_bytes);
  CHECK_FALSE(empty->log_file);

  auto both = parse_env_config("6G", "/tmp/alloc.csv");
  REQUIRE(both.has_value());
  CHECK(both->budget_bytes == std::size_t{6} << 30);
  CHECK(both->log_file == "/tmp/alloc.csv");

  auto bad = parse_env_config("lots", nullptr);
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message(), Catch::Contains("XLOGRT_BUDGET_BYTES='lots'"));

  ::setenv("XLOGRT_BUDGET_BYTES", "1K", 1);
  ::setenv("XLOGRT_LOG_FILE", "x.csv", 1);
  auto env = read_env_config();
  ::unsetenv("XLOGRT_BUDGET_BYTES");
  ::unsetenv("XLOGRT_LOG_FILE");
  REQUIRE(env.has_value());
  CHECK(env->budget_bytes == 1024u);
  CHECK(env->log_file == "x.csv");
}
