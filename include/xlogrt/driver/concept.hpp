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

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

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

      { cd.status_name(i) } -> std::convertible_to<std::string>;
    };

}  // namespace xlogrt
