// SPDX-License-Identifier: Apache-2.0
#pragma once

// The kernels of the use-after-free reproduction (uaf_kernels.cu, built by nvcc) and the
// host functions that enqueue them with <<<>>> on a driver stream. The program itself
// (uaf_repro.cpp) is plain C++: it includes xlogrt, and this header only.

#include <cuda.h>

#include <cstdint>

#if defined(__CUDACC__)
#define XLOGRT_REPRO_HD __host__ __device__
#else
#define XLOGRT_REPRO_HD
#endif

namespace uaf {

/// The owner's pattern in iteration `iteration`: what the reader must see.
XLOGRT_REPRO_HD inline std::uint32_t pattern(std::uint32_t iteration, std::uint32_t j) {
  return (j * 2654435761u) ^ (iteration * 0x9E3779B9u) ^ 0x5A5A5A5Au;
}

/// What the next owner of the memory writes over it.
XLOGRT_REPRO_HD inline std::uint32_t overwrite_pattern(std::uint32_t j) { return ~(j * 2246822519u); }

inline constexpr unsigned fill_grid = 264;   // 2 blocks per SM of an H200
inline constexpr unsigned reader_grid = 2;   // leaves the other SMs to the overwrite
inline constexpr unsigned block_threads = 256;

// Each returns the cudaError_t of the launch (cudaGetLastError), as an int: 0 on success.

/// p[j] = pattern(iteration, j), j < n, on stream `s`.
int enqueue_fill(CUstream s, std::uint32_t* p, std::uint32_t n, std::uint32_t iteration);
/// p[j] = overwrite_pattern(j), j < n, on stream `s`.
int enqueue_overwrite(CUstream s, std::uint32_t* p, std::uint32_t n);
/// The slow reader, on `s`: `passes` passes over p[0..n), each after spinning `spin_ns`,
/// every element added into *sum. Loads bypass L1, so a concurrent write by another SM
/// is seen.
int enqueue_checksum(CUstream s, const std::uint32_t* p, std::uint32_t n, std::uint32_t passes,
                     std::uint64_t spin_ns, unsigned long long* sum);

/// The kernels' handles in the current (primary) context, from cudaGetFuncBySymbol, for
/// cuLaunchKernel. Their parameters, in order:
///   fill       std::uint32_t* p, std::uint32_t n, std::uint32_t iteration
///   overwrite  std::uint32_t* p, std::uint32_t n
///   checksum   const std::uint32_t* p, std::uint32_t n, std::uint32_t passes,
///              std::uint64_t spin_ns, unsigned long long* sum
struct KernelHandles {
  CUfunction fill = nullptr;
  CUfunction overwrite = nullptr;
  CUfunction checksum = nullptr;
};
int kernel_handles(KernelHandles* out);

/// 0 when the kernels can run on the current device (they are built for sm_90 only).
int kernels_loadable();
/// cudaSetDevice(ordinal): the runtime API then uses the device's primary context.
int select_device(int ordinal);
/// Whether `e` says the runtime API found no driver or device of its own (it loads
/// libcuda itself, whatever XLOGRT_LIBCUDA names).
bool runtime_without_driver(int e);
/// cudaGetErrorName.
const char* error_name(int e);

}  // namespace uaf
