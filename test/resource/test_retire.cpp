// SPDX-License-Identifier: Apache-2.0
// Queued frees retire without a reap: AsyncCuda's poll_pending retires what the device
// has reached (event queries, no synchronisation), deallocate polls by itself (every 256
// frees and every 32 MiB freed, on both bases), and Budget
// credits what comes back without synchronising. On SimDriver's manual executor, where
// nothing runs until the test steps the device. Its own program: the budget of ordinal 0
// is process-wide.

#include <catch2/catch.hpp>

#include <vector>

#include <xlogrt/device/stream_pool.hpp>
#include <xlogrt/resource/async_cuda.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/virtual_cuda.hpp>
#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;

namespace {

struct Rig {
  Rig() : sim(SimConfig{.executor = SimExecutor::manual}) {
    auto pool = StreamPool<SimDriver>::open(sim, 0, 2);
    REQUIRE(pool.has_value());
    streams = *pool;
  }
  AsyncCuda<SimDriver> base() {
    auto a = AsyncCuda<SimDriver>::create(streams);
    REQUIRE(a.has_value());
    return std::move(*a);
  }
  SimDriver sim;
  std::shared_ptr<StreamPool<SimDriver>> streams;
};

}  // namespace

TEST_CASE("poll_pending retires the frees the device has reached, and only those", "[retire]") {
  Rig rig;
  auto a = rig.base();
  auto b = a.allocate(4096, StreamId{0}, AllocTag{});
  REQUIRE(b.has_value());
  REQUIRE(a.deallocate(std::move(*b)).has_value());
  CHECK(a.bytes_outstanding() == 4096);
  auto none = a.poll_pending();  // the free is queued, not run: an event marks it
  REQUIRE(none.has_value());
  CHECK(*none == 0);
  CHECK(a.bytes_outstanding() == 4096);
  rig.sim.run_until_idle();
  auto back = a.poll_pending();
  REQUIRE(back.has_value());
  CHECK(*back == 4096);
  CHECK(a.bytes_outstanding() == 0);
  CHECK(a.retired_bytes() == 4096);
  CHECK(rig.sim.calls("cuStreamSynchronize") == 0);
  // A reap afterwards finds nothing to retire twice.
  REQUIRE(a.reap_pending().has_value());
  CHECK(a.retired_bytes() == 4096);
}

TEST_CASE("deallocate polls by itself, so a program that never reaps keeps true figures", "[retire]") {
  Rig rig;
  auto a = rig.base();
  constexpr std::size_t bytes = 4096;
  const std::size_t frees = 3 * AsyncCuda<SimDriver>::Cadence::EVERY_FREES;
  for (std::size_t i = 0; i < frees; ++i) {
    auto b = a.allocate(bytes, StreamId{0}, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(a.deallocate(std::move(*b)).has_value());
    rig.sim.run_until_idle();
  }
  // At most the frees since the poll before last are still counted.
  CHECK(a.bytes_outstanding() <= 2 * AsyncCuda<SimDriver>::Cadence::EVERY_FREES * bytes);
  CHECK(a.retired_bytes() >= AsyncCuda<SimDriver>::Cadence::EVERY_FREES * bytes);
  CHECK(rig.sim.calls("cuStreamSynchronize") == 0);
}

// torch's streams reach the bridge adopted, so only a free on one may poll them (see
// detail::PollCadence). A run of 8 MiB frees there, the device keeping up, leaves fewer
// than EVERY_BYTES counted once the device is idle: the frees since the last poll inside
// a free. Counted by frees alone, up to 255 of them stayed (2 GiB).
TEMPLATE_TEST_CASE("large frees on an adopted stream retire without a reap, on either base", "[retire]",
                   AsyncCuda<SimDriver>, VirtualCuda<SimDriver>) {
  SimDriver sim{SimConfig{.memory_bytes = std::size_t{1} << 30, .executor = SimExecutor::manual}};
  auto streams = StreamPool<SimDriver>::open(sim, 0, 2);
  REQUIRE(streams.has_value());
  auto handle = sim.stream_create();
  REQUIRE(handle.has_value());
  auto adopted = (*streams)->adopt(*handle);
  REQUIRE(adopted.has_value());
  REQUIRE_FALSE((*streams)->owned(*adopted));
  auto made = TestType::create(*streams);
  REQUIRE(made.has_value());
  TestType& base = *made;
  constexpr std::size_t bytes = std::size_t{8} << 20;
  for (int i = 0; i < 300; ++i) {
    auto b = base.allocate(bytes, *adopted, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(base.deallocate(std::move(*b)).has_value());
    sim.run_until_idle();
  }
  REQUIRE(base.poll_pending().has_value());  // names no stream: the adopted one is not called on
  CHECK(base.bytes_outstanding() < TestType::Cadence::EVERY_BYTES);
  CHECK(base.retired_bytes() >= 300 * bytes - TestType::Cadence::EVERY_BYTES);
  CHECK(sim.calls("cuStreamSynchronize") == 0);
  REQUIRE(base.reap_pending().has_value());
  CHECK(base.bytes_outstanding() == 0);
  REQUIRE(sim.stream_destroy(*handle).has_value());
}

TEST_CASE("the budget credits a free the device has reached without synchronising", "[retire]") {
  Rig rig;
  Budget<AsyncCuda<SimDriver>> b{rig.base(), BudgetOptions{.limit_bytes = 8192}};
  auto x = b.allocate(8192, StreamId{0}, AllocTag{});
  REQUIRE(x.has_value());
  REQUIRE(b.deallocate(std::move(*x)).has_value());
  CHECK(device_budget(rig.sim, 0)->in_use == 8192);  // queued: the device still holds it
  rig.sim.run_until_idle();                 // the device reaches the free
  auto y = b.allocate(8192, StreamId{1}, AllocTag{});
  REQUIRE(y.has_value());
  CHECK(rig.sim.calls("cuStreamSynchronize") == 0);  // seen by an event query, not a reap
  CHECK(device_budget(rig.sim, 0)->in_use == 8192);
  CHECK(b.pending_credit() == 0);
  REQUIRE(b.deallocate(std::move(*y)).has_value());
  REQUIRE(b.reap_pending().has_value());
  CHECK(device_budget(rig.sim, 0)->in_use == 0);
}
