// SPDX-License-Identifier: Apache-2.0
// The kernels of the use-after-free reproduction, and the host functions that enqueue
// them with <<<>>> (see uaf_kernels.hpp).

#include "uaf_kernels.hpp"

#include <cuda_runtime.h>

namespace uaf {
namespace {

__global__ void fill_kernel(std::uint32_t* p, std::uint32_t n, std::uint32_t iteration) {
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    p[j] = pattern(iteration, j);
  }
}

__global__ void overwrite_kernel(std::uint32_t* p, std::uint32_t n) {
  for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    p[j] = overwrite_pattern(j);
  }
}

__device__ std::uint64_t globaltimer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Slow on purpose: it stands for a long kernel that reads its input throughout. The
// spin keeps it running while the owner's frees, allocations and overwrite (which take
// microseconds) go ahead on the other stream, when nothing orders them after it.
__global__ void checksum_kernel(const std::uint32_t* p, std::uint32_t n, std::uint32_t passes,
                                std::uint64_t spin_ns, unsigned long long* sum) {
  unsigned long long s = 0;
  for (std::uint32_t pass = 0; pass < passes; ++pass) {
    const std::uint64_t until = globaltimer_ns() + spin_ns;
    while (globaltimer_ns() < until) {
    }
    for (std::uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
      s += __ldcg(p + j);  // ld.global.cg: from L2, where another SM's write lands
    }
  }
  atomicAdd(sum, s);
}

}  // namespace

int enqueue_fill(CUstream s, std::uint32_t* p, std::uint32_t n, std::uint32_t iteration) {
  fill_kernel<<<fill_grid, block_threads, 0, s>>>(p, n, iteration);
  return static_cast<int>(cudaGetLastError());
}

int enqueue_overwrite(CUstream s, std::uint32_t* p, std::uint32_t n) {
  overwrite_kernel<<<fill_grid, block_threads, 0, s>>>(p, n);
  return static_cast<int>(cudaGetLastError());
}

int enqueue_checksum(CUstream s, const std::uint32_t* p, std::uint32_t n, std::uint32_t passes,
                     std::uint64_t spin_ns, unsigned long long* sum) {
  checksum_kernel<<<reader_grid, block_threads, 0, s>>>(p, n, passes, spin_ns, sum);
  return static_cast<int>(cudaGetLastError());
}

int kernel_handles(KernelHandles* out) {
  // cudaFunction_t and CUfunction are the same type (struct CUfunc_st*).
  if (cudaError_t e = cudaGetFuncBySymbol(&out->fill, reinterpret_cast<const void*>(fill_kernel));
      e != cudaSuccess) {
    return static_cast<int>(e);
  }
  if (cudaError_t e = cudaGetFuncBySymbol(&out->overwrite, reinterpret_cast<const void*>(overwrite_kernel));
      e != cudaSuccess) {
    return static_cast<int>(e);
  }
  return static_cast<int>(cudaGetFuncBySymbol(&out->checksum, reinterpret_cast<const void*>(checksum_kernel)));
}

int kernels_loadable() {
  cudaFuncAttributes a{};
  return static_cast<int>(cudaFuncGetAttributes(&a, checksum_kernel));
}

int select_device(int ordinal) { return static_cast<int>(cudaSetDevice(ordinal)); }

bool runtime_without_driver(int e) {
  switch (static_cast<cudaError_t>(e)) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
      return true;
    default:
      return false;
  }
}

const char* error_name(int e) { return cudaGetErrorName(static_cast<cudaError_t>(e)); }

}  // namespace uaf
