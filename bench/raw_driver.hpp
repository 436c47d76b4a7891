// SPDX-License-Identifier: Apache-2.0
#pragma once

// The raw driver calls the allocation benchmarks compare against: libcuda's own entry
// points for CudaDriver (no result objects, no checks), the driver's members otherwise.

#include <xlogrt/driver/cuda_driver.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace xlogrt::bench {

/// Failed raw driver calls. A failed call is fast: any makes the figures void, and the
/// bench says so.
inline std::atomic<long> raw_failures{0};

template <class T>
T counted(result<T> r) {
  if (!r) {
    raw_failures.fetch_add(1, std::memory_order_relaxed);
    return T{};
  }
  return *r;
}
inline void counted(result<void> r) {
  if (!r) raw_failures.fetch_add(1, std::memory_order_relaxed);
}

/// The raw driver calls of a driver: libcuda's own entry points for CudaDriver, the
/// driver's members otherwise.
template <class D>
struct Raw {
  D& d;
  std::uint64_t alloc(std::size_t n) { return counted(d.mem_alloc(n)); }
  void free(std::uint64_t p) { counted(d.mem_free(p)); }
  std::uint64_t alloc_async(std::size_t n, typename D::mempool_t pool, typename D::stream_t s) {
    return counted(d.mem_alloc_async(n, pool, s));
  }
  void free_async(std::uint64_t p, typename D::stream_t s) { counted(d.mem_free_async(p, s)); }
  // The simulator has one stream-ordered allocation call.
  std::uint64_t alloc_async_current(std::size_t n, typename D::mempool_t pool, typename D::stream_t s) {
    return alloc_async(n, pool, s);
  }
};
template <>
struct Raw<CudaDriver> {
  explicit Raw(CudaDriver& drv) : d(drv) {
    // cuMemAllocAsync is not in the library's table (AsyncCuda names its pool): the
    // bench resolves it here, the way the loader resolves the others.
    void* p = nullptr;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    if (d.api().cuGetProcAddress_("cuMemAllocAsync", &p, 11020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q) ==
            CUDA_SUCCESS &&
        q == CU_GET_PROC_ADDRESS_SUCCESS) {
      alloc_async_fn = reinterpret_cast<PFN_cuMemAllocAsync_v11020>(p);
    }
  }
  CudaDriver& d;
  PFN_cuMemAllocAsync_v11020 alloc_async_fn = nullptr;
  std::uint64_t alloc(std::size_t n) {
    CUdeviceptr p = 0;
    check(d.api().cuMemAlloc_(&p, n));
    return p;
  }
  void free(std::uint64_t p) { check(d.api().cuMemFree_(p)); }
  std::uint64_t alloc_async(std::size_t n, CUmemoryPool pool, CUstream s) {
    CUdeviceptr p = 0;
    check(d.api().cuMemAllocFromPoolAsync_(&p, n, pool, s));
    return p;
  }
  void free_async(std::uint64_t p, CUstream s) { check(d.api().cuMemFreeAsync_(p, s)); }
  /// cuMemAllocAsync: from the current pool of the stream's device (its default pool
  /// here, the one AsyncCuda uses).
  std::uint64_t alloc_async_current(std::size_t n, CUmemoryPool, CUstream s) {
    CUdeviceptr p = 0;
    check(alloc_async_fn != nullptr ? alloc_async_fn(&p, n, s) : CUDA_ERROR_NOT_FOUND);
    return p;
  }
  static void check(CUresult r) {
    if (r != CUDA_SUCCESS) raw_failures.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace xlogrt::bench
