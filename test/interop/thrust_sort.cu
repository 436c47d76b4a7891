// SPDX-License-Identifier: Apache-2.0
// The Thrust half of gpu_thrust_sort (see thrust_sort.hpp).

#include "thrust_sort.hpp"

#include <cuda_runtime_api.h>
#include <thrust/device_ptr.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/sort.h>
#include <thrust/transform_reduce.h>

#include <xlogrt/interop/thrust_allocator.hpp>

namespace thrust_test {
namespace {

__global__ void fill(std::uint32_t* keys, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i);  // key(i), spelt for the device
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    keys[i] = x;
  }
}

struct widen {
  __host__ __device__ std::uint64_t operator()(std::uint32_t k) const { return k; }
};

cudaStream_t rt_stream(CUstream s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

int fill_keys(CUstream s, std::uint32_t* keys, std::size_t n) {
  fill<<<528, 256, 0, rt_stream(s)>>>(keys, n);
  return static_cast<int>(cudaGetLastError());
}

int sort_keys(Resource& r, CUstream s, std::uint32_t* keys, std::size_t n) {
  xlogrt::ThrustAllocator<Resource> alloc(r, s);
  auto first = thrust::device_pointer_cast(keys);
  thrust::sort(thrust::cuda::par_nosync(alloc).on(rt_stream(s)), first, first + n);
  return static_cast<int>(cudaGetLastError());
}

int check_keys(Resource& r, CUstream s, const std::uint32_t* keys, std::size_t n, bool* sorted,
               std::uint64_t* sum) {
  xlogrt::ThrustAllocator<Resource> alloc(r, s);
  auto first = thrust::device_pointer_cast(keys);
  auto policy = thrust::cuda::par_nosync(alloc).on(rt_stream(s));
  *sorted = thrust::is_sorted(policy, first, first + n);
  *sum = thrust::transform_reduce(policy, first, first + n, widen{}, std::uint64_t{0},
                                  thrust::plus<std::uint64_t>{});
  return static_cast<int>(cudaStreamSynchronize(rt_stream(s)));
}

}  // namespace thrust_test
