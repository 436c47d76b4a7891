// SPDX-License-Identifier: Apache-2.0
#pragma once

// Shared helpers of the SimDriver tests: a driver with device 0's primary context
// current on the constructing thread, and result unwrapping that prints the error.

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "xlogrt/sim/sim_driver.hpp"

namespace simtest {

using xlogrt::SimDriver;

template <class T>
T value(xlogrt::result<T> r) {
  INFO((r ? std::string() : r.error().what()));
  REQUIRE(r.has_value());
  return std::move(r).value();
}

inline void expect_ok(const xlogrt::result<void>& r) {
  INFO((r ? std::string() : r.error().what()));
  REQUIRE(r.has_value());
}

inline xlogrt::SimConfig manual(std::uint64_t seed = 1, std::size_t memory = std::size_t{1} << 20) {
  xlogrt::SimConfig c;
  c.executor = xlogrt::SimExecutor::manual;
  c.seed = seed;
  c.memory_bytes = memory;
  return c;
}

/// A SimDriver with device 0's primary context retained and current on this thread.
struct Sim {
  SimDriver d;
  SimDriver::context_t ctx = nullptr;
  SimDriver::mempool_t pool = nullptr;

  explicit Sim(xlogrt::SimConfig c = manual()) : d(c) {
    ctx = value(d.primary_ctx_retain(0));
    expect_ok(d.ctx_make_current(ctx));
    if (c.memory_pools_supported) pool = value(d.device_default_mempool(0));
  }

  SimDriver::stream_t stream() { return value(d.stream_create()); }
  SimDriver::event_t event() { return value(d.event_create()); }

  std::uint64_t alloc(std::size_t n, SimDriver::stream_t s) {
    return value(d.mem_alloc_async(n, pool, s));
  }

  std::vector<std::uint8_t> read(std::uint64_t p, std::size_t n, SimDriver::stream_t s) {
    std::vector<std::uint8_t> out(n, 0);
    expect_ok(d.memcpy_dtoh_async(out.data(), p, n, s));
    expect_ok(d.stream_synchronize(s));
    return out;
  }

  void fill(std::uint64_t p, std::uint8_t v, std::size_t n, SimDriver::stream_t s) {
    expect_ok(d.memset_d8_async(p, v, n, s));
  }
};

}  // namespace simtest
