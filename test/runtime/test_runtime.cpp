// SPDX-License-Identifier: Apache-2.0
// DeviceRuntime on SimDriver: the singleton's contract and the owned runtime.

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

using namespace xlogrt;

namespace {
using SimRuntime = DeviceRuntime<AsyncCuda<SimDriver>>;
SimDriver& process_sim() {
  auto s = SimDriver::open();
  REQUIRE(s.has_value());
  return **s;
}

// A stack chosen at run time, as a program would choose it: the environment says whether
// a DebugGuard goes over the base resource, and nothing is recompiled.
using Guarded = DebugGuard<AsyncCuda<SimDriver>>;
using AnyRuntime = DeviceRuntime<AnyResource, SimDriver>;
constexpr const char* GUARD_ENV = "XLOGRT_TEST_DEBUG_GUARD";

result<AnyResource> stack_from_env(const std::shared_ptr<StreamPool<SimDriver>>& streams) noexcept {
  auto base = AsyncCuda<SimDriver>::create(streams);
  if (!base) return std::move(base).error();
  const char* v = std::getenv(GUARD_ENV);
  if (v != nullptr && std::string_view(v) == "1") return AnyResource{Guarded(std::move(*base))};
  return AnyResource{std::move(*base)};
}

// resource/adaptor.hpp's opening example, as written there: it must compile and run
// inside a DeviceRuntime (its first version, with a plain atomic member, did not: #32).
template <class Up>
struct CountAllocations : xlogrt::Adaptor<Up> {
  using xlogrt::Adaptor<Up>::Adaptor;
  // Behind a unique_ptr: a layer must move, and an atomic cannot (see below).
  std::unique_ptr<std::atomic<std::size_t>> calls = std::make_unique<std::atomic<std::size_t>>(0);
  xlogrt::result<xlogrt::DeviceBlock> allocate(std::size_t n, xlogrt::StreamId s,
                                               xlogrt::AllocTag t) noexcept {
    calls->fetch_add(1, std::memory_order_relaxed);
    return this->upstream().allocate(n, s, t);
  }
};
}  // namespace

// What DeviceRuntime<AnyResource>::try_get builds.
template <>
struct xlogrt::StackBuilder<AnyResource> {
  static result<AnyResource> build(const std::shared_ptr<StreamPool<SimDriver>>& streams) noexcept {
    return stack_from_env(streams);
  }
};

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
  auto pool = StreamPool<SimDriver>::open(process_sim(), 0, 2);
  REQUIRE(pool.has_value());
  auto stack = AsyncCuda<SimDriver>::create(*pool);
  REQUIRE(stack.has_value());
  auto made = SimRuntime::create(*pool, std::move(*stack));
  REQUIRE(made.has_value());
  auto& owned = *made;
  CHECK(&owned != *singleton);
  auto block = owned.allocate(1024);
  REQUIRE(block.has_value());
  CHECK(owned.bytes_outstanding() == 1024);
  REQUIRE(owned.deallocate(std::move(*block)).has_value());
  REQUIRE(owned.reap_pending().has_value());
  CHECK(owned.bytes_outstanding() == 0);
  CHECK(*SimRuntime::try_get(0) == *singleton);
}

TEST_CASE("DeviceRuntime::open builds an owned runtime in one call and passes on each step's error",
          "[runtime][open]") {
  SimDriver sim{SimConfig{.devices = 2}};
  SECTION("the stack StackBuilder builds, on the streams asked for") {
    auto rt = SimRuntime::open(sim, 1, 3);
    REQUIRE(rt.has_value());
    CHECK(rt->device_ordinal() == 1);
    CHECK(rt->streams()->size() == 3);
    auto b = rt->allocate(4096, StreamId{2});
    REQUIRE(b.has_value());
    REQUIRE(rt->deallocate(std::move(*b)).has_value());
    REQUIRE(rt->reap_pending().has_value());
    CHECK(rt->bytes_outstanding() == 0);
  }
  SECTION("a stack of one's own from make(streams)") {
    using Rt = DeviceRuntime<Budget<AsyncCuda<SimDriver>>>;
    auto rt = Rt::open(sim, 0, 2, [](const std::shared_ptr<StreamPool<SimDriver>>& streams)
                                      -> result<Budget<AsyncCuda<SimDriver>>> {
      XLOGRT_TRY_ASSIGN(auto base, AsyncCuda<SimDriver>::create(streams));
      return Budget<AsyncCuda<SimDriver>>(std::move(base), BudgetOptions{.limit_bytes = 1 << 20});
    });
    REQUIRE(rt.has_value());
    auto refused = rt->allocate(2 << 20);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().code() == errc::out_of_budget);
  }
  SECTION("each step's error, as it returned it") {
    auto no_device = SimRuntime::open(sim, 2);
    REQUIRE_FALSE(no_device);
    CHECK(no_device.error().code() == errc::invalid_ordinal);
    auto no_streams = SimRuntime::open(sim, 0, 0);
    REQUIRE_FALSE(no_streams);
    CHECK(no_streams.error().code() == errc::invalid_argument);
    sim.fail_nth("cuMemPoolSetAttribute", 1, status::out_of_memory);
    auto no_stack = SimRuntime::open(sim, 0, 2);
    REQUIRE_FALSE(no_stack);
    CHECK(no_stack.error().driver_status() == status::out_of_memory);
    auto refused = SimRuntime::open(sim, 0, 2, [](const std::shared_ptr<StreamPool<SimDriver>>&)
                                                   -> result<AsyncCuda<SimDriver>> {
      return error{errc::invalid_argument, "make refused"};
    });
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message() == "make refused");
  }
  SECTION("a make that builds on another pool is refused by create's check") {
    auto elsewhere = StreamPool<SimDriver>::open(sim, 1, 2);
    REQUIRE(elsewhere.has_value());
    auto rt = SimRuntime::open(sim, 0, 2, [&](const std::shared_ptr<StreamPool<SimDriver>>&) {
      return AsyncCuda<SimDriver>::create(*elsewhere);
    });
    REQUIRE_FALSE(rt);
    CHECK(rt.error().code() == errc::foreign_block);
  }
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
  auto pool = StreamPool<SimDriver>::open(sim, 0, 4);
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
    auto p = StreamPool<SimDriver>::open(d, ordinal, 2);
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

TEST_CASE("DeviceRuntime<AnyResource> runs the stack the environment chose", "[runtime][any_resource]") {
  STATIC_REQUIRE(std::is_same_v<DeviceRuntime<AnyResource>::driver_type, CudaDriver>);  // by default
  STATIC_REQUIRE(std::is_same_v<AnyRuntime::driver_type, SimDriver>);
  STATIC_REQUIRE(AnyRuntime::supports_block_use_tracking);
  SimDriver sim{SimConfig{}};
  auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(pool.has_value());

  for (const char* guard : {"0", "1"}) {
    INFO(GUARD_ENV << "=" << guard);
    REQUIRE(::setenv(GUARD_ENV, guard, 1) == 0);
    auto stack = stack_from_env(*pool);
    REQUIRE(stack.has_value());
    auto made = AnyRuntime::create(*pool, std::move(*stack));
    REQUIRE(made.has_value());
    auto& rt = *made;
    const bool guarded = guard[0] == '1';
    CHECK((rt.stack().target<Guarded>() != nullptr) == guarded);
    CHECK((rt.stack().target<AsyncCuda<SimDriver>>() != nullptr) == !guarded);

    auto b = rt.allocate(4096, StreamId{1}, AllocTag{5});
    REQUIRE(b.has_value());
    REQUIRE(rt.prepare_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    // 8 bytes past the block: into the back guard when there is one.
    REQUIRE(rt.driver().memset_d8_async(b->ptr(), 0x22, 4096 + 8, *rt.stream(StreamId{1})).has_value());
    REQUIRE(rt.finish_block_use(b->id(), StreamId{1}, Access::Write).has_value());
    auto freed = rt.deallocate(std::move(*b));
    CHECK(freed.has_value() == !guarded);
    if (guarded) {
      CHECK(freed.error().code() == errc::guard_corrupted);
    }
    REQUIRE(rt.reap_pending().has_value());
    CHECK(rt.bytes_outstanding() == 0);
  }
  REQUIRE(::unsetenv(GUARD_ENV) == 0);
}

TEST_CASE("DeviceRuntime<AnyResource>::try_get builds through StackBuilder<AnyResource>",
          "[runtime][any_resource]") {
  REQUIRE(::setenv(GUARD_ENV, "1", 1) == 0);
  auto rt = AnyRuntime::try_get(0);
  REQUIRE(::unsetenv(GUARD_ENV) == 0);
  REQUIRE(rt.has_value());
  CHECK((*rt)->stack().target<Guarded>() != nullptr);  // chosen when it was built
  CHECK(*AnyRuntime::try_get(0) == *rt);
  auto b = (*rt)->allocate(512);
  REQUIRE(b.has_value());
  REQUIRE((*rt)->deallocate(std::move(*b)).has_value());
  REQUIRE((*rt)->reap_pending().has_value());
}

TEST_CASE("adaptor.hpp's example decorator runs inside an owned DeviceRuntime", "[runtime][decorator]") {
  SimDriver sim(SimConfig{.devices = 1});
  auto streams = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(streams.has_value());
  auto base = AsyncCuda<SimDriver>::create(*streams);
  REQUIRE(base.has_value());
  using Counted = CountAllocations<AsyncCuda<SimDriver>>;
  auto rt = DeviceRuntime<Counted>::create(*streams, Counted(std::move(*base)));
  REQUIRE(rt.has_value());
  auto b = rt->allocate(4096, StreamId{1}, AllocTag{1});
  REQUIRE(b.has_value());
  CHECK(rt->stack().calls->load() == 1);
  REQUIRE(rt->deallocate(std::move(*b)).has_value());
  REQUIRE(rt->reap_pending().has_value());
  CHECK(rt->bytes_outstanding() == 0);
}
