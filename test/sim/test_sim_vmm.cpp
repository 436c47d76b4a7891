// SPDX-License-Identifier: Apache-2.0
// SimDriver's virtual memory calls (VirtualMemoryDriver): the granularity, reservations,
// physical memory counted against the device, the CUDA rules of mapping, unmapping,
// access and release, stitched and aliased mappings through every memory path (copies,
// fills, kernels, host_view), the hazard checker's view of access and unmap, and fault
// injection at each call. Manual mode unless a case says otherwise.

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"
#include "xlogrt/driver/status.hpp"

using namespace xlogrt;
using simtest::expect_ok;
using simtest::manual;
using simtest::value;

namespace {

constexpr std::uint64_t G = std::uint64_t{2} << 20;  // the default granularity
constexpr std::size_t DEVICE = std::size_t{64} << 20;

SimConfig vmm_config(int devices = 1) {
  SimConfig c = manual(1, DEVICE);
  c.devices = devices;
  return c;
}

/// A simulator with device 0 current, and the steps of the virtual memory calls.
struct Vm : simtest::Sim {
  explicit Vm(SimConfig c = vmm_config()) : Sim(c) {}

  std::uint64_t reserve(std::uint64_t bytes, std::uint64_t align = 0) {
    return value(d.mem_address_reserve(bytes, align));
  }
  SimDriver::phys_t create(std::uint64_t bytes, int dev = 0) { return value(d.mem_create(bytes, dev)); }
  void map(std::uint64_t va, std::uint64_t bytes, SimDriver::phys_t h) {
    expect_ok(d.mem_map(va, bytes, h));
  }
  void access(std::uint64_t va, std::uint64_t bytes, int dev = 0) {
    expect_ok(d.mem_set_access(va, bytes, dev));
  }
  std::size_t free_bytes() { return value(d.mem_get_info()).free; }
  std::size_t physical() { return value(d.memory_stats(0)).physical; }
};

/// `r` failed with CUDA_ERROR_INVALID_VALUE, its message naming `call` and containing `says`.
template <class T>
void invalid(const result<T>& r, const std::string& call, const std::string& says) {
  REQUIRE_FALSE(r);
  INFO(r.error().what());
  CHECK(r.error().code() == errc::driver_error);
  CHECK(r.error().driver_status() == status::invalid_value);
  CHECK(r.error().message().rfind(call, 0) == 0);
  CHECK(r.error().message().find(says) != std::string::npos);
}

/// Success or the error of `r`, without its value.
template <class T>
result<void> outcome(result<T> r) {
  if (r) return ok();
  return std::move(r).error();
}

std::size_t count(const std::vector<SimHazard>& hs, SimHazardKind k) {
  std::size_t n = 0;
  for (const auto& h : hs) n += h.kind == k;
  return n;
}

}  // namespace

TEST_CASE("virtual memory: the concept's static facts", "[sim][vmm]") {
  STATIC_REQUIRE(VirtualMemoryDriver<SimDriver>);
  STATIC_REQUIRE(std::is_trivially_copyable_v<SimDriver::phys_t>);
  CHECK(static_cast<std::uint64_t>(SimDriver::phys_t{}) == 0);
}

TEST_CASE("virtual memory: the granularity is configured, checked, and can be switched off",
          "[sim][vmm]") {
  Vm vm;
  const AllocationGranularity g = value(vm.d.mem_granularity(0));
  CHECK(g.minimum == G);
  CHECK(g.recommended == G);
  auto bad = vm.d.mem_granularity(5);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().driver_status() == status::invalid_device);

  SimConfig c = vmm_config();
  c.vmm_granularity = std::size_t{64} << 10;
  c.vmm_recommended_granularity = std::size_t{1} << 20;
  Vm small(c);
  const AllocationGranularity sg = value(small.d.mem_granularity(0));
  CHECK(sg.minimum == (std::size_t{64} << 10));
  CHECK(sg.recommended == (std::size_t{1} << 20));
  CHECK(small.reserve(std::uint64_t{64} << 10) % (std::uint64_t{64} << 10) == 0);
  auto page = small.create(std::uint64_t{64} << 10);
  expect_ok(small.d.mem_release(page));

  // A configuration the simulator cannot honour fails every call with the reason.
  for (auto [granularity, recommended, says] :
       {std::tuple{std::size_t{3000}, std::size_t{3000}, "vmm_granularity"},
        std::tuple{std::size_t{2} << 20, std::size_t{3} << 20, "vmm_recommended_granularity"}}) {
    SimConfig wrong = vmm_config();
    wrong.vmm_granularity = granularity;
    wrong.vmm_recommended_granularity = recommended;
    SimDriver d(wrong);
    auto r = d.device_count();
    REQUIRE_FALSE(r);
    CHECK(r.error().message().find(says) != std::string::npos);
  }

  // Switched off, each call fails as on a device without virtual memory management, and
  // nothing else changes.
  SimConfig off = vmm_config();
  off.virtual_memory_supported = false;
  Vm none(off);
  const std::vector<result<void>> refused = {
      outcome(none.d.mem_granularity(0)),
      outcome(none.d.mem_address_reserve(G, 0)),
      none.d.mem_address_free(G, G),
      outcome(none.d.mem_create(G, 0)),
      none.d.mem_release(SimDriver::phys_t{1}),
      none.d.mem_map(G, G, SimDriver::phys_t{1}),
      none.d.mem_unmap(G, G),
      none.d.mem_set_access(G, G, 0),
  };
  for (const auto& r : refused) {
    REQUIRE_FALSE(r);
    CHECK(r.error().driver_status() == status::not_supported);
    CHECK(r.error().message().find("virtual_memory_supported") != std::string::npos);
  }
  auto s = none.stream();
  none.fill(none.alloc(256, s), 1, 256, s);
  expect_ok(none.d.stream_synchronize(s));
}

TEST_CASE("virtual memory: reservations are aligned, disjoint, checked and freed whole",
          "[sim][vmm]") {
  SimConfig c = vmm_config();
  c.vmm_address_bytes = 64 * G;
  Vm vm(c);
  const std::uint64_t a = vm.reserve(4 * G);
  const std::uint64_t b = vm.reserve(4096);  // a page: legal, aligned to the granularity
  const std::uint64_t wide = vm.reserve(4 * G, 16 * G);
  CHECK(a % G == 0);
  CHECK(b % G == 0);
  CHECK(wide % (16 * G) == 0);
  CHECK((b >= a + 4 * G || b + 4096 <= a));
  CHECK((wide >= b + 4096 || wide + 4 * G <= b));
  CHECK((wide >= a + 4 * G || wide + 4 * G <= a));

  invalid(vm.d.mem_address_reserve(0, 0), "cuMemAddressReserve", "host page size");
  invalid(vm.d.mem_address_reserve(100, 0), "cuMemAddressReserve", "host page size");
  invalid(vm.d.mem_address_reserve(G, 3 * G), "cuMemAddressReserve", "power of two");
  auto full = vm.d.mem_address_reserve(64 * G, 0);
  REQUIRE_FALSE(full);
  CHECK(full.error().code() == errc::out_of_memory);
  CHECK(full.error().message().find("vmm_address_bytes") != std::string::npos);

  invalid(vm.d.mem_address_free(a, 2 * G), "cuMemAddressFree", "reserved with size");
  invalid(vm.d.mem_address_free(a + G, G), "cuMemAddressFree", "no reservation starts there");
  expect_ok(vm.d.mem_address_free(a, 4 * G));
  invalid(vm.d.mem_address_free(a, 4 * G), "cuMemAddressFree", "no reservation starts there");
  CHECK(vm.reserve(4 * G) == a);  // lowest first: the freed range again
  expect_ok(vm.d.mem_address_free(a, 4 * G));
  expect_ok(vm.d.mem_address_free(b, 4096));
  expect_ok(vm.d.mem_address_free(wide, 4 * G));
}

TEST_CASE("virtual memory: physical memory is counted against the device", "[sim][vmm]") {
  Vm vm;
  const std::size_t before = vm.free_bytes();
  CHECK(before == DEVICE);
  auto h = vm.create(4 * G);
  CHECK(vm.free_bytes() == before - 4 * G);
  CHECK(vm.physical() == 4 * G);
  CHECK(value(vm.d.bytes_reserved(0)) == 4 * G);

  invalid(vm.d.mem_create(G / 2, 0), "cuMemCreate", "multiple of the granularity");
  invalid(vm.d.mem_create(0, 0), "cuMemCreate", "multiple of the granularity");
  auto nodev = vm.d.mem_create(G, 3);
  REQUIRE_FALSE(nodev);
  CHECK(nodev.error().driver_status() == status::invalid_device);
  auto huge = vm.d.mem_create(2 * DEVICE, 0);
  REQUIRE_FALSE(huge);
  CHECK(huge.error().code() == errc::out_of_memory);

  // The rest of the device, then nothing: physical memory and the pool share the device.
  auto rest = vm.create(DEVICE - 4 * G);
  auto over = vm.d.mem_create(G, 0);
  REQUIRE_FALSE(over);
  CHECK(over.error().code() == errc::out_of_memory);
  CHECK(over.error().message().find("by physical allocations") != std::string::npos);
  auto s = vm.stream();
  auto pooled = vm.d.mem_alloc_async(256, vm.pool, s);
  REQUIRE_FALSE(pooled);
  CHECK(pooled.error().code() == errc::out_of_memory);
  CHECK(pooled.error().message().find("held by physical allocations") != std::string::npos);
  expect_ok(vm.d.mem_release(rest));
  CHECK(vm.free_bytes() == before - 4 * G);
  vm.alloc(256, s);

  // The device keeps physical memory when its primary context goes.
  expect_ok(vm.d.primary_ctx_release(0));
  vm.ctx = value(vm.d.primary_ctx_retain(0));
  expect_ok(vm.d.ctx_make_current(vm.ctx));
  CHECK(vm.free_bytes() == before - 4 * G);
  CHECK(vm.physical() == 4 * G);

  expect_ok(vm.d.mem_release(h));
  CHECK(vm.free_bytes() == before);
  CHECK(vm.physical() == 0);
  invalid(vm.d.mem_release(h), "cuMemRelease", "not a live handle");
  invalid(vm.d.mem_release(SimDriver::phys_t{}), "cuMemRelease", "not a live handle");
}

TEST_CASE("virtual memory: mappings follow CUDA's rules", "[sim][vmm]") {
  Vm vm;
  const std::uint64_t va = vm.reserve(8 * G);
  const std::uint64_t next = vm.reserve(8 * G);
  REQUIRE(next == va + 8 * G);  // side by side: a mapping may still not cross from one to the other
  auto h = vm.create(2 * G);
  auto dead = vm.create(G);
  expect_ok(vm.d.mem_release(dead));

  invalid(vm.d.mem_map(va + 8 * G - G, 2 * G, h), "cuMemMap", "not inside one reservation");
  invalid(vm.d.mem_map(va - 2 * G, 2 * G, h), "cuMemMap", "not inside one reservation");
  invalid(vm.d.mem_map(va + G / 2, G, h), "cuMemMap", "multiples of the granularity");
  invalid(vm.d.mem_map(va, G / 2, h), "cuMemMap", "multiples of the granularity");
  invalid(vm.d.mem_map(va, 4 * G, h), "cuMemMap", "the allocation has");
  invalid(vm.d.mem_map(va, G, dead), "cuMemMap", "not a live handle");
  invalid(vm.d.mem_map(va, G, SimDriver::phys_t{}), "cuMemMap", "not a live handle");

  vm.map(va + 2 * G, 2 * G, h);
  vm.map(va + 6 * G, G, h);  // the first part of an allocation, and the same one twice
  invalid(vm.d.mem_map(va + 3 * G, 2 * G, h), "cuMemMap", "overlaps");
  invalid(vm.d.mem_map(va + G, 2 * G, h), "cuMemMap", "overlaps");
  invalid(vm.d.mem_map(va + 2 * G, G, h), "cuMemMap", "overlaps");

  invalid(vm.d.mem_unmap(va + 3 * G, G), "cuMemUnmap", "no mapping starts there");
  invalid(vm.d.mem_unmap(va + 2 * G, G), "cuMemUnmap", "the mapping there is");
  invalid(vm.d.mem_unmap(va, 2 * G), "cuMemUnmap", "no mapping starts there");
  vm.map(va + 4 * G, G, h);  // adjacent to the first: one call still takes one mapping
  invalid(vm.d.mem_unmap(va + 2 * G, 3 * G), "cuMemUnmap", "the mapping there is");
  invalid(vm.d.mem_address_free(va, 8 * G), "cuMemAddressFree", "still mapped");

  expect_ok(vm.d.mem_unmap(va + 2 * G, 2 * G));
  expect_ok(vm.d.mem_unmap(va + 4 * G, G));
  expect_ok(vm.d.mem_unmap(va + 6 * G, G));
  invalid(vm.d.mem_unmap(va + 6 * G, G), "cuMemUnmap", "no mapping starts there");
  vm.map(va, 2 * G, h);  // the range is a reservation again
  expect_ok(vm.d.mem_unmap(va, 2 * G));
  expect_ok(vm.d.mem_release(h));
  expect_ok(vm.d.mem_address_free(va, 8 * G));
  expect_ok(vm.d.mem_address_free(next, 8 * G));
  CHECK(vm.free_bytes() == DEVICE);
}

TEST_CASE("virtual memory: memory released while mapped lives until its last unmap",
          "[sim][vmm]") {
  Vm vm;
  auto s = vm.stream();
  const std::uint64_t va = vm.reserve(4 * G);
  auto h = vm.create(2 * G);
  vm.map(va, 2 * G, h);
  vm.map(va + 2 * G, G, h);
  vm.access(va, 3 * G);
  vm.fill(va, 0x6B, 2 * G, s);
  expect_ok(vm.d.stream_synchronize(s));

  expect_ok(vm.d.mem_release(h));  // legal while mapped: the handle is gone, the memory is not
  CHECK(vm.physical() == 2 * G);
  CHECK(vm.free_bytes() == DEVICE - 2 * G);
  invalid(vm.d.mem_map(va + 3 * G, G, h), "cuMemMap", "not a live handle");
  invalid(vm.d.mem_release(h), "cuMemRelease", "not a live handle");
  const auto back = vm.read(va + 2 * G - 16, 32, s);  // through both mappings
  for (std::size_t i = 0; i < 16; ++i) CHECK(back[i] == 0x6B);
  CHECK(back[16] == 0x6B);  // the second mapping shows the allocation's start

  expect_ok(vm.d.mem_unmap(va, 2 * G));
  CHECK(vm.physical() == 2 * G);  // one mapping still holds it
  expect_ok(vm.d.mem_unmap(va + 2 * G, G));
  CHECK(vm.physical() == 0);
  CHECK(vm.free_bytes() == DEVICE);
  expect_ok(vm.d.mem_address_free(va, 4 * G));
  CHECK(vm.d.hazards().empty());
}

TEST_CASE("virtual memory: stitched and aliased mappings through copies, fills, kernels and host_view",
          "[sim][vmm]") {
  Vm vm;
  auto s = vm.stream();
  const std::uint64_t va = vm.reserve(4 * G);
  const std::uint64_t alias = vm.reserve(2 * G);
  auto a = vm.create(G);
  auto b = vm.create(G);
  vm.map(va, G, b);  // b first, then a: two allocations read as one range
  vm.map(va + G, G, a);
  vm.map(alias, G, a);  // a again, elsewhere
  vm.access(va, 2 * G);
  vm.access(alias, G);

  // A fill and a kernel across the seam.
  vm.fill(va, 0x11, 2 * G, s);
  const SimAccess across{va + G - 8, 16, Access::ReadWrite};
  expect_ok(vm.d.launch_kernel(s, {across}, [](std::span<std::byte* const> p) {
    for (int i = 0; i < 16; ++i) p[0][i] = static_cast<std::byte>(0x40 + i);
  }));
  // A copy from pool memory into the stitched range, and one out of it.
  const std::uint64_t pooled = vm.alloc(4096, s);
  vm.fill(pooled, 0x22, 4096, s);
  expect_ok(vm.d.memcpy_dtod_async(va + G + 64, pooled, 4096, s));
  const std::uint64_t out = vm.alloc(64, s);
  expect_ok(vm.d.memcpy_dtod_async(out, va + G - 32, 64, s));
  expect_ok(vm.d.stream_synchronize(s));

  auto stitched = value(vm.d.host_view(va, 2 * G));
  CHECK(stitched[0] == std::byte{0x11});
  for (std::size_t i = 0; i < 16; ++i) CHECK(stitched[G - 8 + i] == static_cast<std::byte>(0x40 + i));
  CHECK(stitched[G + 64] == std::byte{0x22});
  CHECK(stitched[G + 64 + 4095] == std::byte{0x22});
  CHECK(stitched[G + 64 + 4096] == std::byte{0x11});

  // The alias shows a's bytes: what was written at va + G.
  auto seen = value(vm.d.host_view(alias, G));
  for (std::size_t i = 0; i < 8; ++i) CHECK(seen[i] == static_cast<std::byte>(0x48 + i));
  CHECK(seen[64] == std::byte{0x22});
  // ... and a write through the alias shows through the stitched range.
  vm.fill(alias + 100, 0x77, 1, s);
  const auto through = vm.read(va + G + 100, 1, s);
  CHECK(through[0] == 0x77);
  const auto copied = vm.read(out, 64, s);
  CHECK(copied[0] == 0x11);
  CHECK(copied[24] == 0x40);
  CHECK(copied[39] == 0x4F);
  CHECK(copied[40] == 0x11);

  // Fresh physical memory holds the uninitialised pattern.
  auto fresh = vm.create(G);
  const std::uint64_t f = vm.reserve(G);
  vm.map(f, G, fresh);
  CHECK(value(vm.d.host_view(f, G))[G - 1] == std::byte{vm.d.config().uninit_byte});

  // host_view needs the bytes mapped, without a gap.
  CHECK_FALSE(vm.d.host_view(va + 2 * G, 1));
  CHECK_FALSE(vm.d.host_view(alias + G - 1, 2));
  CHECK(vm.d.hazards().empty());
}

TEST_CASE("virtual memory: access must be granted, on whole mappings, before a stream touches them",
          "[sim][vmm]") {
  Vm vm(vmm_config(2));
  auto s = vm.stream();
  const std::uint64_t va = vm.reserve(8 * G);
  auto a = vm.create(G);
  auto b = vm.create(2 * G);
  vm.map(va, G, a);
  vm.map(va + G, 2 * G, b);

  invalid(vm.d.mem_set_access(va, 4 * G, 0), "cuMemSetAccess", "not mapped");
  invalid(vm.d.mem_set_access(va + 4 * G, G, 0), "cuMemSetAccess", "not mapped");
  invalid(vm.d.mem_set_access(va, 2 * G, 0), "cuMemSetAccess", "cuts a mapping");
  invalid(vm.d.mem_set_access(va + 2 * G, G, 0), "cuMemSetAccess", "cuts a mapping");
  invalid(vm.d.mem_set_access(va + G / 2, G, 0), "cuMemSetAccess", "multiples of the granularity");
  auto nodev = vm.d.mem_set_access(va, G, 7);
  REQUIRE_FALSE(nodev);
  CHECK(nodev.error().driver_status() == status::invalid_device);

  // No access: the checker reports the fill at enqueue, and it faults its stream when it runs.
  vm.fill(va, 1, 64, s);
  auto hs = vm.d.hazards();
  REQUIRE(hs.size() == 1);
  CHECK(hs[0].kind == SimHazardKind::unallocated);
  auto faulted = vm.d.stream_synchronize(s);
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().driver_status() == status::illegal_address);
  vm.d.clear_hazards();

  // Two whole mappings side by side in one call.
  auto t = vm.stream();
  vm.access(va, 3 * G);
  vm.fill(va + G - 1, 0x5C, 2, t);
  CHECK(vm.read(va + G - 1, 2, t) == std::vector<std::uint8_t>{0x5C, 0x5C});
  CHECK(vm.d.hazards().empty());

  // Access for device 1 only: a stream of device 0 faults on it, one of device 1 does not.
  auto c = vm.create(G, 1);
  vm.map(va + 4 * G, G, c);
  vm.access(va + 4 * G, G, 1);
  vm.fill(va + 4 * G, 2, 64, t);
  auto wrong = vm.d.stream_synchronize(t);
  REQUIRE_FALSE(wrong);
  CHECK(wrong.error().driver_status() == status::illegal_address);
  auto ctx1 = value(vm.d.primary_ctx_retain(1));
  expect_ok(vm.d.ctx_make_current(ctx1));
  auto on1 = vm.stream();
  vm.fill(va + 4 * G, 3, 64, on1);
  expect_ok(vm.d.stream_synchronize(on1));
  CHECK(value(vm.d.host_view(va + 4 * G, 1))[0] == std::byte{3});
  CHECK(value(vm.d.memory_stats(1)).physical == G);
  expect_ok(vm.d.ctx_make_current(vm.ctx));
  vm.d.clear_hazards();

  // Unmapped and mapped again, a range needs access again; the old access is a use after
  // its unmap.
  auto u = vm.stream();
  expect_ok(vm.d.stream_synchronize(u));
  expect_ok(vm.d.mem_unmap(va, G));
  vm.map(va, G, a);
  vm.fill(va, 4, 64, u);
  hs = vm.d.hazards();
  REQUIRE(hs.size() == 1);
  CHECK(hs[0].kind == SimHazardKind::use_after_free);
  CHECK(hs[0].first.kind == SimOpKind::mem_unmap);
  CHECK(hs[0].device == 0);
  CHECK_FALSE(vm.d.stream_synchronize(u));
}

TEST_CASE("virtual memory: an unmap is ordered like a free", "[sim][vmm]") {
  Vm vm;
  auto s = vm.stream();
  auto t = vm.stream();
  const std::uint64_t va = vm.reserve(2 * G);
  auto h = vm.create(G);
  vm.map(va, G, h);
  vm.access(va, G);

  // Two streams, no order between them: a race, as on any device memory.
  vm.fill(va, 1, 256, s);
  vm.fill(va, 2, 256, t);
  CHECK(count(vm.d.hazards(), SimHazardKind::race) == 1);
  expect_ok(vm.d.stream_synchronize(s));
  expect_ok(vm.d.stream_synchronize(t));
  vm.d.clear_hazards();

  // Synchronised first: nothing to report.
  vm.fill(va, 3, 256, s);
  expect_ok(vm.d.stream_synchronize(s));
  expect_ok(vm.d.mem_unmap(va, G));
  CHECK(vm.d.hazards().empty());

  // Not synchronised: the unmap races the kernel, which faults when it runs after it.
  vm.map(va, G, h);
  vm.access(va, G);
  expect_ok(vm.d.launch_kernel(s, {SimAccess{va, 256, Access::Write}}, {}, "writer"));
  expect_ok(vm.d.mem_unmap(va, G));
  auto hs = vm.d.hazards();
  REQUIRE(hs.size() == 1);
  CHECK(hs[0].kind == SimHazardKind::free_race);
  CHECK(hs[0].first.label == "writer");
  CHECK(hs[0].second.kind == SimOpKind::mem_unmap);
  CHECK(to_string(hs[0]).find("mem_unmap (host") != std::string::npos);
  auto r = vm.d.stream_synchronize(s);
  REQUIRE_FALSE(r);
  CHECK(r.error().driver_status() == status::illegal_address);
  expect_ok(vm.d.mem_release(h));
}

TEST_CASE("virtual memory: each call fails on injection, by its CUDA name, with no effect",
          "[sim][vmm][inject]") {
  Vm vm;
  const std::uint64_t va = vm.reserve(4 * G);
  auto h = vm.create(G);
  auto inject = [&](const char* name) {
    INFO(name);
    REQUIRE(vm.d.fail_nth(name, 1, status::unknown));
  };
  auto injected = [&](const auto& r, const char* name, std::int64_t calls_before) {
    INFO(name);
    REQUIRE_FALSE(r);
    CHECK(r.error().driver_status() == status::unknown);
    CHECK(r.error().message().rfind(name, 0) == 0);
    CHECK(vm.d.calls(name) == calls_before + 1);
  };
  auto calls = [&](const char* name) {
    const std::int64_t n = vm.d.calls(name);
    CHECK(n >= 0);
    return n;
  };

  std::int64_t n = calls("cuMemGetAllocationGranularity");
  inject("cuMemGetAllocationGranularity");
  injected(vm.d.mem_granularity(0), "cuMemGetAllocationGranularity", n);
  CHECK(value(vm.d.mem_granularity(0)).minimum == G);

  n = calls("cuMemAddressReserve");
  inject("cuMemAddressReserve");
  injected(vm.d.mem_address_reserve(G, 0), "cuMemAddressReserve", n);
  const std::uint64_t other = vm.reserve(G);  // nothing was taken by the failed call
  CHECK(other == va + 4 * G);

  n = calls("cuMemAddressFree");
  inject("cuMemAddressFree");
  injected(vm.d.mem_address_free(other, G), "cuMemAddressFree", n);
  expect_ok(vm.d.mem_address_free(other, G));  // still reserved

  const std::size_t before = vm.free_bytes();
  n = calls("cuMemCreate");
  inject("cuMemCreate");
  injected(vm.d.mem_create(G, 0), "cuMemCreate", n);
  CHECK(vm.free_bytes() == before);

  n = calls("cuMemMap");
  inject("cuMemMap");
  injected(vm.d.mem_map(va, G, h), "cuMemMap", n);
  CHECK_FALSE(vm.d.host_view(va, 1));
  vm.map(va, G, h);

  n = calls("cuMemSetAccess");
  inject("cuMemSetAccess");
  injected(vm.d.mem_set_access(va, G, 0), "cuMemSetAccess", n);
  auto s = vm.stream();
  vm.fill(va, 1, 8, s);  // no access was granted
  CHECK_FALSE(vm.d.stream_synchronize(s));
  vm.d.clear_hazards();
  vm.access(va, G);

  n = calls("cuMemUnmap");
  inject("cuMemUnmap");
  injected(vm.d.mem_unmap(va, G), "cuMemUnmap", n);
  CHECK(vm.d.host_view(va, G));  // still mapped

  n = calls("cuMemRelease");
  inject("cuMemRelease");
  injected(vm.d.mem_release(h), "cuMemRelease", n);
  expect_ok(vm.d.mem_unmap(va, G));
  expect_ok(vm.d.mem_release(h));  // the handle was still live
  CHECK(vm.free_bytes() == DEVICE);

  // fail_always holds until cleared.
  REQUIRE(vm.d.fail_always("cuMemCreate", status::out_of_memory));
  for (int i = 0; i < 3; ++i) {
    auto r = vm.d.mem_create(G, 0);
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::out_of_memory);
  }
  vm.d.clear_failures();
  expect_ok(vm.d.mem_release(vm.create(G)));
  expect_ok(vm.d.mem_address_free(va, 4 * G));
  CHECK(vm.d.hazards().empty());
}

TEST_CASE("virtual memory: a kernel body still running when its range is unmapped does not crash",
          "[sim][vmm][threaded]") {
  SimConfig c = vmm_config();
  c.executor = SimExecutor::threaded;
  Vm vm(c);
  auto s = vm.stream();
  const std::uint64_t va = vm.reserve(G);
  auto h = vm.create(G);
  vm.map(va, G, h);
  vm.access(va, G);
  std::atomic<bool> started{false};
  std::atomic<bool> go{false};
  expect_ok(vm.d.launch_kernel(s, {SimAccess{va, 4096, Access::Write}},
                               [&](std::span<std::byte* const> p) {
                                 started.store(true, std::memory_order_release);
                                 while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
                                 std::memset(p[0], 0x33, 4096);  // after the unmap: scratch
                               }));
  while (!started.load(std::memory_order_acquire)) std::this_thread::yield();
  expect_ok(vm.d.mem_unmap(va, G));  // races the kernel: the checker says so
  go.store(true, std::memory_order_release);
  expect_ok(vm.d.stream_synchronize(s));
  CHECK(count(vm.d.hazards(), SimHazardKind::free_race) == 1);
  // The physical memory did not see the late write.
  vm.map(va, G, h);
  CHECK(value(vm.d.host_view(va, 1))[0] == std::byte{vm.d.config().uninit_byte});
  expect_ok(vm.d.mem_unmap(va, G));
  expect_ok(vm.d.mem_release(h));
  expect_ok(vm.d.mem_address_free(va, G));
}
