// SPDX-License-Identifier: Apache-2.0
#pragma once

// PyTorch's CUDA caching allocator, for cache_bench's comparison column: built only when
// Meson finds torch (bench/torch_alloc.cpp is compiled against torch's headers and linked
// with c10 and c10_cuda; the bench itself never sees a torch header).

#include <cstddef>

#include <cuda.h>

namespace xlogrt::bench {

/// CUDACachingAllocator::init(device_count), on device 0. False when torch fails.
bool torch_alloc_init() noexcept;
/// raw_alloc_with_stream(n, s); nullptr when it throws.
void* torch_alloc(std::size_t n, CUstream s) noexcept;
/// raw_delete(p).
void torch_free(void* p) noexcept;

}  // namespace xlogrt::bench
