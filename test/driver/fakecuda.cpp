// SPDX-License-Identifier: Apache-2.0
// A fake libcuda, built as several shared libraries (test/driver/meson.build) that differ
// by the macros below, so that CudaDriver's run-time loading is tested without a GPU:
//   FAKECUDA_VERSION=n            what cuDriverGetVersion reports (default 12080)
//   FAKECUDA_INIT_STATUS=n        what cuInit returns (default 0)
//   FAKECUDA_DEVICE_COUNT=n       what cuDeviceGetCount reports (default 1)
//   FAKECUDA_MISSING="cuXxx"      a symbol cuGetProcAddress does not find
//   FAKECUDA_NO_GET_PROC_ADDRESS  cuGetProcAddress_v2 is not exported
//   FAKECUDA_NO_INIT              cuInit is not exported (not a driver library at all)
// and, at run time, the environment variable FAKECUDA_INIT_DELAY_MS makes cuInit slow.
//
// cuGetProcAddress behaves as the real one documents: it hands out the newest variant of
// a symbol whose ABI version is at most the version asked for, and for symbols that
// have had more than one ABI the fake has one function per ABI (with that ABI's
// signature, from cudaTypedefs.h), each recording which one ran. "Device memory" is host
// memory, so copies, fills and flag writes can be read back by the test.

#include <cuda.h>
#include <cudaTypedefs.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include "fakecuda.hpp"

#ifndef FAKECUDA_VERSION
#define FAKECUDA_VERSION 12080
#endif
#ifndef FAKECUDA_INIT_STATUS
#define FAKECUDA_INIT_STATUS 0
#endif
#ifndef FAKECUDA_DEVICE_COUNT
#define FAKECUDA_DEVICE_COUNT 1
#endif

namespace {

// The 32-bit device pointer of the CUDA 2.0 ABI (cuda.h declares it only under
// __CUDA_API_VERSION_INTERNAL).
using CUdeviceptr_v1 = unsigned int;

FakeCudaState g_state;

std::mutex g_mem_mutex;
std::set<unsigned long long> g_device_blocks;  // live "device" allocations
std::set<void*> g_host_blocks;                 // live cuMemHostAlloc allocations

CUresult enter(const char* symbol, int variant, unsigned long long a0 = 0,
               unsigned long long a1 = 0, unsigned long long a2 = 0,
               unsigned long long a3 = 0, unsigned long long a4 = 0,
               unsigned long long a5 = 0) {
  g_state.calls.fetch_add(1);
  std::strncpy(g_state.last_symbol, symbol, sizeof g_state.last_symbol - 1);
  g_state.last_variant = variant;
  g_state.last_args[0] = a0;
  g_state.last_args[1] = a1;
  g_state.last_args[2] = a2;
  g_state.last_args[3] = a3;
  g_state.last_args[4] = a4;
  g_state.last_args[5] = a5;
  if (std::strcmp(g_state.fail_symbol, symbol) == 0) {
    return static_cast<CUresult>(g_state.fail_status);
  }
  return CUDA_SUCCESS;
}

template <class T>
unsigned long long u(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<std::uintptr_t>(v);
  } else {
    return static_cast<unsigned long long>(v);
  }
}

unsigned long long device_alloc(std::size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_device_blocks.insert(u(p));
  return u(p);
}

CUresult device_free(unsigned long long p) {
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (g_device_blocks.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)));
  return CUDA_SUCCESS;
}

void* host(unsigned long long p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

// --- Entry points handed out by cuGetProcAddress ----------------------------------------

CUresult CUDAAPI fake_cuGetErrorName(CUresult error, const char** str) {
  if (CUresult r = enter("cuGetErrorName", 6000, u(error)); r != CUDA_SUCCESS) return r;
  switch (static_cast<int>(error)) {
    case 0: *str = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case 1: *str = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case 2: *str = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case 34: *str = "CUDA_ERROR_STUB_LIBRARY"; return CUDA_SUCCESS;
    case 101: *str = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
    case 222: *str = "CUDA_ERROR_FAKE_222"; return CUDA_SUCCESS;  // unknown to status.hpp
    case 600: *str = "CUDA_ERROR_NOT_READY"; return CUDA_SUCCESS;
    case 700: *str = "CUDA_ERROR_ILLEGAL_ADDRESS"; return CUDA_SUCCESS;
    default: *str = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI fake_cuDeviceGetCount(int* count) {
  if (CUresult r = enter("cuDeviceGetCount", 2000); r != CUDA_SUCCESS) return r;
  *count = FAKECUDA_DEVICE_COUNT;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuDeviceGet(CUdevice_v1* dev, int ordinal) {
  if (CUresult r = enter("cuDeviceGet", 2000, u(ordinal)); r != CUDA_SUCCESS) return r;
  if (ordinal < 0 || ordinal >= FAKECUDA_DEVICE_COUNT) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuDeviceGetName(char* name, int len, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDeviceGetName", 2000, u(len), u(dev)); r != CUDA_SUCCESS) return r;
  const char n[] = "Fake GPU";
  std::strncpy(name, n, static_cast<std::size_t>(len));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuDeviceTotalMem_v1(unsigned int* bytes, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDeviceTotalMem", 2000, u(dev)); r != CUDA_SUCCESS) return r;
  *bytes = 0xFFFFFFFFu;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDeviceTotalMem", 3020, u(dev)); r != CUDA_SUCCESS) return r;
  *bytes = std::size_t{80} << 30;
  return CUDA_SUCCESS;
}

// Reports 1000 + the attribute number, so a test sees which attribute was asked for (0 for
// the state's zero_attribute).
CUresult CUDAAPI fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDeviceGetAttribute", 2000, u(attr), u(dev)); r != CUDA_SUCCESS) {
    return r;
  }
  if (dev < 0 || dev >= FAKECUDA_DEVICE_COUNT) return CUDA_ERROR_INVALID_DEVICE;
  *value = static_cast<int>(attr) == g_state.zero_attribute ? 0 : 1000 + static_cast<int>(attr);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDevicePrimaryCtxRetain", 7000, u(dev)); r != CUDA_SUCCESS) return r;
  *ctx = reinterpret_cast<CUcontext>(static_cast<std::uintptr_t>(0x1000 + 16 * dev));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDevicePrimaryCtxRelease_v1(CUdevice_v1 dev) {
  return enter("cuDevicePrimaryCtxRelease", 7000, u(dev));
}
CUresult CUDAAPI fake_cuDevicePrimaryCtxRelease_v2(CUdevice_v1 dev) {
  return enter("cuDevicePrimaryCtxRelease", 11000, u(dev));
}

CUresult CUDAAPI fake_cuCtxGetCurrent(CUcontext* ctx) {
  if (CUresult r = enter("cuCtxGetCurrent", 4000); r != CUDA_SUCCESS) return r;
  *ctx = static_cast<CUcontext>(g_state.current_ctx);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = enter("cuCtxSetCurrent", 4000, u(ctx)); r != CUDA_SUCCESS) return r;
  g_state.set_current_calls.fetch_add(1);
  g_state.current_ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuMemGetInfo_v1(unsigned int* free, unsigned int* total) {
  if (CUresult r = enter("cuMemGetInfo", 2000); r != CUDA_SUCCESS) return r;
  *free = *total = 1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemGetInfo_v2(std::size_t* free, std::size_t* total) {
  if (CUresult r = enter("cuMemGetInfo", 3020); r != CUDA_SUCCESS) return r;
  *free = std::size_t{1} << 30;
  *total = std::size_t{2} << 30;
  return CUDA_SUCCESS;
}

std::atomic<std::uintptr_t> g_next_handle{0x2000};

CUresult CUDAAPI fake_cuStreamCreate(CUstream* s, unsigned int flags) {
  if (CUresult r = enter("cuStreamCreate", 2000, flags); r != CUDA_SUCCESS) return r;
  *s = reinterpret_cast<CUstream>(g_next_handle.fetch_add(16));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamDestroy_v1(CUstream s) { return enter("cuStreamDestroy", 2000, u(s)); }
CUresult CUDAAPI fake_cuStreamDestroy_v2(CUstream s) { return enter("cuStreamDestroy", 4000, u(s)); }
CUresult CUDAAPI fake_cuStreamSynchronize(CUstream s) {
  return enter("cuStreamSynchronize", 2000, u(s));
}
CUresult CUDAAPI fake_cuStreamQuery(CUstream s) {
  if (CUresult r = enter("cuStreamQuery", 2000, u(s)); r != CUDA_SUCCESS) return r;
  return static_cast<CUresult>(g_state.query_status);
}
// The id is derived from the handle and stream_id_salt, so that a test can make a handle
// "destroyed and reused for a new stream" by changing the salt.
CUresult CUDAAPI fake_cuStreamGetId(CUstream s, unsigned long long* id) {
  if (CUresult r = enter("cuStreamGetId", 12000, u(s)); r != CUDA_SUCCESS) return r;
  *id = u(s) * 7 + g_state.stream_id_salt;
  return CUDA_SUCCESS;
}
// The context current when asked: adopt makes its device's current first, so a fake
// stream always belongs to the adopting device.
CUresult CUDAAPI fake_cuStreamGetCtx(CUstream s, CUcontext* ctx) {
  if (CUresult r = enter("cuStreamGetCtx", 9020, u(s)); r != CUDA_SUCCESS) return r;
  *ctx = static_cast<CUcontext>(g_state.current_ctx);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  return enter("cuStreamWaitEvent", 3020, u(s), u(e), flags);
}

CUresult CUDAAPI fake_cuEventCreate(CUevent* e, unsigned int flags) {
  if (CUresult r = enter("cuEventCreate", 2000, flags); r != CUDA_SUCCESS) return r;
  *e = reinterpret_cast<CUevent>(g_next_handle.fetch_add(16));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventDestroy_v1(CUevent e) { return enter("cuEventDestroy", 2000, u(e)); }
CUresult CUDAAPI fake_cuEventDestroy_v2(CUevent e) { return enter("cuEventDestroy", 4000, u(e)); }
CUresult CUDAAPI fake_cuEventRecord(CUevent e, CUstream s) {
  return enter("cuEventRecord", 2000, u(e), u(s));
}
CUresult CUDAAPI fake_cuEventQuery(CUevent e) {
  if (CUresult r = enter("cuEventQuery", 2000, u(e)); r != CUDA_SUCCESS) return r;
  return static_cast<CUresult>(g_state.query_status);
}
CUresult CUDAAPI fake_cuEventSynchronize(CUevent e) {
  return enter("cuEventSynchronize", 2000, u(e));
}

CUresult CUDAAPI fake_cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice_v1 dev) {
  if (CUresult r = enter("cuDeviceGetDefaultMemPool", 11020, u(dev)); r != CUDA_SUCCESS) return r;
  *pool = reinterpret_cast<CUmemoryPool>(static_cast<std::uintptr_t>(0x3000 + 16 * dev));
  return CUDA_SUCCESS;
}
// Records the attribute and the value it points to (a cuuint64_t for the threshold).
CUresult CUDAAPI fake_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                            void* value) {
  return enter("cuMemPoolSetAttribute", 11020, u(pool), u(attr),
               *static_cast<cuuint64_t*>(value));
}
// Records the attribute; the value is the attribute's number times 0x1000, so that a
// test can see each counter land in its own field.
CUresult CUDAAPI fake_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                                            void* value) {
  if (CUresult r = enter("cuMemPoolGetAttribute", 11020, u(pool), u(attr)); r != CUDA_SUCCESS)
    return r;
  *static_cast<cuuint64_t*>(value) = cuuint64_t{0x1000} * static_cast<cuuint64_t>(attr);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (CUresult r = enter("cuMemPoolCreate", 11020, u(props->location.id)); r != CUDA_SUCCESS) return r;
  static int pools = 0;
  *pool = reinterpret_cast<CUmemoryPool>(static_cast<std::uintptr_t>(0x9000 + 0x10 * ++pools));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemPoolDestroy(CUmemoryPool pool) { return enter("cuMemPoolDestroy", 11020, u(pool)); }
CUresult CUDAAPI fake_cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  return enter("cuMemPoolTrimTo", 11020, u(pool), keep);
}
CUresult CUDAAPI fake_cuMemAllocFromPoolAsync(CUdeviceptr_v2* p, std::size_t bytes,
                                              CUmemoryPool pool, CUstream s) {
  if (CUresult r = enter("cuMemAllocFromPoolAsync", 11020, bytes, u(pool), u(s));
      r != CUDA_SUCCESS) {
    return r;
  }
  *p = device_alloc(bytes);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemFreeAsync(CUdeviceptr_v2 p, CUstream s) {
  if (CUresult r = enter("cuMemFreeAsync", 11020, p, u(s)); r != CUDA_SUCCESS) return r;
  return device_free(p);
}

CUresult CUDAAPI fake_cuMemAlloc_v1(CUdeviceptr_v1* p, unsigned int bytes) {
  if (CUresult r = enter("cuMemAlloc", 2000, bytes); r != CUDA_SUCCESS) return r;
  *p = 0;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI fake_cuMemAlloc_v2(CUdeviceptr_v2* p, std::size_t bytes) {
  if (CUresult r = enter("cuMemAlloc", 3020, bytes); r != CUDA_SUCCESS) return r;
  *p = device_alloc(bytes);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemFree_v1(CUdeviceptr_v1 p) { return enter("cuMemFree", 2000, p); }
CUresult CUDAAPI fake_cuMemFree_v2(CUdeviceptr_v2 p) {
  if (CUresult r = enter("cuMemFree", 3020, p); r != CUDA_SUCCESS) return r;
  return device_free(p);
}

CUresult CUDAAPI fake_cuMemHostAlloc(void** p, std::size_t bytes, unsigned int flags) {
  if (CUresult r = enter("cuMemHostAlloc", 2020, bytes, flags); r != CUDA_SUCCESS) return r;
  *p = std::calloc(bytes == 0 ? 1 : bytes, 1);
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  g_host_blocks.insert(*p);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemHostGetDevicePointer_v1(CUdeviceptr_v1* d, void* p, unsigned int flags) {
  return enter("cuMemHostGetDevicePointer", 2020, u(d), u(p), flags);
}
CUresult CUDAAPI fake_cuMemHostGetDevicePointer_v2(CUdeviceptr_v2* d, void* p, unsigned int flags) {
  if (CUresult r = enter("cuMemHostGetDevicePointer", 3020, u(p), flags); r != CUDA_SUCCESS) {
    return r;
  }
  *d = u(p);  // a unified address space: the device sees the host address
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemFreeHost(void* p) {
  if (CUresult r = enter("cuMemFreeHost", 2000, u(p)); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(g_mem_mutex);
  if (g_host_blocks.erase(p) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::free(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuMemsetD8Async(CUdeviceptr_v2 dst, unsigned char v, std::size_t n,
                                      CUstream s) {
  if (CUresult r = enter("cuMemsetD8Async", 3020, dst, v, n, u(s)); r != CUDA_SUCCESS) return r;
  std::memset(host(dst), v, n);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemcpyHtoDAsync_v1(CUdeviceptr_v1 d, const void* s, unsigned int n,
                                           CUstream st) {
  return enter("cuMemcpyHtoDAsync", 2000, d, u(s), n, u(st));
}
CUresult CUDAAPI fake_cuMemcpyHtoDAsync_v2(CUdeviceptr_v2 d, const void* s, std::size_t n,
                                           CUstream st) {
  if (CUresult r = enter("cuMemcpyHtoDAsync", 3020, d, u(s), n, u(st)); r != CUDA_SUCCESS) {
    return r;
  }
  std::memcpy(host(d), s, n);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemcpyDtoHAsync_v1(void* d, CUdeviceptr_v1 s, unsigned int n, CUstream st) {
  return enter("cuMemcpyDtoHAsync", 2000, u(d), s, n, u(st));
}
CUresult CUDAAPI fake_cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr_v2 s, std::size_t n, CUstream st) {
  if (CUresult r = enter("cuMemcpyDtoHAsync", 3020, u(d), s, n, u(st)); r != CUDA_SUCCESS) {
    return r;
  }
  std::memcpy(d, host(s), n);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemcpyDtoDAsync_v1(CUdeviceptr_v1 d, CUdeviceptr_v1 s, unsigned int n,
                                           CUstream st) {
  return enter("cuMemcpyDtoDAsync", 3000, d, s, n, u(st));
}
CUresult CUDAAPI fake_cuMemcpyDtoDAsync_v2(CUdeviceptr_v2 d, CUdeviceptr_v2 s, std::size_t n,
                                           CUstream st) {
  if (CUresult r = enter("cuMemcpyDtoDAsync", 3020, d, s, n, u(st)); r != CUDA_SUCCESS) return r;
  std::memmove(host(d), host(s), n);
  return CUDA_SUCCESS;
}

// v1 (CUDA 8.0) records only; v2 (11.7) performs the write.
CUresult CUDAAPI fake_cuStreamWriteValue32_v1(CUstream s, CUdeviceptr_v2 a, cuuint32_t v,
                                              unsigned int flags) {
  return enter("cuStreamWriteValue32", 8000, u(s), a, v, flags);
}
CUresult CUDAAPI fake_cuStreamWriteValue32_v2(CUstream s, CUdeviceptr_v2 a, cuuint32_t v,
                                              unsigned int flags) {
  if (CUresult r = enter("cuStreamWriteValue32", 11070, u(s), a, v, flags); r != CUDA_SUCCESS) {
    return r;
  }
  std::memcpy(host(a), &v, sizeof v);
  return CUDA_SUCCESS;
}

// Runs the function at once: the fake's streams have no queue.
CUresult CUDAAPI fake_cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  if (CUresult r = enter("cuLaunchHostFunc", 10000, u(s), u(data)); r != CUDA_SUCCESS) return r;
  fn(data);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, unsigned, CUstream, void**, void**) {
  return enter("cuLaunchKernel", 4000);
}
CUresult CUDAAPI fake_cuModuleLoadData(CUmodule*, const void*) {
  return enter("cuModuleLoadData", 2000);
}
CUresult CUDAAPI fake_cuModuleGetFunction(CUfunction*, CUmodule, const char*) {
  return enter("cuModuleGetFunction", 2000);
}

// Stream capture: the fake never captures. Capture info reports no capture; begin and
// end capture only record (end hands out a fresh graph handle); the capture mode is kept
// per thread, as the driver keeps it, so an exchange returns what this thread set last.
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult CUDAAPI fake_cuStreamGetCaptureInfo_v1(CUstream s, CUstreamCaptureStatus* st,
                                                cuuint64_t* id) {
  return enter("cuStreamGetCaptureInfo", 10010, u(s), u(st), u(id));
}
CUresult CUDAAPI fake_cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* st,
                                                cuuint64_t* id, CUgraph* g,
                                                const CUgraphNode** deps, std::size_t* n) {
  if (CUresult r = enter("cuStreamGetCaptureInfo", 11030, u(s), u(g), u(deps), u(n));
      r != CUDA_SUCCESS) {
    return r;
  }
  if (st != nullptr) *st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id != nullptr) *id = 0;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* st,
                                                cuuint64_t* id, CUgraph*, const CUgraphNode**,
                                                const CUgraphEdgeData**, std::size_t*) {
  return enter("cuStreamGetCaptureInfo", 12030, u(s), u(st), u(id));
}
CUresult CUDAAPI fake_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (CUresult r = enter("cuThreadExchangeStreamCaptureMode", 10010, u(*mode)); r != CUDA_SUCCESS) {
    return r;
  }
  const CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuCtxSynchronize_v1() { return enter("cuCtxSynchronize", 2000); }
CUresult CUDAAPI fake_cuCtxSynchronize_v2(CUcontext ctx) {
  return enter("cuCtxSynchronize", 13000, u(ctx));
}
CUresult CUDAAPI fake_cuStreamBeginCapture_v1(CUstream s) {
  return enter("cuStreamBeginCapture", 10000, u(s));
}
CUresult CUDAAPI fake_cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return enter("cuStreamBeginCapture", 10010, u(s), u(mode));
}
CUresult CUDAAPI fake_cuStreamEndCapture(CUstream s, CUgraph* g) {
  if (CUresult r = enter("cuStreamEndCapture", 10000, u(s)); r != CUDA_SUCCESS) return r;
  *g = reinterpret_cast<CUgraph>(g_next_handle.fetch_add(16));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuGraphInstantiateWithFlags(CUgraphExec* x, CUgraph g,
                                                  unsigned long long flags) {
  if (CUresult r = enter("cuGraphInstantiateWithFlags", 11040, u(g), flags); r != CUDA_SUCCESS) {
    return r;
  }
  *x = reinterpret_cast<CUgraphExec>(g_next_handle.fetch_add(16));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuGraphLaunch(CUgraphExec x, CUstream s) {
  return enter("cuGraphLaunch", 10000, u(x), u(s));
}
CUresult CUDAAPI fake_cuGraphDestroy(CUgraph g) { return enter("cuGraphDestroy", 10000, u(g)); }
CUresult CUDAAPI fake_cuGraphExecDestroy(CUgraphExec x) {
  return enter("cuGraphExecDestroy", 10000, u(x));
}

// Virtual memory: each records its arguments (a structure's fields one by one) and hands
// out made-up values: granularities 2 MiB (minimum) and 4 MiB (recommended), one fixed
// reserved address, fresh allocation handles.
CUresult CUDAAPI fake_cuMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp* prop,
                                                    CUmemAllocationGranularity_flags option) {
  if (CUresult r = enter("cuMemGetAllocationGranularity", 10020, u(option), u(prop->type),
                         u(prop->location.type), u(prop->location.id),
                         u(prop->requestedHandleTypes));
      r != CUDA_SUCCESS) {
    return r;
  }
  *g = option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED ? std::size_t{4} << 20 : std::size_t{2} << 20;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemAddressReserve(CUdeviceptr_v2* p, std::size_t size, std::size_t align,
                                          CUdeviceptr_v2 addr, unsigned long long flags) {
  if (CUresult r = enter("cuMemAddressReserve", 10020, size, align, addr, flags); r != CUDA_SUCCESS)
    return r;
  *p = 0x7000'0000'0000ull;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemAddressFree(CUdeviceptr_v2 p, std::size_t size) {
  return enter("cuMemAddressFree", 10020, p, size);
}
CUresult CUDAAPI fake_cuMemCreate(CUmemGenericAllocationHandle* h, std::size_t size,
                                  const CUmemAllocationProp* prop, unsigned long long flags) {
  if (CUresult r = enter("cuMemCreate", 10020, size, u(prop->type), u(prop->location.type),
                         u(prop->location.id), u(prop->requestedHandleTypes), flags);
      r != CUDA_SUCCESS) {
    return r;
  }
  *h = g_next_handle.fetch_add(16);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemRelease(CUmemGenericAllocationHandle h) {
  return enter("cuMemRelease", 10020, h);
}
CUresult CUDAAPI fake_cuMemMap(CUdeviceptr_v2 p, std::size_t size, std::size_t offset,
                               CUmemGenericAllocationHandle h, unsigned long long flags) {
  return enter("cuMemMap", 10020, p, size, offset, h, flags);
}
CUresult CUDAAPI fake_cuMemUnmap(CUdeviceptr_v2 p, std::size_t size) {
  return enter("cuMemUnmap", 10020, p, size);
}
CUresult CUDAAPI fake_cuMemSetAccess(CUdeviceptr_v2 p, std::size_t size, const CUmemAccessDesc* desc,
                                     std::size_t count) {
  return enter("cuMemSetAccess", 10020, p, size, count, u(desc->location.type),
               u(desc->location.id), u(desc->flags));
}

template <class F>
void* as_void(F f) {
  return std::bit_cast<void*>(f);
}

struct Entry {
  const char* name;
  int version;  // the CUDA version that introduced this ABI of the symbol
  void* fn;
};

// Oldest variant first within a symbol.
const Entry g_entries[] = {
    {"cuGetErrorName", 6000, as_void(&fake_cuGetErrorName)},
    {"cuDeviceGetCount", 2000, as_void(&fake_cuDeviceGetCount)},
    {"cuDeviceGet", 2000, as_void(&fake_cuDeviceGet)},
    {"cuDeviceGetName", 2000, as_void(&fake_cuDeviceGetName)},
    {"cuDeviceTotalMem", 2000, as_void(&fake_cuDeviceTotalMem_v1)},
    {"cuDeviceTotalMem", 3020, as_void(&fake_cuDeviceTotalMem_v2)},
    {"cuDeviceGetAttribute", 2000, as_void(&fake_cuDeviceGetAttribute)},
    {"cuDevicePrimaryCtxRetain", 7000, as_void(&fake_cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", 7000, as_void(&fake_cuDevicePrimaryCtxRelease_v1)},
    {"cuDevicePrimaryCtxRelease", 11000, as_void(&fake_cuDevicePrimaryCtxRelease_v2)},
    {"cuCtxGetCurrent", 4000, as_void(&fake_cuCtxGetCurrent)},
    {"cuCtxSetCurrent", 4000, as_void(&fake_cuCtxSetCurrent)},
    {"cuMemGetInfo", 2000, as_void(&fake_cuMemGetInfo_v1)},
    {"cuMemGetInfo", 3020, as_void(&fake_cuMemGetInfo_v2)},
    {"cuStreamCreate", 2000, as_void(&fake_cuStreamCreate)},
    {"cuStreamDestroy", 2000, as_void(&fake_cuStreamDestroy_v1)},
    {"cuStreamDestroy", 4000, as_void(&fake_cuStreamDestroy_v2)},
    {"cuStreamSynchronize", 2000, as_void(&fake_cuStreamSynchronize)},
    {"cuStreamQuery", 2000, as_void(&fake_cuStreamQuery)},
    {"cuStreamGetId", 12000, as_void(&fake_cuStreamGetId)},
    {"cuStreamGetCtx", 9020, as_void(&fake_cuStreamGetCtx)},
    {"cuStreamWaitEvent", 3020, as_void(&fake_cuStreamWaitEvent)},
    {"cuEventCreate", 2000, as_void(&fake_cuEventCreate)},
    {"cuEventDestroy", 2000, as_void(&fake_cuEventDestroy_v1)},
    {"cuEventDestroy", 4000, as_void(&fake_cuEventDestroy_v2)},
    {"cuEventRecord", 2000, as_void(&fake_cuEventRecord)},
    {"cuEventQuery", 2000, as_void(&fake_cuEventQuery)},
    {"cuEventSynchronize", 2000, as_void(&fake_cuEventSynchronize)},
    {"cuDeviceGetDefaultMemPool", 11020, as_void(&fake_cuDeviceGetDefaultMemPool)},
    {"cuMemPoolSetAttribute", 11020, as_void(&fake_cuMemPoolSetAttribute)},
    {"cuMemPoolGetAttribute", 11020, as_void(&fake_cuMemPoolGetAttribute)},
    {"cuMemPoolTrimTo", 11020, as_void(&fake_cuMemPoolTrimTo)},
    {"cuMemPoolCreate", 11020, as_void(&fake_cuMemPoolCreate)},
    {"cuMemPoolDestroy", 11020, as_void(&fake_cuMemPoolDestroy)},
    {"cuMemAllocFromPoolAsync", 11020, as_void(&fake_cuMemAllocFromPoolAsync)},
    {"cuMemFreeAsync", 11020, as_void(&fake_cuMemFreeAsync)},
    {"cuMemAlloc", 2000, as_void(&fake_cuMemAlloc_v1)},
    {"cuMemAlloc", 3020, as_void(&fake_cuMemAlloc_v2)},
    {"cuMemFree", 2000, as_void(&fake_cuMemFree_v1)},
    {"cuMemFree", 3020, as_void(&fake_cuMemFree_v2)},
    {"cuMemHostAlloc", 2020, as_void(&fake_cuMemHostAlloc)},
    {"cuMemHostGetDevicePointer", 2020, as_void(&fake_cuMemHostGetDevicePointer_v1)},
    {"cuMemHostGetDevicePointer", 3020, as_void(&fake_cuMemHostGetDevicePointer_v2)},
    {"cuMemFreeHost", 2000, as_void(&fake_cuMemFreeHost)},
    {"cuMemsetD8Async", 3020, as_void(&fake_cuMemsetD8Async)},
    {"cuMemcpyHtoDAsync", 2000, as_void(&fake_cuMemcpyHtoDAsync_v1)},
    {"cuMemcpyHtoDAsync", 3020, as_void(&fake_cuMemcpyHtoDAsync_v2)},
    {"cuMemcpyDtoHAsync", 2000, as_void(&fake_cuMemcpyDtoHAsync_v1)},
    {"cuMemcpyDtoHAsync", 3020, as_void(&fake_cuMemcpyDtoHAsync_v2)},
    {"cuMemcpyDtoDAsync", 3000, as_void(&fake_cuMemcpyDtoDAsync_v1)},
    {"cuMemcpyDtoDAsync", 3020, as_void(&fake_cuMemcpyDtoDAsync_v2)},
    {"cuStreamWriteValue32", 8000, as_void(&fake_cuStreamWriteValue32_v1)},
    {"cuStreamWriteValue32", 11070, as_void(&fake_cuStreamWriteValue32_v2)},
    {"cuLaunchHostFunc", 10000, as_void(&fake_cuLaunchHostFunc)},
    {"cuLaunchKernel", 4000, as_void(&fake_cuLaunchKernel)},
    {"cuModuleLoadData", 2000, as_void(&fake_cuModuleLoadData)},
    {"cuModuleGetFunction", 2000, as_void(&fake_cuModuleGetFunction)},
    {"cuStreamGetCaptureInfo", 10010, as_void(&fake_cuStreamGetCaptureInfo_v1)},
    {"cuStreamGetCaptureInfo", 11030, as_void(&fake_cuStreamGetCaptureInfo_v2)},
    {"cuStreamGetCaptureInfo", 12030, as_void(&fake_cuStreamGetCaptureInfo_v3)},
    {"cuThreadExchangeStreamCaptureMode", 10010, as_void(&fake_cuThreadExchangeStreamCaptureMode)},
    {"cuCtxSynchronize", 2000, as_void(&fake_cuCtxSynchronize_v1)},
    {"cuCtxSynchronize", 13000, as_void(&fake_cuCtxSynchronize_v2)},
    {"cuStreamBeginCapture", 10000, as_void(&fake_cuStreamBeginCapture_v1)},
    {"cuStreamBeginCapture", 10010, as_void(&fake_cuStreamBeginCapture_v2)},
    {"cuStreamEndCapture", 10000, as_void(&fake_cuStreamEndCapture)},
    {"cuGraphInstantiateWithFlags", 11040, as_void(&fake_cuGraphInstantiateWithFlags)},
    {"cuGraphLaunch", 10000, as_void(&fake_cuGraphLaunch)},
    {"cuGraphDestroy", 10000, as_void(&fake_cuGraphDestroy)},
    {"cuGraphExecDestroy", 10000, as_void(&fake_cuGraphExecDestroy)},
    {"cuMemGetAllocationGranularity", 10020, as_void(&fake_cuMemGetAllocationGranularity)},
    {"cuMemAddressReserve", 10020, as_void(&fake_cuMemAddressReserve)},
    {"cuMemAddressFree", 10020, as_void(&fake_cuMemAddressFree)},
    {"cuMemCreate", 10020, as_void(&fake_cuMemCreate)},
    {"cuMemRelease", 10020, as_void(&fake_cuMemRelease)},
    {"cuMemMap", 10020, as_void(&fake_cuMemMap)},
    {"cuMemUnmap", 10020, as_void(&fake_cuMemUnmap)},
    {"cuMemSetAccess", 10020, as_void(&fake_cuMemSetAccess)},
};

}  // namespace

// --- Exported ------------------------------------------------------------------------

extern "C" FakeCudaState* fakecuda_state() { return &g_state; }

extern "C" CUresult CUDAAPI cuDriverGetVersion(int* version) {
  if (CUresult r = enter("cuDriverGetVersion", 2020); r != CUDA_SUCCESS) return r;
  *version = FAKECUDA_VERSION;
  return CUDA_SUCCESS;
}

// Exported as well as handed out: CudaDriver names a failed cuInit with it.
extern "C" CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  return fake_cuGetErrorName(error, str);
}

#ifndef FAKECUDA_NO_INIT
extern "C" CUresult CUDAAPI cuInit(unsigned int flags) {
  g_state.init_calls.fetch_add(1);
  // A slow initialisation, so that concurrent openers surely overlap with it.
  if (const char* ms = std::getenv("FAKECUDA_INIT_DELAY_MS")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  }
  if (CUresult r = enter("cuInit", 2000, flags); r != CUDA_SUCCESS) return r;
  return static_cast<CUresult>(FAKECUDA_INIT_STATUS);
}
#endif

#ifndef FAKECUDA_NO_GET_PROC_ADDRESS
// cuda.h spells this cuGetProcAddress (a macro for the _v2 name).
extern "C" CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* status) {
  if (CUresult r = enter("cuGetProcAddress", 12000); r != CUDA_SUCCESS) return r;
  FakeCudaRequest* req = nullptr;
  if (g_state.n_requests < static_cast<int>(sizeof g_state.requests / sizeof g_state.requests[0])) {
    req = &g_state.requests[g_state.n_requests++];
    std::strncpy(req->symbol, symbol, sizeof req->symbol - 1);
    req->version = version;
    req->flags = flags;
  }
  *pfn = nullptr;
  if (version > FAKECUDA_VERSION) return CUDA_ERROR_INVALID_VALUE;  // as documented
  bool known = false;
#ifdef FAKECUDA_MISSING
  const bool hidden = std::strcmp(symbol, FAKECUDA_MISSING) == 0;
#else
  const bool hidden = false;
#endif
  int variant = 0;
  for (const Entry& e : g_entries) {
    if (hidden || std::strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.version <= version) {
      *pfn = e.fn;
      variant = e.version;
    }
  }
  if (req != nullptr) req->variant = variant;
  if (status != nullptr) {
    *status = !known          ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
              : variant == 0 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                             : CU_GET_PROC_ADDRESS_SUCCESS;
  }
  return CUDA_SUCCESS;
}
#endif
