// SPDX-License-Identifier: Apache-2.0
// PyTorch's CUDA caching allocator behind bench/torch_alloc.hpp.

#include "torch_alloc.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

namespace xlogrt::bench {

bool torch_alloc_init() noexcept {
  try {
    c10::cuda::CUDACachingAllocator::init(static_cast<int>(c10::cuda::device_count()));
    c10::cuda::set_device(0);
    return true;
  } catch (...) {
    return false;
  }
}

void* torch_alloc(std::size_t n, CUstream s) noexcept {
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(n, reinterpret_cast<cudaStream_t>(s));
  } catch (...) {
    return nullptr;
  }
}

void torch_free(void* p) noexcept {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  } catch (...) {
  }
}

}  // namespace xlogrt::bench
