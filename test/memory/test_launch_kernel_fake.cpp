// SPDX-License-Identifier: Apache-2.0
// The CUfunction form of launch() (memory/launch_kernel.hpp) on CudaDriver, against the
// working fake libcuda of test/driver (XLOGRT_LIBCUDA names it; meson.build sets it), so
// it runs without a GPU: which runtimes have it, argument checks made before anything is
// enqueued, cuLaunchKernel's status mapped to an error, and the launch placed between
// prepare's wait and finish's record, so that the free waits for the kernel.
//
// The fake has no queue, so ordering is observed through the last call that reached it
// (on a failure, that is cuGetErrorName naming the status) and by making one entry
// point fail.

#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../driver/fakecuda.hpp"
#include "xlogrt/memory/launch_kernel.hpp"
#include "xlogrt/sim/sim_driver.hpp"
#include "xlogrt/runtime.hpp"

using namespace xlogrt;
using Catch::Matchers::Contains;

namespace {

using CudaRt = DeviceRuntime<AsyncCuda<CudaDriver>>;
using SimRt = DeviceRuntime<AsyncCuda<SimDriver>>;

template <class Rt>
concept CanLaunchKernel = requires(Rt& rt, const KernelLaunch& k, BufferUse u) { launch(rt, StreamId{}, k, u); };
template <class Rt, class F>
concept CanLaunchCallable = requires(Rt& rt, F f, BufferUse u) { launch(rt, StreamId{}, f, u); };

// The KernelLaunch form exists for runtimes on CudaDriver only; the callable form stays
// what it was, on every driver.
static_assert(CanLaunchKernel<CudaRt>);
static_assert(!CanLaunchKernel<SimRt>);
static_assert(CanLaunchCallable<CudaRt, int (*)(CUstream)>);
static_assert(CanLaunchCallable<SimRt, void (*)(SimDriver::stream_t)>);
static_assert(!CanLaunchCallable<SimRt, KernelLaunch>);

constexpr StreamId A{0};
constexpr StreamId B{1};

FakeCudaState& fake() {
  static FakeCudaState* s = [] {
    const char* path = std::getenv("XLOGRT_LIBCUDA");
    INFO("XLOGRT_LIBCUDA must name test/driver's fake libcuda (meson.build sets it)");
    REQUIRE(path != nullptr);
    void* lib = ::dlopen(path, RTLD_NOW | RTLD_NOLOAD);  // loaded by CudaDriver::open
    REQUIRE(lib != nullptr);
    auto get = std::bit_cast<FakeCudaState* (*)()>(::dlsym(lib, "fakecuda_state"));
    REQUIRE(get != nullptr);
    return get();
  }();
  return *s;
}

CudaRt& runtime() {
  auto rt = CudaRt::try_get(0);
  if (!rt) FAIL(rt.error().what());
  (void)fake();
  return **rt;
}

/// Makes `symbol` fail with `status` until the guard is destroyed.
struct FailGuard {
  FailGuard(const char* symbol, int status) {
    std::strncpy(fake().fail_symbol, symbol, sizeof fake().fail_symbol - 1);
    fake().fail_status = status;
  }
  ~FailGuard() {
    fake().fail_symbol[0] = '\0';
    fake().fail_status = 0;
  }
  FailGuard(const FailGuard&) = delete;
  FailGuard& operator=(const FailGuard&) = delete;
};

std::string last_symbol() { return fake().last_symbol; }

// Any non-null handle: the fake never dereferences it.
CUfunction some_function() { return std::bit_cast<CUfunction>(std::uintptr_t{0x4000}); }

/// Whether the block's free has to wait for a use on another stream: with every
/// cuStreamWaitEvent failing, such a free fails (and leaves the block with the caller);
/// one that waits for nothing succeeds. Frees the block either way.
bool free_waits(CudaRt& rt, DeviceBlock& b) {
  bool waited = false;
  {
    FailGuard g("cuStreamWaitEvent", status::invalid_value);
    auto r = rt.deallocate(std::move(b));
    waited = !r;
  }
  if (waited) REQUIRE(rt.deallocate(std::move(b)).has_value());
  return waited;
}

}  // namespace

TEST_CASE("a null function or a zero dimension is invalid_argument, before anything is enqueued",
          "[launch_kernel]") {
  CudaRt& rt = runtime();
  auto b = rt.allocate(4096, A);
  REQUIRE(b.has_value());
  void* args[] = {nullptr};
  const struct {
    KernelLaunch k;
    const char* says;
  } cases[] = {
      {KernelLaunch{nullptr, {4}, {256}, 0, args}, "KernelLaunch::function is null"},
      {KernelLaunch{some_function(), {0}, {256}, 0, args}, "dimension is 0"},
      {KernelLaunch{some_function(), {4, 1, 0}, {256}, 0, args}, "dimension is 0"},
      {KernelLaunch{some_function(), {4}, {0}, 0, args}, "dimension is 0"},
      {KernelLaunch{some_function(), {4}, {256, 0, 1}, 0, args}, "dimension is 0"},
  };
  for (const auto& c : cases) {
    // A read on B of a block written on A: a prepare would record and wait.
    const long calls = fake().calls.load();
    auto r = launch(rt, B, c.k, read(*b));
    REQUIRE_FALSE(r);
    INFO(r.error().what());
    CHECK(r.error().code() == errc::invalid_argument);
    CHECK_THAT(r.error().message(), Contains(c.says));
    CHECK_THAT(r.error().message(), Contains("on stream 1 of ordinal 0"));
    CHECK(fake().calls.load() == calls);  // not a single driver call
  }
  CHECK_FALSE(free_waits(rt, *b));  // and no use was recorded
}

TEST_CASE("cuLaunchKernel's failure is its status, and records no use", "[launch_kernel]") {
  CudaRt& rt = runtime();
  for (int st : {status::launch_failed, status::invalid_value}) {
    auto b = rt.allocate(4096, A);
    REQUIRE(b.has_value());
    result<void> r;
    {
      FailGuard g("cuLaunchKernel", st);
      r = launch(rt, B, KernelLaunch{some_function(), {8, 2}, {128}, 512, nullptr}, read(*b));
    }
    REQUIRE_FALSE(r);
    INFO(r.error().what());
    CHECK(r.error().code() == (st == status::launch_failed ? errc::stream_fault : errc::driver_error));
    CHECK(r.error().driver_status() == st);
    CHECK_THAT(r.error().message(), Contains("cuLaunchKernel failed with"));
    CHECK_THAT(r.error().message(), Contains("grid 8x2x1, block 128x1x1, 512 B dynamic shared memory"));
    CHECK_THAT(r.error().message(), Contains("on stream 1 of ordinal 0"));
    // Naming the status was the last call: no finish after the failed enqueue.
    CHECK(last_symbol() == "cuGetErrorName");
    CHECK(fake().last_args[0] == static_cast<unsigned long long>(st));
    CHECK_FALSE(free_waits(rt, *b));            // the free does not wait for a use that never was
  }
}

TEST_CASE("a failed prepare enqueues no kernel", "[launch_kernel]") {
  CudaRt& rt = runtime();
  auto b = rt.allocate(4096, A);
  REQUIRE(b.has_value());
  result<void> r;
  {
    // B must wait for the allocation on A: that wait fails.
    FailGuard g("cuStreamWaitEvent", status::invalid_value);
    r = launch(rt, B, KernelLaunch{some_function(), {1}, {32}, 0, nullptr}, read(*b));
  }
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Contains("cuStreamWaitEvent"));
  // Naming the wait's status was the last call: no cuLaunchKernel after it.
  CHECK(last_symbol() == "cuGetErrorName");
  CHECK(fake().last_args[0] == static_cast<unsigned long long>(status::invalid_value));
  REQUIRE(rt.deallocate(std::move(*b)).has_value());
}

TEST_CASE("a kernel launched on another stream is waited for by the free", "[launch_kernel]") {
  CudaRt& rt = runtime();
  auto sb = rt.stream(B);
  REQUIRE(sb.has_value());
  int value = 7;
  void* args[] = {&value};

  SECTION("a read on B: finish records it on B, and the free on A waits for it") {
    auto b = rt.allocate(4096, A);
    REQUIRE(b.has_value());
    REQUIRE(launch(rt, A, KernelLaunch{some_function(), {4}, {256}, 0, args}, write(*b)).has_value());
    REQUIRE(launch(rt, B, KernelLaunch{some_function(), {4}, {256}, 0, args}, read(*b)).has_value());
    CHECK(last_symbol() == "cuEventRecord");
    CHECK(fake().last_args[1] == std::bit_cast<std::uintptr_t>(*sb));
    CHECK(free_waits(rt, *b));
  }
  SECTION("work on the block's own stream only: the free waits for nothing") {
    auto b = rt.allocate(4096, A);
    REQUIRE(b.has_value());
    REQUIRE(launch(rt, A, KernelLaunch{some_function(), {4}, {256}, 0, args}, write(*b)).has_value());
    REQUIRE(launch(rt, A, KernelLaunch{some_function(), {4}, {256}, 0, args}, read(*b)).has_value());
    CHECK_FALSE(free_waits(rt, *b));
  }
  SECTION("no buffer argument: just the launch") {
    REQUIRE(launch(rt, B, KernelLaunch{some_function(), {1}, {1}, 0, nullptr}).has_value());
    CHECK(last_symbol() == "cuLaunchKernel");
  }
  SECTION("an unknown stream is unknown_stream") {
    auto r = launch(rt, StreamId{200}, KernelLaunch{some_function(), {1}, {1}, 0, nullptr});
    REQUIRE_FALSE(r);
    CHECK(r.error().code() == errc::unknown_stream);
  }
}

TEST_CASE("the callable form still works on CudaDriver runtimes, next to the KernelLaunch form",
          "[launch_kernel]") {
  CudaRt& rt = runtime();
  auto b = rt.allocate(4096, A);
  REQUIRE(b.has_value());
  auto sb = rt.stream(B);
  REQUIRE(sb.has_value());
  CUstream seen = nullptr;
  REQUIRE(launch(rt, B, [&](CUstream s) { seen = s; return CUDA_SUCCESS; }, read(*b)).has_value());
  CHECK(seen == *sb);
  auto r = launch(rt, B, [](CUstream) { return CUDA_ERROR_INVALID_VALUE; }, read(*b));
  REQUIRE_FALSE(r);
  CHECK(r.error().driver_status() == static_cast<int>(CUDA_ERROR_INVALID_VALUE));
  CHECK(free_waits(rt, *b));  // the first launch's read, recorded
}
