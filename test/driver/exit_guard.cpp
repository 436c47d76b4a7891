// SPDX-License-Identifier: Apache-2.0
// Once the process has begun to exit, no CudaDriver call reaches libcuda (here the fake
// of fakecuda.cpp, which counts every call).
//
// Not a Catch2 test: what it checks happens after main has returned, in exit handlers.
// Those run in reverse order of registration, which the test uses:
//   after_flag   registered in main before open()  runs last: the exit flag is set, so
//                every member must return shutting_down and the fake must see no call;
//   (the flag)   registered by open()               sets the flag;
//   before_flag  registered in main after open()   runs first: the flag is still clear,
//                and a call must still reach the driver (proves the counter counts).
// main itself returns 3; only after_flag's _exit(0) turns the run into a pass, so the
// test cannot pass by its checks not running.

#include <dlfcn.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fakecuda.hpp"
#include "xlogrt/driver/cuda_driver.hpp"

using namespace xlogrt;

namespace {

int failures = 0;
FakeCudaState* fake = nullptr;
CudaDriver* drv = nullptr;
bool before_flag_ran = false;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <class T>
void check_shutting_down(result<T> r, const char* what) {
  const bool refused = !r && r.error().code() == errc::shutting_down;
  check(refused, std::string(what) + " returns shutting_down" +
                     (r ? std::string(" (it succeeded)")
                        : refused ? std::string() : " (got " + r.error().what() + ")"));
}

void before_flag() {
  check(!detail::process_exiting(), "exit handlers registered after open() run before the flag");
  const long calls = fake->calls.load();
  auto n = drv->device_count();
  check(n.has_value() && fake->calls.load() == calls + 1,
        "before the flag is set, a call still reaches the driver");
  before_flag_ran = true;
}

void after_flag() {
  if (fake == nullptr || drv == nullptr) ::_exit(1);  // main failed before the checks
  check(before_flag_ran, "the earlier exit handler ran first");
  check(detail::process_exiting(), "the exit flag is set");
  const long calls = fake->calls.load();
  CudaDriver& d = *drv;
  CUstream s = nullptr;
  CUevent e = nullptr;
  char host[16] = {};

  check_shutting_down(CudaDriver::open(), "open");
  check_shutting_down(d.device_count(), "device_count");
  check_shutting_down(d.device_get(0), "device_get");
  check_shutting_down(d.device_name(0), "device_name");
  check_shutting_down(d.device_total_mem(0), "device_total_mem");
  check_shutting_down(d.device_attribute(0, DeviceAttr::multiprocessor_count),
                      "device_attribute");
  check_shutting_down(d.primary_ctx_retain(0), "primary_ctx_retain");
  check_shutting_down(d.primary_ctx_release(0), "primary_ctx_release");
  check_shutting_down(d.ctx_make_current(nullptr), "ctx_make_current");
  check_shutting_down(d.mem_get_info(), "mem_get_info");
  check_shutting_down(d.stream_create(), "stream_create");
  check_shutting_down(d.stream_destroy(s), "stream_destroy");
  check_shutting_down(d.stream_synchronize(s), "stream_synchronize");
  check_shutting_down(d.stream_query(s), "stream_query");
  check_shutting_down(d.stream_get_id(s), "stream_get_id");
  check_shutting_down(d.stream_wait_event(s, e), "stream_wait_event");
  check_shutting_down(d.event_create(), "event_create");
  check_shutting_down(d.event_destroy(e), "event_destroy");
  check_shutting_down(d.event_record(e, s), "event_record");
  check_shutting_down(d.event_query(e), "event_query");
  check_shutting_down(d.event_synchronize(e), "event_synchronize");
  check_shutting_down(d.device_default_mempool(0), "device_default_mempool");
  check_shutting_down(d.mempool_set_release_threshold(nullptr, 0), "mempool_set_release_threshold");
  check_shutting_down(d.mem_alloc_async(16, nullptr, s), "mem_alloc_async");
  check_shutting_down(d.mem_free_async(16, s), "mem_free_async");
  check_shutting_down(d.mem_alloc(16), "mem_alloc");
  check_shutting_down(d.mem_free(16), "mem_free");
  check_shutting_down(d.mem_host_alloc_mapped(16), "mem_host_alloc_mapped");
  check_shutting_down(d.mem_host_device_pointer(host), "mem_host_device_pointer");
  check_shutting_down(d.mem_host_free(host), "mem_host_free");
  check_shutting_down(d.memset_d8_async(16, 0, 1, s), "memset_d8_async");
  check_shutting_down(d.memcpy_htod_async(16, host, 1, s), "memcpy_htod_async");
  check_shutting_down(d.memcpy_dtoh_async(host, 16, 1, s), "memcpy_dtoh_async");
  check_shutting_down(d.memcpy_dtod_async(16, 32, 1, s), "memcpy_dtod_async");
  check_shutting_down(d.stream_write_value32(s, 16, 1), "stream_write_value32");
  check_shutting_down(d.launch_host_func(s, [](void*) {}, nullptr), "launch_host_func");
  check_shutting_down(d.stream_capture_info(s), "stream_capture_info");
  check_shutting_down(d.exchange_capture_mode(CaptureMode::relaxed), "exchange_capture_mode");
  check_shutting_down(d.ctx_synchronize(), "ctx_synchronize");
  check_shutting_down(d.stream_begin_capture(s, CaptureMode::global), "stream_begin_capture");
  check_shutting_down(d.stream_end_capture(s), "stream_end_capture");
  check_shutting_down(d.graph_instantiate(nullptr), "graph_instantiate");
  check_shutting_down(d.graph_launch(nullptr, s), "graph_launch");
  check_shutting_down(d.graph_destroy(nullptr), "graph_destroy");
  check_shutting_down(d.graph_exec_destroy(nullptr), "graph_exec_destroy");

  auto free_err = d.mem_free_async(16, s);
  check(!free_err && free_err.error().message().find("cuMemFreeAsync was not called") == 0,
        "the refusal names the driver call it did not make");
  check(d.status_name(1) == "CUDA_ERROR_INVALID_VALUE",
        "status_name answers from status.hpp without the driver");
  check(fake->calls.load() == calls, "no call reached the driver after the flag was set");

  std::printf("%d failure(s)\n", failures);
  std::fflush(stdout);
  ::_exit(failures == 0 ? 0 : 1);  // the verdict; exit() may not be called from here
}

}  // namespace

int main() {
  std::atexit(after_flag);  // before open(): runs after the flag handler

  const char* ok = std::getenv("FAKECUDA_OK");
  if (ok == nullptr) {
    std::printf("FAIL FAKECUDA_OK must name the fake libcuda (set by meson.build)\n");
    return 1;
  }
  ::setenv("XLOGRT_LIBCUDA", ok, 1);
  auto d = CudaDriver::open();
  if (!d) {
    std::printf("FAIL open: %s\n", d.error().what().c_str());
    return 1;
  }
  drv = *d;
  void* lib = ::dlopen(ok, RTLD_NOW | RTLD_NOLOAD);
  auto get = lib ? std::bit_cast<FakeCudaState* (*)()>(::dlsym(lib, "fakecuda_state")) : nullptr;
  if (get == nullptr) {
    std::printf("FAIL the fake libcuda is not loaded\n");
    return 1;
  }
  fake = get();
  check(!detail::process_exiting(), "the exit flag is clear while main runs");

  std::atexit(before_flag);  // after open(): runs before the flag handler
  return 3;                  // only after_flag may turn this into a pass
}
