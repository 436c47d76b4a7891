// SPDX-License-Identifier: Apache-2.0
#pragma once

// CudaDriver: the Driver policy over the real CUDA driver API, loaded at run time.
//
// Nothing links against libcuda: open() dlopens libcuda.so.1 (or the file named by the
// environment variable XLOGRT_LIBCUDA), checks that it is CUDA 12.0 or newer, calls
// cuInit(0) and resolves every entry point through cuGetProcAddress at the version whose
// ABI matches the function pointer type (detail/cuda_api.hpp says which, and why). A
// program built with xlogrt therefore starts on any machine, and learns from open()
// whether there is a usable GPU:
//   errc::no_driver       no libcuda (or not a working one)
//   errc::driver_too_old  libcuda older than CUDA 12.0, or lacking an entry point
//   errc::no_device       the driver works but sees no GPU
// each with a sentence saying what to do. The virtual memory calls (VirtualMemoryDriver)
// are optional: a driver that lacks one of them still opens, and those members then fail
// with errc::driver_too_old naming what is missing (detail/cuda_api.hpp).
//
// Cost. Each wrapper is one load of the exit flag, one indirect call through the table
// and one test of the status; the error (and its message) is built out of line, only
// on failure. No lock, no string work and no allocation on success.

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

static_assert(sizeof(CUdeviceptr) == sizeof(std::uint64_t), "CUdeviceptr must be 64-bit");

/// A memory pool's counters (CudaDriver::mempool_usage), in bytes.
struct MemPoolUsage {
  std::uint64_t reserved = 0;
  std::uint64_t reserved_high = 0;
  std::uint64_t used = 0;
  std::uint64_t used_high = 0;
};

/// The real driver. Obtain it with open(); it lives until the process ends.
///
/// Every member is a thin wrapper over one driver call (named in its doc) and follows
/// the Driver contract (driver/concept.hpp): noexcept, a failure is
/// status::driver_failure(status, "cuXxx", status_name(status)), and once the process
/// has begun to exit (driver/lifetime.hpp) no member calls libcuda: each returns
/// errc::shutting_down instead. Calls that need a context use the calling thread's
/// current one (see ctx_make_current).
///
/// Thread-safe. (The function table is immutable after open(); libcuda is thread-safe.
/// ctx_make_current changes the calling thread's current context only.)
class alignas(64) CudaDriver {
 public:
  using device_t = CUdevice;
  using context_t = CUcontext;
  using stream_t = CUstream;
  using event_t = CUevent;
  using mempool_t = CUmemoryPool;
  using graph_t = CUgraph;
  using graph_exec_t = CUgraphExec;
  using phys_t = CUmemGenericAllocationHandle;

  static constexpr const char* kind = "cuda";

  /// The oldest driver open() accepts, as cuDriverGetVersion reports it (12.0).
  static constexpr int min_driver_version = detail::min_cuda_driver_version;

  /// The process-wide driver, loaded and checked on the first successful call.
  ///
  /// Concurrent first callers wait for one load and receive the same instance. A failed
  /// open keeps no instance and caches no error, so a later call tries again (e.g. after
  /// the caller has set XLOGRT_LIBCUDA); once one has succeeded, the library and the
  /// environment are not looked at again. Errors: no_driver, driver_too_old, no_device
  /// (see the file comment), a driver_failure of cuDeviceGetCount, shutting_down once
  /// exit has begun. Thread-safe; lock-free after the first success.
  //
  // The instance slot, lock-free on the read side:
  //   instance_ == nullptr  not loaded yet, or every attempt so far failed;
  //   instance_ == d        loaded; never changes again (d is never freed).
  // The first load is acquire and pairs with open_slow()'s release store, so a thread
  // that sees d also sees the function table written before it was published. Inside
  // open_slow() the second load may be relaxed: a pointer stored by another opener was
  // stored under the same mutex, whose lock orders it before this load. A function-local
  // static (`static auto d = load();`) would be simpler, but it would either cache a
  // failure for the life of the process or need an exception to retry, and xlogrt
  // throws none.
  static result<CudaDriver*> open() noexcept;

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  /// The raw function table, for callers that time or use driver calls directly.
  const detail::CudaApi& api() const noexcept { return api_; }
  /// cuDriverGetVersion of the loaded driver (12080 for CUDA 12.8).
  int driver_version() const noexcept { return version_; }
  /// The library name or path that was loaded ("libcuda.so.1" unless XLOGRT_LIBCUDA).
  const std::string& library() const noexcept { return library_; }

  // --- Devices and their primary contexts -------------------------------------------

  /// cuDeviceGetCount.
  result<int> device_count() const noexcept;

  /// cuDeviceGet. An ordinal out of range fails with CUDA_ERROR_INVALID_DEVICE
  /// (errc::no_device).
  result<CUdevice> device_get(int ordinal) const noexcept;

  /// cuDeviceGetName ("NVIDIA H200").
  result<std::string> device_name(CUdevice dev) const noexcept;

  /// cuDeviceTotalMem (the _v2 variant: size_t bytes).
  result<std::size_t> device_total_mem(CUdevice dev) const noexcept;

  /// cuDeviceGetAttribute, with DeviceAttr mapped to CUdevice_attribute.
  ///
  /// stream_mem_ops_supported answers for what xlogrt calls, cuStreamWriteValue32 in its
  /// v2 form: every driver open() accepts (CUDA 12.0 or newer) supports it on every
  /// device, so it is 1 once cuDeviceGetAttribute has confirmed that `dev` is a device.
  /// (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 describes the deprecated v1
  /// operations, which need a kernel module parameter, and is 0 on most machines.)
  /// An attr outside DeviceAttr gives errc::invalid_argument.
  result<int> device_attribute(CUdevice dev, DeviceAttr attr) const noexcept;

  /// cuDevicePrimaryCtxRetain. Balance with primary_ctx_release.
  result<CUcontext> primary_ctx_retain(CUdevice dev) const noexcept;

  /// cuDevicePrimaryCtxRelease (_v2).
  result<void> primary_ctx_release(CUdevice dev) const noexcept {
    return call("cuDevicePrimaryCtxRelease", api_.cuDevicePrimaryCtxRelease_, dev);
  }

  /// Makes `ctx` current on the calling thread. cuCtxGetCurrent first, and
  /// cuCtxSetCurrent only when another context (or none) is current, so calling it
  /// before every operation is cheap.
  result<void> ctx_make_current(CUcontext ctx) const noexcept;

  /// cuMemGetInfo (_v2) of the current context's device.
  result<MemInfo> mem_get_info() const noexcept;

  // --- Streams and events ----------------------------------------------------------

  /// cuStreamCreate(CU_STREAM_NON_BLOCKING): the stream does not synchronise with the
  /// legacy default stream.
  result<CUstream> stream_create() const noexcept;

  /// cuStreamDestroy (_v2): work already enqueued still completes.
  result<void> stream_destroy(CUstream s) const noexcept {
    return call("cuStreamDestroy", api_.cuStreamDestroy_, s);
  }

  /// cuStreamSynchronize.
  result<void> stream_synchronize(CUstream s) const noexcept {
    return call("cuStreamSynchronize", api_.cuStreamSynchronize_, s);
  }

  /// cuStreamQuery: true when all enqueued work is done, false on CUDA_ERROR_NOT_READY.
  result<bool> stream_query(CUstream s) const noexcept;

  /// cuStreamGetId: the stream's id, unique over the process's life (a reused handle
  /// gets a new one).
  result<std::uint64_t> stream_get_id(CUstream s) const noexcept;

  /// cuStreamGetCtx: the context `s` belongs to (StreamPool::adopt compares it with its
  /// device's).
  result<CUcontext> stream_context(CUstream s) const noexcept;

  /// cuStreamWaitEvent(s, e, 0): work enqueued on `s` afterwards waits for `e`.
  result<void> stream_wait_event(CUstream s, CUevent e) const noexcept {
    return call("cuStreamWaitEvent", api_.cuStreamWaitEvent_, s, e, 0u);
  }

  /// cuEventCreate(CU_EVENT_DISABLE_TIMING).
  result<CUevent> event_create() const noexcept;

  /// cuEventDestroy (_v2).
  result<void> event_destroy(CUevent e) const noexcept {
    return call("cuEventDestroy", api_.cuEventDestroy_, e);
  }

  /// cuEventRecord.
  result<void> event_record(CUevent e, CUstream s) const noexcept {
    return call("cuEventRecord", api_.cuEventRecord_, e, s);
  }

  /// cuEventQuery: true when reached, false on CUDA_ERROR_NOT_READY.
  result<bool> event_query(CUevent e) const noexcept;

  /// cuEventSynchronize.
  result<void> event_synchronize(CUevent e) const noexcept {
    return call("cuEventSynchronize", api_.cuEventSynchronize_, e);
  }

  // --- Memory ------------------------------------------------------------------------

  /// cuDeviceGetDefaultMemPool.
  result<CUmemoryPool> device_default_mempool(CUdevice dev) const noexcept;

  /// cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes): how much freed
  /// memory the pool keeps instead of returning it at the next synchronisation.
  result<void> mempool_set_release_threshold(CUmemoryPool pool,
                                             std::uint64_t bytes) const noexcept;

  /// cuMemPoolGetAttribute of the pool's four memory counters. `reserved` is the device
  /// memory the pool holds, `used` what allocations from it (live, or freed on a stream
  /// that has not reached the free) occupy; the rest of `reserved` is the pool's own free
  /// memory, which it keeps up to the release threshold. The `_high` values are each
  /// counter's highest since the pool was created or the counter was last reset.
  result<MemPoolUsage> mempool_usage(CUmemoryPool pool) const noexcept;

  /// cuMemPoolCreate: a pool of pinned device memory on `dev`, beside its default pool
  /// (no IPC handle types), for stream-ordered allocation with cuMemAllocFromPoolAsync.
  result<CUmemoryPool> mempool_create(CUdevice dev) const noexcept;

  /// cuMemPoolDestroy: the pool's memory goes back once the last of its blocks is freed.
  result<void> mempool_destroy(CUmemoryPool pool) const noexcept {
    return call("cuMemPoolDestroy", api_.cuMemPoolDestroy_, pool);
  }

  /// cuMemPoolTrimTo: gives the pool's unused memory back to the device until it holds at
  /// most `keep` bytes beyond what its allocations occupy (memory freed on a stream counts
  /// as unused once the stream has reached the free).
  result<void> mempool_trim_to(CUmemoryPool pool, std::uint64_t keep) const noexcept {
    return call("cuMemPoolTrimTo", api_.cuMemPoolTrimTo_, pool, static_cast<std::size_t>(keep));
  }

  /// cuMemAllocFromPoolAsync: `bytes` from `pool`, usable by work enqueued on `s` after
  /// this call.
  result<std::uint64_t> mem_alloc_async(std::size_t bytes, CUmemoryPool pool,
                                        CUstream s) const noexcept;

  /// cuMemFreeAsync: the memory returns to its pool when `s` reaches this point.
  result<void> mem_free_async(std::uint64_t ptr, CUstream s) const noexcept {
    return call("cuMemFreeAsync", api_.cuMemFreeAsync_, CUdeviceptr{ptr}, s);
  }

  /// cuMemAlloc (_v2), synchronous.
  result<std::uint64_t> mem_alloc(std::size_t bytes) const noexcept;

  /// cuMemFree (_v2), synchronous.
  result<void> mem_free(std::uint64_t ptr) const noexcept {
    return call("cuMemFree", api_.cuMemFree_, CUdeviceptr{ptr});
  }

  /// cuMemHostAlloc(CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE): page-locked
  /// host memory, mapped into the device address space, usable from every context.
  result<void*> mem_host_alloc_mapped(std::size_t bytes) const noexcept;

  /// cuMemHostGetDevicePointer (_v2, flags 0): the device address of mapped host memory.
  result<std::uint64_t> mem_host_device_pointer(void* host) const noexcept;

  /// cuMemFreeHost.
  result<void> mem_host_free(void* host) const noexcept {
    return call("cuMemFreeHost", api_.cuMemFreeHost_, host);
  }

  // --- Virtual memory (VirtualMemoryDriver) ------------------------------------------------
  //
  // Each fails with errc::driver_too_old, calling nothing, when the loaded driver lacks
  // one of the virtual memory entry points (see the file comment). Physical memory is
  // pinned device memory of one device, with no shareable handle type.

  /// cuMemGetAllocationGranularity, minimum and recommended, for pinned memory of `dev`
  /// (2 MiB each on an H200). A device that does not support virtual memory management
  /// (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0, read first) fails with
  /// status::not_supported (errc::driver_error), so this is the call to probe with.
  result<AllocationGranularity> mem_granularity(CUdevice dev) const noexcept;

  /// cuMemAddressReserve(bytes, alignment, no fixed address, flags 0): a new range of
  /// device addresses, backed by nothing. `bytes` is a multiple of the host page size;
  /// `alignment` a power of two, or 0 for the driver's default.
  result<std::uint64_t> mem_address_reserve(std::size_t bytes,
                                            std::size_t alignment) const noexcept;

  /// cuMemAddressFree: a whole range, as mem_address_reserve returned it.
  result<void> mem_address_free(std::uint64_t va, std::size_t bytes) const noexcept {
    return optional_call("cuMemAddressFree", api_.cuMemAddressFree_, CUdeviceptr{va}, bytes);
  }

  /// cuMemCreate (CU_MEM_ALLOCATION_TYPE_PINNED on `dev`, flags 0): `bytes`, a multiple of
  /// the minimum granularity, of device memory, mapped nowhere yet.
  result<CUmemGenericAllocationHandle> mem_create(std::size_t bytes, CUdevice dev) const noexcept;

  /// cuMemRelease: the handle is gone; the memory goes back once no mapping holds it.
  result<void> mem_release(CUmemGenericAllocationHandle h) const noexcept {
    return optional_call("cuMemRelease", api_.cuMemRelease_, h);
  }

  /// cuMemMap(va, bytes, offset 0, h, flags 0): the first `bytes` of `h` at a reserved,
  /// unmapped [va, va + bytes). Not accessible until mem_set_access.
  result<void> mem_map(std::uint64_t va, std::size_t bytes,
                       CUmemGenericAllocationHandle h) const noexcept {
    return optional_call("cuMemMap", api_.cuMemMap_, CUdeviceptr{va}, bytes, std::size_t{0}, h,
                         0ull);
  }

  /// cuMemUnmap: one whole mapping. Order it after the work that uses the range (the
  /// driver documents it as synchronous only "for most use cases").
  result<void> mem_unmap(std::uint64_t va, std::size_t bytes) const noexcept {
    return optional_call("cuMemUnmap", api_.cuMemUnmap_, CUdeviceptr{va}, bytes);
  }

  /// cuMemSetAccess with one descriptor: read-write access for `dev` to the mappings that
  /// make up [va, va + bytes).
  result<void> mem_set_access(std::uint64_t va, std::size_t bytes, CUdevice dev) const noexcept;

  // --- Stream-ordered copies, fills, flag writes and host callbacks ---------------------

  /// cuMemsetD8Async.
  result<void> memset_d8_async(std::uint64_t dst, std::uint8_t value, std::size_t bytes,
                               CUstream s) const noexcept {
    return call("cuMemsetD8Async", api_.cuMemsetD8Async_, CUdeviceptr{dst},
                static_cast<unsigned char>(value), bytes, s);
  }

  /// cuMemcpyHtoDAsync (_v2).
  result<void> memcpy_htod_async(std::uint64_t dst, const void* src, std::size_t bytes,
                                 CUstream s) const noexcept {
    return call("cuMemcpyHtoDAsync", api_.cuMemcpyHtoDAsync_, CUdeviceptr{dst}, src, bytes, s);
  }

  /// cuMemcpyDtoHAsync (_v2).
  result<void> memcpy_dtoh_async(void* dst, std::uint64_t src, std::size_t bytes,
                                 CUstream s) const noexcept {
    return call("cuMemcpyDtoHAsync", api_.cuMemcpyDtoHAsync_, dst, CUdeviceptr{src}, bytes, s);
  }

  /// cuMemcpyDtoDAsync (_v2).
  result<void> memcpy_dtod_async(std::uint64_t dst, std::uint64_t src, std::size_t bytes,
                                 CUstream s) const noexcept {
    return call("cuMemcpyDtoDAsync", api_.cuMemcpyDtoDAsync_, CUdeviceptr{dst},
                CUdeviceptr{src}, bytes, s);
  }

  /// cuStreamWriteValue32 (v2, CU_STREAM_WRITE_VALUE_DEFAULT): when `s` reaches this
  /// point, `value` is written to `dst` (4-byte aligned device or mapped host address),
  /// ordered after the stream's earlier work.
  result<void> stream_write_value32(CUstream s, std::uint64_t dst,
                                    std::uint32_t value) const noexcept {
    return call("cuStreamWriteValue32", api_.cuStreamWriteValue32_, s, CUdeviceptr{dst},
                cuuint32_t{value}, static_cast<unsigned>(CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  /// cuLaunchHostFunc: runs fn(data) on a driver thread when `s` reaches this point.
  /// fn must not call the CUDA API.
  result<void> launch_host_func(CUstream s, HostFn fn, void* data) const noexcept {
    return call("cuLaunchHostFunc", api_.cuLaunchHostFunc_, s, CUhostFn{fn}, data);
  }

  // --- Stream capture and graphs ---------------------------------------------------------

  /// cuStreamGetCaptureInfo (_v2; the graph and its dependencies are not asked for):
  /// whether `s` is capturing, and the capture's id. Legal on a capturing stream.
  result<CaptureInfo> stream_capture_info(CUstream s) const noexcept;

  /// cuThreadExchangeStreamCaptureMode: sets the calling thread's capture interaction
  /// mode to `mode` and returns the one it replaces. Use it in pairs, restoring the old
  /// mode afterwards.
  result<CaptureMode> exchange_capture_mode(CaptureMode mode) const noexcept;

  /// cuCtxSynchronize: waits for all work of the calling thread's current context.
  /// Potentially unsafe during a capture (see exchange_capture_mode).
  result<void> ctx_synchronize() const noexcept {
    return call("cuCtxSynchronize", api_.cuCtxSynchronize_);
  }

  /// cuStreamBeginCapture (_v2): the work later enqueued on `s` (and on the streams that
  /// join it through events) is recorded into a graph instead of running.
  result<void> stream_begin_capture(CUstream s, CaptureMode mode) const noexcept {
    return call("cuStreamBeginCapture", api_.cuStreamBeginCapture_, s, to_cu(mode));
  }

  /// cuStreamEndCapture: the graph recorded since stream_begin_capture(s). A capture
  /// that was invalidated ends too, and fails (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
  result<CUgraph> stream_end_capture(CUstream s) const noexcept;

  /// cuGraphInstantiateWithFlags (flags 0): an executable graph.
  result<CUgraphExec> graph_instantiate(CUgraph g) const noexcept;

  /// cuGraphLaunch: the graph's work, ordered after the work already enqueued on `s`.
  result<void> graph_launch(CUgraphExec x, CUstream s) const noexcept {
    return call("cuGraphLaunch", api_.cuGraphLaunch_, x, s);
  }

  /// cuGraphDestroy.
  result<void> graph_destroy(CUgraph g) const noexcept {
    return call("cuGraphDestroy", api_.cuGraphDestroy_, g);
  }

  /// cuGraphExecDestroy.
  result<void> graph_exec_destroy(CUgraphExec x) const noexcept {
    return call("cuGraphExecDestroy", api_.cuGraphExecDestroy_, x);
  }

  /// The driver's name of status `s` (cuGetErrorName: "CUDA_ERROR_INVALID_VALUE"); the
  /// names status.hpp knows when the driver does not (or may no longer be) asked; empty
  /// for a status nobody knows.
  std::string status_name(int s) const;

 private:
  // The members declared here or above without a body are defined in
  // detail/cuda_driver_impl.hpp, included at the end of this header. Each is inline, as
  // it was when defined in the class: its definition says so, or, for a noinline one, its
  // declaration here (GCC wants the keyword beside the attribute).

  explicit CudaDriver(detail::LoadedCuda&& loaded) noexcept
      : api_(loaded.api),
        library_(std::move(loaded.library)),
        optional_missing_(std::move(loaded.optional_missing)),
        version_(loaded.version) {}

  /// detail::process_exiting(), from a copy of the flag in this object's first cache line,
  /// beside the hot entries of the table: the global flag was one more line for every
  /// driver call on the hot paths to miss on.
  bool exiting_now() const noexcept { return exiting_.load(std::memory_order_acquire); }

  static constexpr CUstreamCaptureMode to_cu(CaptureMode m) noexcept;

  // One wrapper of a call whose only output is its status.
  template <class Fn, class... Args>
  result<void> call(const char* name, Fn fn, Args... args) const noexcept;

  // The same for an optional entry (cuda_api.hpp): unavailable() when it is null.
  template <class Fn, class... Args>
  result<void> optional_call(const char* name, Fn fn, Args... args) const noexcept;

  [[gnu::cold, gnu::noinline]] inline xlogrt::error failure(CUresult s, const char* fn_name) const;

  [[gnu::cold, gnu::noinline]] static inline xlogrt::error exiting(const char* fn_name);

  // An optional entry the loaded driver lacks: errc::driver_too_old, naming what is missing.
  [[gnu::cold, gnu::noinline]] inline xlogrt::error unavailable(const char* fn_name) const;

  [[gnu::noinline]] static inline result<CudaDriver*> open_slow() noexcept;

  // First line: the exit flag, the table's three bootstrap entries and its first four
  // (the hot paths' calls; see XLOGRT_CUDA_API_ENTRIES).
  std::atomic<bool> exiting_{false};
  detail::CudaApi api_;
  std::string library_;
  std::string optional_missing_;  // LoadedCuda::optional_missing
  int version_;

  static inline std::atomic<CudaDriver*> instance_{nullptr};
  static inline std::mutex open_mutex_;
};

static_assert(Driver<CudaDriver>);
static_assert(CapturingDriver<CudaDriver>);
static_assert(VirtualMemoryDriver<CudaDriver>);

}  // namespace xlogrt

// The members defined out of line (see the private section).
#include "xlogrt/driver/detail/cuda_driver_impl.hpp"
