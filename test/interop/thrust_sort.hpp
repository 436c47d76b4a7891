// SPDX-License-Identifier: Apache-2.0
#pragma once

// The nvcc-built half of the Thrust test (thrust_sort.cu): Thrust calls through a
// ThrustAllocator over the default stack's PointerResource. The program itself
// (gpu_thrust_sort.cpp) is built by the C++ compiler.

#include <cstddef>
#include <cstdint>

#include <xlogrt/interop/pointer_resource.hpp>
#include <xlogrt/runtime/default_stack.hpp>

namespace thrust_test {

using Resource = xlogrt::PointerResource<xlogrt::DefaultStack>;

/// The i-th key before sorting (a bijective hash, so the keys are spread).
inline std::uint32_t key(std::uint64_t i) {
  auto x = static_cast<std::uint32_t>(i);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Each returns the cudaError_t of its last CUDA call, as an int: 0 on success; a
// std::bad_alloc from the allocator propagates.

/// keys[i] = key(i), i < n, on `s`.
int fill_keys(CUstream s, std::uint32_t* keys, std::size_t n);
/// thrust::sort(thrust::cuda::par_nosync(alloc).on(s), keys, keys + n), `alloc` a
/// ThrustAllocator over `r` on `s`. Does not synchronise.
int sort_keys(Resource& r, CUstream s, std::uint32_t* keys, std::size_t n);
/// Whether keys[0..n) is sorted, and the 64-bit sum of its keys, through the same
/// allocator (Thrust returns these values to the host, so this synchronises `s`).
int check_keys(Resource& r, CUstream s, const std::uint32_t* keys, std::size_t n, bool* sorted,
               std::uint64_t* sum);

}  // namespace thrust_test
