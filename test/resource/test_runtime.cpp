// SPDX-License-Identifier: Apache-2.0
// DeviceRuntime on SimDriver: the singleton's contract and the owned runtime.

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include <xlogrt/driver/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

using namespace xlogrt;

namespace {
using SimRuntime = DeviceRuntime<AsyncCuda<SimDriver>>;
SimDriver& process_sim() {
  auto s = SimDriver::open();
  REQUIRE(s.has_value());
  return **s;
}
}  // namespace

TEST_CASE("try_get returns the same singleton for an ordinal", "[runtime]") {
  auto a = SimRuntime::try_get(0);
  REQUIRE(a.has_value());
  auto b = SimRuntime::try_get(0);
  REQUIRE(b.has_value());
  CHECK(*a == *b);
  CHECK((*a)->device_ordinal() == 0);
  auto other = SimRuntime::try_get(1);
  REQUIRE(other.has_value());
  CHECK(*other != *a);
  CHECK((*other)->device_ordinal() == 1);
}

TEST_CASE("allocate / deallocate through the runtime return bytes_outstanding to its start",
          "[runtime]") {
  auto rt = SimRuntime::try_get(0);
  REQUIRE(rt.has_value());
  const auto before = (*rt)->bytes_outstanding();
  auto block = (*rt)->allocate(2048, StreamId::DEFAULT, AllocTag::UNTAGGED);
  REQUIRE(block.has_value());
  CHECK(block->bytes() == 2048);
  CHECK((*rt)->bytes_outstanding() == before + 2048);
  REQUIRE((*rt)->deallocate(std::move(*block)).has_value());
  REQUIRE((*rt)->reap_pending().has_value());
  CHECK((*rt)->bytes_outstanding() == before);
}

TEST_CASE("try_get refuses ordinals out of range", "[runtime]") {
  auto e = SimRuntime::try_get(SimRuntime::MAX_DEVICE_ORDINALS);
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::invalid_ordinal);
  CHECK(e.error().message().find("16") != std::string::npos);
  // Below the table's bound but beyond the simulated machine's devices.
  auto absent = SimRuntime::try_get(7);
  REQUIRE_FALSE(absent);
  CHECK(absent.error().code() == errc::invalid_ordinal);
}

TEST_CASE("an owned runtime is not the singleton", "[runtime]") {
  auto singleton = SimRuntime::try_get(0);
  REQUIRE(singleton.has_value());
  auto dev = Device<SimDriver>::open(process_sim(), 0);
  REQUIRE(dev.has_value());
  auto pool = StreamPool<SimDriver>::create(*dev, 2);
  REQUIRE(pool.has_value());
  auto stack = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(stack.has_value());
  SimRuntime owned(*pool, std::move(*stack));
  CHECK(&owned != *singleton);
  auto block = owned.allocate(1024);
  REQUIRE(block.has_value());
  CHECK(owned.bytes_outstanding() == 1024);
  REQUIRE(owned.deallocate(std::move(*block)).has_value());
  REQUIRE(owned.reap_pending().has_value());
  CHECK(owned.bytes_outstanding() == 0);
  CHECK(*SimRuntime::try_get(0) == *singleton);
}

TEST_CASE("32 threads racing the first try_get build exactly one runtime", "[runtime]") {
  // A stack type no other test uses, so that this is its first build.
  using Fresh = DeviceRuntime<DirectCuda<SimDriver>>;
  SimDriver& sim = process_sim();
  const auto retains = sim.calls("cuDevicePrimaryCtxRetain");
  std::atomic<bool> go{false};
  std::vector<Fresh*> seen(32, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      auto rt = Fresh::try_get(1);
      if (rt) seen[i] = *rt;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  for (auto* p : seen) CHECK(p == seen[0]);
  CHECK(seen[0] != nullptr);
  CHECK(sim.calls("cuDevicePrimaryCtxRetain") == retains + 1);
}

TEST_CASE("a failed build leaves the slot empty and the next caller builds it", "[runtime]") {
  using Fresh = DeviceRuntime<DirectCuda<SimDriver>>;
  SimDriver& sim = process_sim();
  sim.fail_nth("cuStreamCreate", 1, status::out_of_memory);
  auto failed = Fresh::try_get(0);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code() == errc::out_of_memory);
  CHECK(failed.error().message().find("cuStreamCreate") != std::string::npos);
  sim.clear_failures();
  auto built = Fresh::try_get(0);
  REQUIRE(built.has_value());
  CHECK(*Fresh::try_get(0) == *built);
}

TEST_CASE("reap_pending from many threads at once retires each queued free once", "[runtime][reap]") {
  SimDriver sim{SimConfig{}};
  auto dev = Device<SimDriver>::open(sim, 0);
  REQUIRE(dev.has_value());
  auto pool = StreamPool<SimDriver>::create(*dev, 4);
  REQUIRE(pool.has_value());
  auto stack = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(stack.has_value());
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        auto b = stack->allocate(4096, StreamId{static_cast<std::uint32_t>(t % 4)}, AllocTag::UNTAGGED);
        if (!b || !stack->deallocate(std::move(*b)) || !stack->reap_pending()) failed = true;
        // Never more than the blocks this process could hold at once: a double retire
        // would wrap the count below zero.
        if (stack->bytes_outstanding() > 8 * 4096 * 2) failed = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_FALSE(failed.load());
  REQUIRE(stack->reap_pending().has_value());
  CHECK(stack->bytes_outstanding() == 0);
}

TEST_CASE("weak spot: DeviceRuntime::create refuses a pool and a stack of different devices, pools or drivers",
          "[runtime]") {
  using Rt = DeviceRuntime<AsyncCuda<SimDriver>>;
  SimDriver sim{SimConfig{}};
  SimDriver other{SimConfig{}};
  const auto pool_on = [](SimDriver& d, std::uint32_t ordinal) {
    auto dev = Device<SimDriver>::open(d, ordinal);
    REQUIRE(dev.has_value());
    auto p = StreamPool<SimDriver>::create(*dev, 2);
    REQUIRE(p.has_value());
    return *p;
  };
  const auto stack_on = [](const std::shared_ptr<StreamPool<SimDriver>>& p) {
    auto a = AsyncCuda<SimDriver>::create(p);
    REQUIRE(a.has_value());
    return std::move(*a);
  };
  auto p0 = pool_on(sim, 0);
  for (auto* where : {"another device", "another pool of the same device", "another driver"}) {
    INFO(where);
    const std::string w = where;
    auto p = w == "another device" ? pool_on(sim, 1) : w == "another driver" ? pool_on(other, 0) : pool_on(sim, 0);
    auto rt = Rt::create(p0, stack_on(p));
    REQUIRE_FALSE(rt);
    CHECK(rt.error().code() == errc::foreign_block);
  }
  auto rt = Rt::create(p0, stack_on(p0));
  REQUIRE(rt.has_value());
  auto b = rt->allocate(256, StreamId{1});
  REQUIRE(b.has_value());
  REQUIRE(rt->deallocate(std::move(*b)).has_value());
  REQUIRE(rt->reap_pending().has_value());
  CHECK(!Rt::create(nullptr, stack_on(p0)));
}
