// SPDX-License-Identifier: Apache-2.0
#pragma once

// SimDriver internals: the simulated objects behind the handles (contexts, streams,
// events, pools, devices), the operations queued on streams, and the table of entry
// points that fault injection and call counting use (sim/detail/fault_injector.hpp).
//
// Handles are pointers to these objects. A SimDriver never frees a stream or an event
// before it is destroyed itself: a destroyed handle stays a valid pointer to an object
// marked dead, so using it is reported (invalid_handle) instead of reading freed memory.
//
// Not thread-safe, every type here: each object is guarded by its SimDriver's mutex.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "xlogrt/driver/concept.hpp"
#include "xlogrt/sim/detail/clock.hpp"
#include "xlogrt/sim/detail/device_memory.hpp"

namespace xlogrt::detail::sim {

/// The host body of a simulated kernel: one host pointer per declared access, in order.
using KernelBody = std::function<void(std::span<std::byte* const>)>;

struct Device;
struct Stream;
struct Capture;
struct Graph;
struct GraphExec;

/// A device's primary context. Active while retained; the last release destroys it
/// (bumps `generation`), which invalidates the streams and events made in it.
struct Context {
  Device* device = nullptr;
  int retains = 0;
  std::uint64_t generation = 0;
};

/// A device's memory pool: its default one, or one made by mempool_create (every pool
/// of a device allocates from the device's one arena).
struct Pool {
  Device* device = nullptr;
  std::uint64_t release_threshold = 0;
  bool destroyed = false;  // a created pool after mempool_destroy (kept: handles stay unique)
};

struct Kernel {
  std::vector<std::uint64_t> ptrs;
  std::vector<std::uint64_t> bytes;
  KernelBody body;
};

/// One queued stream operation. Which fields matter depends on `kind`.
struct Op {
  OpKind kind = OpKind::none;
  std::uint64_t seq = 0;
  std::uint64_t dst = 0;
  std::uint64_t src = 0;
  std::uint64_t bytes = 0;
  std::uint32_t value = 0;
  void* host = nullptr;
  const void* chost = nullptr;
  HostFn fn = nullptr;
  Stream* wait_stream = nullptr;  // stream_wait_event: the recorded point waited for
  std::uint64_t wait_seq = 0;
  std::uint64_t free_id = 0;             // mem_free_async: names its recycled ranges
  std::unique_ptr<Kernel> kernel;        // kernel
  std::unique_ptr<VectorClock> release;  // host_func, write_value32: clock published to the host
};

struct Stream {
  const void* owner = nullptr;  // the SimDriver, to refuse another driver's handles
  Device* device = nullptr;
  std::uint32_t id = 0;  // index in the driver's stream table; 0 is the host
  std::uint64_t api_id = 0;  // stream_get_id: id, or a new number when the handle was reused
  std::uint64_t generation = 0;
  bool alive = true;
  bool legacy = false;
  bool busy = false;            // its head operation is running (lock released)
  bool active = false;          // listed in the driver's active list
  int fault = 0;                // sticky status once faulted
  std::uint64_t enqueued = 0;   // seq of the last enqueued operation
  std::uint64_t completed = 0;  // seq of the last executed operation
  std::deque<Op> queue;
  VectorClock vc;  // clock of the last enqueued operation
  std::uint64_t host_version = 0;
  Capture* capture = nullptr;  // the capture it records into (sim/detail/capture.hpp); null: none
  VectorClock capture_vc;      // its capture clock, while it records into one
};

struct Event {
  const void* owner = nullptr;
  Device* device = nullptr;
  std::uint64_t generation = 0;
  bool alive = true;
  Stream* stream = nullptr;  // of the latest record; null: never recorded, or recorded in a capture
  std::uint64_t seq = 0;
  VectorClock vc;
  std::uint64_t capture_id = 0;  // the capture its latest record was made in; 0: none
  VectorClock capture_vc;        // the recording stream's capture clock then
};

/// A device: its memory, its primary context and default pool, and its legacy stream.
struct Device {
  int ordinal = 0;
  DeviceMemory mem;
  Context ctx;
  Pool pool;
  std::deque<Pool> created_pools;  // mempool_create's, in a deque so that handles stay put
  Stream* legacy = nullptr;
};

/// The driver entry points, one per Driver, CapturingDriver and VirtualMemoryDriver
/// concept member plus launch_kernel.
enum class Call : std::uint8_t {
  device_count,
  device_get,
  device_name,
  device_total_mem,
  device_attribute,
  primary_ctx_retain,
  primary_ctx_release,
  ctx_make_current,
  mem_get_info,
  stream_create,
  stream_destroy,
  stream_synchronize,
  stream_query,
  stream_get_id,
  stream_wait_event,
  event_create,
  event_destroy,
  event_record,
  event_query,
  event_synchronize,
  device_default_mempool,
  mempool_set_release_threshold,
  mem_alloc_async,
  mem_free_async,
  mem_alloc,
  mem_free,
  mem_host_alloc_mapped,
  mem_host_device_pointer,
  mem_host_free,
  memset_d8_async,
  memcpy_htod_async,
  memcpy_dtoh_async,
  memcpy_dtod_async,
  stream_write_value32,
  launch_host_func,
  launch_kernel,
  mempool_create,
  mempool_destroy,
  stream_capture_info,
  exchange_capture_mode,
  ctx_synchronize,
  stream_begin_capture,
  stream_end_capture,
  graph_instantiate,
  graph_launch,
  graph_destroy,
  graph_exec_destroy,
  mem_granularity,
  mem_address_reserve,
  mem_address_free,
  mem_create,
  mem_release,
  mem_map,
  mem_unmap,
  mem_set_access,
  count_,
};

inline constexpr std::size_t call_count = static_cast<std::size_t>(Call::count_);

/// The CUDA driver API name of each entry point, in Call order.
inline constexpr std::array<std::string_view, call_count> call_names = {
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuCtxSetCurrent",
    "cuMemGetInfo",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamGetId",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolSetAttribute",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer",
    "cuMemFreeHost",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuStreamWriteValue32",
    "cuLaunchHostFunc",
    "cuLaunchKernel",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuStreamGetCaptureInfo",
    "cuThreadExchangeStreamCaptureMode",
    "cuCtxSynchronize",
    "cuStreamBeginCapture",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
};

constexpr std::string_view call_name(Call c) noexcept {
  return call_names[static_cast<std::size_t>(c)];
}

/// The entry point named `name`; also accepts cuMemAllocAsync for mem_alloc_async
/// (whose real call, taking the pool, is cuMemAllocFromPoolAsync).
constexpr bool find_call(std::string_view name, Call& out) noexcept {
  if (name == "cuMemAllocAsync") {
    out = Call::mem_alloc_async;
    return true;
  }
  for (std::size_t i = 0; i < call_count; ++i) {
    if (call_names[i] == name) {
      out = static_cast<Call>(i);
      return true;
    }
  }
  return false;
}

}  // namespace xlogrt::detail::sim

namespace xlogrt::detail::sim {

/// The calling thread's current context, as ctx_make_current left it. CUDA has one
/// current context per thread; `driver` is the serial of the SimDriver it belongs to,
/// so a context made current on one simulator is not current on another.
struct Current {
  std::uint64_t driver = 0;
  Context* ctx = nullptr;
  std::uint64_t generation = 0;
};

inline Current& current() noexcept {
  thread_local Current c;
  return c;
}

/// The calling thread's capture interaction mode on the SimDriver with serial `driver`
/// (CUDA keeps one per thread; a thread starts in global mode). Only threads that have
/// set another mode have an entry, so the list stays as short as the drivers a thread
/// has relaxed.
inline std::vector<std::pair<std::uint64_t, CaptureMode>>& thread_capture_modes() noexcept {
  thread_local std::vector<std::pair<std::uint64_t, CaptureMode>> modes;
  return modes;
}

inline CaptureMode thread_capture_mode(std::uint64_t driver) noexcept {
  for (const auto& [d, m] : thread_capture_modes()) {
    if (d == driver) return m;
  }
  return CaptureMode::global;
}

/// Sets the calling thread's mode on `driver`; returns the previous one. Throws
/// std::bad_alloc only when a non-global mode needs an entry and there is no memory.
inline CaptureMode exchange_thread_capture_mode(std::uint64_t driver, CaptureMode mode) {
  auto& modes = thread_capture_modes();
  for (auto it = modes.begin(); it != modes.end(); ++it) {
    if (it->first != driver) continue;
    const CaptureMode old = it->second;
    if (mode == CaptureMode::global) {
      modes.erase(it);
    } else {
      it->second = mode;
    }
    return old;
  }
  if (mode != CaptureMode::global) modes.emplace_back(driver, mode);
  return CaptureMode::global;
}

/// Process-unique serial numbers for SimDriver instances (0 is never handed out).
inline std::uint64_t next_driver_serial() noexcept {
  static std::atomic<std::uint64_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace xlogrt::detail::sim
