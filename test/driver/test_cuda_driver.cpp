// SPDX-License-Identifier: Apache-2.0
// CudaDriver on machines without a GPU: loading, version checks and their errors, the
// version and flags each entry point is resolved with, and the mapping of every member
// onto its driver call, all against the fake libcuda of fakecuda.cpp.
//
// CudaDriver::open() is a process-wide singleton, so every test case is hidden ([.])
// and meson.build runs each group, selected by tag, in a process of its own with the
// environment it needs (XLOGRT_LIBCUDA, and FAKECUDA_* naming the fake libraries).

#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/driver/cuda_driver.hpp"

using namespace xlogrt;
using Catch::Matchers::Contains;

namespace {

std::string fake_path(const char* env) {
  const char* p = std::getenv(env);
  INFO("environment variable " << env << " must name a fake libcuda (set by meson.build)");
  REQUIRE(p != nullptr);
  return p;
}

FakeCudaState* state_of(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);  // loaded by CudaDriver::open
  auto get = std::bit_cast<FakeCudaState* (*)()>(::dlsym(lib, "fakecuda_state"));
  REQUIRE(get != nullptr);
  return get();
}

/// Opens the driver on the working fake; every [wrappers] case runs in one process.
CudaDriver& ok_driver() {
  ::setenv("XLOGRT_LIBCUDA", fake_path("FAKECUDA_OK").c_str(), 1);
  auto d = CudaDriver::open();
  if (!d) FAIL(d.error().what());
  return **d;
}

FakeCudaState& ok_state() {
  static FakeCudaState* s = state_of(fake_path("FAKECUDA_OK"));
  return *s;
}

template <class T>
std::optional<error> error_of(result<T> r) {
  if (r) return std::nullopt;
  return std::move(r).error();
}

std::string last_symbol() { return ok_state().last_symbol; }

}  // namespace

TEST_CASE("a driver file that does not exist is no_driver, naming the file", "[.][no_driver]") {
  const char* env = std::getenv("XLOGRT_LIBCUDA");
  REQUIRE(env != nullptr);
  REQUIRE(std::string(env) == "/nonexistent/libcuda.so.1");
  for (int attempt = 0; attempt < 2; ++attempt) {  // a failure is not cached
    auto d = CudaDriver::open();
    REQUIRE_FALSE(d);
    CHECK(d.error().code() == errc::no_driver);
    CHECK_THAT(d.error().message(), Contains("'/nonexistent/libcuda.so.1'"));
    CHECK_THAT(d.error().message(), Contains("XLOGRT_LIBCUDA"));
    CHECK(d.error().driver_status() == 0);
  }
}

TEST_CASE("each way of failing to open is its own error, and open retries after a failure",
          "[.][retry]") {
  struct Case {
    std::string library;
    errc code;
    std::vector<std::string> says;
    int driver_status;
  };
  const std::vector<Case> cases = {
      {"/nonexistent/libcuda.so.1", errc::no_driver, {"could not load", "XLOGRT_LIBCUDA"}, 0},
      {fake_path("FAKECUDA_NOINIT"), errc::no_driver, {"is not a CUDA driver library", "cuInit"}, 0},
      {fake_path("FAKECUDA_OLD"),
       errc::driver_too_old,
       {"supports CUDA 11.4", "11040", "needs CUDA 12.0 or newer", "newer NVIDIA driver"},
       0},
      {fake_path("FAKECUDA_NOGPA"), errc::driver_too_old, {"cuGetProcAddress_v2", "12.0"}, 0},
      {fake_path("FAKECUDA_STUB"), errc::no_driver, {"cuInit failed with CUDA_ERROR_STUB_LIBRARY (34)", "nvidia-smi"}, 34},
      {fake_path("FAKECUDA_NODEVICE"),
       errc::no_device,
       {"cuInit failed with CUDA_ERROR_NO_DEVICE (100)", "CUDA_VISIBLE_DEVICES"},
       100},
      {fake_path("FAKECUDA_MISSING"),
       errc::driver_too_old,
       {"lacks cuMemAllocFromPoolAsync (CUDA 11.2 ABI, not found)", "12.0"},
       0},
      {fake_path("FAKECUDA_ZERO"), errc::no_device, {"cuDeviceGetCount is 0", "nvidia-smi"}, 0},
  };
  for (const Case& c : cases) {
    INFO("XLOGRT_LIBCUDA=" << c.library);
    ::setenv("XLOGRT_LIBCUDA", c.library.c_str(), 1);
    auto d = CudaDriver::open();
    REQUIRE_FALSE(d);
    INFO(d.error().what());
    CHECK(d.error().code() == c.code);
    CHECK(d.error().driver_status() == c.driver_status);
    for (const std::string& s : c.says) CHECK_THAT(d.error().message(), Contains(s));
    if (c.library != "/nonexistent/libcuda.so.1" && c.code != errc::driver_too_old) {
      CHECK_THAT(d.error().message(), Contains(c.library));
    }
  }

  // After all those failures, a working driver opens...
  const std::string ok = fake_path("FAKECUDA_OK");
  ::setenv("XLOGRT_LIBCUDA", ok.c_str(), 1);
  auto d = CudaDriver::open();
  REQUIRE(d);
  CHECK((*d)->library() == ok);
  CHECK((*d)->driver_version() == 12080);
  CHECK(std::string(CudaDriver::kind) == "cuda");
  CHECK(state_of(ok)->init_calls.load() == 1);

  // ...and from then on the same instance is handed out, without looking again.
  ::setenv("XLOGRT_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
  auto again = CudaDriver::open();
  REQUIRE(again);
  CHECK(*again == *d);
  CHECK(state_of(ok)->init_calls.load() == 1);
}

TEST_CASE("concurrent first callers of open get one instance, loaded once", "[.][concurrent]") {
  const std::string ok = fake_path("FAKECUDA_OK");
  ::setenv("XLOGRT_LIBCUDA", ok.c_str(), 1);
  ::setenv("FAKECUDA_INIT_DELAY_MS", "200", 1);  // every thread arrives during the load
  constexpr int n = 8;
  std::vector<CudaDriver*> got(n, nullptr);
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      auto d = CudaDriver::open();
      if (d) got[i] = *d;
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(got[0] != nullptr);
  for (CudaDriver* d : got) CHECK(d == got[0]);
  CHECK(state_of(ok)->init_calls.load() == 1);
}

TEST_CASE("every entry point is resolved at the version of its ABI, legacy stream",
          "[.][wrappers]") {
  ok_driver();
  FakeCudaState& st = ok_state();
  // The versions of cudaTypedefs.h's PFN_ typedefs that CudaDriver calls through:
  // the _v2 variants of the memory calls (3020), of cuStreamDestroy / cuEventDestroy
  // (4000), of cuDevicePrimaryCtxRelease (11000) and of cuStreamWriteValue32 (11070).
  const std::map<std::string, int> expected = {
      {"cuGetErrorName", 6000},           {"cuDeviceGetCount", 2000},
      {"cuDeviceGet", 2000},              {"cuDeviceGetName", 2000},
      {"cuDeviceTotalMem", 3020},         {"cuDeviceGetAttribute", 2000},
      {"cuDevicePrimaryCtxRetain", 7000}, {"cuDevicePrimaryCtxRelease", 11000},
      {"cuCtxGetCurrent", 4000},          {"cuCtxSetCurrent", 4000},
      {"cuMemGetInfo", 3020},             {"cuStreamCreate", 2000},
      {"cuStreamDestroy", 4000},          {"cuStreamSynchronize", 2000},
      {"cuStreamQuery", 2000},            {"cuStreamWaitEvent", 3020},
      {"cuStreamGetId", 12000},          {"cuStreamGetCtx", 9020},
      {"cuEventCreate", 2000},            {"cuEventDestroy", 4000},
      {"cuEventRecord", 2000},            {"cuEventQuery", 2000},
      {"cuEventSynchronize", 2000},       {"cuDeviceGetDefaultMemPool", 11020},
      {"cuMemPoolSetAttribute", 11020},   {"cuMemPoolGetAttribute", 11020},
      {"cuMemPoolTrimTo", 11020},         {"cuMemPoolCreate", 11020},
      {"cuMemPoolDestroy", 11020},
      {"cuMemAllocFromPoolAsync", 11020},
      {"cuMemFreeAsync", 11020},          {"cuMemAlloc", 3020},
      {"cuMemFree", 3020},                {"cuMemHostAlloc", 2020},
      {"cuMemHostGetDevicePointer", 3020}, {"cuMemFreeHost", 2000},
      {"cuMemsetD8Async", 3020},          {"cuMemcpyHtoDAsync", 3020},
      {"cuMemcpyDtoHAsync", 3020},        {"cuMemcpyDtoDAsync", 3020},
      {"cuStreamWriteValue32", 11070},    {"cuLaunchHostFunc", 10000},
      {"cuLaunchKernel", 4000},           {"cuModuleLoadData", 2000},
      {"cuModuleGetFunction", 2000},
      // Stream capture: _v2 of cuStreamGetCaptureInfo (with the graph, 11030) and of
      // cuStreamBeginCapture (with the mode, 10010); the context-less cuCtxSynchronize.
      {"cuStreamGetCaptureInfo", 11030},  {"cuThreadExchangeStreamCaptureMode", 10010},
      {"cuCtxSynchronize", 2000},         {"cuStreamBeginCapture", 10010},
      {"cuStreamEndCapture", 10000},      {"cuGraphInstantiateWithFlags", 11040},
      {"cuGraphLaunch", 10000},           {"cuGraphDestroy", 10000},
      {"cuGraphExecDestroy", 10000},
      // Virtual memory, optional (each has had one ABI, CUDA 10.2's).
      {"cuMemGetAllocationGranularity", 10020}, {"cuMemAddressReserve", 10020},
      {"cuMemAddressFree", 10020},        {"cuMemCreate", 10020},
      {"cuMemRelease", 10020},            {"cuMemMap", 10020},
      {"cuMemUnmap", 10020},              {"cuMemSetAccess", 10020},
  };
  REQUIRE(st.n_requests == static_cast<int>(expected.size()));
  std::map<std::string, int> seen;
  for (int i = 0; i < st.n_requests; ++i) {
    const FakeCudaRequest& r = st.requests[i];
    INFO(r.symbol);
    CHECK(r.flags == CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    CHECK(r.variant == r.version);  // the variant handed out is the ABI asked for
    seen[r.symbol] = r.version;
  }
  CHECK(seen == expected);

  // The raw table is there for side-by-side timing, and calls the same functions.
  const detail::CudaApi& api = ok_driver().api();
  REQUIRE(api.cuLaunchKernel_ != nullptr);
  REQUIRE(api.cuModuleLoadData_ != nullptr);
  REQUIRE(api.cuModuleGetFunction_ != nullptr);
  int count = 0;
  CHECK(api.cuDeviceGetCount_(&count) == CUDA_SUCCESS);
  CHECK(count == 1);
}

TEST_CASE("each member calls its driver entry point once, with the documented arguments",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  long before = 0;
  auto mark = [&] { before = st.calls.load(); };
  auto one_call = [&](const char* symbol, int variant) {
    CHECK(st.calls.load() - before == 1);
    CHECK(last_symbol() == symbol);
    CHECK(st.last_variant == variant);
  };

  mark();
  auto n = d.device_count();
  REQUIRE(n);
  CHECK(*n == 1);
  one_call("cuDeviceGetCount", 2000);

  mark();
  auto dev = d.device_get(0);
  REQUIRE(dev);
  CHECK(*dev == 0);
  one_call("cuDeviceGet", 2000);

  mark();
  auto name = d.device_name(*dev);
  REQUIRE(name);
  CHECK(*name == "Fake GPU");
  one_call("cuDeviceGetName", 2000);

  mark();
  auto total = d.device_total_mem(*dev);
  REQUIRE(total);
  CHECK(*total == std::size_t{80} << 30);
  one_call("cuDeviceTotalMem", 3020);

  // The fake reports 1000 + the attribute number it was asked for.
  const std::pair<DeviceAttr, int> attrs[] = {
      {DeviceAttr::memory_pools_supported, 1000 + CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED},
      {DeviceAttr::can_map_host_memory, 1000 + CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY},
      {DeviceAttr::compute_capability_major,
       1000 + CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {DeviceAttr::compute_capability_minor,
       1000 + CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {DeviceAttr::multiprocessor_count, 1000 + CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
  };
  for (auto [attr, want] : attrs) {
    mark();
    auto v = d.device_attribute(*dev, attr);
    REQUIRE(v);
    CHECK(*v == want);
    one_call("cuDeviceGetAttribute", 2000);
  }
  // v2 write-value is core in every accepted driver: 1, once the device is confirmed.
  mark();
  auto memops = d.device_attribute(*dev, DeviceAttr::stream_mem_ops_supported);
  REQUIRE(memops);
  CHECK(*memops == 1);
  one_call("cuDeviceGetAttribute", 2000);
  auto bad_dev = d.device_attribute(7, DeviceAttr::stream_mem_ops_supported);
  REQUIRE_FALSE(bad_dev);
  CHECK(bad_dev.error().code() == errc::no_device);
  auto bad_attr = d.device_attribute(*dev, static_cast<DeviceAttr>(200));
  REQUIRE_FALSE(bad_attr);
  CHECK(bad_attr.error().code() == errc::invalid_argument);
  CHECK_THAT(bad_attr.error().message(), Contains("200"));

  mark();
  auto ctx = d.primary_ctx_retain(*dev);
  REQUIRE(ctx);
  one_call("cuDevicePrimaryCtxRetain", 7000);

  // ctx_make_current sets only when another context is current.
  st.current_ctx = nullptr;
  const int sets = st.set_current_calls.load();
  REQUIRE(d.ctx_make_current(*ctx));
  CHECK(st.set_current_calls.load() == sets + 1);
  CHECK(st.current_ctx == static_cast<void*>(*ctx));
  mark();
  REQUIRE(d.ctx_make_current(*ctx));
  one_call("cuCtxGetCurrent", 4000);
  CHECK(st.set_current_calls.load() == sets + 1);
  int other = 0;
  st.current_ctx = &other;
  REQUIRE(d.ctx_make_current(*ctx));
  CHECK(st.set_current_calls.load() == sets + 2);
  CHECK(st.current_ctx == static_cast<void*>(*ctx));

  mark();
  auto info = d.mem_get_info();
  REQUIRE(info);
  CHECK(info->free == std::size_t{1} << 30);
  CHECK(info->total == std::size_t{2} << 30);
  one_call("cuMemGetInfo", 3020);

  mark();
  auto s = d.stream_create();
  REQUIRE(s);
  one_call("cuStreamCreate", 2000);
  CHECK(st.last_args[0] == CU_STREAM_NON_BLOCKING);

  mark();
  auto e = d.event_create();
  REQUIRE(e);
  one_call("cuEventCreate", 2000);
  CHECK(st.last_args[0] == CU_EVENT_DISABLE_TIMING);

  mark();
  REQUIRE(d.event_record(*e, *s));
  one_call("cuEventRecord", 2000);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*e));
  CHECK(st.last_args[1] == reinterpret_cast<std::uintptr_t>(*s));

  mark();
  REQUIRE(d.stream_wait_event(*s, *e));
  one_call("cuStreamWaitEvent", 3020);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*s));
  CHECK(st.last_args[1] == reinterpret_cast<std::uintptr_t>(*e));
  CHECK(st.last_args[2] == 0);

  mark();
  REQUIRE(d.event_synchronize(*e));
  one_call("cuEventSynchronize", 2000);
  mark();
  REQUIRE(d.stream_synchronize(*s));
  one_call("cuStreamSynchronize", 2000);

  // Queries: SUCCESS is true, NOT_READY is false, anything else an error.
  st.query_status = CUDA_SUCCESS;
  mark();
  CHECK(d.stream_query(*s).value() == true);
  one_call("cuStreamQuery", 2000);
  mark();
  CHECK(d.event_query(*e).value() == true);
  one_call("cuEventQuery", 2000);
  st.query_status = CUDA_ERROR_NOT_READY;
  mark();
  CHECK(d.stream_query(*s).value() == false);
  one_call("cuStreamQuery", 2000);
  mark();
  CHECK(d.event_query(*e).value() == false);
  one_call("cuEventQuery", 2000);
  mark();
  auto sid = d.stream_get_id(*s);
  REQUIRE(sid);
  one_call("cuStreamGetId", 12000);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*s));
  CHECK(*sid == reinterpret_cast<std::uintptr_t>(*s) * 7 + st.stream_id_salt);

  st.query_status = CUDA_ERROR_ILLEGAL_ADDRESS;
  auto faulted = d.stream_query(*s);
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().code() == errc::stream_fault);
  CHECK(faulted.error().message() == "cuStreamQuery failed with CUDA_ERROR_ILLEGAL_ADDRESS (700)");
  auto efaulted = d.event_query(*e);
  REQUIRE_FALSE(efaulted);
  CHECK(efaulted.error().code() == errc::stream_fault);
  st.query_status = CUDA_SUCCESS;

  mark();
  auto pool = d.device_default_mempool(*dev);
  REQUIRE(pool);
  one_call("cuDeviceGetDefaultMemPool", 11020);
  mark();
  REQUIRE(d.mempool_set_release_threshold(*pool, 0x123456789ull));
  one_call("cuMemPoolSetAttribute", 11020);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*pool));
  CHECK(st.last_args[1] == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  CHECK(st.last_args[2] == 0x123456789ull);
  mark();
  auto usage = d.mempool_usage(*pool);
  REQUIRE(usage);
  CHECK(st.calls.load() - before == 4);
  CHECK(last_symbol() == "cuMemPoolGetAttribute");
  CHECK(st.last_variant == 11020);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*pool));
  CHECK(usage->reserved == 0x1000ull * CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  CHECK(usage->reserved_high == 0x1000ull * CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
  CHECK(usage->used == 0x1000ull * CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  CHECK(usage->used_high == 0x1000ull * CU_MEMPOOL_ATTR_USED_MEM_HIGH);

  mark();
  REQUIRE(d.event_destroy(*e));
  one_call("cuEventDestroy", 4000);
  mark();
  REQUIRE(d.stream_destroy(*s));
  one_call("cuStreamDestroy", 4000);
  mark();
  REQUIRE(d.primary_ctx_release(*dev));
  one_call("cuDevicePrimaryCtxRelease", 11000);
}

TEST_CASE("the capture members call their entry points with the documented arguments",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  long before = 0;
  auto mark = [&] { before = st.calls.load(); };
  auto one_call = [&](const char* symbol, int variant) {
    CHECK(st.calls.load() - before == 1);
    CHECK(last_symbol() == symbol);
    CHECK(st.last_variant == variant);
  };
  auto s = d.stream_create();
  REQUIRE(s);
  const auto sp = reinterpret_cast<std::uintptr_t>(*s);

  // The fake never captures; the wrapper asks for status and id only.
  mark();
  auto info = d.stream_capture_info(*s);
  REQUIRE(info);
  one_call("cuStreamGetCaptureInfo", 11030);
  CHECK(st.last_args[0] == sp);
  CHECK(st.last_args[1] == 0);  // no graph
  CHECK(st.last_args[2] == 0);  // no dependencies
  CHECK(st.last_args[3] == 0);  // no count
  CHECK(info->status == CaptureStatus::none);
  CHECK(info->id == 0);

  // The mode is the thread's: each exchange returns the one set before, and another
  // thread starts from global.
  mark();
  auto was = d.exchange_capture_mode(CaptureMode::relaxed);
  REQUIRE(was);
  one_call("cuThreadExchangeStreamCaptureMode", 10010);
  CHECK(st.last_args[0] == CU_STREAM_CAPTURE_MODE_RELAXED);
  CHECK(*was == CaptureMode::global);
  CHECK(d.exchange_capture_mode(CaptureMode::per_thread).value() == CaptureMode::relaxed);
  CHECK(st.last_args[0] == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  std::optional<CaptureMode> other;
  std::thread([&] { other = d.exchange_capture_mode(CaptureMode::global).value(); }).join();
  CHECK(other == CaptureMode::global);
  CHECK(d.exchange_capture_mode(CaptureMode::global).value() == CaptureMode::per_thread);

  mark();
  REQUIRE(d.ctx_synchronize());
  one_call("cuCtxSynchronize", 2000);

  mark();
  REQUIRE(d.stream_begin_capture(*s, CaptureMode::per_thread));
  one_call("cuStreamBeginCapture", 10010);
  CHECK(st.last_args[0] == sp);
  CHECK(st.last_args[1] == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);

  mark();
  auto g = d.stream_end_capture(*s);
  REQUIRE(g);
  one_call("cuStreamEndCapture", 10000);
  CHECK(st.last_args[0] == sp);
  CHECK(*g != nullptr);

  mark();
  auto x = d.graph_instantiate(*g);
  REQUIRE(x);
  one_call("cuGraphInstantiateWithFlags", 11040);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*g));
  CHECK(st.last_args[1] == 0);  // flags

  mark();
  REQUIRE(d.graph_launch(*x, *s));
  one_call("cuGraphLaunch", 10000);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*x));
  CHECK(st.last_args[1] == sp);

  mark();
  REQUIRE(d.graph_exec_destroy(*x));
  one_call("cuGraphExecDestroy", 10000);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*x));
  mark();
  REQUIRE(d.graph_destroy(*g));
  one_call("cuGraphDestroy", 10000);
  CHECK(st.last_args[0] == reinterpret_cast<std::uintptr_t>(*g));
  REQUIRE(d.stream_destroy(*s));
}

TEST_CASE("the virtual memory members call their entry points with the documented arguments",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  static_assert(VirtualMemoryDriver<CudaDriver>);
  long before = 0;
  auto mark = [&] { before = st.calls.load(); };
  auto last_call = [&](const char* symbol, long calls) {
    CHECK(st.calls.load() - before == calls);
    CHECK(last_symbol() == symbol);
    CHECK(st.last_variant == 10020);
  };
  auto args = [&](std::initializer_list<unsigned long long> want) {
    std::size_t i = 0;
    for (unsigned long long w : want) {
      INFO("argument " << i);
      CHECK(st.last_args[i++] == w);
    }
  };

  // The support attribute first, then the minimum and the recommended granularity of
  // pinned memory on the device, with no shareable handle type.
  mark();
  auto g = d.mem_granularity(0);
  REQUIRE(g);
  CHECK(g->minimum == std::size_t{2} << 20);
  CHECK(g->recommended == std::size_t{4} << 20);
  last_call("cuMemGetAllocationGranularity", 3);
  args({CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_ALLOCATION_TYPE_PINNED,
        CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_HANDLE_TYPE_NONE});

  mark();
  auto va = d.mem_address_reserve(std::size_t{64} << 20, std::size_t{1} << 30);
  REQUIRE(va);
  CHECK(*va == 0x7000'0000'0000ull);
  last_call("cuMemAddressReserve", 1);
  args({std::uint64_t{64} << 20, std::uint64_t{1} << 30, 0, 0});  // no fixed address, flags 0

  mark();
  auto h = d.mem_create(std::size_t{2} << 20, 0);
  REQUIRE(h);
  last_call("cuMemCreate", 1);
  args({std::uint64_t{2} << 20, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, 0,
        CU_MEM_HANDLE_TYPE_NONE, 0});

  mark();
  REQUIRE(d.mem_map(*va + (std::uint64_t{2} << 20), std::size_t{2} << 20, *h));
  last_call("cuMemMap", 1);
  args({*va + (std::uint64_t{2} << 20), std::uint64_t{2} << 20, 0, *h, 0});  // offset 0, flags 0

  mark();
  REQUIRE(d.mem_set_access(*va, std::size_t{4} << 20, 0));
  last_call("cuMemSetAccess", 1);
  args({*va, std::uint64_t{4} << 20, 1, CU_MEM_LOCATION_TYPE_DEVICE, 0,
        CU_MEM_ACCESS_FLAGS_PROT_READWRITE});

  mark();
  REQUIRE(d.mem_unmap(*va, std::size_t{2} << 20));
  last_call("cuMemUnmap", 1);
  args({*va, std::uint64_t{2} << 20});

  mark();
  REQUIRE(d.mem_release(*h));
  last_call("cuMemRelease", 1);
  args({*h});

  mark();
  REQUIRE(d.mem_address_free(*va, std::size_t{64} << 20));
  last_call("cuMemAddressFree", 1);
  args({*va, std::uint64_t{64} << 20});

  // A device without virtual memory management is named, and not asked for granularity.
  st.zero_attribute = CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
  mark();
  auto none = d.mem_granularity(0);
  st.zero_attribute = -1;
  REQUIRE_FALSE(none);
  CHECK(st.calls.load() - before == 1);
  CHECK(last_symbol() == "cuDeviceGetAttribute");
  args({CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0});
  CHECK(none.error().code() == errc::driver_error);
  CHECK(none.error().driver_status() == CUDA_ERROR_NOT_SUPPORTED);
  CHECK_THAT(none.error().message(),
             Contains("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0"));
}

TEST_CASE("a driver without the virtual memory calls opens, and those members say so",
          "[.][novmm]") {
  const std::string lib = fake_path("FAKECUDA_NOVMM");
  ::setenv("XLOGRT_LIBCUDA", lib.c_str(), 1);
  auto opened = CudaDriver::open();
  REQUIRE(opened);
  CudaDriver& d = **opened;
  FakeCudaState& st = *state_of(lib);
  // The group is all or nothing: the fake lacks cuMemMap alone, and every member refuses.
  const detail::CudaApi& api = d.api();
  CHECK(api.cuMemCreate_ == nullptr);
  CHECK(api.cuMemMap_ == nullptr);
  CHECK(api.cuMemSetAccess_ == nullptr);
  const std::vector<std::pair<std::string, std::function<std::optional<error>()>>> calls = {
      {"cuMemGetAllocationGranularity", [&] { return error_of(d.mem_granularity(0)); }},
      {"cuMemAddressReserve", [&] { return error_of(d.mem_address_reserve(4096, 0)); }},
      {"cuMemAddressFree", [&] { return error_of(d.mem_address_free(1, 4096)); }},
      {"cuMemCreate", [&] { return error_of(d.mem_create(4096, 0)); }},
      {"cuMemRelease", [&] { return error_of(d.mem_release(1)); }},
      {"cuMemMap", [&] { return error_of(d.mem_map(1, 4096, 1)); }},
      {"cuMemUnmap", [&] { return error_of(d.mem_unmap(1, 4096)); }},
      {"cuMemSetAccess", [&] { return error_of(d.mem_set_access(1, 4096, 0)); }},
  };
  for (const auto& [symbol, call] : calls) {
    INFO(symbol);
    const long before = st.calls.load();
    auto err = call();
    REQUIRE(err.has_value());
    CHECK(st.calls.load() == before);  // libcuda was not called
    CHECK(err->code() == errc::driver_too_old);
    CHECK(err->driver_status() == 0);
    CHECK_THAT(err->message(), Contains(symbol + " was not called"));
    CHECK_THAT(err->message(), Contains("lacks cuMemMap (CUDA 10.2 ABI, not found)"));
    CHECK_THAT(err->message(), Contains(lib));
  }
  // Everything else works.
  auto n = d.device_count();
  REQUIRE(n);
  CHECK(*n == 1);
  auto s = d.stream_create();
  REQUIRE(s);
  CHECK(d.stream_destroy(*s));
}

TEST_CASE("memory, copies, fills, flag writes and host functions go through in order",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  auto s = d.stream_create();
  REQUIRE(s);
  auto pool = d.device_default_mempool(0);
  REQUIRE(pool);

  auto a = d.mem_alloc_async(64, *pool, *s);
  REQUIRE(a);
  CHECK(last_symbol() == "cuMemAllocFromPoolAsync");
  CHECK(st.last_args[0] == 64);
  auto b = d.mem_alloc(64);
  REQUIRE(b);
  CHECK(last_symbol() == "cuMemAlloc");
  CHECK(st.last_variant == 3020);

  unsigned char host[64];
  REQUIRE(d.memset_d8_async(*a, 0xAB, 64, *s));
  CHECK(st.last_args[1] == 0xAB);
  std::memset(host, 0, sizeof host);
  REQUIRE(d.memcpy_dtoh_async(host, *a, 64, *s));
  CHECK(st.last_variant == 3020);
  for (unsigned char c : host) REQUIRE(c == 0xAB);

  for (int i = 0; i < 64; ++i) host[i] = static_cast<unsigned char>(i);
  REQUIRE(d.memcpy_htod_async(*a, host, 64, *s));
  CHECK(st.last_variant == 3020);
  REQUIRE(d.memcpy_dtod_async(*b, *a, 64, *s));
  CHECK(st.last_variant == 3020);
  unsigned char back[64] = {};
  REQUIRE(d.memcpy_dtoh_async(back, *b, 64, *s));
  CHECK(std::memcmp(host, back, 64) == 0);

  REQUIRE(d.mem_free_async(*a, *s));
  CHECK(last_symbol() == "cuMemFreeAsync");
  REQUIRE(d.mem_free(*b));
  CHECK(last_symbol() == "cuMemFree");

  // A bogus pointer: the driver's status, named by the driver, and the call.
  auto bogus = d.mem_free(0xdead0000ull);
  REQUIRE_FALSE(bogus);
  CHECK(bogus.error().code() == errc::driver_error);
  CHECK(bogus.error().driver_status() == CUDA_ERROR_INVALID_VALUE);
  CHECK(bogus.error().message() == "cuMemFree failed with CUDA_ERROR_INVALID_VALUE (1)");

  // Mapped pinned memory and a flag write into it.
  auto flags = d.mem_host_alloc_mapped(4096);
  REQUIRE(flags);
  CHECK(last_symbol() == "cuMemHostAlloc");
  CHECK(st.last_args[0] == 4096);
  CHECK(st.last_args[1] == (CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  auto dptr = d.mem_host_device_pointer(*flags);
  REQUIRE(dptr);
  CHECK(st.last_variant == 3020);
  CHECK(st.last_args[1] == 0);  // flags must be 0
  REQUIRE(d.stream_write_value32(*s, *dptr + 8, 0xC0FFEEu));
  CHECK(last_symbol() == "cuStreamWriteValue32");
  CHECK(st.last_variant == 11070);
  CHECK(st.last_args[3] == CU_STREAM_WRITE_VALUE_DEFAULT);
  std::uint32_t word = 0;
  std::memcpy(&word, static_cast<char*>(*flags) + 8, sizeof word);
  CHECK(word == 0xC0FFEEu);
  REQUIRE(d.mem_host_free(*flags));
  CHECK(last_symbol() == "cuMemFreeHost");

  int ran = 0;
  REQUIRE(d.launch_host_func(*s, [](void* p) { ++*static_cast<int*>(p); }, &ran));
  CHECK(last_symbol() == "cuLaunchHostFunc");
  CHECK(ran == 1);
  REQUIRE(d.stream_destroy(*s));
}

TEST_CASE("every member reports a failed call by name, with the driver's status name",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  CUstream s = nullptr;
  CUevent e = nullptr;
  CUmemoryPool pool = nullptr;
  CUcontext ctx = nullptr;
  char buf[8];
  const std::vector<std::pair<std::string, std::function<std::optional<error>()>>> calls = {
      {"cuDeviceGetCount", [&] { return error_of(d.device_count()); }},
      {"cuDeviceGet", [&] { return error_of(d.device_get(0)); }},
      {"cuDeviceGetName", [&] { return error_of(d.device_name(0)); }},
      {"cuDeviceTotalMem", [&] { return error_of(d.device_total_mem(0)); }},
      {"cuDeviceGetAttribute",
       [&] { return error_of(d.device_attribute(0, DeviceAttr::multiprocessor_count)); }},
      {"cuDevicePrimaryCtxRetain", [&] { return error_of(d.primary_ctx_retain(0)); }},
      {"cuDevicePrimaryCtxRelease", [&] { return error_of(d.primary_ctx_release(0)); }},
      {"cuCtxGetCurrent", [&] { return error_of(d.ctx_make_current(ctx)); }},
      {"cuCtxSetCurrent",
       [&] {
         st.current_ctx = buf;  // another context is current
         return error_of(d.ctx_make_current(ctx));
       }},
      {"cuMemGetInfo", [&] { return error_of(d.mem_get_info()); }},
      {"cuStreamCreate", [&] { return error_of(d.stream_create()); }},
      {"cuStreamDestroy", [&] { return error_of(d.stream_destroy(s)); }},
      {"cuStreamSynchronize", [&] { return error_of(d.stream_synchronize(s)); }},
      {"cuStreamQuery", [&] { return error_of(d.stream_query(s)); }},
      {"cuStreamGetId", [&] { return error_of(d.stream_get_id(s)); }},
      {"cuStreamWaitEvent", [&] { return error_of(d.stream_wait_event(s, e)); }},
      {"cuEventCreate", [&] { return error_of(d.event_create()); }},
      {"cuEventDestroy", [&] { return error_of(d.event_destroy(e)); }},
      {"cuEventRecord", [&] { return error_of(d.event_record(e, s)); }},
      {"cuEventQuery", [&] { return error_of(d.event_query(e)); }},
      {"cuEventSynchronize", [&] { return error_of(d.event_synchronize(e)); }},
      {"cuDeviceGetDefaultMemPool", [&] { return error_of(d.device_default_mempool(0)); }},
      {"cuMemPoolSetAttribute",
       [&] { return error_of(d.mempool_set_release_threshold(pool, 1)); }},
      {"cuMemPoolGetAttribute", [&] { return error_of(d.mempool_usage(pool)); }},
      {"cuMemPoolTrimTo", [&] { return error_of(d.mempool_trim_to(pool, 0)); }},
      {"cuMemPoolCreate", [&] { return error_of(d.mempool_create(0)); }},
      {"cuMemPoolDestroy", [&] { return error_of(d.mempool_destroy(pool)); }},
      {"cuMemAllocFromPoolAsync", [&] { return error_of(d.mem_alloc_async(16, pool, s)); }},
      {"cuMemFreeAsync", [&] { return error_of(d.mem_free_async(1, s)); }},
      {"cuMemAlloc", [&] { return error_of(d.mem_alloc(16)); }},
      {"cuMemFree", [&] { return error_of(d.mem_free(1)); }},
      {"cuMemHostAlloc", [&] { return error_of(d.mem_host_alloc_mapped(16)); }},
      {"cuMemHostGetDevicePointer", [&] { return error_of(d.mem_host_device_pointer(buf)); }},
      {"cuMemFreeHost", [&] { return error_of(d.mem_host_free(buf)); }},
      {"cuMemsetD8Async", [&] { return error_of(d.memset_d8_async(1, 0, 1, s)); }},
      {"cuMemcpyHtoDAsync", [&] { return error_of(d.memcpy_htod_async(1, buf, 1, s)); }},
      {"cuMemcpyDtoHAsync", [&] { return error_of(d.memcpy_dtoh_async(buf, 1, 1, s)); }},
      {"cuMemcpyDtoDAsync", [&] { return error_of(d.memcpy_dtod_async(1, 2, 1, s)); }},
      {"cuStreamWriteValue32", [&] { return error_of(d.stream_write_value32(s, 1, 1)); }},
      {"cuLaunchHostFunc",
       [&] { return error_of(d.launch_host_func(s, [](void*) {}, nullptr)); }},
      {"cuStreamGetCaptureInfo", [&] { return error_of(d.stream_capture_info(s)); }},
      {"cuThreadExchangeStreamCaptureMode",
       [&] { return error_of(d.exchange_capture_mode(CaptureMode::global)); }},
      {"cuCtxSynchronize", [&] { return error_of(d.ctx_synchronize()); }},
      {"cuStreamBeginCapture",
       [&] { return error_of(d.stream_begin_capture(s, CaptureMode::global)); }},
      {"cuStreamEndCapture", [&] { return error_of(d.stream_end_capture(s)); }},
      {"cuGraphInstantiateWithFlags", [&] { return error_of(d.graph_instantiate(nullptr)); }},
      {"cuGraphLaunch", [&] { return error_of(d.graph_launch(nullptr, s)); }},
      {"cuGraphDestroy", [&] { return error_of(d.graph_destroy(nullptr)); }},
      {"cuGraphExecDestroy", [&] { return error_of(d.graph_exec_destroy(nullptr)); }},
      {"cuMemGetAllocationGranularity", [&] { return error_of(d.mem_granularity(0)); }},
      {"cuMemAddressReserve", [&] { return error_of(d.mem_address_reserve(4096, 0)); }},
      {"cuMemAddressFree", [&] { return error_of(d.mem_address_free(1, 4096)); }},
      {"cuMemCreate", [&] { return error_of(d.mem_create(4096, 0)); }},
      {"cuMemRelease", [&] { return error_of(d.mem_release(1)); }},
      {"cuMemMap", [&] { return error_of(d.mem_map(1, 4096, 1)); }},
      {"cuMemUnmap", [&] { return error_of(d.mem_unmap(1, 4096)); }},
      {"cuMemSetAccess", [&] { return error_of(d.mem_set_access(1, 4096, 0)); }},
  };
  for (const auto& [symbol, call] : calls) {
    INFO(symbol);
    std::strncpy(st.fail_symbol, symbol.c_str(), sizeof st.fail_symbol - 1);
    st.fail_status = 222;  // a status only the (fake) driver has a name for
    auto err = call();
    std::memset(st.fail_symbol, 0, sizeof st.fail_symbol);
    REQUIRE(err.has_value());
    CHECK(err->code() == errc::driver_error);
    CHECK(err->driver_status() == 222);
    CHECK(err->message() == symbol + " failed with CUDA_ERROR_FAKE_222 (222)");
  }

  // Statuses with known consequences map to their errc.
  std::strncpy(st.fail_symbol, "cuMemAlloc", sizeof st.fail_symbol - 1);
  st.fail_status = CUDA_ERROR_OUT_OF_MEMORY;
  auto oom = d.mem_alloc(1ull << 40);
  std::memset(st.fail_symbol, 0, sizeof st.fail_symbol);
  REQUIRE_FALSE(oom);
  CHECK(oom.error().code() == errc::out_of_memory);
  CHECK(oom.error().message() == "cuMemAlloc failed with CUDA_ERROR_OUT_OF_MEMORY (2)");
}

TEST_CASE("StreamPool knows an adopted stream by its driver id: a reused handle is a new stream, on the old one's id",
          "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  auto pool = StreamPool<CudaDriver>::open(d, 0, 2);
  REQUIRE(pool);
  auto& p = **pool;
  auto handle = d.stream_create();
  REQUIRE(handle);
  auto first = p.adopt(*handle);
  REQUIRE(first);
  CHECK(*first == StreamId{2});
  CHECK(*p.adopt(*handle) == *first);
  // The driver destroys the stream and hands its handle to a new one, with a new id:
  // the old stream is gone, and the new one takes its StreamId after a synchronisation.
  st.stream_id_salt += 1;
  auto second = p.adopt(*handle);
  REQUIRE(second);
  CHECK(*second == StreamId{2});
  CHECK(p.recycled() == 1);
  CHECK(*p.get(*second) == *handle);
  CHECK(*p.adopt(*handle) == *second);
  st.stream_id_salt -= 1;
  std::strncpy(st.fail_symbol, "cuStreamGetId", sizeof st.fail_symbol - 1);
  st.fail_status = CUDA_ERROR_INVALID_HANDLE;
  auto refused = p.adopt(*handle);
  st.fail_symbol[0] = 0;
  REQUIRE_FALSE(refused);
  CHECK(refused.error().driver_status() == CUDA_ERROR_INVALID_HANDLE);
  CHECK(p.size() == 3);
}

TEST_CASE("status_name asks the driver, and falls back without calling it", "[.][wrappers]") {
  CudaDriver& d = ok_driver();
  FakeCudaState& st = ok_state();
  CHECK(d.status_name(222) == "CUDA_ERROR_FAKE_222");
  CHECK(d.status_name(CUDA_ERROR_NOT_READY) == "CUDA_ERROR_NOT_READY");
  // Unknown to the driver: status.hpp's name, or empty.
  CHECK(d.status_name(status::launch_failed) == "CUDA_ERROR_LAUNCH_FAILED");
  CHECK(d.status_name(998).empty());
  // Not a CUresult at all: no call is made.
  const long before = st.calls.load();
  CHECK(d.status_name(-5).empty());
  CHECK(d.status_name(4242).empty());
  CHECK(st.calls.load() == before);
}
