// SPDX-License-Identifier: Apache-2.0
// CudaMrResource on SimDriver, compiled once per CCCL shape (meson.build): the toolkit's
// CCCL 3.0 (experimental, stream-last) and CCCL 3.4 (stable, stream-first). The concepts
// are checked at compile time; the calls, through the adapter and through CCCL's own
// type-erased reference, reach the stack (Statistics counts them) and free by pointer.

#include <catch2/catch.hpp>

#include <xlogrt/interop/cuda_mr.hpp>
#include <xlogrt/sim/sim_driver.hpp>
#include <xlogrt/runtime.hpp>

using namespace xlogrt;

namespace {
using Stack = Statistics<AsyncCuda<SimDriver>>;
using Mr = CudaMrResource<Stack>;
using ProdMr = CudaMrResource<DefaultStack>;

#if CCCL_VERSION >= 3001000
static_assert(cccl_stable_memory_resource);
static_assert(cuda::mr::resource_with<Mr, cuda::mr::device_accessible>);
static_assert(cuda::mr::synchronous_resource_with<Mr, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<ProdMr, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<ProdMr, cuda::mr::host_accessible>);
using Ref = cuda::mr::resource_ref<cuda::mr::device_accessible>;
#else
static_assert(!cccl_stable_memory_resource);
static_assert(cuda::mr::async_resource_with<Mr, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<Mr, cuda::mr::device_accessible>);
static_assert(cuda::mr::async_resource_with<ProdMr, cuda::mr::device_accessible>);
static_assert(!cuda::mr::async_resource_with<ProdMr, cuda::mr::host_accessible>);
using Ref = cuda::mr::async_resource_ref<cuda::mr::device_accessible>;
#endif

struct Rig {
  SimDriver sim;
  std::shared_ptr<StreamPool<SimDriver>> streams;
  std::unique_ptr<DeviceRuntime<Stack>> rt;
  Rig() {
    auto made = DeviceRuntime<Stack>::open(sim, 0, 2);  // StackBuilder builds the stack
    REQUIRE(made.has_value());
    streams = made->streams();
    rt = std::make_unique<DeviceRuntime<Stack>>(std::move(*made));
  }
  cuda::stream_ref stream() {
    auto s = sim.stream_create();
    REQUIRE(s.has_value());
    return cuda::stream_ref(reinterpret_cast<cudaStream_t>(*s));
  }
  std::size_t live_bytes() { return rt->stack().snapshot().total.current_bytes; }
};

void* async_alloc(Ref r, cuda::stream_ref s, std::size_t n) {
#if CCCL_VERSION >= 3001000
  return r.allocate(s, n, 256);
#else
  return r.allocate_async(n, 256, s);
#endif
}
void async_free(Ref r, cuda::stream_ref s, void* p, std::size_t n) {
#if CCCL_VERSION >= 3001000
  r.deallocate(s, p, n, 256);
#else
  r.deallocate_async(p, n, 256, s);
#endif
}
void* sync_alloc(Mr& r, std::size_t n) {
#if CCCL_VERSION >= 3001000
  return r.allocate_sync(n, 256);
#else
  return r.allocate(n, 256);
#endif
}
void sync_free(Mr& r, void* p, std::size_t n) {
#if CCCL_VERSION >= 3001000
  r.deallocate_sync(p, n, 256);
#else
  r.deallocate(p, n, 256);
#endif
}
}  // namespace

TEST_CASE("a stack as a cuda::mr resource: stream-ordered and synchronous calls", "[interop][cuda_mr]") {
  Rig rig;
  Mr mr(*rig.rt, {.tag = AllocTag{5}});
  Mr copy = mr;
  CHECK(copy == mr);
  CHECK(Mr(*rig.rt) != mr);  // another PointerResource: memory does not cross

  auto s = rig.stream();
  Ref ref(copy);
  void* p = async_alloc(ref, s, 1 << 16);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  CHECK(rig.live_bytes() == 1 << 16);
  CHECK(rig.rt->stack().snapshot().of(AllocTag{5}).allocations == 1);
  void* q = sync_alloc(mr, 4096);
  CHECK(rig.live_bytes() == (1 << 16) + 4096);
  async_free(ref, s, p, 1 << 16);
  sync_free(mr, q, 4096);
  CHECK(rig.live_bytes() == 0);
  REQUIRE(rig.rt->reap_pending().has_value());
  CHECK(rig.rt->bytes_outstanding() == 0);
}

TEST_CASE("cuda::mr adapter: a refused allocation throws allocation_error, a bad free keeps the block",
          "[interop][cuda_mr]") {
  Rig rig;
  Mr mr(*rig.rt);
  auto s = rig.stream();
  try {
    async_alloc(Ref(mr), s, std::size_t{1} << 50);
    FAIL("a 1 PiB allocation succeeded");
  } catch (const allocation_error& e) {
    CHECK((e.code() == errc::too_large || e.code() == errc::out_of_memory));
    CHECK(std::string(e.what()).size() > 0);
  }
  try {
#if CCCL_VERSION >= 3001000
    mr.allocate(s, 64, 4096);
#else
    mr.allocate_async(64, 4096, s);
#endif
    FAIL("an alignment of 4096 was accepted");
  } catch (const std::bad_alloc& e) {
    CHECK(std::string(e.what()).find("alignment") != std::string::npos);
  }
  void* p = async_alloc(Ref(mr), s, 1024);
  async_free(Ref(mr), s, p, 999);  // the wrong size: refused on stderr, nothing lost
  CHECK(rig.live_bytes() == 1024);
  CHECK(mr.resource().find(p) != nullptr);
  async_free(Ref(mr), s, p, 1024);
  CHECK(rig.live_bytes() == 0);
}
