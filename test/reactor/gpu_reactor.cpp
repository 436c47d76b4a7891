// SPDX-License-Identifier: Apache-2.0
// The completion reactor on a real GPU: the scenarios of the SimDriver suite on
// CudaDriver (device 0), plus a 100,000-round ping-pong.
//
// Exits 77 (Meson's SKIP) when CudaDriver::open() fails or there is no device: it never
// passes without running. Fault injection is not repeated here: a real fault poisons the
// whole context, and with it every later test of the process.

#define CATCH_CONFIG_RUNNER
#include "../gpu_main.hpp"
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <future>
#include <string>
#include <thread>

#include "scenarios.hpp"
#include "xlogrt/driver/cuda_driver.hpp"
#include "xlogrt/reactor/flags.hpp"
#include "xlogrt/reactor/pinned_flags.hpp"

using namespace xlogrt;
using namespace reactor_rt;
using namespace std::chrono_literals;

static_assert(SlotFlags<PinnedFlags<CudaDriver>, StdAtomics>);

namespace {

CudaDriver* g_driver = nullptr;

ReactorOptions options(std::size_t slots = 1024) {
  ReactorOptions o;
  o.slots = slots;
  return o;
}

}  // namespace

TEST_CASE("gpu: every waiter completes exactly once: 8 threads on 4 streams", "[gpu]") {
  Rig<CudaDriver> rig(*g_driver, options());
  REQUIRE(rig.reactor->uses_flag_writes());
  many_waiters(rig, 8, 2000);
}

TEST_CASE("gpu: every waiter completes exactly once with 4 slots", "[gpu]") {
  Rig<CudaDriver> rig(*g_driver, options(4));
  many_waiters(rig, 8, 1000);
  CHECK(rig.reactor->counters().fallbacks > 0);
}

TEST_CASE("gpu: every waiter completes exactly once on host functions only", "[gpu]") {
  ReactorOptions o = options();
  o.flag_writes = false;
  Rig<CudaDriver> rig(*g_driver, o);
  REQUIRE_FALSE(rig.reactor->uses_flag_writes());
  many_waiters(rig, 8, 500);
}

TEST_CASE("gpu: destroying the reactor cancels every wait in flight, once", "[gpu]") {
  SECTION("flag writes") {
    Rig<CudaDriver> rig(*g_driver, options());
    shutdown_in_flight(rig, 300);
  }
  SECTION("flag writes and host functions (8 slots)") {
    // 8 flag writes and 32 host functions: the driver queues that many behind the held
    // one without blocking the enqueue (see shutdown_in_flight).
    Rig<CudaDriver> rig(*g_driver, options(8));
    shutdown_in_flight(rig, 40);
  }
}

TEST_CASE("gpu: coroutines resume on the scanner, or on the executor named", "[gpu]") {
  Rig<CudaDriver> rig(*g_driver, options());
  coroutines_resume_where_asked(rig);
}

TEST_CASE("gpu: the scanner parks when idle and a registration wakes it", "[gpu]") {
  Rig<CudaDriver> rig(*g_driver, options());
  parks_when_idle_and_wakes(rig);
}

TEST_CASE("gpu: ping-pong, 100,000 rounds", "[gpu]") {
  Rig<CudaDriver> rig(*g_driver, options());
  const auto t0 = std::chrono::steady_clock::now();
  ping_pong(rig, 100000);
  const auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0);
  std::printf("ping-pong: 100000 rounds, %.2f us per round (memset + when_done_future + get)\n",
              us.count() / 100000);
}

TEST_CASE("gpu: a point's waiters, attached from many threads while it fires, complete once",
          "[gpu][point]") {
  Rig<CudaDriver> rig(*g_driver, options());
  point_many_attachers(rig, 200, 8, 64);
}

TEST_CASE("gpu: waiters attached after a point fired complete at once", "[gpu][point]") {
  Rig<CudaDriver> rig(*g_driver, options());
  point_attach_after_fire(rig);
}

// Points on the host-function path, with no slots at all. (The SimDriver suite also runs
// it with the slots exhausted by waits behind a held host function; on CUDA that hold
// would stop every host function of the process, the points' included.)
TEST_CASE("gpu: a point on the host-function path", "[gpu][point]") {
  ReactorOptions o = options();
  o.flag_writes = false;
  Rig<CudaDriver> rig(*g_driver, o);
  point_on_fallback_path(rig, 100, 8, 32);
}

TEST_CASE("gpu: destroying the reactor cancels the waiters of an armed point", "[gpu][point]") {
  Rig<CudaDriver> rig(*g_driver, options());
  point_cancelled_by_shutdown(rig, 200);
}

// arm() makes no context current: the flag write and the host function name a stream,
// which carries its context. Arms from a thread that has never had a context, on both
// paths, and sees every wait complete.
TEST_CASE("gpu: a thread with no current context arms waits on both paths", "[gpu][context]") {
  for (const bool flags : {true, false}) {
    ReactorOptions o = options();
    o.flag_writes = flags;
    Rig<CudaDriver> rig(*g_driver, o);
    REQUIRE(rig.reactor->uses_flag_writes() == flags);
    bool no_context = false;
    int completed = 0;
    std::string why;
    std::thread fresh([&] {
      CUcontext c = nullptr;
      no_context = g_driver->api().cuCtxGetCurrent_(&c) == CUDA_SUCCESS && c == nullptr;
      for (std::uint32_t s = 0; s < 4; ++s) {
        auto f = rig.reactor->when_done_future(StreamId{s});
        if (!f) return void(why = f.error().what());
        if (f->wait_for(10s) != std::future_status::ready) return void(why = "a wait did not complete");
        f->get();
        ++completed;
      }
    });
    fresh.join();
    INFO((flags ? "flag writes: " : "host functions: ") << why);
    CHECK(no_context);
    CHECK(completed == 4);
  }
}

int main(int argc, char** argv) { return xlogrt::testing::run_gpu_tests(argc, argv, g_driver); }
