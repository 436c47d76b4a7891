// SPDX-License-Identifier: Apache-2.0
// Two devices of one simulated machine: a runtime per ordinal, built concurrently and
// owned; a block of one ordinal refused by the other's stack, with nothing lost;
// budgets per ordinal; and the hazard checker on work that crosses devices.
//
// SimDriver models two devices with separate memory, streams, events and contexts, and
// one happens-before order over all of them (an event of device 0 can be waited on by a
// stream of device 1, as in CUDA). It does not model peer access or pool access
// (cuCtxEnablePeerAccess, cuMemPoolSetAccess; the Driver concept has neither): a kernel
// on device 1 may touch device 0's memory, and the checker judges only the order.
//
// A runtime tracks uses on the streams of its own pool only (StreamPool::adopt refuses a
// stream of another device), so a use of a device 0 block by device 1 is told to device
// 0's runtime as a use on a device 0 stream that device 1's stream is ordered with, both
// ways, by events (the proxy case below).

#include <catch2/catch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

#include "../resource/conformance.hpp"
#include "../resource/stack_registry.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {

SimDriver& process_sim() {
  auto s = SimDriver::open();
  REQUIRE(s.has_value());
  return **s;
}

std::string describe(const std::vector<SimHazard>& hs) {
  std::string s;
  for (const auto& h : hs) s += to_string(h) + "\n";
  return s;
}

using ForeignStacks = std::tuple<Entry<AsyncCuda<SimDriver>>, Entry<DirectCuda<SimDriver>>, Entry<Cached<AsyncCuda<SimDriver>>>,
                                 Entry<DefaultStackOn<SimDriver>>, Entry<DebugGuard<AsyncCuda<SimDriver>>>, Entry<Any<DefaultStackOn<SimDriver>>>>;

/// What a refused call must leave as it was, on one ordinal's stack.
struct Accounting {
  std::size_t outstanding = 0;
  std::size_t budget_in_use = 0;
  std::size_t budget_limit = 0;
  std::size_t live = 0;  // the base's or DebugGuard's live blocks, where the stack tells
  AllocationCounters stats{};
  friend bool operator==(const Accounting&, const Accounting&) = default;
};

template <class Stack>
Accounting accounting_of(const SimDriver& sim, const Stack& s) {
  Accounting a;
  a.outstanding = s.bytes_outstanding();
  auto u = device_budget(sim, s.device_ordinal());
  REQUIRE(u.has_value());
  a.budget_in_use = u->in_use;
  a.budget_limit = u->limit;
  if constexpr (requires { s.live_blocks(); }) a.live = s.live_blocks();
  if constexpr (requires { s.snapshot(); }) a.stats = s.snapshot().total;
  return a;
}

/// Driver calls a refused free or use must not make.
struct Calls {
  std::int64_t frees_async, frees, waits, records, memsets, copies;
  friend bool operator==(const Calls&, const Calls&) = default;
};
Calls calls_of(const SimDriver& sim) {
  return Calls{sim.calls("cuMemFreeAsync"), sim.calls("cuMemFree"),        sim.calls("cuStreamWaitEvent"),
               sim.calls("cuEventRecord"),  sim.calls("cuMemsetD8Async"), sim.calls("cuMemcpyDtoHAsync")};
}

void expect_foreign(const result<void>& r, const char* what) {
  INFO(what);
  REQUIRE_FALSE(r);
  INFO(r.error().what());
  CHECK(r.error().code() == errc::foreign_block);
}

/// A block of ordinal 0 handed to ordinal 1's stack `s1`: every free, use and record is
/// refused with foreign_block, nothing is counted or queued on either ordinal, and the
/// block is still the caller's (its own stack `s0` frees it afterwards). Ordinal 1 holds
/// a twin in the same table slot (the same thread's first allocation, same size, stream
/// and tag), quiet on its alloc stream, so that only the table's owner tells them apart.
template <class Stack>
void refuse_foreign(SimDriver& sim, Stack& s0, Stack& s1) {
  const Accounting start0 = accounting_of(sim, s0), start1 = accounting_of(sim, s1);
  auto twin = s1.allocate(4096, StreamId{1}, AllocTag{7});
  REQUIRE(twin.has_value());
  auto b = s0.allocate(4096, StreamId{1}, AllocTag{7});
  REQUIRE(b.has_value());
  REQUIRE(b->device_ordinal() == 0);
  REQUIRE(twin->device_ordinal() == 1);
  const DeviceBlock copy{b->ptr(), b->bytes(), b->alloc_stream(), b->device_ordinal(), b->tag(), b->id()};

  const Accounting before0 = accounting_of(sim, s0), before1 = accounting_of(sim, s1);
  const Calls calls = calls_of(sim);

  expect_foreign(s1.deallocate(std::move(*b)), "deallocate through ordinal 1");
  REQUIRE_FALSE(b->empty());
  CHECK(b->ptr() == copy.ptr());
  CHECK(b->bytes() == copy.bytes());
  CHECK(b->id() == copy.id());
  CHECK(b->device_ordinal() == 0);
  if constexpr (TrackingResource<Stack>) {
    for (StreamId use : {StreamId{1}, StreamId{2}}) {  // 1: the twin's quiet alloc stream
      INFO("stream " << use.value);
      expect_foreign(s1.record_block_use(*b, use), "record_block_use through ordinal 1");
      for (Access a : {Access::Read, Access::Write, Access::ReadWrite}) {
        expect_foreign(s1.prepare_block_use(b->id(), use, a), "prepare_block_use through ordinal 1");
        expect_foreign(s1.finish_block_use(b->id(), use, a), "finish_block_use through ordinal 1");
      }
    }
  }
  CHECK(accounting_of(sim, s0) == before0);
  CHECK(accounting_of(sim, s1) == before1);
  CHECK(calls_of(sim) == calls);
  CHECK(sim.hazards().empty());

  // Still the caller's, and whole: its own ordinal frees it, and the twin frees too.
  REQUIRE(s0.deallocate(std::move(*b)).has_value());
  CHECK(b->empty());
  REQUIRE(s1.deallocate(std::move(*twin)).has_value());
  REQUIRE(s0.reap_pending().has_value());
  REQUIRE(s1.reap_pending().has_value());
  CHECK(s0.bytes_outstanding() == start0.outstanding);
  CHECK(s1.bytes_outstanding() == start1.outstanding);
  CHECK(sim.hazards().empty());
}

/// A stack type whose StackBuilder builds it on the other ordinal's pool, as a mistaken
/// specialisation would: try_get must refuse it, not run it (issue #28, finding 6).
struct OffOrdinal : Adaptor<AsyncCuda<SimDriver>> {
  using Adaptor<AsyncCuda<SimDriver>>::Adaptor;
};
}  // namespace

template <>
struct xlogrt::StackBuilder<OffOrdinal> {
  static result<OffOrdinal> build(const std::shared_ptr<StreamPool<SimDriver>>& streams) noexcept {
    auto dev = Device<SimDriver>::open(streams->driver(), 1 - streams->device()->ordinal());
    if (!dev) return std::move(dev).error();
    auto other = StreamPool<SimDriver>::create(std::move(*dev), streams->size());
    if (!other) return std::move(other).error();
    auto base = AsyncCuda<SimDriver>::create(*other);
    if (!base) return std::move(base).error();
    return OffOrdinal(std::move(*base));
  }
};

TEST_CASE("the simulated machine has two devices", "[two_devices]") {
  auto n = process_sim().device_count();
  REQUIRE(n.has_value());
  CHECK(*n == 2);
}

TEST_CASE("16 threads racing try_get on both ordinals build one runtime per ordinal", "[two_devices][runtime]") {
  // A stack type no other test of this program builds, so that this is its first build.
  using Rt = DeviceRuntime<Budget<AsyncCuda<SimDriver>>>;
  SimDriver& sim = process_sim();
  const auto retains = sim.calls("cuDevicePrimaryCtxRetain");
  constexpr int THREADS = 16;
  std::atomic<bool> go{false};
  std::vector<Rt*> seen0(THREADS, nullptr), seen1(THREADS, nullptr);
  std::vector<int> block_ordinal(THREADS, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < THREADS; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      // Half the threads ask for ordinal 1 first, so both builds race each other too.
      const std::uint32_t first = static_cast<std::uint32_t>(i % 2);
      auto a = Rt::try_get(first);
      auto b = Rt::try_get(1 - first);
      if (!a || !b) return;
      (first == 0 ? seen0 : seen1)[i] = *a;
      (first == 0 ? seen1 : seen0)[i] = *b;
      auto block = (*a)->allocate(256, StreamId{static_cast<std::uint32_t>(i % 4)}, AllocTag{1});
      if (!block) return;
      block_ordinal[i] = static_cast<int>(block->device_ordinal());
      if (!(*a)->deallocate(std::move(*block))) block_ordinal[i] = -2;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  REQUIRE(seen0[0] != nullptr);
  REQUIRE(seen1[0] != nullptr);
  for (int i = 0; i < THREADS; ++i) {
    INFO("thread " << i);
    CHECK(seen0[i] == seen0[0]);
    CHECK(seen1[i] == seen1[0]);
    CHECK(block_ordinal[i] == i % 2);
  }
  CHECK(seen0[0] != seen1[0]);
  CHECK(seen0[0]->device_ordinal() == 0);
  CHECK(seen1[0]->device_ordinal() == 1);
  CHECK(&seen0[0]->driver() == &sim);
  CHECK(&seen1[0]->driver() == &sim);
  CHECK(seen0[0]->device() != seen1[0]->device());
  CHECK(sim.calls("cuDevicePrimaryCtxRetain") == retains + 2);  // one build per ordinal
  CHECK(*Rt::try_get(0) == seen0[0]);
  CHECK(*Rt::try_get(1) == seen1[0]);
  for (Rt* rt : {seen0[0], seen1[0]}) {
    REQUIRE(rt->reap_pending().has_value());
    CHECK(rt->bytes_outstanding() == 0);
  }
}

TEST_CASE("owned runtimes on both devices of one SimDriver allocate each from its own device",
          "[two_devices][runtime]") {
  SimDriver sim{SimConfig{}};
  using Rt = DeviceRuntime<AsyncCuda<SimDriver>>;
  std::vector<Rt> rts;
  for (std::uint32_t ord : {0u, 1u}) {
    auto pool = StreamPool<SimDriver>::open(sim, ord, 4);
    REQUIRE(pool.has_value());
    auto base = AsyncCuda<SimDriver>::create(*pool);
    REQUIRE(base.has_value());
    auto rt = Rt::create(*pool, std::move(*base));
    REQUIRE(rt.has_value());
    CHECK(rt->device_ordinal() == ord);
    rts.push_back(std::move(*rt));
  }
  // A stack of one device does not make a runtime with the other's streams.
  {
    auto base1 = AsyncCuda<SimDriver>::create(rts[1].streams());
    REQUIRE(base1.has_value());
    auto mixed = Rt::create(rts[0].streams(), std::move(*base1));
    REQUIRE_FALSE(mixed);
    CHECK(mixed.error().code() == errc::foreign_block);
  }
  const auto mem0 = *sim.memory_stats(0), mem1 = *sim.memory_stats(1);
  auto a = rts[0].allocate(std::size_t{1} << 20, StreamId{1}, AllocTag{2});
  auto b = rts[1].allocate(std::size_t{2} << 20, StreamId{1}, AllocTag{2});
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(a->device_ordinal() == 0);
  CHECK(b->device_ordinal() == 1);
  CHECK(sim.memory_stats(0)->allocated == mem0.allocated + (std::size_t{1} << 20));
  CHECK(sim.memory_stats(1)->allocated == mem1.allocated + (std::size_t{2} << 20));
  CHECK(rts[0].bytes_outstanding() == std::size_t{1} << 20);
  CHECK(rts[1].bytes_outstanding() == std::size_t{2} << 20);
  REQUIRE(rts[0].deallocate(std::move(*a)).has_value());
  REQUIRE(rts[1].deallocate(std::move(*b)).has_value());
  for (auto& rt : rts) {
    REQUIRE(rt.reap_pending().has_value());
    CHECK(rt.bytes_outstanding() == 0);
  }
  CHECK(sim.hazards().empty());
}

TEMPLATE_LIST_TEST_CASE("a block of ordinal 0 is foreign to ordinal 1's stack", "[two_devices][foreign]",
                        ForeignStacks) {
  INFO("stack: " << TestType::name);
  SimDriver sim{SimConfig{}};
  Rig<TestType> r0(sim, 0), r1(sim, 1);
  refuse_foreign(sim, *r0.stack, *r1.stack);
}

TEST_CASE("a block of ordinal 0 is foreign to ordinal 1's default runtime", "[two_devices][foreign][runtime]") {
  using Rt = DeviceRuntime<DefaultStackOn<SimDriver>>;
  auto rt0 = Rt::try_get(0);
  auto rt1 = Rt::try_get(1);
  REQUIRE(rt0.has_value());
  REQUIRE(rt1.has_value());
  refuse_foreign(process_sim(), (*rt0)->stack(), (*rt1)->stack());
  // The runtime's own members go to the same stack.
  auto b = (*rt0)->allocate(512, StreamId{2}, AllocTag{3});
  REQUIRE(b.has_value());
  expect_foreign((*rt1)->deallocate(std::move(*b)), "DeviceRuntime::deallocate through ordinal 1");
  expect_foreign((*rt1)->record_block_use(*b, StreamId{2}), "DeviceRuntime::record_block_use through ordinal 1");
  expect_foreign((*rt1)->prepare_block_use(b->id(), StreamId{2}, Access::Read),
                 "DeviceRuntime::prepare_block_use through ordinal 1");
  expect_foreign((*rt1)->finish_block_use(b->id(), StreamId{2}, Access::Read),
                 "DeviceRuntime::finish_block_use through ordinal 1");
  REQUIRE((*rt0)->deallocate(std::move(*b)).has_value());
}

TEST_CASE("budgets are per ordinal", "[two_devices][budget]") {
  SimDriver sim{SimConfig{}};
  constexpr std::size_t MiB = std::size_t{1} << 20;
  Rig<Entry<Budget<AsyncCuda<SimDriver>>>> b0(sim, 0), b1(sim, 1);
  Rig<Entry<DefaultStackOn<SimDriver>>> d0(sim, 0), d1(sim, 1);
  // The machine's ledgers are this test's own: nothing is in use on them yet.
  const BudgetUsage start0 = *device_budget(sim, 0), start1 = *device_budget(sim, 1);
  const std::size_t limit0 = start0.in_use + 2 * MiB, limit1 = start1.in_use + 20 * MiB;

  REQUIRE(set_device_budget(sim, 0, limit0).has_value());
  CHECK(device_budget(sim, 1)->limit == start1.limit);  // setting ordinal 0's left ordinal 1's alone
  CHECK(device_budget(sim, 0)->limit == limit0);

  // Ordinal 0 exhausted, through both stacks on it (they share its budget).
  auto x = b0.stack->allocate(MiB, StreamId{0}, AllocTag{1});
  auto y = d0.stack->allocate(MiB, StreamId{0}, AllocTag{1});
  REQUIRE(x.has_value());
  REQUIRE(y.has_value());
  auto refused_by_budget = [](const result<DeviceBlock>& r, const char* ordinal) {
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::out_of_budget);
    CHECK(r.error().message().find(ordinal) != std::string::npos);
  };
  refused_by_budget(b0.stack->allocate(MiB, StreamId{0}, AllocTag{1}), "ordinal 0");
  refused_by_budget(d0.stack->allocate(MiB, StreamId{0}, AllocTag{1}), "ordinal 0");
  CHECK(device_budget(sim, 0)->in_use == start0.in_use + 2 * MiB);

  // Ordinal 1 still allocates, far beyond ordinal 0's limit, and counts only its own.
  auto big1 = b1.stack->allocate(8 * MiB, StreamId{0}, AllocTag{1});
  auto big2 = d1.stack->allocate(8 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE(big1.has_value());
  REQUIRE(big2.has_value());
  CHECK(device_budget(sim, 1)->in_use == start1.in_use + 16 * MiB);
  CHECK(device_budget(sim, 0)->in_use == start0.in_use + 2 * MiB);

  // A limit on ordinal 1 leaves ordinal 0's as it was, and binds ordinal 1 alone.
  REQUIRE(set_device_budget(sim, 1, limit1).has_value());
  CHECK(device_budget(sim, 0)->limit == limit0);
  refused_by_budget(b1.stack->allocate(8 * MiB, StreamId{0}, AllocTag{1}), "ordinal 1");
  auto fits1 = d1.stack->allocate(4 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE(fits1.has_value());

  // Freeing on ordinal 1 makes no room on ordinal 0.
  REQUIRE(b1.stack->deallocate(std::move(*big1)).has_value());
  REQUIRE(b1.stack->reap_pending().has_value());
  CHECK(device_budget(sim, 1)->in_use == start1.in_use + 12 * MiB);
  refused_by_budget(b0.stack->allocate(MiB, StreamId{0}, AllocTag{1}), "ordinal 0");

  REQUIRE(b0.stack->deallocate(std::move(*x)).has_value());
  REQUIRE(d0.stack->deallocate(std::move(*y)).has_value());
  REQUIRE(d1.stack->deallocate(std::move(*big2)).has_value());
  REQUIRE(d1.stack->deallocate(std::move(*fits1)).has_value());
  find_layer<Cached>(*d0.stack)->trim();  // the caching layers give their blocks back
  find_layer<Cached>(*d1.stack)->trim();
  for (auto* s : {&*b0.stack, &*b1.stack}) REQUIRE(s->reap_pending().has_value());
  for (auto* s : {&*d0.stack, &*d1.stack}) REQUIRE(s->reap_pending().has_value());
  CHECK(device_budget(sim, 0)->in_use == start0.in_use);
  CHECK(device_budget(sim, 1)->in_use == start1.in_use);
}

TEST_CASE("the hazard checker across devices", "[two_devices][hazard]") {
  SimDriver sim{SimConfig{.executor = SimExecutor::manual}};
  Rig<Entry<AsyncCuda<SimDriver>>> r0(sim, 0), r1(sim, 1);
  AsyncCuda<SimDriver>& a0 = *r0.stack;
  const auto dev0 = r0.streams->device(), dev1 = r1.streams->device();
  const SimDriver::stream_t s0 = *r0.streams->get(StreamId{0});  // the block's alloc stream
  const SimDriver::stream_t p0 = *r0.streams->get(StreamId{1});  // device 0's proxy for device 1's use
  const SimDriver::stream_t q1 = *r1.streams->get(StreamId{0});  // device 1's stream
  constexpr std::size_t N = 4096;

  auto event_on = [&](const std::shared_ptr<Device<SimDriver>>& dev) {
    REQUIRE(dev->make_current().has_value());
    auto e = sim.event_create();
    REQUIRE(e.has_value());
    return *e;
  };
  const SimDriver::event_t e0 = event_on(dev0), e1 = event_on(dev1);

  // A block of device 0 filled on its alloc stream.
  auto filled = [&] {
    auto b = a0.allocate(N, StreamId{0}, AllocTag{1});
    REQUIRE(b.has_value());
    REQUIRE(sim.memset_d8_async(b->ptr(), 0x5A, N, s0).has_value());
    return std::move(*b);
  };
  // Device 1's kernel reading it; `seen` gets the first byte it read.
  int seen = -1;
  auto read_on_device1 = [&](const DeviceBlock& b) {
    REQUIRE(sim.launch_kernel(q1, {SimAccess{b.ptr(), N, Access::Read}},
                              [&seen](std::span<std::byte* const> p) { seen = static_cast<int>(p[0][0]); },
                              "reader on device 1")
                .has_value());
  };
  // Device 1's stream waits for device 0's stream `s` (and device 0's for device 1's).
  auto q1_waits_for = [&](SimDriver::stream_t s) {
    REQUIRE(sim.event_record(e0, s).has_value());
    REQUIRE(sim.stream_wait_event(q1, e0).has_value());
  };
  auto waits_for_q1 = [&](SimDriver::stream_t s) {
    REQUIRE(sim.event_record(e1, q1).has_value());
    REQUIRE(sim.stream_wait_event(s, e1).has_value());
  };
  auto settle = [&] {
    sim.run_until_idle();
    REQUIRE(a0.reap_pending().has_value());
    CHECK(a0.bytes_outstanding() == 0);
  };

  SECTION("a read on device 1 not ordered after device 0's fill is a race") {
    auto b = filled();
    read_on_device1(b);
    const auto hs = sim.hazards();
    INFO(describe(hs));
    REQUIRE_FALSE(hs.empty());
    bool found = false;
    for (const auto& h : hs) {
      found = found || (h.kind == SimHazardKind::race && h.device == 0 && h.first.device == 0 &&
                        h.first.kind == SimOpKind::memset && h.second.device == 1);
    }
    CHECK(found);
    REQUIRE(sim.stream_synchronize(q1).has_value());  // the host now orders the free after the read
    sim.clear_hazards();
    REQUIRE(a0.deallocate(std::move(b)).has_value());
    CHECK(sim.hazards().empty());
    settle();
  }

  SECTION("a free on device 0 not ordered after device 1's read is a free race") {
    auto b = filled();
    q1_waits_for(s0);
    read_on_device1(b);
    CHECK(sim.hazards().empty());  // the read is ordered after the fill
    REQUIRE(a0.deallocate(std::move(b)).has_value());  // the use was never told to the runtime
    const auto hs = sim.hazards();
    INFO(describe(hs));
    REQUIRE_FALSE(hs.empty());
    bool found = false;
    for (const auto& h : hs) {
      found = found || (h.kind == SimHazardKind::free_race && h.device == 0 && h.first.device == 1 &&
                        h.first.kind == SimOpKind::kernel && h.second.kind == SimOpKind::mem_free_async &&
                        h.second.device == 0);
    }
    CHECK(found);
    settle();
  }

  SECTION("event waits both ways order the read and the free: no hazard") {
    auto b = filled();
    q1_waits_for(s0);
    read_on_device1(b);
    waits_for_q1(s0);
    REQUIRE(a0.deallocate(std::move(b)).has_value());
    INFO(describe(sim.hazards()));
    CHECK(sim.hazards().empty());
    settle();
    CHECK(seen == 0x5A);
  }

  SECTION("tracked on device 0's runtime through a proxy stream of device 0: no hazard") {
    // The runtime names only its own pool's streams, so device 1's use is tracked as a use
    // on a device 0 stream (p0) that device 1's stream waits for and that waits for it.
    auto b = filled();
    REQUIRE(a0.finish_block_use(b.id(), StreamId{0}, Access::Write).has_value());  // the fill
    REQUIRE(a0.prepare_block_use(b.id(), StreamId{1}, Access::Read).has_value());  // p0 waits for it
    q1_waits_for(p0);
    read_on_device1(b);
    waits_for_q1(p0);
    REQUIRE(a0.finish_block_use(b.id(), StreamId{1}, Access::Read).has_value());  // the free waits for p0
    REQUIRE(a0.deallocate(std::move(b)).has_value());
    INFO(describe(sim.hazards()));
    CHECK(sim.hazards().empty());
    settle();
    CHECK(seen == 0x5A);
  }

  SECTION("the same proxy without finish_block_use: the free races device 1's read") {
    // The honest counterpart of the tracked case: drop the finish and the checker objects.
    auto b = filled();
    REQUIRE(a0.finish_block_use(b.id(), StreamId{0}, Access::Write).has_value());
    REQUIRE(a0.prepare_block_use(b.id(), StreamId{1}, Access::Read).has_value());
    q1_waits_for(p0);
    read_on_device1(b);
    waits_for_q1(p0);
    REQUIRE(a0.deallocate(std::move(b)).has_value());
    const auto hs = sim.hazards();
    INFO(describe(hs));
    bool found = false;
    for (const auto& h : hs) found = found || (h.kind == SimHazardKind::free_race && h.first.device == 1);
    CHECK(found);
    settle();
  }

  SECTION("what the simulator and the runtime refuse across devices") {
    // An event records only on a stream of its own device.
    auto r = sim.event_record(e0, q1);
    REQUIRE_FALSE(r);
    CHECK(r.error().message().find("device 0") != std::string::npos);
    // Device 1's stream cannot join device 0's pool, so device 0's runtime cannot name it.
    auto adopted = r0.streams->adopt(q1);
    REQUIRE_FALSE(adopted);
    CHECK(adopted.error().code() == errc::foreign_block);
    auto b = filled();
    auto unknown = a0.prepare_block_use(b.id(), StreamId{static_cast<std::uint32_t>(r0.streams->size())},
                                        Access::Read);
    REQUIRE_FALSE(unknown);
    CHECK(unknown.error().code() == errc::unknown_stream);
    REQUIRE(a0.deallocate(std::move(b)).has_value());
    CHECK(sim.hazards().empty());
    settle();
  }

  REQUIRE(dev0->make_current().has_value());
  REQUIRE(sim.event_destroy(e0).has_value());
  REQUIRE(dev1->make_current().has_value());
  REQUIRE(sim.event_destroy(e1).has_value());
}

TEST_CASE("a stack on ordinal 0 under a stream pool of ordinal 1 is refused by name (issue #28, finding 6)",
          "[two_devices][runtime]") {
  using Rt = DeviceRuntime<AsyncCuda<SimDriver>>;
  // The unchecked constructor is private: create() is the only way to an owned runtime.
  CHECK_FALSE(std::is_constructible_v<Rt, std::shared_ptr<StreamPool<SimDriver>>, AsyncCuda<SimDriver>>);

  SimDriver sim{SimConfig{.devices = 2}};
  auto pool_on = [&](std::uint32_t ordinal) {
    auto p = StreamPool<SimDriver>::open(sim, ordinal, 4);
    REQUIRE(p.has_value());
    return *p;
  };
  auto p0 = pool_on(0);
  auto p1 = pool_on(1);
  auto stack0 = AsyncCuda<SimDriver>::create(p0);
  REQUIRE(stack0.has_value());
  auto rt = Rt::create(p1, std::move(*stack0));
  REQUIRE_FALSE(rt.has_value());
  CHECK(rt.error().code() == errc::foreign_block);
  const std::string what = rt.error().what();
  INFO(what);
  CHECK(what.find("allocates on ordinal 0") != std::string::npos);
  CHECK(what.find("ordinal 1's") != std::string::npos);
}

TEST_CASE("try_get refuses a stack its StackBuilder built on the other ordinal's pool", "[two_devices][runtime]") {
  for (std::uint32_t ordinal : {0u, 1u}) {
    INFO("ordinal " << ordinal);
    auto rt = DeviceRuntime<OffOrdinal>::try_get(ordinal);
    REQUIRE_FALSE(rt.has_value());
    CHECK(rt.error().code() == errc::foreign_block);
    CHECK(rt.error().what().find("allocates on ordinal " + std::to_string(1 - ordinal)) != std::string::npos);
  }
}
