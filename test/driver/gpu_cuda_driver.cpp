// SPDX-License-Identifier: Apache-2.0
// CudaDriver on a real GPU: every member of the Driver contract, on device 0.
//
// Exits 77 (Meson's SKIP) when open() reports no_driver or no_device, and fails when the
// driver is there but unusable (driver_too_old, anything else): it never passes without
// running. Prints a "checked:" line for each property it verified.
//
// Host functions that hold a stream back ("gates") let the test observe ordering
// deterministically: work enqueued behind a closed gate must not have happened, and
// must have happened once the gate is opened and the stream synchronised. A gate waits
// at most 20 s, so a failing test cannot hang the driver's callback thread forever.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "xlogrt/driver/cuda_driver.hpp"

using namespace xlogrt;
using Catch::Matchers::StartsWith;

namespace {

CudaDriver* g_driver = nullptr;

void checked(const std::string& what) { std::printf("checked: %s\n", what.c_str()); }

/// The calling thread uses device 0's primary context (retained for the life of the
/// object) as its current context.
struct Device0 {
  CudaDriver& d = *g_driver;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;

  Device0() {
    auto got = d.device_get(0);
    REQUIRE(got);
    dev = *got;
    auto c = d.primary_ctx_retain(dev);
    REQUIRE(c);
    ctx = *c;
    REQUIRE(d.ctx_make_current(ctx));
  }
  ~Device0() { (void)d.primary_ctx_release(dev); }
  Device0(const Device0&) = delete;
  Device0& operator=(const Device0&) = delete;
};

/// A host function that holds its stream until opened (or 20 s have passed). Lives in
/// static storage so that a callback never outlives it.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> entered{false};

  static void CUDA_CB wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    g->entered.store(true, std::memory_order_release);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!g->open.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

Gate g_gates[4];

void CUDA_CB count_call(void* p) {
  static_cast<std::atomic<int>*>(p)->fetch_add(1, std::memory_order_acq_rel);
}

/// Gives wrongly ordered work a chance to run before the test looks.
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

}  // namespace

TEST_CASE("devices, attributes, contexts and memory info", "[gpu]") {
  Device0 g;
  CudaDriver& d = g.d;

  auto n = d.device_count();
  REQUIRE(n);
  REQUIRE(*n >= 1);
  auto name = d.device_name(g.dev);
  REQUIRE(name);
  CHECK_FALSE(name->empty());
  auto total = d.device_total_mem(g.dev);
  REQUIRE(total);
  CHECK(*total > 0);
  checked("device_count " + std::to_string(*n) + ", device 0 '" + *name + "', " +
          std::to_string(*total >> 20) + " MiB");

  auto major = d.device_attribute(g.dev, DeviceAttr::compute_capability_major);
  auto minor = d.device_attribute(g.dev, DeviceAttr::compute_capability_minor);
  auto sms = d.device_attribute(g.dev, DeviceAttr::multiprocessor_count);
  auto pools = d.device_attribute(g.dev, DeviceAttr::memory_pools_supported);
  auto map = d.device_attribute(g.dev, DeviceAttr::can_map_host_memory);
  auto memops = d.device_attribute(g.dev, DeviceAttr::stream_mem_ops_supported);
  REQUIRE((major && minor && sms && pools && map && memops));
  CHECK(*major >= 5);  // CUDA 12 supports compute capability 5.0 and newer
  CHECK(*minor >= 0);
  CHECK(*sms > 0);
  CHECK(*pools == 1);
  CHECK(*map == 1);
  CHECK(*memops == 1);
  int v1_memops = -1;
  (void)d.api().cuDeviceGetAttribute_(&v1_memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1,
                                      g.dev);
  checked("attributes: compute capability " + std::to_string(*major) + "." +
          std::to_string(*minor) + ", " + std::to_string(*sms) + " SMs, memory pools " +
          std::to_string(*pools) + ", map host memory " + std::to_string(*map) +
          ", stream mem ops (v2) " + std::to_string(*memops) + " (raw V1 attribute: " +
          std::to_string(v1_memops) + ")");

  auto beyond = d.device_get(*n);
  REQUIRE_FALSE(beyond);
  CHECK(beyond.error().code() == errc::no_device);
  CHECK_THAT(beyond.error().message(), StartsWith("cuDeviceGet failed with CUDA_ERROR_"));
  checked("device_get(" + std::to_string(*n) + ") -> " + beyond.error().what());

  // The context made current by Device0 is current; making it current again is a no-op.
  CUcontext current = nullptr;
  REQUIRE(d.api().cuCtxGetCurrent_(&current) == CUDA_SUCCESS);
  CHECK(current == g.ctx);
  REQUIRE(d.ctx_make_current(g.ctx));
  REQUIRE(d.api().cuCtxGetCurrent_(&current) == CUDA_SUCCESS);
  CHECK(current == g.ctx);
  // From no context current, it sets it.
  REQUIRE(d.api().cuCtxSetCurrent_(nullptr) == CUDA_SUCCESS);
  REQUIRE(d.ctx_make_current(g.ctx));
  REQUIRE(d.api().cuCtxGetCurrent_(&current) == CUDA_SUCCESS);
  CHECK(current == g.ctx);
  checked("primary_ctx_retain / ctx_make_current (already current and not current)");

  // Retain and release balance (main holds one more reference for the whole run, so the
  // primary context never goes inactive between test cases).
  auto again = d.primary_ctx_retain(g.dev);
  REQUIRE(again);
  CHECK(*again == g.ctx);  // the primary context is one per device
  REQUIRE(d.primary_ctx_release(g.dev));
  checked("primary_ctx_retain returns the device's one primary context; primary_ctx_release");

  auto info = d.mem_get_info();
  REQUIRE(info);
  CHECK(info->total > 0);
  CHECK(info->free <= info->total);
  checked("mem_get_info: " + std::to_string(info->free >> 20) + " MiB free of " +
          std::to_string(info->total >> 20) + " MiB");
}

TEST_CASE("streams and events order work across streams", "[gpu]") {
  Device0 g;
  CudaDriver& d = g.d;
  auto s1 = d.stream_create();
  auto s2 = d.stream_create();
  auto e = d.event_create();
  REQUIRE((s1 && s2 && e));

  Gate& gate = g_gates[0];
  static std::atomic<int> after_wait;  // static: a callback never outlives it
  after_wait.store(0);
  REQUIRE(d.launch_host_func(*s1, &Gate::wait, &gate));
  REQUIRE(d.event_record(*e, *s1));               // behind the gate
  REQUIRE(d.stream_wait_event(*s2, *e));          // s2 waits for the event...
  REQUIRE(d.launch_host_func(*s2, &count_call, &after_wait));  // ...before this runs
  settle();

  auto q1 = d.stream_query(*s1);
  auto qe = d.event_query(*e);
  REQUIRE((q1 && qe));
  CHECK(*q1 == false);
  CHECK(*qe == false);
  CHECK(after_wait.load() == 0);
  checked("while a host function holds stream 1: stream_query false, event_query false, "
          "stream 2's work waits on the event");

  gate.open.store(true, std::memory_order_release);
  REQUIRE(d.stream_synchronize(*s2));
  CHECK(after_wait.load() == 1);
  REQUIRE(d.event_synchronize(*e));
  auto qe2 = d.event_query(*e);
  REQUIRE(qe2);
  CHECK(*qe2 == true);
  REQUIRE(d.stream_synchronize(*s1));
  auto q1b = d.stream_query(*s1);
  REQUIRE(q1b);
  CHECK(*q1b == true);
  checked("after the gate opens: stream_wait_event released stream 2, host function ran "
          "once, event_query / stream_query true");

  REQUIRE(d.event_destroy(*e));
  REQUIRE(d.stream_destroy(*s1));
  REQUIRE(d.stream_destroy(*s2));
  checked("stream_create / stream_destroy / event_create / event_destroy");
}

TEST_CASE("pool allocation, memset and copies round trip", "[gpu]") {
  Device0 g;
  CudaDriver& d = g.d;
  auto s = d.stream_create();
  REQUIRE(s);
  auto pool = d.device_default_mempool(g.dev);
  REQUIRE(pool);
  REQUIRE(d.mempool_set_release_threshold(*pool, std::uint64_t{64} << 20));
  checked("device_default_mempool / mempool_set_release_threshold(64 MiB)");

  constexpr std::size_t n = std::size_t{1} << 20;
  auto a = d.mem_alloc_async(n, *pool, *s);
  auto b = d.mem_alloc_async(n, *pool, *s);
  REQUIRE((a && b));
  CHECK(*a != 0);
  CHECK(*b != 0);
  CHECK(*a != *b);
  auto usage = d.mempool_usage(*pool);
  REQUIRE(usage);
  CHECK(usage->used >= 2 * n);
  CHECK(usage->reserved >= usage->used);
  CHECK(usage->used_high >= usage->used);
  CHECK(usage->reserved_high >= usage->reserved);
  checked("mempool_usage with 2 MiB live: reserved " + std::to_string(usage->reserved) + ", used " +
          std::to_string(usage->used) + ", peaks " + std::to_string(usage->reserved_high) + " / " +
          std::to_string(usage->used_high));
  auto staging = d.mem_host_alloc_mapped(n);
  REQUIRE(staging);
  auto* h = static_cast<unsigned char*>(*staging);

  REQUIRE(d.memset_d8_async(*a, 0x5A, n, *s));
  REQUIRE(d.memcpy_dtoh_async(h, *a, n, *s));
  REQUIRE(d.stream_synchronize(*s));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += h[i] != 0x5A;
  CHECK(wrong == 0);
  checked("mem_alloc_async 1 MiB x2, memset_d8_async 0x5A, memcpy_dtoh_async: " +
          std::to_string(n - wrong) + "/" + std::to_string(n) + " bytes right");

  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>(i * 7 + 3);
  REQUIRE(d.memcpy_htod_async(*a, h, n, *s));
  REQUIRE(d.memcpy_dtod_async(*b, *a, n, *s));
  REQUIRE(d.stream_synchronize(*s));
  std::memset(h, 0, n);
  REQUIRE(d.memcpy_dtoh_async(h, *b, n, *s));
  REQUIRE(d.stream_synchronize(*s));
  wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += h[i] != static_cast<unsigned char>(i * 7 + 3);
  CHECK(wrong == 0);
  checked("memcpy_htod_async -> memcpy_dtod_async -> memcpy_dtoh_async round trip: " +
          std::to_string(n - wrong) + "/" + std::to_string(n) + " bytes right");

  REQUIRE(d.mem_free_async(*a, *s));
  REQUIRE(d.mem_free_async(*b, *s));
  REQUIRE(d.stream_synchronize(*s));
  checked("mem_free_async x2");

  auto sync_block = d.mem_alloc(4096);
  REQUIRE(sync_block);
  REQUIRE(d.memset_d8_async(*sync_block, 0, 4096, *s));
  REQUIRE(d.stream_synchronize(*s));
  REQUIRE(d.mem_free(*sync_block));
  checked("mem_alloc / mem_free");

  auto bogus = d.mem_free(0xdead0000ull);
  REQUIRE_FALSE(bogus);
  CHECK(bogus.error().code() != errc::shutting_down);
  CHECK(bogus.error().driver_status() != 0);
  CHECK_THAT(bogus.error().message(), StartsWith("cuMemFree failed with CUDA_ERROR_"));
  checked("mem_free(bogus pointer) -> " + bogus.error().what());

  // The bogus free did not poison the context: work still runs.
  auto after = d.mem_alloc(4096);
  REQUIRE(after);
  REQUIRE(d.mem_free(*after));

  REQUIRE(d.mem_host_free(*staging));
  REQUIRE(d.stream_destroy(*s));
  checked("mem_host_free, and the context still works after the failed free");
}

TEST_CASE("write-value into mapped host memory, read back on the host", "[gpu]") {
  Device0 g;
  CudaDriver& d = g.d;
  auto s = d.stream_create();
  REQUIRE(s);
  auto flags = d.mem_host_alloc_mapped(4096);
  REQUIRE(flags);
  auto* words = static_cast<std::uint32_t*>(*flags);
  std::memset(words, 0, 4096);
  auto dptr = d.mem_host_device_pointer(*flags);
  REQUIRE(dptr);
  CHECK(*dptr != 0);
  checked("mem_host_alloc_mapped 4 KiB, mem_host_device_pointer");

  auto read = [&](int i) {
    return std::atomic_ref<std::uint32_t>(words[i]).load(std::memory_order_acquire);
  };

  // Ordered behind a gate: not written while the gate is closed.
  Gate& gate = g_gates[1];
  REQUIRE(d.launch_host_func(*s, &Gate::wait, &gate));
  REQUIRE(d.stream_write_value32(*s, *dptr + 4, 0xC0FFEEu));
  settle();
  CHECK(read(1) == 0u);
  gate.open.store(true, std::memory_order_release);
  REQUIRE(d.stream_synchronize(*s));
  CHECK(read(1) == 0xC0FFEEu);
  CHECK(read(0) == 0u);
  CHECK(read(2) == 0u);
  checked("stream_write_value32 waits for earlier work, then writes 0xC0FFEE where asked");

  // Seen by a host that polls, without synchronising the stream (the reactor's use).
  REQUIRE(d.stream_write_value32(*s, *dptr + 8, 7u));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (read(2) != 7u && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  CHECK(read(2) == 7u);
  checked("a host thread polling the mapped word sees the write without a stream sync");

  static std::atomic<int> ran;  // static: a callback never outlives it
  ran.store(0);
  REQUIRE(d.launch_host_func(*s, &count_call, &ran));
  REQUIRE(d.stream_synchronize(*s));
  CHECK(ran.load() == 1);
  checked("launch_host_func ran its function once");

  REQUIRE(d.mem_host_free(*flags));
  REQUIRE(d.stream_destroy(*s));
}

TEST_CASE("status names come from the driver", "[gpu]") {
  CudaDriver& d = *g_driver;
  CHECK(d.status_name(CUDA_ERROR_INVALID_VALUE) == "CUDA_ERROR_INVALID_VALUE");
  CHECK(d.status_name(CUDA_ERROR_NOT_READY) == "CUDA_ERROR_NOT_READY");
  CHECK(d.status_name(CUDA_ERROR_STUB_LIBRARY) == "CUDA_ERROR_STUB_LIBRARY");  // not in status.hpp
  checked("status_name via cuGetErrorName");
}

int main(int argc, char** argv) {
  auto d = CudaDriver::open();
  if (!d) {
    std::printf("%s\n", d.error().what().c_str());
    const errc c = d.error().code();
    if (c == errc::no_driver || c == errc::no_device) {
      std::printf("SKIP: no CUDA driver or no device\n");
      return 77;
    }
    return 1;  // a driver that is present but unusable is a failure, not a skip
  }
  g_driver = *d;
  std::printf("driver: %s, CUDA %s (%d)\n", g_driver->library().c_str(),
              detail::cuda_version_string(g_driver->driver_version()).c_str(),
              g_driver->driver_version());
  // One reference to device 0's primary context for the whole run: each test case's
  // retain / release pair then never destroys and recreates it.
  auto dev = g_driver->device_get(0);
  auto ctx = dev ? g_driver->primary_ctx_retain(*dev) : result<CUcontext>(dev.error());
  if (!ctx) {
    std::printf("FAIL retaining device 0's primary context: %s\n", ctx.error().what().c_str());
    return 1;
  }
  // A filter that selects nothing is a failure too: this test never passes unrun.
  std::vector<const char*> args(argv, argv + argc);
  args.push_back("--warn");
  args.push_back("NoTests");
  const int failed = Catch::Session().run(static_cast<int>(args.size()), args.data());
  (void)g_driver->primary_ctx_release(*dev);
  return failed == 0 ? 0 : 1;
}
