// SPDX-License-Identifier: Apache-2.0
#pragma once

// CudaApi: the libcuda entry points CudaDriver calls, as one table of function pointers,
// and the CUDA version each of them is requested at.
//
// Nothing links against libcuda. Three bootstrap symbols are found with dlsym (cuInit,
// cuDriverGetVersion, cuGetProcAddress_v2: each has had one ABI since it appeared, and
// they are needed before the version check can say "too old"); every other entry is
// resolved through cuGetProcAddress(base name, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM).
//
// Versions. cuGetProcAddress returns the newest variant of a symbol that is ABI
// compatible with the version asked for, so the version is part of the type: each row
// of XLOGRT_CUDA_API_ENTRIES names a symbol and a version, the member is declared with
// cudaTypedefs.h's PFN_<symbol>_v<version>, and the same pair is what is requested. The
// pointer's type and the variant the driver hands back cannot drift apart. The rows
// that have more than one variant, and why the one chosen:
//   cuDeviceTotalMem, cuMemGetInfo, cuMemAlloc, cuMemFree, cuMemHostGetDevicePointer,
//   cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync   3020: the _v2 variants,
//       size_t byte counts and 64-bit CUdeviceptr (the older ones take 32-bit values).
//   cuStreamDestroy, cuEventDestroy   4000: the _v2 variants (the ones cuda.h maps to).
//   cuDevicePrimaryCtxRelease   11000: _v2, which cuda.h maps to since CUDA 11.
//   cuStreamWriteValue32   11070: the v2 stream memory operation, available on every
//       platform by default; the 8000 variant is the v1 operation, which needs the
//       nvidia module parameter NVreg_EnableStreamMemOPs=1.
//   cuStreamGetCaptureInfo   11030: _v2 (status, id, graph, dependencies; CudaDriver
//       passes nullptr for the last three); 10010 reports no graph, and 12030 (_v3) adds
//       edge data that xlogrt does not read.
//   cuStreamBeginCapture   10010: _v2, which takes the capture mode; the 10000 variant
//       takes none and captures in global mode.
//   cuCtxSynchronize   2000: the current context's; the 13000 variant names a context.
// Every version asked for is at most 12000, the oldest driver CudaDriver accepts, so a
// driver that passes the version check can answer every request.
//
// Optional entries. The rows of XLOGRT_CUDA_API_OPTIONAL_ENTRIES (the virtual memory
// calls, at 10020: each has had one ABI since CUDA 10.2) are resolved the same way, but a
// driver that lacks one of them still opens: the loader leaves the whole group null and
// says which were missing (LoadedCuda::optional_missing), and CudaDriver's virtual memory
// members fail with errc::driver_too_old naming them, without calling libcuda. The group
// is all or nothing, so that a member never finds half of what it needs.
//
// Default stream. Every entry is requested with CU_GET_PROC_ADDRESS_LEGACY_STREAM, never
// the per-thread (_ptsz / _ptds) variants: the table is process-wide and shared by every
// translation unit, so it cannot follow a per-TU macro such as
// CUDA_API_PER_THREAD_DEFAULT_STREAM, and the Driver contract says a value-initialised
// stream_t is the legacy default stream. The streams xlogrt creates are non-blocking.
//
// Names. Members are the driver's base name plus a trailing underscore (cuMemAlloc_):
// cuda.h defines many base names as macros (cuMemAlloc -> cuMemAlloc_v2), and a member
// spelt like a macro would change name with the macros in force in each TU.

#include <cuda.h>
#include <cudaTypedefs.h>

namespace xlogrt::detail {

// clang-format off
/// One row per resolved entry point: X(base symbol name, CUDA version of its ABI).
/// The first four rows are the hot paths' calls (an allocate + deallocate pair, and
/// cross-stream tracking): in CudaDriver they share one cache line with its exit flag.
#define XLOGRT_CUDA_API_ENTRIES(X)     \
  X(cuMemAllocFromPoolAsync, 11020)    \
  X(cuMemFreeAsync, 11020)             \
  X(cuEventRecord, 2000)               \
  X(cuStreamWaitEvent, 3020)           \
  X(cuGetErrorName, 6000)              \
  X(cuDeviceGetCount, 2000)            \
  X(cuDeviceGet, 2000)                 \
  X(cuDeviceGetName, 2000)             \
  X(cuDeviceTotalMem, 3020)            \
  X(cuDeviceGetAttribute, 2000)        \
  X(cuDevicePrimaryCtxRetain, 7000)    \
  X(cuDevicePrimaryCtxRelease, 11000)  \
  X(cuCtxGetCurrent, 4000)             \
  X(cuCtxSetCurrent, 4000)             \
  X(cuMemGetInfo, 3020)                \
  X(cuStreamCreate, 2000)              \
  X(cuStreamDestroy, 4000)             \
  X(cuStreamSynchronize, 2000)         \
  X(cuStreamQuery, 2000)               \
  X(cuStreamGetId, 12000)              \
  X(cuStreamGetCtx, 9020)              \
  X(cuEventCreate, 2000)               \
  X(cuEventDestroy, 4000)              \
  X(cuEventQuery, 2000)                \
  X(cuEventSynchronize, 2000)          \
  X(cuDeviceGetDefaultMemPool, 11020)  \
  X(cuMemPoolSetAttribute, 11020)      \
  X(cuMemPoolGetAttribute, 11020)      \
  X(cuMemPoolTrimTo, 11020)            \
  X(cuMemPoolCreate, 11020)            \
  X(cuMemPoolDestroy, 11020)           \
  X(cuMemAlloc, 3020)                  \
  X(cuMemFree, 3020)                   \
  X(cuMemHostAlloc, 2020)              \
  X(cuMemHostGetDevicePointer, 3020)   \
  X(cuMemFreeHost, 2000)               \
  X(cuMemsetD8Async, 3020)             \
  X(cuMemcpyHtoDAsync, 3020)           \
  X(cuMemcpyDtoHAsync, 3020)           \
  X(cuMemcpyDtoDAsync, 3020)           \
  X(cuStreamWriteValue32, 11070)       \
  X(cuLaunchHostFunc, 10000)           \
  X(cuLaunchKernel, 4000)              \
  X(cuModuleLoadData, 2000)            \
  X(cuModuleGetFunction, 2000)         \
  X(cuStreamGetCaptureInfo, 11030)     \
  X(cuThreadExchangeStreamCaptureMode, 10010) \
  X(cuCtxSynchronize, 2000)            \
  X(cuStreamBeginCapture, 10010)       \
  X(cuStreamEndCapture, 10000)         \
  X(cuGraphInstantiateWithFlags, 11040) \
  X(cuGraphLaunch, 10000)              \
  X(cuGraphDestroy, 10000)             \
  X(cuGraphExecDestroy, 10000)

/// Entry points CudaDriver can do without (see "Optional entries" above): the virtual
/// memory management calls. Same shape as XLOGRT_CUDA_API_ENTRIES.
#define XLOGRT_CUDA_API_OPTIONAL_ENTRIES(X) \
  X(cuMemGetAllocationGranularity, 10020)   \
  X(cuMemAddressReserve, 10020)             \
  X(cuMemAddressFree, 10020)                \
  X(cuMemCreate, 10020)                     \
  X(cuMemRelease, 10020)                    \
  X(cuMemMap, 10020)                        \
  X(cuMemUnmap, 10020)                      \
  X(cuMemSetAccess, 10020)
// clang-format on

/// The raw libcuda function table. Filled once by load_cuda_driver() and immutable
/// afterwards. Thread-safe (read-only after construction).
struct CudaApi {
  // Bootstrap entries, found with dlsym.
  PFN_cuInit_v2000 cuInit_ = nullptr;
  PFN_cuDriverGetVersion_v2020 cuDriverGetVersion_ = nullptr;
  PFN_cuGetProcAddress_v12000 cuGetProcAddress_ = nullptr;

  // Entries resolved through cuGetProcAddress, one per XLOGRT_CUDA_API_ENTRIES row.
#define XLOGRT_CUDA_API_MEMBER(sym, ver) PFN_##sym##_v##ver sym##_ = nullptr;
  XLOGRT_CUDA_API_ENTRIES(XLOGRT_CUDA_API_MEMBER)
  // Optional entries: all null when the driver lacks any of them.
  XLOGRT_CUDA_API_OPTIONAL_ENTRIES(XLOGRT_CUDA_API_MEMBER)
#undef XLOGRT_CUDA_API_MEMBER
};

/// The oldest driver CudaDriver accepts: CUDA 12.0, where memory pools, v2 stream memory
/// operations and cuGetProcAddress_v2 are all part of the core driver.
inline constexpr int min_cuda_driver_version = 12000;

}  // namespace xlogrt::detail
