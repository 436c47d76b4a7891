// SPDX-License-Identifier: Apache-2.0
// The kernels of the soak, and the host functions that enqueue them (see soak_kernels.hpp).

#include "soak_kernels.hpp"

#include <cuda_runtime.h>

namespace soak {
namespace {

unsigned grid_for(std::uint64_t bytes) {
  const std::uint64_t words = bytes / 4;
  const std::uint64_t blocks = (words + block_threads - 1) / block_threads;
  return blocks == 0 ? 1u : blocks > max_grid ? max_grid : static_cast<unsigned>(blocks);
}

__global__ void fill_kernel(std::uint32_t* p, std::uint64_t bytes, std::uint32_t seed) {
  const std::uint64_t n = bytes / 4;
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < n;
       j += std::uint64_t{gridDim.x} * blockDim.x) {
    p[j] = word(seed, static_cast<std::uint32_t>(j));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    auto* b = reinterpret_cast<std::uint8_t*>(p);
    for (std::uint64_t k = n * 4; k < bytes; ++k) b[k] = tail_byte(seed, k);
  }
}

__global__ void check_kernel(const std::uint32_t* p, std::uint64_t bytes, std::uint32_t seed, CheckResult* out) {
  __shared__ unsigned long long sums[block_threads];
  __shared__ unsigned long long bad[block_threads];
  const std::uint64_t n = bytes / 4;
  unsigned long long s = 0;
  unsigned long long m = 0;
  for (std::uint64_t j = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; j < n;
       j += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint32_t v = __ldcg(p + j);  // from L2, where another SM's write lands
    s += v;
    if (v != word(seed, static_cast<std::uint32_t>(j))) {
      ++m;
      atomicMax(&out->first_bad, ~static_cast<unsigned long long>(j * 4));
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const auto* b = reinterpret_cast<const std::uint8_t*>(p);
    for (std::uint64_t k = n * 4; k < bytes; ++k) {
      const std::uint8_t v = b[k];
      s += v;
      if (v != tail_byte(seed, k)) {
        ++m;
        atomicMax(&out->first_bad, ~static_cast<unsigned long long>(k));
      }
    }
  }
  const unsigned t = threadIdx.x;
  sums[t] = s;
  bad[t] = m;
  __syncthreads();
  for (unsigned stride = block_threads / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      sums[t] += sums[t + stride];
      bad[t] += bad[t + stride];
    }
    __syncthreads();
  }
  if (t == 0) {
    atomicAdd(&out->sum, sums[0]);
    if (bad[0] != 0) atomicAdd(&out->mismatches, bad[0]);
  }
}

}  // namespace

int enqueue_fill(CUstream s, std::uint64_t p, std::uint64_t bytes, std::uint32_t seed) {
  fill_kernel<<<grid_for(bytes), block_threads, 0, s>>>(reinterpret_cast<std::uint32_t*>(p), bytes, seed);
  return static_cast<int>(cudaGetLastError());
}

int enqueue_check(CUstream s, std::uint64_t p, std::uint64_t bytes, std::uint32_t seed, CheckResult* out) {
  check_kernel<<<grid_for(bytes), block_threads, 0, s>>>(reinterpret_cast<const std::uint32_t*>(p), bytes, seed,
                                                         out);
  return static_cast<int>(cudaGetLastError());
}

int kernels_loadable() {
  cudaFuncAttributes a{};
  if (cudaError_t e = cudaFuncGetAttributes(&a, fill_kernel); e != cudaSuccess) return static_cast<int>(e);
  return static_cast<int>(cudaFuncGetAttributes(&a, check_kernel));
}

int strict_pool_reuse(CUmemoryPool pool) {
  int off = 0;
  for (const cudaMemPoolAttr attr : {cudaMemPoolReuseAllowOpportunistic, cudaMemPoolReuseAllowInternalDependencies}) {
    if (cudaError_t e = cudaMemPoolSetAttribute(pool, attr, &off); e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace soak
