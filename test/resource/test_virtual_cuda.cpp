// SPDX-License-Identifier: Apache-2.0
// VirtualCuda on SimDriver: the conformance suite over it and over stacks on it (the
// default stack with XLOGRT_BACKEND=vmm included), a fault at each of its driver calls,
// the hazard checker over randomized multi-stream schedules (and over a mutant that
// skips the cross-stream rule, to show the checker catches it), stitching, and trim.

#include "conformance.hpp"
#include "stack_registry.hpp"

#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <xlogrt/resource/pool_or_virtual.hpp>
#include <xlogrt/resource/stack_sample.hpp>
#include <xlogrt/resource/virtual_cuda.hpp>
#include <xlogrt/runtime/env_config.hpp>
#include <xlogrt/sim/sim_driver.hpp>

using namespace xlogrt;
using namespace xlogrt::testing;

using V = VirtualCuda<SimDriver>;
static_assert(RecyclingResource<V> && DriverResource<V> && RetiringResource<V>);
static_assert(RecyclingResource<PoolOrVirtual<SimDriver>> && DriverResource<PoolOrVirtual<SimDriver>> &&
              RetiringResource<PoolOrVirtual<SimDriver>>);
static_assert(std::string_view(Entry<Cached<Budget<V>>>::name) == "Cached<Budget<VirtualCuda>>");

namespace {

constexpr std::size_t MIB = std::size_t{1} << 20;
constexpr std::size_t PAGE = 2 * MIB;  // SimConfig's default granularity

/// The stacks the conformance suite runs over VirtualCuda.
using VirtualStacks = std::tuple<Entry<V>, Entry<Cached<V>>, Entry<Budget<V>>, Entry<Statistics<V>>,
                                 Entry<GraphPools<V>>, Entry<Logging<V, RingSink>>,
                                 Entry<Statistics<GraphPools<Logging<Cached<Budget<V>>, RingSink>>>>>;

/// Sets an environment variable for a scope.
struct ScopedEnv {
  /// `value` null: unset while in scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    REQUIRE((value != nullptr ? setenv(name, value, 1) : unsetenv(name)) == 0);
  }
  ~ScopedEnv() { unsetenv(name_); }
  const char* name_;
};

template <class T>
T value(result<T> r) {
  INFO((r ? std::string() : r.error().what()));
  REQUIRE(r.has_value());
  return std::move(r).value();
}
void expect_ok(const result<void>& r) {
  INFO((r ? std::string() : r.error().what()));
  REQUIRE(r.has_value());
}

/// A VirtualCuda on device 0 of `sim`, with 4 streams.
struct VRig {
  explicit VRig(SimDriver& sim, VirtualCudaOptions o = {}) {
    streams = value(StreamPool<SimDriver>::open(sim, 0, 4));
    res = std::make_unique<V>(value(V::create(streams, o)));
  }
  SimDriver::stream_t at(std::uint32_t s) const { return streams->at(StreamId{s}); }
  std::shared_ptr<StreamPool<SimDriver>> streams;
  std::unique_ptr<V> res;
};

std::size_t physical(SimDriver& sim) { return value(sim.memory_stats(0)).physical; }

SimConfig manual_config(std::size_t memory = std::size_t{64} << 20) {
  return SimConfig{.devices = 1, .memory_bytes = memory, .executor = SimExecutor::manual};
}

}  // namespace

TEMPLATE_LIST_TEST_CASE("resource conformance over VirtualCuda on SimDriver", "[vmm][conformance]", VirtualStacks) {
  SimDriver sim{SimConfig{}};
  conformance_suite<TestType>(sim);
}

TEST_CASE("the default stack with XLOGRT_BACKEND=vmm stands on VirtualCuda and conforms", "[vmm][conformance]") {
  ScopedEnv env(ENV_BACKEND, "vmm");
  SimDriver sim{SimConfig{}};
  {
    Rig<Entry<DefaultStackOn<SimDriver>>> rig(sim);
    auto* base = find_layer<Budget>(*rig.stack);
    REQUIRE(base->upstream().is_virtual());
    auto b = value(rig.stack->allocate(3 * MIB, StreamId{1}, AllocTag{7}));
    CHECK(b.ptr() >= base->upstream().virtual_base()->base());
    CHECK(base->upstream().virtual_base()->stats().mapped_bytes >= 3 * MIB);
    // The sizes the cache keeps get a region of their own.
    CHECK(base->upstream().virtual_base()->stats().small_region_bytes != 0);
    auto s = value(rig.stack->allocate(MIB, StreamId{1}, AllocTag{7}));
    const VirtualStats st = base->upstream().virtual_base()->stats();
    CHECK(s.ptr() - base->upstream().virtual_base()->base() >= st.reserved_bytes - st.small_region_bytes);
    expect_ok(rig.stack->deallocate(std::move(s)));
    expect_ok(rig.stack->deallocate(std::move(b)));
  }
  {
    // With the cache off, one region.
    ScopedEnv off(ENV_CACHE, "0");
    Rig<Entry<DefaultStackOn<SimDriver>>> rig(sim);
    CHECK(find_layer<Budget>(*rig.stack)->upstream().virtual_base()->stats().small_region_bytes == 0);
  }
  conformance_suite<Entry<DefaultStackOn<SimDriver>>>(sim);
}

TEST_CASE("a sample of the default stack over VirtualCuda reads the virtual base, not the idle pool",
          "[vmm][logging]") {
  ScopedEnv env(ENV_BACKEND, "vmm");
  SimDriver sim{SimConfig{}};
  Rig<Entry<DefaultStackOn<SimDriver>>> rig(sim);
  auto b = value(rig.stack->allocate(3 * MIB, StreamId{1}, AllocTag{7}));
  const auto* v = find_layer<Budget>(*rig.stack)->upstream().virtual_base();
  REQUIRE(v != nullptr);
  const StackSample s = sample_stack(*rig.stack);
  REQUIRE(s.held.has_value());
  CHECK(*s.held == v->bytes_outstanding());
  CHECK(*s.held >= 3 * MIB);  // through upstream() it would be the idle pool's 0
  REQUIRE(s.pool_reserved.has_value());
  CHECK(*s.pool_reserved == v->stats().physical_bytes);
  CHECK(*s.pool_reserved >= 3 * MIB);
  CHECK_FALSE(s.queued.has_value());
  expect_ok(rig.stack->deallocate(std::move(b)));
}

TEST_CASE("XLOGRT_BACKEND: auto, pool, vmm (any case) or unset; anything else is a named error", "[vmm][env]") {
  CHECK(value(parse_env_config(nullptr, nullptr, nullptr, nullptr)).backend == Backend::automatic);
  CHECK(value(parse_env_config(nullptr, nullptr, nullptr, "")).backend == Backend::automatic);
  CHECK(value(parse_env_config(nullptr, nullptr, nullptr, "Auto")).backend == Backend::automatic);
  CHECK(value(parse_env_config(nullptr, nullptr, nullptr, "pool")).backend == Backend::pool);
  CHECK(value(parse_env_config(nullptr, nullptr, nullptr, "VMM")).backend == Backend::vmm);
  auto bad = parse_env_config(nullptr, nullptr, nullptr, "virtual");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);
  CHECK(bad.error().message().find("XLOGRT_BACKEND='virtual'") != std::string::npos);
  // Unset, the default stack is on the virtual base where the driver has virtual memory...
  SimDriver sim{SimConfig{}};
  Rig<Entry<DefaultStackOn<SimDriver>>> rig(sim);
  CHECK(find_layer<Budget>(*rig.stack)->upstream().is_virtual());
  {
    ScopedEnv pool(ENV_BACKEND, "pool");
    auto p = StackBuilder<DefaultStackOn<SimDriver>>::build(rig.streams);
    REQUIRE(p);
    CHECK_FALSE(find_layer<Budget>(*p)->upstream().is_virtual());
  }
  ScopedEnv wrong(ENV_BACKEND, "virtual");
  auto refused = StackBuilder<DefaultStackOn<SimDriver>>::build(rig.streams);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::invalid_argument);
}

TEST_CASE("XLOGRT_BACKEND: without virtual memory, auto takes the pool and vmm is a named error", "[vmm][env]") {
  SimConfig no_vmm;
  no_vmm.virtual_memory_supported = false;
  SimDriver sim{no_vmm};
  for (const char* unset_or_auto : {static_cast<const char*>(nullptr), "auto"}) {
    ScopedEnv env(ENV_BACKEND, unset_or_auto);
    Rig<Entry<DefaultStackOn<SimDriver>>> rig(sim);
    CHECK_FALSE(find_layer<Budget>(*rig.stack)->upstream().is_virtual());
    auto b = value(rig.stack->allocate(4096, StreamId{1}, AllocTag{}));
    expect_ok(rig.stack->deallocate(std::move(b)));
  }
  auto pool = StreamPool<SimDriver>::open(sim, 0, 4);
  REQUIRE(pool);
  ScopedEnv vmm(ENV_BACKEND, "vmm");
  auto refused = StackBuilder<DefaultStackOn<SimDriver>>::build(*pool);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().driver_status() == status::not_supported);
}

TEST_CASE("VirtualCuda: small blocks share a page; a freed range is reusable on its stream at once, on another "
          "only once its free is known complete",
          "[vmm]") {
  SimDriver sim{manual_config()};
  VRig r(sim);
  V& v = *r.res;
  auto a = value(v.allocate(1000, StreamId{1}, AllocTag{}));
  auto b = value(v.allocate(3000, StreamId{2}, AllocTag{}));
  CHECK(b.ptr() == a.ptr() + 1024);  // the alignment, 512: best fit right after a
  CHECK(v.stats().mapped_bytes == PAGE);
  CHECK(physical(sim) == PAGE);
  const std::uint64_t at = a.ptr();
  expect_ok(sim.memset_d8_async(a.ptr(), 1, 1000, r.at(1)));  // not run yet (manual executor)
  expect_ok(v.deallocate(std::move(a)));
  CHECK(v.bytes_outstanding() == 1000 + 3000);
  // Stream 2 cannot have it while stream 1 may still be writing...
  auto c = value(v.allocate(1000, StreamId{2}, AllocTag{}));
  CHECK(c.ptr() != at);
  // ... stream 1 can, at once.
  auto d = value(v.allocate(1000, StreamId{1}, AllocTag{}));
  CHECK(d.ptr() == at);
  expect_ok(v.deallocate(std::move(d)));
  // Once stream 1 has run past the free, the range is free for all.
  sim.run_until_idle();
  CHECK(value(v.poll_pending()) == 1000 + 1000);
  CHECK(v.bytes_outstanding() == 3000 + 1000);
  auto e = value(v.allocate(1000, StreamId{3}, AllocTag{}));
  CHECK(e.ptr() == at);
  for (DeviceBlock* x : {&b, &c, &e}) expect_ok(v.deallocate(std::move(*x)));
  expect_ok(v.reap_pending());
  CHECK(v.bytes_outstanding() == 0);
  CHECK(sim.hazards().empty());
}

TEST_CASE("VirtualCuda stitches: a large block over idle pages taken from holes, no new memory", "[vmm]") {
  for (const bool remap_idle : {true, false}) {
    INFO("remap_idle " << remap_idle);
    // 8 pages of device memory; the address range is larger.
    SimDriver sim{manual_config(8 * PAGE)};
    VRig r(sim, VirtualCudaOptions{.reserve_bytes = 64 * PAGE, .remap_idle = remap_idle});
    V& v = *r.res;
    std::vector<DeviceBlock> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(value(v.allocate(PAGE, StreamId{1}, AllocTag{})));
    CHECK(physical(sim) == 8 * PAGE);
    // Holes at pages 0, 2, 4 and 6 (a hole at page 7 would merge with the free range past
    // the mapped pages, and the block would start there, on that idle page in place).
    for (int i = 0; i < 8; i += 2) expect_ok(v.deallocate(std::move(blocks[static_cast<std::size_t>(i)])));
    expect_ok(v.reap_pending());
    // No hole holds 4 pages, and the device has no room for one more: the block is made
    // of the 4 idle pages, unmapped from the holes and mapped side by side.
    auto big = value(v.allocate(4 * PAGE, StreamId{2}, AllocTag{}));
    CHECK(physical(sim) == 8 * PAGE);
    const VirtualStats st = v.stats();
    CHECK(st.pages_created == 8);
    CHECK(st.pages_unmapped == 4);
    CHECK(st.mapped_bytes == 8 * PAGE);
    CHECK(big.ptr() - v.base() == 8 * PAGE);
    // One contiguous range: a fill across the page boundaries reads back whole.
    expect_ok(sim.memset_d8_async(big.ptr(), 0x5A, 4 * PAGE, r.at(2)));
    std::vector<std::uint8_t> back(4 * PAGE);
    expect_ok(sim.memcpy_dtoh_async(back.data(), big.ptr(), back.size(), r.at(2)));
    expect_ok(sim.stream_synchronize(r.at(2)));
    CHECK(std::all_of(back.begin(), back.end(), [](std::uint8_t x) { return x == 0x5A; }));
    // The other blocks kept their bytes.
    expect_ok(v.deallocate(std::move(big)));
    for (auto& b : blocks) {
      if (!b.empty()) expect_ok(v.deallocate(std::move(b)));
    }
    expect_ok(v.reap_pending());
    CHECK(sim.hazards().empty());
  }
}

TEST_CASE("VirtualCuda: before mapping pages, a free the device finished on another stream gives its mapped range",
          "[vmm]") {
  SimDriver sim{manual_config(std::size_t{64} << 20)};
  VRig r(sim, VirtualCudaOptions{.reserve_bytes = 64 * PAGE});
  V& v = *r.res;
  auto a = value(v.allocate(2 * PAGE, StreamId{1}, AllocTag{}));
  expect_ok(sim.memset_d8_async(a.ptr(), 0x11, 2 * PAGE, r.at(1)));
  expect_ok(v.deallocate(std::move(a)));  // pending on stream 1: the fill may still run
  // The device has not reached the free: stream 2 cannot have its pages.
  auto b = value(v.allocate(PAGE, StreamId{2}, AllocTag{}));
  CHECK(v.stats().pages_created == 3);
  expect_ok(sim.stream_synchronize(r.at(1)));  // now it has
  // No reap since: the best fit on stream 2 lies past the mapped pages. Before mapping
  // new ones, the finished free is retired and its range, mapped, taken instead.
  auto c = value(v.allocate(2 * PAGE, StreamId{2}, AllocTag{}));
  const VirtualStats st = v.stats();
  CHECK(c.ptr() == v.base());
  CHECK(st.pages_created == 3);
  CHECK(st.pages_unmapped == 0);
  CHECK(physical(sim) == 3 * PAGE);
  expect_ok(sim.memset_d8_async(c.ptr(), 0x22, 2 * PAGE, r.at(2)));
  expect_ok(v.deallocate(std::move(b)));
  expect_ok(v.deallocate(std::move(c)));
  expect_ok(v.reap_pending());
  CHECK(sim.hazards().empty());
}

TEST_CASE("VirtualCuda: a pending range the poll's mark covers retires when the mark is reached, however the stream "
          "goes on freeing next to it",
          "[vmm]") {
  SimDriver sim{manual_config(std::size_t{256} << 20)};
  VRig r(sim);
  V& v = *r.res;
  // An adopted stream (torch's, through the bridge): only a free on it polls it.
  auto handle = value(sim.stream_create());
  const StreamId s = value(r.streams->adopt(handle));
  constexpr std::size_t X = V::Cadence::EVERY_BYTES;  // its free polls
  auto x = value(v.allocate(X, s, AllocTag{}));
  auto y = value(v.allocate(4 * MIB, s, AllocTag{}));
  const std::uint64_t x_at = x.ptr();
  REQUIRE(y.ptr() == x_at + X);  // next to each other
  expect_ok(sim.memset_d8_async(x.ptr(), 1, X, handle));
  expect_ok(v.deallocate(std::move(x)));  // polls: the stream is busy, so a mark is recorded
  expect_ok(sim.memset_d8_async(y.ptr(), 2, 4 * MIB, handle));
  expect_ok(v.deallocate(std::move(y)));  // after the mark, next to x's range
  sim.run_until_idle();
  // The mark is reached: x's range is free on every stream; y's waits for a later mark
  // (merged with y's, it waited with it).
  CHECK(value(v.poll_pending()) == X);
  CHECK(v.stats().pending_bytes == 4 * MIB);
  auto z = value(v.allocate(X, StreamId{2}, AllocTag{}));
  CHECK(z.ptr() == x_at);
  expect_ok(v.deallocate(std::move(z)));
  expect_ok(v.reap_pending());
  CHECK(v.bytes_outstanding() == 0);
  CHECK(sim.hazards().empty());
  expect_ok(sim.stream_destroy(handle));
}

TEST_CASE("VirtualCuda: trim unmaps and releases idle pages, and the device's free memory rises", "[vmm]") {
  SimDriver sim{manual_config(std::size_t{256} << 20)};
  VRig r(sim);
  V& v = *r.res;
  expect_ok(r.streams->device()->make_current());
  const std::size_t free0 = value(sim.mem_get_info()).free;
  auto keep = value(v.allocate(100, StreamId{0}, AllocTag{}));
  auto big = value(v.allocate(64 * MIB, StreamId{1}, AllocTag{}));
  expect_ok(sim.memset_d8_async(big.ptr(), 3, 64 * MIB, r.at(1)));
  const std::size_t free1 = value(sim.mem_get_info()).free;
  CHECK(free0 - free1 == 66 * MIB);  // 33 pages: the small block's and the big one's
  expect_ok(v.deallocate(std::move(big)));
  CHECK(value(v.trim()) == 64 * MIB);  // reaped first: the page `keep` touches stays
  CHECK(free0 - value(sim.mem_get_info()).free == PAGE);
  CHECK(v.stats().physical_bytes == PAGE);
  expect_ok(v.deallocate(std::move(keep)));
  CHECK(value(v.trim()) == PAGE);
  CHECK(value(sim.mem_get_info()).free == free0);
  CHECK(sim.hazards().empty());
}

TEST_CASE("VirtualCuda: release_threshold gives back idle memory at each reap", "[vmm]") {
  SimDriver sim{manual_config()};
  VRig r(sim, VirtualCudaOptions{.release_threshold = 4 * MIB});
  V& v = *r.res;
  auto b = value(v.allocate(20 * MIB, StreamId{1}, AllocTag{}));
  CHECK(physical(sim) == 20 * MIB);
  expect_ok(v.deallocate(std::move(b)));
  CHECK(physical(sim) == 20 * MIB);  // pending: not known complete yet
  expect_ok(v.reap_pending());
  CHECK(physical(sim) == 4 * MIB);
}

TEST_CASE("VirtualCuda refuses to allocate on a capturing stream, with a named error", "[vmm]") {
  SimDriver sim{manual_config()};
  VRig r(sim);
  expect_ok(sim.stream_begin_capture(r.at(1), CaptureMode::global));
  auto b = r.res->allocate(4096, StreamId{1}, AllocTag{});
  REQUIRE_FALSE(b);
  CHECK(b.error().code() == errc::stream_misuse);
  CHECK(b.error().message().find("GraphPools") != std::string::npos);
  auto g = value(sim.stream_end_capture(r.at(1)));
  expect_ok(sim.graph_destroy(g));
  CHECK(r.res->bytes_outstanding() == 0);
}

// ---- faults ----------------------------------------------------------------------------

TEST_CASE("VirtualCuda: a fault at each driver call of allocate is named, and changes no accounting", "[vmm][faults]") {
  struct Case {
    const char* call;
    int n;  // which call of the allocation fails
  };
  for (const Case c : {Case{"cuMemCreate", 1}, Case{"cuMemCreate", 2}, Case{"cuMemMap", 1}, Case{"cuMemMap", 3},
                       Case{"cuMemSetAccess", 1}}) {
    for (const int status : {status::unknown, status::out_of_memory}) {
      INFO(c.call << " #" << c.n << ", status " << status);
      SimDriver sim{manual_config()};
      VRig r(sim, VirtualCudaOptions{.remap_idle = false});
      V& v = *r.res;
      auto first = value(v.allocate(1000, StreamId{1}, AllocTag{}));  // the first page, mapped
      const std::size_t held = physical(sim);
      const VirtualStats before = v.stats();
      REQUIRE(sim.fail_nth(c.call, c.n, status).has_value());
      // Three new pages past the first one.
      auto b = v.allocate(7 * MIB, StreamId{2}, AllocTag{});
      sim.clear_failures();
      const bool retried = std::string_view(c.call) == "cuMemCreate" && status == status::out_of_memory;
      if (retried) {
        // Out of memory at cuMemCreate: the resource looks for idle pages, finds none, and
        // creates again, which the device now grants.
        REQUIRE(b.has_value());
        expect_ok(v.deallocate(std::move(*b)));
      } else {
        REQUIRE_FALSE(b);
        CHECK(b.error().message().find(c.call) != std::string::npos);
        CHECK(b.error().driver_status() == status);
        CHECK(physical(sim) == held);
        CHECK(v.stats().mapped_bytes == before.mapped_bytes);
        CHECK(v.stats().used_bytes == before.used_bytes);
        CHECK(v.bytes_outstanding() == 1000);
        // The next one succeeds, and everything goes back.
        auto again = value(v.allocate(7 * MIB, StreamId{2}, AllocTag{}));
        expect_ok(v.deallocate(std::move(again)));
      }
      expect_ok(v.deallocate(std::move(first)));
      (void)value(v.trim());
      CHECK(v.bytes_outstanding() == 0);
      CHECK(physical(sim) == 0);
    }
  }
}

TEST_CASE("VirtualCuda: under pressure, idle pages are taken before refusing; a refusal is named and exact",
          "[vmm][faults]") {
  SimDriver sim{manual_config(4 * PAGE)};
  VRig r(sim, VirtualCudaOptions{.reserve_bytes = 32 * PAGE, .remap_idle = false});
  V& v = *r.res;
  auto a1 = value(v.allocate(PAGE, StreamId{1}, AllocTag{}));
  auto b = value(v.allocate(PAGE, StreamId{1}, AllocTag{}));
  auto a2 = value(v.allocate(PAGE, StreamId{1}, AllocTag{}));
  auto x = value(v.allocate(PAGE, StreamId{1}, AllocTag{}));
  // Pending on stream 1: not idle until known complete.
  expect_ok(v.deallocate(std::move(a1)));
  expect_ok(v.deallocate(std::move(a2)));
  // The device is full. The allocation's poll retires the two frees (stream 1 is idle),
  // whose ranges are a page each; cuMemCreate fails, and the two idle pages are taken.
  auto c = value(v.allocate(2 * PAGE, StreamId{2}, AllocTag{}));
  CHECK(physical(sim) == 4 * PAGE);
  CHECK(v.stats().pages_created == 4);
  CHECK(v.stats().pages_unmapped == 2);
  // Nothing idle is left: refused, named, and nothing changed.
  const VirtualStats before = v.stats();
  auto d = v.allocate(PAGE, StreamId{2}, AllocTag{});
  REQUIRE_FALSE(d);
  CHECK(d.error().code() == errc::out_of_memory);
  CHECK(d.error().message().find("VirtualCuda") != std::string::npos);
  CHECK(d.error().message().find("cuMemCreate") != std::string::npos);
  CHECK(v.bytes_outstanding() == 4 * PAGE);
  CHECK(physical(sim) == 4 * PAGE);
  CHECK(v.stats().used_bytes == before.used_bytes);
  for (DeviceBlock* k : {&b, &x, &c}) expect_ok(v.deallocate(std::move(*k)));
  value(v.trim());
  CHECK(physical(sim) == 0);
  CHECK(sim.hazards().empty());
}

TEST_CASE("VirtualCuda keeps small blocks on pages of their own: freeing the large ones gives their pages back",
          "[vmm]") {
  // Small blocks (a cache above keeps them live) allocated between large ones. With one
  // region they sit on the large blocks' pages and keep those mapped; with the small
  // region they pack onto two pages at its start.
  auto held_after_large_frees = [](std::size_t small_block_bytes) {
    SimDriver sim{manual_config(128 * PAGE)};
    VRig r(sim, VirtualCudaOptions{.reserve_bytes = 128 * PAGE, .small_block_bytes = small_block_bytes});
    V& v = *r.res;
    std::vector<DeviceBlock> large, small;
    for (int i = 0; i < 16; ++i) {
      large.push_back(value(v.allocate(3 * MIB, StreamId{1}, AllocTag{})));
      small.push_back(value(v.allocate(256 * 1024, StreamId{1}, AllocTag{})));
    }
    const VirtualStats st = v.stats();
    for (const DeviceBlock& b : small) {
      const bool in_small_region = b.ptr() - v.base() >= st.reserved_bytes - st.small_region_bytes;
      CHECK(in_small_region == (small_block_bytes != 0));
    }
    for (DeviceBlock& b : large) expect_ok(v.deallocate(std::move(b)));
    (void)value(v.trim());
    const std::size_t now = physical(sim);
    for (DeviceBlock& b : small) expect_ok(v.deallocate(std::move(b)));
    (void)value(v.trim());
    CHECK(physical(sim) == 0);
    CHECK(sim.hazards().empty());
    return now;
  };
  CHECK(held_after_large_frees(MIB) == 2 * PAGE);  // 16 x 256 KiB: two pages
  CHECK(held_after_large_frees(0) >= 16 * PAGE);   // one page or more per small block
}

TEST_CASE("VirtualCuda: a region with no room takes the other's; the small region is the range's last eighth",
          "[vmm]") {
  SimDriver sim{manual_config(64 * PAGE)};
  VRig r(sim, VirtualCudaOptions{.reserve_bytes = 16 * PAGE});
  V& v = *r.res;
  const VirtualStats st = v.stats();
  REQUIRE(st.small_region_bytes == 2 * PAGE);
  const std::uint64_t boundary = st.reserved_bytes - st.small_region_bytes;
  // The large region, all of it: one block of 14 pages, at the range's start.
  auto whole = value(v.allocate(14 * PAGE, StreamId{1}, AllocTag{}));
  CHECK(whole.ptr() == v.base());
  // A large block with no room in its region takes the small one's.
  auto large = value(v.allocate(PAGE, StreamId{1}, AllocTag{}));
  CHECK(large.ptr() - v.base() == boundary);
  auto small = value(v.allocate(MIB, StreamId{1}, AllocTag{}));
  CHECK(small.ptr() - v.base() >= boundary);
  // No range crosses the boundary: freeing the large region's block leaves it whole, and
  // a small block with no room in its region takes from it.
  expect_ok(v.deallocate(std::move(whole)));
  expect_ok(v.reap_pending());
  auto small2 = value(v.allocate(MIB, StreamId{1}, AllocTag{}));
  CHECK(small2.ptr() - v.base() >= boundary);  // the small region's last MiB
  auto small3 = value(v.allocate(MIB, StreamId{1}, AllocTag{}));
  CHECK(small3.ptr() == v.base());  // the small region is full
  for (DeviceBlock* x : {&large, &small, &small2, &small3}) expect_ok(v.deallocate(std::move(*x)));
  (void)value(v.trim());
  CHECK(physical(sim) == 0);
  // The whole range is free, but no region holds 15 pages: refused, named.
  auto big = v.allocate(15 * PAGE, StreamId{1}, AllocTag{});
  REQUIRE_FALSE(big);
  CHECK(big.error().code() == errc::out_of_memory);
  CHECK(v.stats().used_bytes == 0);
  // small_block_bytes 0: one region, a block may take the whole range.
  VRig one(sim, VirtualCudaOptions{.reserve_bytes = 16 * PAGE, .small_block_bytes = 0});
  CHECK(one.res->stats().small_region_bytes == 0);
  auto all = value(one.res->allocate(16 * PAGE, StreamId{1}, AllocTag{}));
  expect_ok(one.res->deallocate(std::move(all)));
  (void)value(one.res->trim());
  CHECK(sim.hazards().empty());
}

TEST_CASE("VirtualCuda: a fault unmapping or releasing in trim is named; a later trim gives everything back",
          "[vmm][faults]") {
  for (const auto& [call, n] : {std::pair{"cuMemUnmap", 2}, std::pair{"cuMemRelease", 2},
                                std::pair{"cuStreamSynchronize", 1}}) {
    INFO(call);
    SimDriver sim{manual_config()};
    VRig r(sim);
    V& v = *r.res;
    auto b = value(v.allocate(6 * MIB, StreamId{1}, AllocTag{}));
    expect_ok(v.deallocate(std::move(b)));
    REQUIRE(sim.fail_nth(call, n, status::unknown).has_value());
    auto t = v.trim();
    sim.clear_failures();
    REQUIRE_FALSE(t);
    CHECK(t.error().message().find(call) != std::string::npos);
    CHECK(physical(sim) > 0);
    value(v.trim());
    CHECK(physical(sim) == 0);
    CHECK(v.bytes_outstanding() == 0);
  }
}

TEST_CASE("VirtualCuda: faults in create, the free's wait and the poll are named and lose nothing", "[vmm][faults]") {
  SimDriver sim{manual_config()};
  auto streams = value(StreamPool<SimDriver>::open(sim, 0, 4));
  for (const char* call : {"cuMemGetAllocationGranularity", "cuMemAddressReserve"}) {
    REQUIRE(sim.fail_nth(call, 1, status::unknown).has_value());
    auto v = V::create(streams);
    sim.clear_failures();
    REQUIRE_FALSE(v);
    CHECK(v.error().message().find(call) != std::string::npos);
  }
  auto bad = V::create(streams, VirtualCudaOptions{.alignment = 100});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code() == errc::invalid_argument);

  V v = value(V::create(streams));
  auto b = value(v.allocate(4096, StreamId{1}, AllocTag{}));
  expect_ok(v.record_block_use(b, StreamId{2}));
  REQUIRE(sim.fail_nth("cuStreamWaitEvent", 1, status::unknown).has_value());
  auto e = v.deallocate(std::move(b));
  sim.clear_failures();
  REQUIRE_FALSE(e);
  CHECK(e.error().message().find("cuStreamWaitEvent") != std::string::npos);
  CHECK_FALSE(b.empty());
  CHECK(v.bytes_outstanding() == 4096);
  expect_ok(v.deallocate(std::move(b)));
  for (const char* call : {"cuStreamQuery", "cuEventRecord"}) {
    auto x = value(v.allocate(4096, StreamId{1}, AllocTag{}));
    expect_ok(sim.memset_d8_async(x.ptr(), 0, 4096, streams->at(StreamId{1})));
    expect_ok(v.deallocate(std::move(x)));
    REQUIRE(sim.fail_nth(call, 1, status::unknown).has_value());
    auto p = v.poll_pending();
    sim.clear_failures();
    REQUIRE_FALSE(p);
    CHECK(p.error().message().find(call) != std::string::npos);
    CHECK(v.bytes_outstanding() > 0);
  }
  expect_ok(v.reap_pending());
  CHECK(v.bytes_outstanding() == 0);
}

// ---- the hazard checker ------------------------------------------------------------------

namespace {

/// A randomized schedule over 4 streams: blocks of 256 B to 5 MiB allocated on a stream,
/// written there, read or written on other streams through prepare/finish, freed, with
/// polls, reaps and trims between. Every block's bytes are checked at its free. Returns
/// the hazards the checker found.
std::vector<SimHazard> random_schedule(std::uint64_t seed, VirtualCudaOptions o, bool manual) {
  SimConfig cfg = manual ? manual_config(std::size_t{48} << 20)
                         : SimConfig{.devices = 1, .memory_bytes = std::size_t{48} << 20};
  cfg.seed = seed;
  SimDriver sim{cfg};
  VRig r(sim, o);
  V& v = *r.res;
  std::mt19937_64 rng(seed);
  struct Held {
    DeviceBlock b;
    std::uint8_t fill;
  };
  std::vector<Held> held;
  std::size_t errors = 0;
  for (int step = 0; step < 400; ++step) {
    const unsigned op = rng() % 10;
    if (op < 4 || held.empty()) {
      const std::size_t n = (rng() % 4 == 0) ? (rng() % (5 * MIB)) + 1 : (rng() % 8192) + 256;
      const StreamId s{static_cast<std::uint32_t>(rng() % 4)};
      auto b = v.allocate(n, s, AllocTag{});
      if (!b) {
        ++errors;  // the device may be full: a named refusal
        CHECK(b.error().code() == errc::out_of_memory);
        continue;
      }
      const auto fill = static_cast<std::uint8_t>(rng());
      expect_ok(sim.memset_d8_async(b->ptr(), fill, n, r.at(s.value)));
      held.push_back(Held{std::move(*b), fill});
    } else if (op < 6) {
      Held& h = held[rng() % held.size()];
      const StreamId u{static_cast<std::uint32_t>(rng() % 4)};
      const bool write = rng() % 2 == 0;
      const Access a = write ? Access::Write : Access::Read;
      expect_ok(v.prepare_block_use(h.b.id(), u, a));
      if (write) {
        expect_ok(sim.memset_d8_async(h.b.ptr(), h.fill, h.b.bytes(), r.at(u.value)));
      } else {
        std::vector<std::uint8_t> scratch(64);
        expect_ok(sim.memcpy_dtoh_async(scratch.data(), h.b.ptr(), 64, r.at(u.value)));
        expect_ok(sim.stream_synchronize(r.at(u.value)));
      }
      expect_ok(v.finish_block_use(h.b.id(), u, a));
    } else if (op < 9) {
      const std::size_t i = rng() % held.size();
      expect_ok(v.deallocate(std::move(held[i].b)));
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      switch (rng() % 4) {
        case 0: expect_ok(v.reap_pending()); break;
        case 1: (void)value(v.trim()); break;
        default: (void)value(v.poll_pending()); break;
      }
    }
    if (manual && rng() % 3 == 0) {
      for (int k = 0; k < 3; ++k) sim.step();
    }
  }
  for (Held& h : held) {
    expect_ok(v.prepare_block_use(h.b.id(), h.b.alloc_stream(), Access::Read));
    std::vector<std::uint8_t> back(std::min<std::size_t>(h.b.bytes(), 4096));
    expect_ok(sim.memcpy_dtoh_async(back.data(), h.b.ptr(), back.size(), r.at(h.b.alloc_stream().value)));
    expect_ok(sim.stream_synchronize(r.at(h.b.alloc_stream().value)));
    CHECK(std::all_of(back.begin(), back.end(), [&](std::uint8_t x) { return x == h.fill; }));
    expect_ok(v.deallocate(std::move(h.b)));
  }
  (void)value(v.trim());
  CHECK(v.bytes_outstanding() == 0);
  CHECK(physical(sim) == 0);
  CHECK(errors < 100);
  return sim.hazards();
}

}  // namespace

TEST_CASE("VirtualCuda under randomized multi-stream schedules: the hazard checker finds nothing",
          "[vmm][hazards]") {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    for (const bool manual : {true, false}) {
      INFO("seed " << seed << (manual ? ", manual executor" : ", threaded executor"));
      const VirtualCudaOptions o{.release_threshold = seed % 3 == 0 ? 0 : ~0ull, .remap_idle = seed % 2 == 0};
      auto found = random_schedule(seed, o, manual);
      CHECK(found.empty());
    }
  }
}

TEST_CASE("the hazard checker catches cross-stream reuse without the wait (a mutant that skips it)",
          "[vmm][hazards]") {
  SimDriver sim{manual_config()};
  VRig r(sim, VirtualCudaOptions{.unsafe_cross_stream_reuse_for_testing = true});
  V& v = *r.res;
  auto a = value(v.allocate(4096, StreamId{1}, AllocTag{}));
  expect_ok(sim.memset_d8_async(a.ptr(), 1, 4096, r.at(1)));  // queued, not run
  const std::uint64_t at = a.ptr();
  expect_ok(v.deallocate(std::move(a)));
  auto b = value(v.allocate(4096, StreamId{2}, AllocTag{}));
  REQUIRE(b.ptr() == at);  // the mutant hands the range to stream 2 at once
  expect_ok(sim.memset_d8_async(b.ptr(), 2, 4096, r.at(2)));
  CHECK_FALSE(sim.hazards().empty());
  expect_ok(v.deallocate(std::move(b)));
  sim.clear_hazards();
  // And a page unmapped while work on it may still run. trim reaps first (which orders
  // the unmap after the work), so unmap through the threshold path of a poll: nothing is
  // pending, and the mutant's range is free already.
  VRig r2(sim, VirtualCudaOptions{.release_threshold = 0, .unsafe_cross_stream_reuse_for_testing = true});
  auto d = value(r2.res->allocate(4096, StreamId{1}, AllocTag{}));
  expect_ok(sim.memset_d8_async(d.ptr(), 1, 4096, r2.at(1)));
  expect_ok(r2.res->deallocate(std::move(d)));
  (void)r2.res->poll_pending();
  CHECK_FALSE(sim.hazards().empty());
  sim.run_until_idle();
}
