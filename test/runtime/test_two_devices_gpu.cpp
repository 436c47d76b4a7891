// SPDX-License-Identifier: Apache-2.0
// Two GPUs of one process on the real driver: the per-ordinal runtimes built from 16
// threads, threads on each device allocating, using across streams and freeing at once,
// a block of ordinal 0 refused by ordinal 1's stacks, and budgets per ordinal. The
// SimDriver counterpart is test_two_devices.cpp (host suite).
//
// Exits 77 (Meson's SKIP) without a driver or with fewer than two devices: it never
// passes without running on two GPUs. test/gpu_repro/two_gpu.sh runs it.
//
// Not covered here: a kernel of device 1 reading device 0's pool memory. That needs pool
// access granted with cuMemPoolSetAccess (and peer access for the plain allocations of
// DirectCuda), which the Driver concept has no entry point for.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <xlogrt/runtime.hpp>

#include "../gpu_main.hpp"
#include "../resource/conformance.hpp"
#include "../resource/stack_registry.hpp"

using namespace xlogrt;
using namespace xlogrt::testing;

namespace {

CudaDriver* gpu = nullptr;

using GpuStacks = std::tuple<Entry<AsyncCuda<CudaDriver>>, Entry<DirectCuda<CudaDriver>>, Entry<Cached<AsyncCuda<CudaDriver>>>,
                             Entry<DefaultStackOn<CudaDriver>>, Entry<DebugGuard<AsyncCuda<CudaDriver>>>>;

void expect_foreign(const result<void>& r, const char* what) {
  INFO(what);
  REQUIRE_FALSE(r);
  INFO(r.error().what());
  CHECK(r.error().code() == errc::foreign_block);
}

}  // namespace

TEST_CASE("16 threads, 8 on each GPU, race try_get and then work on their own device", "[gpu2][runtime]") {
  using Rt = DeviceRuntime<DefaultStack>;
  constexpr int THREADS = 16;
  constexpr int ROUNDS = 200;
  constexpr std::size_t N = std::size_t{1} << 16;
  std::atomic<bool> go{false};
  std::vector<Rt*> seen(THREADS, nullptr);
  std::vector<std::string> trouble(THREADS);
  std::vector<std::thread> threads;
  for (int i = 0; i < THREADS; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      const auto ord = static_cast<std::uint32_t>(i % 2);
      auto rt = Rt::try_get(ord);
      if (!rt) return void(trouble[i] = rt.error().what());
      seen[i] = *rt;
      // A block written on stream A, read back on stream B, freed: every round checked.
      const StreamId a{static_cast<std::uint32_t>(i % 4)}, b{static_cast<std::uint32_t>(4 + i % 4)};
      std::vector<std::uint8_t> host(N);
      for (int round = 0; round < ROUNDS; ++round) {
        auto blk = (*rt)->allocate(N, a, AllocTag{static_cast<std::uint32_t>(1 + i)});
        if (!blk) return void(trouble[i] = blk.error().what());
        if (blk->device_ordinal() != ord) return void(trouble[i] = "a block of the wrong ordinal");
        const auto v = static_cast<std::uint8_t>(i * 16 + round);
        auto sa = (*rt)->stream(a), sb = (*rt)->stream(b);
        if (!sa || !sb) return void(trouble[i] = "no stream");
        auto& d = (*rt)->driver();
        for (auto r : {(*rt)->prepare_block_use(blk->id(), a, Access::Write), d.memset_d8_async(blk->ptr(), v, N, *sa),
                       (*rt)->finish_block_use(blk->id(), a, Access::Write),
                       (*rt)->prepare_block_use(blk->id(), b, Access::Read),
                       d.memcpy_dtoh_async(host.data(), blk->ptr(), N, *sb),
                       (*rt)->finish_block_use(blk->id(), b, Access::Read), d.stream_synchronize(*sb)}) {
          if (!r) return void(trouble[i] = r.error().what());
        }
        for (std::uint8_t x : host) {
          if (x != v) return void(trouble[i] = "round " + std::to_string(round) + " read back a wrong byte");
        }
        if (auto r = (*rt)->deallocate(std::move(*blk)); !r) return void(trouble[i] = r.error().what());
      }
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  for (int i = 0; i < THREADS; ++i) {
    INFO("thread " << i << " on ordinal " << i % 2 << ": " << trouble[i]);
    CHECK(trouble[i].empty());
    CHECK(seen[i] == seen[i % 2]);
  }
  REQUIRE(seen[0] != nullptr);
  REQUIRE(seen[1] != nullptr);
  CHECK(seen[0] != seen[1]);
  CHECK(seen[0]->device_ordinal() == 0);
  CHECK(seen[1]->device_ordinal() == 1);
}

TEMPLATE_LIST_TEST_CASE("a block of GPU 0 is foreign to GPU 1's stack", "[gpu2][foreign]", GpuStacks) {
  Rig<TestType> r0(*gpu, 0), r1(*gpu, 1);
  auto& s0 = *r0.stack;
  auto& s1 = *r1.stack;
  const std::size_t start0 = s0.bytes_outstanding(), start1 = s1.bytes_outstanding();
  auto twin = s1.allocate(4096, StreamId{1}, AllocTag{7});
  auto b = s0.allocate(4096, StreamId{1}, AllocTag{7});
  REQUIRE(twin.has_value());
  REQUIRE(b.has_value());
  const std::size_t held0 = s0.bytes_outstanding(), held1 = s1.bytes_outstanding();
  const auto budget0 = *device_budget(0), budget1 = *device_budget(1);
  expect_foreign(s1.deallocate(std::move(*b)), "deallocate through ordinal 1");
  REQUIRE_FALSE(b->empty());
  if constexpr (TrackingResource<typename TestType::type>) {
    for (StreamId use : {StreamId{1}, StreamId{2}}) {
      expect_foreign(s1.record_block_use(*b, use), "record_block_use through ordinal 1");
      expect_foreign(s1.prepare_block_use(b->id(), use, Access::Write), "prepare_block_use through ordinal 1");
      expect_foreign(s1.finish_block_use(b->id(), use, Access::Read), "finish_block_use through ordinal 1");
    }
  }
  CHECK(s0.bytes_outstanding() == held0);
  CHECK(s1.bytes_outstanding() == held1);
  CHECK(device_budget(0)->in_use == budget0.in_use);
  CHECK(device_budget(1)->in_use == budget1.in_use);
  REQUIRE(s0.deallocate(std::move(*b)).has_value());
  REQUIRE(s1.deallocate(std::move(*twin)).has_value());
  REQUIRE(s0.reap_pending().has_value());
  REQUIRE(s1.reap_pending().has_value());
  CHECK(s0.bytes_outstanding() == start0);
  CHECK(s1.bytes_outstanding() == start1);
}

TEST_CASE("budgets are per GPU", "[gpu2][budget]") {
  constexpr std::size_t MiB = std::size_t{1} << 20;
  Rig<Entry<Budget<AsyncCuda<CudaDriver>>>> r0(*gpu, 0), r1(*gpu, 1);
  const BudgetUsage start0 = *device_budget(0), start1 = *device_budget(1);
  REQUIRE(set_device_budget(0, start0.in_use + 2 * MiB).has_value());
  CHECK(device_budget(1)->limit == start1.limit);
  auto x = r0.stack->allocate(2 * MiB, StreamId{0}, AllocTag{1});
  REQUIRE(x.has_value());
  auto refused = r0.stack->allocate(MiB, StreamId{0}, AllocTag{1});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code() == errc::out_of_budget);
  auto y = r1.stack->allocate(64 * MiB, StreamId{0}, AllocTag{1});  // ordinal 1 has no limit
  REQUIRE(y.has_value());
  CHECK(device_budget(1)->in_use == start1.in_use + 64 * MiB);
  REQUIRE(r0.stack->deallocate(std::move(*x)).has_value());
  REQUIRE(r1.stack->deallocate(std::move(*y)).has_value());
  REQUIRE(r0.stack->reap_pending().has_value());
  REQUIRE(r1.stack->reap_pending().has_value());
  REQUIRE(clear_device_budget(0).has_value());
  CHECK(device_budget(0)->in_use == start0.in_use);
  CHECK(device_budget(1)->in_use == start1.in_use);
}

int main(int argc, char** argv) { return testing::run_gpu_tests(argc, argv, gpu, 2); }
