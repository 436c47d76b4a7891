// SPDX-License-Identifier: Apache-2.0
#pragma once

// The caching layer's compute-sanitizer marks, over NVTX's memory API
// (nvtx3/nvToolsExtMem.h, header-only, in the CUDA Toolkit).
//
// Include this header in one translation unit of a program (more do no harm) to let
// CachedOptions::nvtx_marks, and XLOGRT_CACHE=nvtx in the default stack, mark the
// layer's blocks: memcheck then reports a kernel that touches a block while it is
// cached. Without it, Cached::create refuses nvtx_marks with invalid_argument, naming
// this header. It is not part of <xlogrt/runtime.hpp>: NVTX compiles its implementation
// into every translation unit that includes it (detail/cache_nvtx.hpp says why that
// matters).
//
// Installing is a static initialiser: a Cached created before main() (from another
// translation unit's static initialiser) may not see the table yet; call
// install_nvtx_marks() first there.

#include <cstddef>
#include <cstdint>

#include <nvtx3/nvToolsExtMem.h>

#include "xlogrt/resource/detail/cache_nvtx.hpp"

namespace xlogrt {
namespace detail {

inline const void* nvtx_ptr(std::uint64_t p) noexcept {
  return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p));
}

inline void* nvtx_create_domain(const char* name) noexcept { return nvtxDomainCreateA(name); }

inline void* nvtx_register_heap(void* domain, std::uint64_t ptr, std::size_t bytes) noexcept {
  nvtxMemVirtualRangeDesc_t range{bytes, nvtx_ptr(ptr)};
  nvtxMemHeapDesc_t heap{};
  heap.extCompatID = NVTX_EXT_COMPATID_MEM;
  heap.structSize = sizeof heap;
  heap.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  heap.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  heap.typeSpecificDescSize = sizeof range;
  heap.typeSpecificDesc = &range;
  return nvtxMemHeapRegister(static_cast<nvtxDomainHandle_t>(domain), &heap);
}

inline void nvtx_unregister_heap(void* domain, void* heap) noexcept {
  nvtxMemHeapUnregister(static_cast<nvtxDomainHandle_t>(domain), static_cast<nvtxMemHeapHandle_t>(heap));
}

inline void nvtx_register_region(void* domain, void* heap, std::uint64_t ptr, std::size_t bytes) noexcept {
  nvtxMemVirtualRangeDesc_t range{bytes, nvtx_ptr(ptr)};
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof batch;
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = static_cast<nvtxMemHeapHandle_t>(heap);
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof range;
  batch.regionDescElements = &range;
  nvtxMemRegionsRegister(static_cast<nvtxDomainHandle_t>(domain), &batch);
}

inline void nvtx_unregister_region(void* domain, std::uint64_t ptr) noexcept {
  nvtxMemRegionRef_t ref{};
  ref.pointer = nvtx_ptr(ptr);
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof batch;
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof ref;
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(static_cast<nvtxDomainHandle_t>(domain), &batch);
}

inline constexpr NvtxMemApi nvtx_api{&nvtx_create_domain, &nvtx_register_heap, &nvtx_unregister_heap,
                                     &nvtx_register_region, &nvtx_unregister_region};

}  // namespace detail

/// Makes the caching layers created from now on able to mark their blocks.
inline void install_nvtx_marks() noexcept { detail::nvtx_mem_api.store(&detail::nvtx_api, std::memory_order_release); }

namespace detail {
inline const bool nvtx_marks_installed = (install_nvtx_marks(), true);
}  // namespace detail

}  // namespace xlogrt
