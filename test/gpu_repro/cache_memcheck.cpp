// SPDX-License-Identifier: Apache-2.0
// A kernel that reads a block after its owner freed it, while the caching layer of the
// default stack holds the block: the memory is still the process's to the driver, so
// compute-sanitizer's memcheck sees nothing wrong, unless the layer marks its cached
// blocks through the NVTX memory API (XLOGRT_CACHE=nvtx). cache_memcheck.sh runs this
// under memcheck both ways and requires the read to be reported with the marks only.
//
// Exit status: 77 (SKIP) without a driver, device or sm_90 GPU; 1 when a call fails or
// the cache did not keep the block (then the test would prove nothing); 0 otherwise.

#include <cstdint>
#include <cstdio>
#include <string>

#include <xlogrt/memory/launch.hpp>
#include <xlogrt/resource/nvtx_marks.hpp>
#include <xlogrt/runtime.hpp>

#include "uaf_kernels.hpp"

using namespace xlogrt;

int main() {
  constexpr int SKIP = 77;
  auto drv = CudaDriver::open();
  if (!drv) return std::printf("SKIP: no usable CUDA driver: %s\n", drv.error().what().c_str()), SKIP;
  auto got = DeviceRuntime<DefaultStack>::try_get(0);
  if (!got) return std::printf("SKIP: cannot open ordinal 0: %s\n", got.error().what().c_str()), SKIP;
  auto& rt = **got;
  if (!rt.device()->make_current() || uaf::select_device(0) != 0 || uaf::kernels_loadable() != 0) {
    return std::printf("SKIP: the kernels (sm_90) cannot run here\n"), SKIP;
  }
  auto& cache = *find_layer<Cached>(rt.stack());
  std::printf("caching layer %s, NVTX marks %s\n", cache.options().enabled ? "on" : "off",
              cache.options().nvtx_marks ? "on" : "off");
  const StreamId a{0};
  auto sums = rt.allocate(sizeof(unsigned long long), a);
  auto block = rt.allocate(std::size_t{1} << 20, a);
  if (!sums || !block) return std::printf("FAIL: allocate\n"), 1;
  const std::uint32_t n = (1u << 20) / 4;
  auto* p = block->as<std::uint32_t>();
  if (!launch(rt, a, [&](CUstream s) { return uaf::enqueue_fill(s, p, n, 1); }, write(*block))) {
    return std::printf("FAIL: fill\n"), 1;
  }
  const std::uint64_t freed = block->ptr();
  if (!rt.deallocate(std::move(*block))) return std::printf("FAIL: free\n"), 1;
  // The bug: a read of the freed block, which now sits in the cache.
  CUstream s = *rt.stream(a);
  if (uaf::enqueue_checksum(s, reinterpret_cast<const std::uint32_t*>(freed), n, 1, 0, sums->as<unsigned long long>()) != 0 ||
      !rt.driver().stream_synchronize(s)) {
    return std::printf("FAIL: the reading kernel did not run\n"), 1;
  }
  auto again = rt.allocate(std::size_t{1} << 20, a);
  if (!again) return std::printf("FAIL: allocate again\n"), 1;
  const bool kept = again->ptr() == freed;
  std::printf("read a freed block while cached; the cache handed it back: %s\n", kept ? "yes" : "no");
  (void)rt.deallocate(std::move(*again));
  (void)rt.deallocate(std::move(*sums));
  return kept || !cache.options().enabled ? 0 : 1;
}
