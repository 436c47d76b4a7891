// SPDX-License-Identifier: Apache-2.0
// libxlogrt_torch: PyTorch's pluggable-allocator functions over DeviceRuntime<DefaultStack>
// (configured by XLOGRT_BUDGET_BYTES, XLOGRT_LOG_FILE and XLOGRT_LIBCUDA, as every
// default runtime), one PointerResource per device ordinal, built on the device's first
// allocation. torch's streams are adopted on first sight, keyed by cuStreamGetId, so a
// stream handle the driver reuses after torch destroyed its stream starts afresh.
//
// No torch dependency: this library is what CUDAPluggableAllocator loads. The hooks that
// need torch's C++ API (record_stream, torch.OutOfMemoryError, empty_cache, the memory
// fraction) are torch_hooks.cpp.
//
// Symbols: built with hidden visibility and xlogrt_torch.map, the library exports the
// xlogrt_torch_* functions alone. It is loaded into processes full of other C++ libraries
// (cuDNN, Arrow, ...) and may carry its own copy of libstdc++ (linked statically, as
// wheels are): an exported copy would be bound by libraries loaded after it.

#include "xlogrt_torch.h"

#ifndef XLOGRT_VERSION
#error "XLOGRT_VERSION must be defined (meson.build and setup.py pass the project's version)"
#endif

#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include <xlogrt/interop/pointer_resource.hpp>
#include <xlogrt/resource/budget.hpp>
#include <xlogrt/resource/cached.hpp>
#include <xlogrt/resource/find_layer.hpp>
#include <xlogrt/resource/graph_pools.hpp>
#include <xlogrt/resource/nvtx_marks.hpp>  // XLOGRT_CACHE=nvtx works under torch too
#include <xlogrt/runtime.hpp>

namespace {

using Runtime = xlogrt::DeviceRuntime<xlogrt::DefaultStack>;
using Resource = xlogrt::PointerResource<xlogrt::DefaultStack>;
using Filter = xlogrt::GraphPools<xlogrt::DefaultStack::upstream_type>::Filter;
constexpr std::uint32_t DEVICES = Runtime::MAX_DEVICE_ORDINALS;

/// torch's allocations carry this tag in Statistics and in the log (CuPy's and Numba's
/// theirs, through xlogrt_torch_malloc_tagged).
constexpr xlogrt::AllocTag TORCH_TAG{XLOGRT_TAG_TORCH};
static_assert(XLOGRT_TAG_MAX < xlogrt::StatisticsOptions{}.tag_slots,
              "every framework's tag must have a Statistics slot of its own");

// The resources, built once per device and never destroyed (as the runtimes: torch frees
// tensors during interpreter shutdown, after static destructors would have run).
std::array<std::atomic<Resource*>, DEVICES> g_resources{};
std::mutex g_build_mu;
std::atomic<xlogrt_torch_failure_handler> g_failure_handler{nullptr};
thread_local std::string t_last_error;

void set_error(const std::string& m) { t_last_error = m; }

/// The resource of `device`, built on first use. Null (with the error set) when the
/// device has no runtime.
Resource* resource(int device) noexcept {
  if (device < 0 || static_cast<std::uint32_t>(device) >= DEVICES) {
    set_error("invalid_ordinal: device " + std::to_string(device) + " is outside 0.." +
              std::to_string(DEVICES - 1));
    return nullptr;
  }
  auto& slot = g_resources[static_cast<std::size_t>(device)];
  // Acquire pairs with the release store below: a non-null pointer comes built.
  if (Resource* r = slot.load(std::memory_order_acquire)) return r;
  std::lock_guard lock(g_build_mu);
  if (Resource* r = slot.load(std::memory_order_relaxed)) return r;
  auto rt = Runtime::try_get(static_cast<std::uint32_t>(device));
  if (!rt) {
    set_error(rt.error().what());
    return nullptr;
  }
  auto* r = new (std::nothrow) Resource(**rt, {.tag = TORCH_TAG, .map_capacity = std::size_t{1} << 16});
  if (r == nullptr) {
    set_error("out_of_memory: host allocation of the bridge's resource failed");
    return nullptr;
  }
  slot.store(r, std::memory_order_release);
  return r;
}

/// The GraphPools layer of `device`'s stack, built on first use. Null (with the error
/// set) when the device has no runtime.
auto* graph_pools(int device) noexcept {
  Resource* r = resource(device);
  return r != nullptr ? xlogrt::find_layer<xlogrt::GraphPools>(r->runtime().stack()) : nullptr;
}

/// The virtual memory base the stack allocates from under XLOGRT_BACKEND=vmm; null on
/// the pool.
auto* virtual_base(Runtime& rt) noexcept {
  return xlogrt::find_layer<xlogrt::PoolOrVirtual>(rt.stack())->virtual_base();
}

/// The device pools the stack allocates from: the default one, and the small blocks' own
/// (null when the stack has none). Under XLOGRT_BACKEND=vmm the pools serve nothing (see
/// PoolOrVirtual).
std::array<CUmemoryPool, 2> pools(Runtime& rt) {
  const auto& base = *xlogrt::find_layer<xlogrt::AsyncCuda>(rt.stack());
  return {base.pool(), base.small_pool() != base.pool() ? base.small_pool() : nullptr};
}

/// Statistics' counters of a tag or of all tags into the first fields of `out`.
void copy_counters(const xlogrt::AllocationCounters& c, xlogrt_torch_stats* out) {
  out->current_bytes = c.current_bytes;
  out->peak_bytes = c.peak_bytes;
  out->total_bytes = c.total_bytes;
  out->freed_bytes = c.freed_bytes;
  out->current_count = c.current_count;
  out->allocations = c.allocations;
  out->frees = c.frees;
  out->failed = c.failed;
}

/// The stack's budget error, with the variable that sets the budget named.
std::string failure_message(const xlogrt::error& e) {
  std::string m = "xlogrt: " + e.what();
  if (e.code() == xlogrt::errc::out_of_budget) m += " (the budget is XLOGRT_BUDGET_BYTES)";
  return m;
}

[[gnu::cold]] void* fail(const std::string& message, std::size_t bytes, int device) {
  set_error(message);
  if (auto h = g_failure_handler.load(std::memory_order_acquire)) h(message.c_str(), bytes, device);  // may throw
  return nullptr;
}

// CuPy's allocations (xlogrt_torch_cupy_init): a builtin function of the Python process,
// made by CPython (PyCFunction_NewEx) from the method definition below, that allocates and
// builds the block's owner. The Python API table is written once, under g_python_mu,
// before g_python_ready is set (release); the function runs only after init returned, so
// after the table was published, and never writes it.
xlogrt_torch_python_api g_python{};
std::atomic<bool> g_python_ready{false};
std::mutex g_python_mu;
constexpr const char* CUPY_OWNER = "xlogrt_torch.cupy_block";

/// What a CuPy owner's capsule frees: xlogrt_torch_free's arguments.
struct CupyBlock {
  void* ptr;
  ssize_t size;
  int device;
  xlogrt_torch_stream stream;
};

/// The capsule's destructor: runs where CPython deallocates the capsule, with the GIL (or
/// the thread attached), while the owner tuple still holds the stream object.
void free_cupy_block(void* capsule) {
  auto* b = static_cast<CupyBlock*>(g_python.capsule_get_pointer(capsule, CUPY_OWNER));
  if (b == nullptr) return;  // never expected: the name is the one the capsule was made with
  xlogrt_torch_free(b->ptr, b->size, b->device, b->stream);
  delete b;
}

/// alloc(size, device, stream, stream_object), a METH_FASTCALL function (xlogrt_torch.h
/// says what it returns). CPython calls it with the GIL held.
void* cupy_alloc(void* /*self*/, void* const* args, ssize_t nargs) {
  const auto& py = g_python;
  if (nargs != 4) {
    py.err_set_string(py.type_error, "xlogrt_torch_cupy_alloc takes (size, device, stream, stream_object)");
    return nullptr;
  }
  // Each conversion's error value may be a value too: the error is what PyErr_Occurred says.
  const ssize_t size = py.long_as_ssize_t(args[0]);
  if (size == -1 && py.err_occurred() != nullptr) return nullptr;  // not an int, or out of range
  const long device = py.long_as_long(args[1]);
  if (device == -1 && py.err_occurred() != nullptr) return nullptr;
  auto* stream = static_cast<xlogrt_torch_stream>(py.long_as_void_ptr(args[2]));
  if (stream == nullptr && py.err_occurred() != nullptr) return nullptr;
  if (device < INT_MIN || device > INT_MAX) {
    set_error("xlogrt: invalid_ordinal: device " + std::to_string(device));
    py.incref(py.none);
    return py.none;
  }
  void* thread = py.save_thread();  // other Python threads run during the allocation
  void* p = xlogrt_torch_malloc_tagged(size, static_cast<int>(device), stream, XLOGRT_TAG_CUPY);
  CupyBlock* b = p != nullptr ? new (std::nothrow) CupyBlock{p, size, static_cast<int>(device), stream} : nullptr;
  if (p != nullptr && b == nullptr) {
    xlogrt_torch_free(p, size, static_cast<int>(device), stream);
    set_error("xlogrt: out_of_memory: host allocation of a CuPy block's owner failed");
  }
  py.restore_thread(thread);
  if (b == nullptr) {
    py.incref(py.none);
    return py.none;
  }
  // The capsule owns the block from here: dropping it (on a failure below) frees it.
  void* capsule = py.capsule_new(b, CUPY_OWNER, free_cupy_block);
  if (capsule == nullptr) {
    xlogrt_torch_free(p, size, static_cast<int>(device), stream);
    delete b;
    return nullptr;  // PyCapsule_New set the exception
  }
  void* address = py.long_from_void_ptr(p);
  void* owner = address != nullptr ? py.tuple_pack(3, address, args[3], capsule) : nullptr;
  if (address != nullptr) py.decref(address);
  py.decref(capsule);  // the tuple holds it; without a tuple, this frees the block
  return owner;        // NULL: the exception the API set
}

/// CPython's PyMethodDef (stable ABI), Python objects as void*.
struct MethodDef {
  const char* name;
  void* (*function)(void* self, void* const* args, ssize_t nargs);
  int flags;
  const char* doc;
};
constexpr int METH_FASTCALL = 0x0080;  // CPython's value (Include/methodobject.h)
// Not const: CPython takes a PyMethodDef* (and never writes it).
MethodDef g_cupy_alloc_def{"xlogrt_torch_cupy_alloc", cupy_alloc, METH_FASTCALL,
                           "alloc(size, device, stream, stream_object): (address, stream_object, owner capsule), "
                           "or None on a refusal (xlogrt_torch_last_error says why)"};

}  // namespace

extern "C" {

// Not noexcept: the failure handler may throw through here into torch.
void* xlogrt_torch_malloc(ssize_t size, int device, xlogrt_torch_stream stream) {
  if (size <= 0) {
    if (size == 0) return nullptr;  // torch asks for 0 bytes: no block
    return fail("xlogrt: invalid_argument: a negative size (" + std::to_string(size) + ")", 0, device);
  }
  const auto bytes = static_cast<std::size_t>(size);
  Resource* r = resource(device);
  if (r == nullptr) return fail("xlogrt: " + t_last_error, bytes, device);
  auto p = r->allocate(bytes, stream);
  if (!p) [[unlikely]] return fail(failure_message(p.error()), bytes, device);
  return *p;
}

void* xlogrt_torch_malloc_tagged(ssize_t size, int device, xlogrt_torch_stream stream, uint32_t tag) {
  if (size <= 0) {
    if (size == 0) return set_error(""), nullptr;
    return set_error("xlogrt: invalid_argument: a negative size (" + std::to_string(size) + ")"), nullptr;
  }
  if (tag == 0 || tag > XLOGRT_TAG_MAX) {
    return set_error("xlogrt: invalid_argument: tag " + std::to_string(tag) + " is outside 1.." +
                     std::to_string(XLOGRT_TAG_MAX)),
           nullptr;
  }
  Resource* r = resource(device);
  if (r == nullptr) return set_error("xlogrt: " + t_last_error), nullptr;
  auto p = r->allocate(static_cast<std::size_t>(size), stream, xlogrt::AllocTag{tag});
  if (!p) [[unlikely]] return set_error(failure_message(p.error())), nullptr;
  return *p;
}

void xlogrt_torch_free(void* ptr, ssize_t size, int device, xlogrt_torch_stream stream) {
  if (ptr == nullptr) return;
  if (size < 0) {
    set_error("invalid_argument: free of a negative size (" + std::to_string(size) + ")");
    std::fprintf(stderr, "xlogrt: free of %p refused, the block stays live: %s\n", ptr, t_last_error.c_str());
    return;
  }
  Resource* r = resource(device);
  if (r == nullptr) {
    std::fprintf(stderr, "xlogrt: free of %p on device %d refused: %s\n", ptr, device, t_last_error.c_str());
    return;
  }
  auto done = r->deallocate(ptr, static_cast<std::size_t>(size), stream);
  if (!done) [[unlikely]] {
    set_error(done.error().what());
    std::fprintf(stderr, "xlogrt: free refused, the block stays live: %s\n", done.error().what().c_str());
  }
}

int xlogrt_torch_record_stream(void* ptr, xlogrt_torch_stream stream) {
  // The pointer's device is the one whose resource filed it.
  for (std::uint32_t d = 0; d < DEVICES; ++d) {
    Resource* r = g_resources[d].load(std::memory_order_acquire);
    if (r == nullptr || r->find(ptr) == nullptr) continue;
    auto done = r->record_use(ptr, stream);
    if (done) return 0;
    set_error(done.error().what());
    return -1;
  }
  set_error("foreign_block: record_stream of " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
            ": not a live pointer of the xlogrt bridge");
  return -1;
}

const void* xlogrt_torch_cupy_init(const xlogrt_torch_python_api* api) {
  if (g_python_ready.load(std::memory_order_acquire)) return &g_cupy_alloc_def;
  if (api == nullptr || !api->capsule_new || !api->capsule_get_pointer || !api->long_from_void_ptr ||
      !api->long_as_ssize_t || !api->long_as_long || !api->long_as_void_ptr || !api->err_occurred ||
      !api->err_set_string || !api->tuple_pack || !api->incref || !api->decref || !api->save_thread ||
      !api->restore_thread || !api->none || !api->type_error) {
    return set_error("invalid_argument: the Python API table has a NULL entry"), nullptr;
  }
  std::lock_guard lock(g_python_mu);
  if (!g_python_ready.load(std::memory_order_relaxed)) {
    g_python = *api;
    g_python_ready.store(true, std::memory_order_release);
  }
  return &g_cupy_alloc_def;
}

void xlogrt_torch_set_failure_handler(xlogrt_torch_failure_handler handler) {
  g_failure_handler.store(handler, std::memory_order_release);
}

int xlogrt_torch_get_stats(int device, xlogrt_torch_stats* out) {
  if (out == nullptr) return set_error("invalid_argument: no stats to fill"), -1;
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  auto& rt = r->runtime();
  auto& budget = *xlogrt::find_layer<xlogrt::Budget>(rt.stack());
  (void)budget.poll_pending();  // figures of frees the device has reached, without waiting
  *out = {};
  copy_counters(xlogrt::find_layer<xlogrt::Statistics>(rt.stack())->snapshot().total, out);
  out->bytes_outstanding = rt.bytes_outstanding();
  const auto cache = xlogrt::find_layer<xlogrt::Cached>(rt.stack())->stats();
  out->cached_bytes = cache.cached_bytes;
  out->device_allocs = cache.misses + cache.bypasses;
  out->alloc_retries = cache.pressure_retries;
  const auto both = pools(rt);
  for (auto pool : both) {  // the peaks of the two pools may fall at different times: a bound
    if (pool == nullptr) continue;
    if (auto u = rt.driver().mempool_usage(pool)) {
      out->pool_reserved += u->reserved;
      out->pool_reserved_peak += u->reserved_high;
      out->pool_used += u->used;
      if (pool == both[1]) {
        out->small_pool_reserved = u->reserved;
        out->small_pool_reserved_peak = u->reserved_high;
      }
    }
  }
  const auto usage = budget.usage();
  out->budget_bytes = usage.limit != std::numeric_limits<std::size_t>::max() ? usage.limit
                                                                            : std::numeric_limits<std::uint64_t>::max();
  out->budget_in_use = usage.in_use;
  const auto graphs = xlogrt::find_layer<xlogrt::GraphPools>(rt.stack())->graph_stats();
  out->graph_pool_bytes = graphs.held_bytes;
  out->graph_pool_live_bytes = graphs.live_bytes;
  if (const auto* vmm = virtual_base(rt)) {
    const auto v = vmm->stats();  // the physical pages stand for the pool's reserve
    out->pool_reserved = v.physical_bytes;
    out->pool_reserved_peak = v.peak_physical_bytes;
    out->pool_used = v.used_bytes;
  }
  out->stream_ids = rt.streams()->size();
  out->streams_recycled = rt.streams()->recycled();
  return 0;
}

int xlogrt_torch_begin_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second,
                                        xlogrt_torch_stream capture_stream, xlogrt_torch_stream_filter filter,
                                        void* filter_ctx) {
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  if (capture_stream != nullptr) {  // adopted before the capture: its id cannot be read during it
    auto adopted = r->stream_id(capture_stream);
    if (!adopted) return set_error(adopted.error().what()), -1;
  }
  auto* graphs = xlogrt::find_layer<xlogrt::GraphPools>(r->runtime().stack());
  auto& layer = *graphs;
  Filter admit;
  if (filter != nullptr) {
    admit = [&layer, filter, filter_ctx](xlogrt::StreamId s) {
      auto h = layer.stream_handle(s);
      return h && filter(filter_ctx, reinterpret_cast<xlogrt_torch_stream>(*h)) != 0;
    };
  }
  auto done = layer.begin_allocate_to_pool({pool_first, pool_second}, std::move(admit));
  if (!done) return set_error(done.error().what()), -1;
  return 0;
}

int xlogrt_torch_end_allocate_to_pool(int device, uint64_t pool_first, uint64_t pool_second) {
  auto* graphs = graph_pools(device);
  if (graphs == nullptr) return -1;
  auto done = graphs->end_allocate_to_pool({pool_first, pool_second});
  if (!done) return set_error(done.error().what()), -1;
  return 0;
}

int xlogrt_torch_release_pool(int device, uint64_t pool_first, uint64_t pool_second) {
  auto* graphs = graph_pools(device);
  if (graphs == nullptr) return -1;
  auto done = graphs->release_pool({pool_first, pool_second});
  // torch may release a pool it never allocated to (a MemPool never used): nothing to do.
  if (!done && done.error().code() != xlogrt::errc::invalid_argument) return set_error(done.error().what()), -1;
  return 0;
}

int xlogrt_torch_get_tag_stats(int device, uint32_t tag, xlogrt_torch_stats* out) {
  if (tag > XLOGRT_TAG_MAX) {
    return set_error("invalid_argument: tag " + std::to_string(tag) + " is outside 0.." + std::to_string(XLOGRT_TAG_MAX)),
           -1;
  }
  if (xlogrt_torch_get_stats(device, out) != 0) return -1;
  Resource* r = g_resources[static_cast<std::size_t>(device)].load(std::memory_order_acquire);
  copy_counters(xlogrt::find_layer<xlogrt::Statistics>(r->runtime().stack())->snapshot().of(xlogrt::AllocTag{tag}), out);
  return 0;
}

int xlogrt_torch_mem_get_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return set_error("invalid_argument: nowhere to write"), -1;
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  auto& rt = r->runtime();
  if (auto done = rt.device()->make_current(); !done) return set_error(done.error().what()), -1;
  auto info = rt.driver().mem_get_info();
  if (!info) return set_error(info.error().what()), -1;
  *free_bytes = info->free;
  *total_bytes = info->total;
  return 0;
}

int xlogrt_torch_reset_peak(int device) {
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  xlogrt::find_layer<xlogrt::Statistics>(r->runtime().stack())->reset_peak();
  return 0;
}

int xlogrt_torch_reap(int device) {
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  if (auto done = r->runtime().reap_pending(); !done) return set_error(done.error().what()), -1;
  return 0;
}

int xlogrt_torch_empty_cache(int device) {
  if (device == -1) {
    int rc = 0;
    for (std::uint32_t d = 0; d < DEVICES; ++d) {
      if (g_resources[d].load(std::memory_order_acquire) != nullptr && xlogrt_torch_empty_cache(static_cast<int>(d)) != 0) rc = -1;
    }
    return rc;
  }
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  auto& rt = r->runtime();
  (void)xlogrt::find_layer<xlogrt::Cached>(rt.stack())->trim();
  if (auto done = rt.reap_pending(); !done) return set_error(done.error().what()), -1;
  if (auto* vmm = virtual_base(rt)) {
    if (auto done = vmm->trim(); !done) return set_error(done.error().what()), -1;  // unmaps and releases idle pages
    return 0;
  }
  for (auto pool : pools(rt)) {
    if (pool == nullptr) continue;
    if (auto done = rt.driver().mempool_trim_to(pool, 0); !done) return set_error(done.error().what()), -1;
  }
  return 0;
}

int xlogrt_torch_set_memory_fraction(double fraction, int device) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {  // NaN fails too
    return set_error("invalid_argument: a memory fraction must be in (0, 1], not " + std::to_string(fraction)), -1;
  }
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  const auto total = static_cast<double>(r->runtime().device()->info().total_bytes);
  const auto limit = static_cast<std::size_t>(std::floor(fraction * total));
  if (auto done = xlogrt::set_device_budget(static_cast<std::uint32_t>(device), limit); !done) {
    return set_error(done.error().what()), -1;
  }
  return 0;
}

int xlogrt_torch_flush_log(int device) {
  Resource* r = resource(device);
  if (r == nullptr) return -1;
  if (auto done = xlogrt::find_layer<xlogrt::Logging>(r->runtime().stack())->flush(); !done) {
    return set_error(done.error().what()), -1;
  }
  return 0;
}

const char* xlogrt_torch_last_error(void) { return t_last_error.c_str(); }

const char* xlogrt_torch_version(void) { return XLOGRT_VERSION; }

}  // extern "C"
