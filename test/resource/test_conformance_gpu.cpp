// SPDX-License-Identifier: Apache-2.0
// The conformance suite over every stack of the registry (stack_registry.hpp) and the
// runtime's contract, on the real driver. Exits 77 (Meson's SKIP) when the machine has no
// CUDA driver or no device; never passes without running.

#define CATCH_CONFIG_RUNNER
#include "../gpu_main.hpp"
#include "conformance.hpp"
#include "stack_registry.hpp"

#include <cstdio>
#include <string>
#include <thread>

#include <xlogrt/runtime.hpp>

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {
CudaDriver* gpu = nullptr;
}

using GuardedStack = Entry<DebugGuard<AsyncCuda<CudaDriver>>>;

TEST_CASE("DebugGuard catches a real overrun on the device, and not a clean block", "[gpu][debug_guard]") {
  Rig<GuardedStack> rig(*gpu);
  auto& r = *rig.stack;
  auto clean = r.allocate(4096, StreamId{1}, AllocTag{3});
  REQUIRE(clean.has_value());
  auto s = *rig.streams->get(StreamId{1});
  REQUIRE(rig.driver().memset_d8_async(clean->ptr(), 0x11, 4096, s).has_value());
  REQUIRE(r.deallocate(std::move(*clean)).has_value());

  auto b = r.allocate(4096, StreamId{1}, AllocTag{3});
  REQUIRE(b.has_value());
  // The device writes 4096 + 8 bytes: 8 bytes into the back guard.
  REQUIRE(rig.driver().memset_d8_async(b->ptr(), 0x22, 4096 + 8, s).has_value());
  auto e = r.deallocate(std::move(*b));
  REQUIRE_FALSE(e);
  CHECK(e.error().code() == errc::guard_corrupted);
  INFO(e.error().message());
  CHECK(e.error().message().find("back") != std::string::npos);
  REQUIRE(r.reap_pending().has_value());
  CHECK(r.bytes_outstanding() == 0);  // freed all the same
}

TEMPLATE_LIST_TEST_CASE("resource conformance on CudaDriver", "[gpu][conformance]", AllStacks<CudaDriver>) {
  conformance_suite<TestType>(*gpu);
}

TEST_CASE("the caching layer keeps a held stream's blocks from other streams on the GPU", "[gpu][cached]") {
  Rig<Entry<Cached<AsyncCuda<CudaDriver>>>> rig(*gpu);
  auto& r = *rig.stack;
  auto s0 = *rig.streams->get(StreamId{0});
  std::atomic<bool> release{false};
  // Stream 0 is held by a host function until the test lets it go.
  REQUIRE(rig.driver().launch_host_func(s0, [](void* p) {
    while (!static_cast<std::atomic<bool>*>(p)->load()) std::this_thread::yield();
  }, &release).has_value());
  std::vector<std::uint64_t> held;
  std::vector<DeviceBlock> blocks;
  for (int i = 0; i < 40; ++i) {
    auto b = r.allocate(1 << 16, StreamId{0}, AllocTag{});
    REQUIRE(b.has_value());
    REQUIRE(rig.driver().memset_d8_async(b->ptr(), 0x5A, 1 << 16, s0).has_value());
    held.push_back(b->ptr());
    blocks.push_back(std::move(*b));
  }
  for (auto& b : blocks) REQUIRE(r.deallocate(std::move(b)).has_value());
  blocks.clear();
  for (int i = 0; i < 40; ++i) {
    auto b = r.allocate(1 << 16, StreamId{1}, AllocTag{});
    REQUIRE(b.has_value());
    CHECK(std::find(held.begin(), held.end(), b->ptr()) == held.end());
    blocks.push_back(std::move(*b));
  }
  CHECK(r.stats().cross_stream_moves == 0);
  release.store(true);
  REQUIRE(rig.driver().stream_synchronize(s0).has_value());
  bool came_back = false;
  for (int i = 0; i < 60 && !came_back; ++i) {
    auto b = r.allocate(1 << 16, StreamId{2}, AllocTag{});
    REQUIRE(b.has_value());
    came_back = std::find(held.begin(), held.end(), b->ptr()) != held.end();
    blocks.push_back(std::move(*b));
  }
  CHECK(came_back);
  for (auto& b : blocks) REQUIRE(r.deallocate(std::move(b)).has_value());
  (void)r.trim();
  REQUIRE(r.reap_pending().has_value());
}

TEST_CASE("the runtime singleton on the GPU", "[gpu][runtime]") {
  using Rt = DeviceRuntime<DefaultStack>;
  auto a = Rt::try_get(0);
  REQUIRE(a.has_value());
  CHECK(*Rt::try_get(0) == *a);
  const auto before = (*a)->bytes_outstanding();
  auto block = (*a)->allocate(2048, StreamId::DEFAULT, AllocTag::UNTAGGED);
  REQUIRE(block.has_value());
  CHECK((*a)->bytes_outstanding() == before + 2048);
  REQUIRE((*a)->deallocate(std::move(*block)).has_value());
  REQUIRE((*a)->reap_pending().has_value());
  CHECK((*a)->bytes_outstanding() == before);
  auto out = Rt::try_get(Rt::MAX_DEVICE_ORDINALS);
  REQUIRE_FALSE(out);
  CHECK(out.error().code() == errc::invalid_ordinal);

  auto pool = StreamPool<CudaDriver>::create((*a)->device(), 2);
  REQUIRE(pool.has_value());
  auto stack = AsyncCuda<CudaDriver>::create(*pool);
  REQUIRE(stack.has_value());
  auto made = DeviceRuntime<AsyncCuda<CudaDriver>>::create(*pool, std::move(*stack));
  REQUIRE(made.has_value());
  auto& owned = *made;
  CHECK(static_cast<void*>(&owned) != static_cast<void*>(*a));
  auto b = owned.allocate(1024);
  REQUIRE(b.has_value());
  REQUIRE(owned.deallocate(std::move(*b)).has_value());
  REQUIRE(owned.reap_pending().has_value());
  CHECK(owned.bytes_outstanding() == 0);
}

TEST_CASE("AsyncCuda's hot paths work from a thread with no current context", "[gpu][context]") {
  auto pool = StreamPool<CudaDriver>::open(*gpu, 0, 2);
  REQUIRE(pool.has_value());
  auto stack = AsyncCuda<CudaDriver>::create(*pool);
  REQUIRE(stack.has_value());
  bool no_context = false, ok = false;
  std::string why;
  std::thread fresh([&] {
    CUcontext c = nullptr;
    no_context = gpu->api().cuCtxGetCurrent_(&c) == CUDA_SUCCESS && c == nullptr;
    auto b = stack->allocate(1 << 20, StreamId{0}, AllocTag::UNTAGGED);
    if (!b) return void(why = b.error().what());
    for (auto r : {stack->prepare_block_use(b->id(), StreamId{1}, Access::Write),
                   stack->finish_block_use(b->id(), StreamId{1}, Access::Write),
                   stack->prepare_block_use(b->id(), StreamId{0}, Access::Read),
                   stack->finish_block_use(b->id(), StreamId{0}, Access::Read),
                   stack->deallocate(std::move(*b))}) {
      if (!r) return void(why = r.error().what());
    }
    ok = true;
  });
  fresh.join();
  CHECK(no_context);
  INFO(why);
  CHECK(ok);
  REQUIRE(stack->reap_pending().has_value());
  CHECK(stack->bytes_outstanding() == 0);
}

int main(int argc, char** argv) { return xlogrt::testing::run_gpu_tests(argc, argv, gpu); }
