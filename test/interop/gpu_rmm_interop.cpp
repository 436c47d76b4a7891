// SPDX-License-Identifier: Apache-2.0
// RMM 26.06 over an xlogrt stack, through CudaMrResource (CCCL's stable cuda::mr API):
// a pool_memory_resource, under a statistics_resource_adaptor, takes the default stack as
// its upstream. The pool's growth shows in xlogrt's Statistics (under the adapter's tag),
// RMM's counters agree with what the program allocated, the memory works on the device,
// and once the pool is gone xlogrt's bytes are back to their start.
//
// CI compiles this file only (-fsyntax-only, against ../shared/third_party); the GPU
// build links RMM's sources and the CUDA runtime (test/interop/meson.build). A plain
// program, so that the GPU machine needs no Catch2: exit 0 passed, 1 failed, 77 (SKIP)
// without a driver or device.

#include <rmm/aligned.hpp>
#include <rmm/cuda_stream_view.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include <xlogrt/interop/cuda_mr.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/runtime.hpp>

static_assert(xlogrt::cccl_stable_memory_resource, "RMM 26.06 needs CCCL >= 3.3: put its include/ first");
static_assert(cuda::mr::resource_with<xlogrt::CudaMrResource<xlogrt::DefaultStack>, cuda::mr::device_accessible>);

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}
}  // namespace

int main() {
  using namespace xlogrt;
  auto drv = CudaDriver::open();
  if (!drv) {
    std::printf("%s\n", drv.error().what().c_str());
    const errc c = drv.error().code();
    return (c == errc::no_driver || c == errc::no_device) ? (std::puts("SKIP: no CUDA driver or device"), 77) : 1;
  }
  if (auto n = (*drv)->device_count(); !n || *n == 0) return std::puts("SKIP: no CUDA device"), 77;
  if (cudaSetDevice(0) != cudaSuccess) return std::puts("FAIL: cudaSetDevice(0)"), 1;

  auto rt = DeviceRuntime<DefaultStack>::try_get(0);
  if (!rt) return std::printf("FAIL: %s\n", rt.error().what().c_str()), 1;
  auto& stats = *find_layer<Statistics>((*rt)->stack());
  constexpr AllocTag TAG{27};  // below Statistics' tag_slots (64): counted on its own
  const std::size_t start_bytes = (*rt)->bytes_outstanding();

  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  constexpr std::size_t INITIAL = std::size_t{64} << 20;
  constexpr std::size_t ALIGN = rmm::CUDA_ALLOCATION_ALIGNMENT;
  {
    CudaMrResource<DefaultStack> upstream(**rt, {.tag = TAG});
    rmm::mr::pool_memory_resource pool(upstream, INITIAL);
    const auto grown = stats.snapshot().of(TAG);
    check(grown.allocations >= 1 && grown.current_bytes >= INITIAL,
          "the pool's initial growth is an allocation of the xlogrt stack, under the adapter's tag");

    rmm::mr::statistics_resource_adaptor counted(pool);
    rmm::cuda_stream_view sv(stream);
    std::vector<std::pair<void*, std::size_t>> live;
    std::size_t asked = 0;
    for (std::size_t i = 0; i < 64; ++i) {
      const std::size_t n = (i + 1) * 4096;
      live.emplace_back(counted.allocate(sv, n, ALIGN), n);
      asked += n;
    }
    check(counted.get_bytes_counter().value == static_cast<std::int64_t>(asked),
          "RMM's statistics adaptor counts the bytes asked for");
    check(counted.get_allocations_counter().value == 64, "RMM's statistics adaptor counts 64 allocations");

    // The memory works: fill one block on the device and read it back.
    auto [p, n] = live[10];
    std::vector<unsigned char> host(n, 0);
    check(cudaMemsetAsync(p, 0x5A, n, stream) == cudaSuccess &&
              cudaMemcpyAsync(host.data(), p, n, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
              cudaStreamSynchronize(stream) == cudaSuccess,
          "a pool block is written and read back on a non-default stream");
    bool all = true;
    for (unsigned char c : host) all = all && c == 0x5A;
    check(all, "the bytes read back are the bytes written");

    // A request larger than the pool holds makes it grow from the xlogrt stack again.
    const auto before_grow = stats.snapshot().of(TAG).allocations;
    void* big = counted.allocate(sv, INITIAL * 2, ALIGN);
    check(stats.snapshot().of(TAG).allocations > before_grow, "the pool grows through the adapter");
    counted.deallocate(sv, big, INITIAL * 2, ALIGN);
    for (auto [q, m] : live) counted.deallocate(sv, q, m, ALIGN);
    check(counted.get_bytes_counter().value == 0, "RMM's counters are back to 0");
    cudaStreamSynchronize(stream);
  }  // the pool releases its upstream blocks
  check(stats.snapshot().of(TAG).current_bytes == 0, "xlogrt's current bytes of the tag are back to 0");
  check((*rt)->reap_pending().has_value() && (*rt)->bytes_outstanding() == start_bytes,
        "after the reap the stack's bytes outstanding are back to their start");
  cudaStreamDestroy(stream);
  std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
