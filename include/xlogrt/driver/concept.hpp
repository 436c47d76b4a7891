// SPDX-License-Identifier: Apache-2.0
#pragma once

// The Driver concept: the driver operations xlogrt needs, as one policy type.
//
// Resources, streams, events and the reactor are templates over a Driver. CudaDriver
// forwards to libcuda (loaded at run time); SimDriver emulates the same contract on the
// host. A Driver is an object (it owns a function table or a simulated machine); the
// layers above hold a `D&` to it, and `D::open()` hands out the process-wide instance
// that DeviceRuntime::try_get uses.
//
// Contract shared by every member:
// - noexcept; failures come back as result errors made by status::driver_failure, so
//   error().driver_status() is the CUDA status number and the message names the call.
// - handles (device_t, context_t, stream_t, event_t, mempool_t) are trivially copyable;
//   a value-initialised stream_t is the legacy default stream.
// - device pointers are std::uint64_t (CUdeviceptr).
// - every stream operation is stream-ordered exactly as the CUDA driver API documents.
// - calls that need a current context use the one made current on the calling thread by
//   ctx_make_current; callers (Device, StreamPool, resources) make it current first.
// - once the process has begun to exit (see driver/lifetime.hpp), CudaDriver makes no
//   driver call and returns errc::shutting_down.
//
// Stream capture (CUDA graphs). Every Driver answers whether a stream is capturing
// (stream_capture_info), lets a thread change its capture interaction mode
// (exchange_capture_mode) and synchronises its current context (ctx_synchronize): the
// layers above need the three to stay legal while an application captures a graph
// through them. Starting and ending a capture, and running the graph, is
// CapturingDriver's, a refinement that programs and tests which capture through the
// driver object use. While a stream captures, the work enqueued on it is recorded, not
// run, and the calls the CUDA driver API calls "potentially unsafe" (synchronous
// allocation and free, device-wide synchronisation) fail and invalidate the capture
// unless the calling thread's mode allows them; see cuStreamBeginCapture and
// cuThreadExchangeStreamCaptureMode.
//
// Virtual memory. VirtualMemoryDriver, a second refinement, adds what a resource that
// maps physical memory into address ranges of its own needs (the CUDA driver API's
// virtual memory management): reserving and freeing address ranges, creating and
// releasing physical allocations of a device, mapping and unmapping them, and granting a
// device access to what is mapped. The base Driver concept does not ask for it, so a
// driver without it still runs every other layer.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// Device attributes the library reads.
enum class DeviceAttr : std::uint8_t {
  memory_pools_supported,     ///< CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
  stream_mem_ops_supported,   ///< v2 cuStreamWriteValue32 available: always 1 on a driver >= 12.0
  can_map_host_memory,        ///< CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
  compute_capability_major,   ///< CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
  compute_capability_minor,   ///< CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
  multiprocessor_count,       ///< CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
};

/// Free and total device memory, as cuMemGetInfo reports them.
struct MemInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

/// A host function enqueued on a stream (cuLaunchHostFunc's CUhostFn).
using HostFn = void (*)(void*);

/// A stream's capture state (cuStreamGetCaptureInfo).
enum class CaptureStatus : std::uint8_t { none, active, invalidated };

/// What stream_capture_info reports of a stream.
struct CaptureInfo {
  CaptureStatus status = CaptureStatus::none;
  std::uint64_t id = 0;  ///< the capture sequence's process-unique id (0 when none)
};

/// A thread's capture interaction mode (CUstreamCaptureMode): global, thread_local, relaxed.
///   global      a potentially unsafe call fails while this thread captures in a
///               non-relaxed mode, or while any thread captures in global mode;
///   per_thread  it fails only while this thread captures in a non-relaxed mode;
///   relaxed     it is never refused for a capture.
enum class CaptureMode : std::uint8_t { global, per_thread, relaxed };

template <class D>
concept Driver =
    requires(D& d, const D& cd, int i, typename D::device_t dev, typename D::context_t ctx,
             typename D::stream_t s, typename D::event_t e, typename D::mempool_t pool,
             std::uint64_t ptr, std::size_t n, void* host, const void* chost,
             std::uint32_t u32, std::uint8_t u8, std::uint64_t u64, HostFn fn) {
      typename D::device_t;
      typename D::context_t;
      typename D::stream_t;
      typename D::event_t;
      typename D::mempool_t;
      { D::kind } -> std::convertible_to<const char*>;  // "cuda" / "sim"
      { D::open() } -> std::same_as<result<D*>>;         // the process-wide instance

      // Devices and their primary contexts.
      { d.device_count() } -> std::same_as<result<int>>;
      { d.device_get(i) } -> std::same_as<result<typename D::device_t>>;
      { d.device_name(dev) } -> std::same_as<result<std::string>>;
      { d.device_total_mem(dev) } -> std::same_as<result<std::size_t>>;
      { d.device_attribute(dev, DeviceAttr{}) } -> std::same_as<result<int>>;
      { d.primary_ctx_retain(dev) } -> std::same_as<result<typename D::context_t>>;
      { d.primary_ctx_release(dev) } -> std::same_as<result<void>>;
      { d.ctx_make_current(ctx) } -> std::same_as<result<void>>;  // cheap when already current
      { d.mem_get_info() } -> std::same_as<result<MemInfo>>;

      // Streams (created non-blocking) and events (created with timing disabled).
      { d.stream_create() } -> std::same_as<result<typename D::stream_t>>;
      { d.stream_destroy(s) } -> std::same_as<result<void>>;
      { d.stream_synchronize(s) } -> std::same_as<result<void>>;
      { d.stream_query(s) } -> std::same_as<result<bool>>;  // true: all work done
      // The stream's process-unique id (cuStreamGetId): a handle the driver reuses for a
      // new stream after destroying an old one has a new id.
      { d.stream_get_id(s) } -> std::same_as<result<std::uint64_t>>;
      { d.stream_wait_event(s, e) } -> std::same_as<result<void>>;
      { d.event_create() } -> std::same_as<result<typename D::event_t>>;
      { d.event_destroy(e) } -> std::same_as<result<void>>;
      { d.event_record(e, s) } -> std::same_as<result<void>>;
      { d.event_query(e) } -> std::same_as<result<bool>>;  // true: reached
      { d.event_synchronize(e) } -> std::same_as<result<void>>;

      // Memory: stream-ordered from a pool, synchronous, and pinned mapped host memory.
      { d.device_default_mempool(dev) } -> std::same_as<result<typename D::mempool_t>>;
      { d.mempool_set_release_threshold(pool, u64) } -> std::same_as<result<void>>;
      { d.mem_alloc_async(n, pool, s) } -> std::same_as<result<std::uint64_t>>;
      { d.mem_free_async(ptr, s) } -> std::same_as<result<void>>;
      { d.mem_alloc(n) } -> std::same_as<result<std::uint64_t>>;
      { d.mem_free(ptr) } -> std::same_as<result<void>>;
      { d.mem_host_alloc_mapped(n) } -> std::same_as<result<void*>>;
      { d.mem_host_device_pointer(host) } -> std::same_as<result<std::uint64_t>>;
      { d.mem_host_free(host) } -> std::same_as<result<void>>;

      // Stream-ordered copies, fills, flag writes and host callbacks.
      { d.memset_d8_async(ptr, u8, n, s) } -> std::same_as<result<void>>;
      { d.memcpy_htod_async(ptr, chost, n, s) } -> std::same_as<result<void>>;
      { d.memcpy_dtoh_async(host, ptr, n, s) } -> std::same_as<result<void>>;
      { d.memcpy_dtod_async(ptr, ptr, n, s) } -> std::same_as<result<void>>;
      { d.stream_write_value32(s, ptr, u32) } -> std::same_as<result<void>>;
      { d.launch_host_func(s, fn, host) } -> std::same_as<result<void>>;

      // Stream capture, as far as every layer needs it (see the file comment).
      // cuStreamGetCaptureInfo: legal on a capturing stream, and does not invalidate it.
      { d.stream_capture_info(s) } -> std::same_as<result<CaptureInfo>>;
      // cuThreadExchangeStreamCaptureMode: sets the calling thread's mode, returns the old.
      { d.exchange_capture_mode(CaptureMode{}) } -> std::same_as<result<CaptureMode>>;
      // cuCtxSynchronize of the calling thread's current context.
      { d.ctx_synchronize() } -> std::same_as<result<void>>;

      { cd.status_name(i) } -> std::convertible_to<std::string>;
    };

/// A Driver that also captures streams into graphs and runs them, for programs and tests
/// that capture through the driver object (CudaDriver and SimDriver both are one).
/// graph_t and graph_exec_t are trivially copyable handles.
template <class D>
concept CapturingDriver =
    Driver<D> && requires(D& d, typename D::stream_t s, typename D::graph_t g,
                          typename D::graph_exec_t x) {
      typename D::graph_t;
      typename D::graph_exec_t;
      requires std::is_trivially_copyable_v<typename D::graph_t>;
      requires std::is_trivially_copyable_v<typename D::graph_exec_t>;
      // cuStreamBeginCapture_v2: `s` records its later work, with the given mode.
      { d.stream_begin_capture(s, CaptureMode{}) } -> std::same_as<result<void>>;
      // cuStreamEndCapture: the recorded graph; an invalidated capture ends, and fails
      // with the driver's status (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
      { d.stream_end_capture(s) } -> std::same_as<result<typename D::graph_t>>;
      // cuGraphInstantiateWithFlags(flags 0).
      { d.graph_instantiate(g) } -> std::same_as<result<typename D::graph_exec_t>>;
      // cuGraphLaunch: the graph's work, stream-ordered on `s`.
      { d.graph_launch(x, s) } -> std::same_as<result<void>>;
      { d.graph_destroy(g) } -> std::same_as<result<void>>;
      { d.graph_exec_destroy(x) } -> std::same_as<result<void>>;
    };

/// The allocation granularity of a device's pinned memory (cuMemGetAllocationGranularity):
/// `minimum` is what sizes, addresses and offsets of physical allocations and mappings must
/// be multiples of; `recommended`, a multiple of it, is the size the driver advises for best
/// performance.
struct AllocationGranularity {
  std::size_t minimum = 0;
  std::size_t recommended = 0;
};

/// A Driver that also manages virtual memory: address ranges reserved apart from any
/// memory, physical allocations of a device, and mappings of the one into the other. What
/// a caller may rely on (the CUDA driver API's rules, which SimDriver enforces with the
/// same statuses):
/// - a physical allocation is `phys_t`, a trivially copyable handle (value-initialised:
///   none); its size is a multiple of the device's minimum granularity, and it holds
///   device memory from mem_create to the later of mem_release and the unmapping of its
///   last mapping (mem_get_info's free memory falls and rises accordingly);
/// - a mapping places the start of one physical allocation at a reserved address: the
///   address and size are multiples of the minimum granularity, the size is at most the
///   allocation's, the range lies in one reservation and is not mapped already. It is
///   not accessible until mem_set_access grants a device access, and a kernel or copy
///   that touches it before then faults (CUDA_ERROR_ILLEGAL_ADDRESS: on a GPU the whole
///   context, SimDriver faults the stream);
/// - mem_unmap takes one whole mapping (never part of one), and does not wait for work
///   that still uses it: the caller orders the unmap after that work (synchronising the
///   streams that touched the range), as it orders a free. The range is a reservation
///   again, and a new mapping there needs access granted again;
/// - mem_address_free takes a whole reservation, as reserved, once nothing is mapped in it.
/// Every member follows the Driver contract (noexcept, errors from status::driver_failure).
template <class D>
concept VirtualMemoryDriver =
    Driver<D> && requires(D& d, typename D::device_t dev, typename D::phys_t h,
                          std::uint64_t va, std::size_t n) {
      typename D::phys_t;
      requires std::is_trivially_copyable_v<typename D::phys_t>;
      // cuMemGetAllocationGranularity (minimum and recommended) for pinned memory of `dev`.
      { d.mem_granularity(dev) } -> std::same_as<result<AllocationGranularity>>;
      // cuMemAddressReserve(size n, alignment n (0: the driver's default), no fixed address):
      // the start of a new range of n bytes, which no allocation or other range overlaps.
      { d.mem_address_reserve(n, n) } -> std::same_as<result<std::uint64_t>>;
      // cuMemAddressFree(start, size), both as reserved.
      { d.mem_address_free(va, n) } -> std::same_as<result<void>>;
      // cuMemCreate: n bytes of pinned memory of `dev`, mapped nowhere yet.
      { d.mem_create(n, dev) } -> std::same_as<result<typename D::phys_t>>;
      // cuMemRelease: the handle is gone at once; the memory once no mapping holds it.
      { d.mem_release(h) } -> std::same_as<result<void>>;
      // cuMemMap(va, n, offset 0, h): the first n bytes of h at [va, va + n). (No offset
      // parameter: the driver API documents that cuMemMap's must currently be zero.)
      { d.mem_map(va, n, h) } -> std::same_as<result<void>>;
      // cuMemUnmap(va, n): one whole mapping.
      { d.mem_unmap(va, n) } -> std::same_as<result<void>>;
      // cuMemSetAccess: read-write access for `dev` to [va, va + n), whole mappings only.
      { d.mem_set_access(va, n, dev) } -> std::same_as<result<void>>;
    };

}  // namespace xlogrt
