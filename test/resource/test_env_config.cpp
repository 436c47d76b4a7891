// SPDX-License-Identifier: Apache-2.0
// XLOGRT_BUDGET_BYTES and XLOGRT_LOG_FILE: parsed, or refused with a named error.

#include <catch2/catch.hpp>

#include <algorithm>

#include <cstdlib>

#include <xlogrt/runtime/env_config.hpp>

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

TEST_CASE("XLOGRT_LOG_SAMPLES: milliseconds between the log's samples, or off", "[env_config]") {
  auto at = [](const char* v) { return parse_env_config(nullptr, nullptr, nullptr, nullptr, v); };
  CHECK_FALSE(at(nullptr)->log_sample_ms);
  CHECK_FALSE(at("")->log_sample_ms);
  CHECK(at("0")->log_sample_ms == 0u);
  CHECK(at("off")->log_sample_ms == 0u);
  CHECK(at("250")->log_sample_ms == 250u);
  CHECK(at("5ms")->log_sample_ms == 5u);
  CHECK(at("3600000")->log_sample_ms == 3600000u);
  for (const char* bad : {"3600001", "-1", "1.5", "ms", "10s", "on", "99999999999", "1\n"}) {
    auto r = at(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::StartsWith("XLOGRT_LOG_SAMPLES='"));
    CHECK(r.error().message().find('\n') == std::string::npos);
  }
}

TEST_CASE("XLOGRT_CACHE: a mode and the caching layer's sizes, comma-separated", "[env_config]") {
  auto c = parse_env_config(nullptr, nullptr, "on,depot_bytes=4G,thread_bytes=256M,thread_block_bytes=512K");
  REQUIRE(c.has_value());
  CHECK(c->cache);
  CHECK_FALSE(c->cache_nvtx);
  CHECK(c->cache_sizes.depot_bytes == std::size_t{4} << 30);
  CHECK(c->cache_sizes.thread_bytes == std::size_t{256} << 20);
  CHECK(c->cache_sizes.thread_block_bytes == std::size_t{512} << 10);
  CHECK_FALSE(c->cache_sizes.bin_bytes);
  CHECK_FALSE(c->cache_sizes.max_block_bytes);

  auto sizes_only = parse_env_config(nullptr, nullptr, "bin_bytes=1M,max_block_bytes=64M,bin_bytes=2M");
  REQUIRE(sizes_only.has_value());
  CHECK(sizes_only->cache);                                    // no mode: on
  CHECK(sizes_only->cache_sizes.bin_bytes == 2u << 20);        // the later item wins
  CHECK(sizes_only->cache_sizes.max_block_bytes == 64u << 20);
  auto later = parse_env_config(nullptr, nullptr, "nvtx,off");
  REQUIRE(later.has_value());
  CHECK_FALSE(later->cache);
  CHECK_FALSE(later->cache_nvtx);

  for (const char* bad : {"depot=4G", "on,", ",on", "on,,off", "depot_bytes=", "depot_bytes=0", "depot_bytes=4X",
                          "thread_bytes=99999999999999999999", "=4G", "onn"}) {
    auto r = parse_env_config(nullptr, nullptr, bad);
    INFO(bad);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK_THAT(r.error().message(), Catch::Contains("XLOGRT_CACHE"));
  }
  auto unknown = parse_env_config(nullptr, nullptr, "on,depot=4G");
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message(), Catch::Contains("'depot=4G' has an unknown key"));
  auto zero = parse_env_config(nullptr, nullptr, "depot_bytes=0");
  REQUIRE_FALSE(zero);
  CHECK_THAT(zero.error().message(), Catch::Contains("XLOGRT_CACHE depot_bytes='0' is zero"));
}

TEST_CASE("XLOGRT_CACHE: thread_block_bytes=0 is accepted (every block through the depots), other zeros are not",
          "[env_config]") {
  // Issue #28, finding 5: CachedOptions documents thread_block_bytes = 0 as "every block
  // goes through the depots", but the variable refused it as "is zero".
  for (const char* v : {"thread_block_bytes=0", "on,thread_block_bytes=0K", "thread_block_bytes=64K,thread_block_bytes=0 B"}) {
    INFO(v);
    auto c = parse_env_config(nullptr, nullptr, v);
    INFO((c ? std::string() : c.error().what()));
    REQUIRE(c.has_value());
    CHECK(c->cache);
    REQUIRE(c->cache_sizes.thread_block_bytes.has_value());
    CHECK(*c->cache_sizes.thread_block_bytes == 0u);
  }
  for (const char* v : {"max_block_bytes=0", "bin_bytes=0", "thread_bytes=0", "depot_bytes=0K"}) {
    INFO(v);
    auto c = parse_env_config(nullptr, nullptr, v);
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == errc::invalid_argument);
    CHECK_THAT(c.error().message(), Catch::Contains("is zero") && Catch::Contains("only thread_block_bytes and small_pool_bytes may be 0"));
  }
  auto empty = parse_env_config(nullptr, nullptr, "thread_block_bytes=");  // still no number
  REQUIRE_FALSE(empty);
  CHECK_THAT(empty.error().message(), Catch::Contains("XLOGRT_CACHE thread_block_bytes='' is empty"));
}

TEST_CASE("weak spot: a budget of 2^63 bytes or more is refused, not taken as no budget", "[env_config]") {
  for (const char* v : {"9223372036854775808", "9223372036854775807", "18446744073709551615", "8388608T"}) {
    INFO(v);
    auto c = parse_env_config(v, nullptr);
    REQUIRE_FALSE(c);
    CHECK(c.error().code() == errc::invalid_argument);
    CHECK_THAT(c.error().message(), Catch::Contains("XLOGRT_BUDGET_BYTES") && Catch::Contains("too large"));
  }
  auto top = parse_env_config("9223372036854775806", nullptr);  // the largest budget
  REQUIRE(top.has_value());
  CHECK(*top->budget_bytes == MAX_BUDGET_BYTES);
  CHECK(parse_env_config("8388607T", nullptr).has_value());
}

TEST_CASE("weak spot: error messages escape control characters from the environment", "[env_config]") {
  auto b = parse_env_config("12\n\x1b[31mX\\", nullptr);
  REQUIRE_FALSE(b);
  const std::string& m = b.error().message();
  CHECK_THAT(m, Catch::Contains("12\\x0a\\x1b[31mX\\\\"));
  CHECK(std::none_of(m.begin(), m.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20; }));
  auto c = parse_env_config(nullptr, nullptr, "on\r\x7f");
  REQUIRE_FALSE(c);
  CHECK_THAT(c.error().message(), Catch::Contains("XLOGRT_CACHE='on\\x0d\\x7f'"));
}
