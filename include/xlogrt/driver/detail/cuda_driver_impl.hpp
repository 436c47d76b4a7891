// SPDX-License-Identifier: Apache-2.0
#pragma once

// CudaDriver's members defined out of line (driver/cuda_driver.hpp): open and its slow
// path (the load, the leaked instance, the exit flag), the wrappers whose driver call has
// an output or a status other than success to read, or a structure to fill, and the
// helpers every wrapper uses (call, optional_call, failure, exiting, unavailable, to_cu). The one-line wrappers stay in the class. The function
// table they call through is detail/cuda_api.hpp; its loading, detail/cuda_loader.hpp.
//
// Out-of-line definitions: driver/cuda_driver.hpp includes this header at its end, after
// the class; it is not meant to be included on its own.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/driver/concept.hpp"
#include "xlogrt/driver/detail/cuda_api.hpp"
#include "xlogrt/driver/detail/cuda_loader.hpp"
#include "xlogrt/driver/lifetime.hpp"
#include "xlogrt/driver/status.hpp"

namespace xlogrt {

inline result<CudaDriver*> CudaDriver::open() noexcept {
  if (detail::process_exiting()) [[unlikely]] {
    return xlogrt::error{errc::shutting_down,
                         "CudaDriver::open refused: the process is exiting, and libcuda "
                         "may already be torn down"};
  }
  if (CudaDriver* d = instance_.load(std::memory_order_acquire)) return d;
  return open_slow();
}

inline result<int> CudaDriver::device_count() const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceGetCount");
  int n = 0;
  if (const CUresult s = api_.cuDeviceGetCount_(&n); s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuDeviceGetCount");
  }
  return n;
}

inline result<CUdevice> CudaDriver::device_get(int ordinal) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceGet");
  CUdevice dev = 0;
  if (const CUresult s = api_.cuDeviceGet_(&dev, ordinal); s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuDeviceGet");
  }
  return dev;
}

inline result<std::string> CudaDriver::device_name(CUdevice dev) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceGetName");
  char name[256] = {};
  if (const CUresult s = api_.cuDeviceGetName_(name, static_cast<int>(sizeof name) - 1, dev);
      s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuDeviceGetName");
  }
  return std::string(name);
}

inline result<std::size_t> CudaDriver::device_total_mem(CUdevice dev) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceTotalMem");
  std::size_t bytes = 0;
  if (const CUresult s = api_.cuDeviceTotalMem_(&bytes, dev); s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuDeviceTotalMem");
  }
  return bytes;
}

inline result<int> CudaDriver::device_attribute(CUdevice dev, DeviceAttr attr) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceGetAttribute");
  CUdevice_attribute a{};
  bool always_one = false;
  switch (attr) {
    case DeviceAttr::memory_pools_supported:
      a = CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
      break;
    case DeviceAttr::stream_mem_ops_supported:
      a = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;  // validates dev
      always_one = true;
      break;
    case DeviceAttr::can_map_host_memory:
      a = CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY;
      break;
    case DeviceAttr::compute_capability_major:
      a = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
      break;
    case DeviceAttr::compute_capability_minor:
      a = CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
      break;
    case DeviceAttr::multiprocessor_count:
      a = CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
      break;
    default:
      return error{errc::invalid_argument,
                   "device_attribute: DeviceAttr value " +
                       std::to_string(static_cast<int>(attr)) +
                       " is not one CudaDriver knows; pass a named DeviceAttr"};
  }
  int value = 0;
  if (const CUresult s = api_.cuDeviceGetAttribute_(&value, a, dev); s != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(s, "cuDeviceGetAttribute");
  }
  return always_one ? 1 : value;
}

inline result<CUcontext> CudaDriver::primary_ctx_retain(CUdevice dev) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDevicePrimaryCtxRetain");
  CUcontext ctx = nullptr;
  if (const CUresult s = api_.cuDevicePrimaryCtxRetain_(&ctx, dev); s != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(s, "cuDevicePrimaryCtxRetain");
  }
  return ctx;
}

inline result<void> CudaDriver::ctx_make_current(CUcontext ctx) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuCtxGetCurrent");
  CUcontext current = nullptr;
  if (const CUresult s = api_.cuCtxGetCurrent_(&current); s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuCtxGetCurrent");
  }
  if (current == ctx) return ok();
  if (const CUresult s = api_.cuCtxSetCurrent_(ctx); s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuCtxSetCurrent");
  }
  return ok();
}

inline result<MemInfo> CudaDriver::mem_get_info() const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuMemGetInfo");
  MemInfo info;
  if (const CUresult s = api_.cuMemGetInfo_(&info.free, &info.total); s != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(s, "cuMemGetInfo");
  }
  return info;
}

inline result<CUstream> CudaDriver::stream_create() const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamCreate");
  CUstream s = nullptr;
  if (const CUresult r = api_.cuStreamCreate_(&s, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuStreamCreate");
  }
  return s;
}

inline result<bool> CudaDriver::stream_query(CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamQuery");
  const CUresult r = api_.cuStreamQuery_(s);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) return false;
  return failure(r, "cuStreamQuery");
}

inline result<std::uint64_t> CudaDriver::stream_get_id(CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamGetId");
  unsigned long long id = 0;
  if (const CUresult r = api_.cuStreamGetId_(s, &id); r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuStreamGetId");
  }
  return static_cast<std::uint64_t>(id);
}

inline result<CUcontext> CudaDriver::stream_context(CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamGetCtx");
  CUcontext ctx = nullptr;
  if (const CUresult r = api_.cuStreamGetCtx_(s, &ctx); r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuStreamGetCtx");
  }
  return ctx;
}

inline result<CUevent> CudaDriver::event_create() const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuEventCreate");
  CUevent e = nullptr;
  if (const CUresult r = api_.cuEventCreate_(&e, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuEventCreate");
  }
  return e;
}

inline result<bool> CudaDriver::event_query(CUevent e) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuEventQuery");
  const CUresult r = api_.cuEventQuery_(e);
  if (r == CUDA_SUCCESS) return true;
  if (r == CUDA_ERROR_NOT_READY) return false;
  return failure(r, "cuEventQuery");
}

inline result<CUmemoryPool> CudaDriver::device_default_mempool(CUdevice dev) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuDeviceGetDefaultMemPool");
  CUmemoryPool pool = nullptr;
  if (const CUresult s = api_.cuDeviceGetDefaultMemPool_(&pool, dev); s != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(s, "cuDeviceGetDefaultMemPool");
  }
  return pool;
}

inline result<void> CudaDriver::mempool_set_release_threshold(CUmemoryPool pool, std::uint64_t bytes) const noexcept {
  cuuint64_t value = bytes;  // the attribute's value type
  return call("cuMemPoolSetAttribute", api_.cuMemPoolSetAttribute_, pool,
              CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, static_cast<void*>(&value));
}

inline result<MemPoolUsage> CudaDriver::mempool_usage(CUmemoryPool pool) const noexcept {
  MemPoolUsage u;
  const std::pair<CUmemPool_attribute, std::uint64_t*> rows[] = {
      {CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &u.reserved},
      {CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &u.reserved_high},
      {CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u.used},
      {CU_MEMPOOL_ATTR_USED_MEM_HIGH, &u.used_high},
  };
  for (const auto& [attr, out] : rows) {
    cuuint64_t value = 0;  // the attributes' value type
    if (auto r = call("cuMemPoolGetAttribute", api_.cuMemPoolGetAttribute_, pool, attr,
                      static_cast<void*>(&value));
        !r) {
      return std::move(r).error();
    }
    *out = value;
  }
  return u;
}

inline result<CUmemoryPool> CudaDriver::mempool_create(CUdevice dev) const noexcept {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = static_cast<int>(dev);
  CUmemoryPool pool = nullptr;
  if (auto r = call("cuMemPoolCreate", api_.cuMemPoolCreate_, &pool, static_cast<const CUmemPoolProps*>(&props)); !r) {
    return std::move(r).error();
  }
  return pool;
}

inline result<std::uint64_t> CudaDriver::mem_alloc_async(std::size_t bytes, CUmemoryPool pool,
                                                         CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuMemAllocFromPoolAsync");
  CUdeviceptr p = 0;
  if (const CUresult r = api_.cuMemAllocFromPoolAsync_(&p, bytes, pool, s); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuMemAllocFromPoolAsync");
  }
  return std::uint64_t{p};
}

inline result<std::uint64_t> CudaDriver::mem_alloc(std::size_t bytes) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuMemAlloc");
  CUdeviceptr p = 0;
  if (const CUresult r = api_.cuMemAlloc_(&p, bytes); r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuMemAlloc");
  }
  return std::uint64_t{p};
}

inline result<void*> CudaDriver::mem_host_alloc_mapped(std::size_t bytes) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuMemHostAlloc");
  void* p = nullptr;
  if (const CUresult r = api_.cuMemHostAlloc_(
          &p, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
      r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuMemHostAlloc");
  }
  return p;
}

inline result<std::uint64_t> CudaDriver::mem_host_device_pointer(void* host) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuMemHostGetDevicePointer");
  CUdeviceptr p = 0;
  if (const CUresult r = api_.cuMemHostGetDevicePointer_(&p, host, 0u); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuMemHostGetDevicePointer");
  }
  return std::uint64_t{p};
}

inline result<AllocationGranularity> CudaDriver::mem_granularity(CUdevice dev) const noexcept {
  constexpr const char* name = "cuMemGetAllocationGranularity";
  if (exiting_now()) [[unlikely]] return exiting(name);
  if (api_.cuMemGetAllocationGranularity_ == nullptr) [[unlikely]] return unavailable(name);
  int supported = 0;
  if (const CUresult s = api_.cuDeviceGetAttribute_(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
      s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, "cuDeviceGetAttribute");
  }
  if (supported == 0) {
    return xlogrt::error{errc::driver_error,
                         std::string(name) + " was not called: device " + std::to_string(dev) +
                             " does not support virtual memory management "
                             "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0); "
                             "use a resource over memory pools (AsyncCuda) on it",
                         status::not_supported};
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(dev);
  AllocationGranularity g;
  const std::pair<CUmemAllocationGranularity_flags, std::size_t*> rows[] = {
      {CU_MEM_ALLOC_GRANULARITY_MINIMUM, &g.minimum},
      {CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g.recommended},
  };
  for (const auto& [option, out] : rows) {
    if (const CUresult s = api_.cuMemGetAllocationGranularity_(out, &prop, option);
        s != CUDA_SUCCESS) [[unlikely]] {
      return failure(s, name);
    }
  }
  return g;
}

inline result<std::uint64_t> CudaDriver::mem_address_reserve(std::size_t bytes,
                                                              std::size_t alignment) const noexcept {
  constexpr const char* name = "cuMemAddressReserve";
  if (exiting_now()) [[unlikely]] return exiting(name);
  if (api_.cuMemAddressReserve_ == nullptr) [[unlikely]] return unavailable(name);
  CUdeviceptr p = 0;
  if (const CUresult s = api_.cuMemAddressReserve_(&p, bytes, alignment, CUdeviceptr{0}, 0ull);
      s != CUDA_SUCCESS) [[unlikely]] {
    return failure(s, name);
  }
  return std::uint64_t{p};
}

inline result<CUmemGenericAllocationHandle> CudaDriver::mem_create(std::size_t bytes,
                                                                   CUdevice dev) const noexcept {
  constexpr const char* name = "cuMemCreate";
  if (exiting_now()) [[unlikely]] return exiting(name);
  if (api_.cuMemCreate_ == nullptr) [[unlikely]] return unavailable(name);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(dev);
  CUmemGenericAllocationHandle h = 0;
  if (const CUresult s = api_.cuMemCreate_(&h, bytes, &prop, 0ull); s != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(s, name);
  }
  return h;
}

inline result<void> CudaDriver::mem_set_access(std::uint64_t va, std::size_t bytes,
                                               CUdevice dev) const noexcept {
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = static_cast<int>(dev);
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return optional_call("cuMemSetAccess", api_.cuMemSetAccess_, CUdeviceptr{va}, bytes,
                       static_cast<const CUmemAccessDesc*>(&desc), std::size_t{1});
}

inline result<CaptureInfo> CudaDriver::stream_capture_info(CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamGetCaptureInfo");
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (const CUresult r = api_.cuStreamGetCaptureInfo_(s, &status, &id, nullptr, nullptr, nullptr);
      r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuStreamGetCaptureInfo");
  }
  switch (status) {
    case CU_STREAM_CAPTURE_STATUS_ACTIVE: return CaptureInfo{CaptureStatus::active, id};
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED: return CaptureInfo{CaptureStatus::invalidated, id};
    default: return CaptureInfo{};
  }
}

inline result<CaptureMode> CudaDriver::exchange_capture_mode(CaptureMode mode) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuThreadExchangeStreamCaptureMode");
  CUstreamCaptureMode m = to_cu(mode);
  if (const CUresult r = api_.cuThreadExchangeStreamCaptureMode_(&m); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuThreadExchangeStreamCaptureMode");
  }
  switch (m) {
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return CaptureMode::per_thread;
    case CU_STREAM_CAPTURE_MODE_RELAXED: return CaptureMode::relaxed;
    default: return CaptureMode::global;
  }
}

inline result<CUgraph> CudaDriver::stream_end_capture(CUstream s) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuStreamEndCapture");
  CUgraph g = nullptr;
  if (const CUresult r = api_.cuStreamEndCapture_(s, &g); r != CUDA_SUCCESS) [[unlikely]] {
    return failure(r, "cuStreamEndCapture");
  }
  return g;
}

inline result<CUgraphExec> CudaDriver::graph_instantiate(CUgraph g) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting("cuGraphInstantiateWithFlags");
  CUgraphExec x = nullptr;
  if (const CUresult r = api_.cuGraphInstantiateWithFlags_(&x, g, 0ull); r != CUDA_SUCCESS)
      [[unlikely]] {
    return failure(r, "cuGraphInstantiateWithFlags");
  }
  return x;
}

inline std::string CudaDriver::status_name(int s) const {
  if (s >= 0 && s <= static_cast<int>(CUDA_ERROR_UNKNOWN) && !exiting_now()) {
    const char* n = nullptr;
    if (api_.cuGetErrorName_(static_cast<CUresult>(s), &n) == CUDA_SUCCESS && n != nullptr) {
      return n;
    }
  }
  return std::string(status::name(s));
}

constexpr CUstreamCaptureMode CudaDriver::to_cu(CaptureMode m) noexcept {
  switch (m) {
    case CaptureMode::per_thread: return CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    case CaptureMode::relaxed: return CU_STREAM_CAPTURE_MODE_RELAXED;
    default: return CU_STREAM_CAPTURE_MODE_GLOBAL;
  }
}

template <class Fn, class... Args>
inline result<void> CudaDriver::call(const char* name, Fn fn, Args... args) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting(name);
  if (const CUresult s = fn(args...); s != CUDA_SUCCESS) [[unlikely]] return failure(s, name);
  return ok();
}

template <class Fn, class... Args>
inline result<void> CudaDriver::optional_call(const char* name, Fn fn,
                                              Args... args) const noexcept {
  if (exiting_now()) [[unlikely]] return exiting(name);
  if (fn == nullptr) [[unlikely]] return unavailable(name);
  if (const CUresult s = fn(args...); s != CUDA_SUCCESS) [[unlikely]] return failure(s, name);
  return ok();
}

xlogrt::error CudaDriver::unavailable(const char* fn_name) const {
  return xlogrt::error{errc::driver_too_old,
                       std::string(fn_name) + " was not called: " + optional_missing_ +
                           ", which CudaDriver's virtual memory calls need (every CUDA 12 "
                           "driver has them: check the driver installation), or use a "
                           "resource over memory pools (AsyncCuda)"};
}

xlogrt::error CudaDriver::failure(CUresult s, const char* fn_name) const {
  const int st = static_cast<int>(s);
  return status::driver_failure(st, fn_name, status_name(st));
}

xlogrt::error CudaDriver::exiting(const char* fn_name) {
  return xlogrt::error{errc::shutting_down,
                       std::string(fn_name) +
                           " was not called: the process is exiting and libcuda may "
                           "already be torn down; release GPU resources before exit"};
}

result<CudaDriver*> CudaDriver::open_slow() noexcept {
  std::lock_guard<std::mutex> lock(open_mutex_);
  if (CudaDriver* d = instance_.load(std::memory_order_relaxed)) return d;
  auto loaded = detail::load_cuda_driver();
  if (!loaded) return std::move(loaded).error();
  // Leaked on purpose, and libcuda never dlclosed: runtimes, streams and leaked
  // singletons hold references to this object and call through its table until the
  // very end of the process, and destroying either at exit would race with libcuda's
  // own teardown (driver/lifetime.hpp). The exit flag stops the calls instead.
  auto* d = new (std::nothrow) CudaDriver(std::move(*loaded));
  if (d == nullptr) {
    return xlogrt::error{errc::out_of_memory,
                         "CudaDriver::open could not allocate the driver object"};
  }
  // Armed after cuInit (in load_cuda_driver), so that the flag handler is registered
  // after any exit handler libcuda registered while initialising, and therefore runs
  // before it: no xlogrt call reaches libcuda once its teardown may have begun.
  detail::arm_exit_guard();
  instance_.store(d, std::memory_order_release);
  // The driver's own copy of the flag (exiting_now()), set by a handler registered next
  // to the global one, so it runs at the same point of the exit.
  std::atexit([] {
    instance_.load(std::memory_order_acquire)->exiting_.store(true, std::memory_order_release);
  });
  return d;
}

}  // namespace xlogrt
