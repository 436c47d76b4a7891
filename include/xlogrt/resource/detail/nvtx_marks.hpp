// SPDX-License-Identifier: Apache-2.0
#pragma once

// NvtxMarks: what the caching layer tells compute-sanitizer about its blocks, through
// the NVTX memory API (nvtx3/nvToolsExtMem.h, header-only, in the CUDA Toolkit).
//
// A cached block is memory the device still holds for the process, so memcheck would
// let a kernel read it. With the marks on, each block the layer takes from its upstream
// is registered as a sub-allocator heap of its own, and the part a user holds as a
// region of that heap: memcheck then reports any access to a block while it sits in the
// cache (the heap without a region), as it reports an access to freed memory. The heap
// is unregistered before the block goes back to the upstream.
//
// Off (the default) it does nothing. On, each call is a host call that NVTX makes a no-op
// when no tool is attached; the heap handles are kept in a map under a mutex, which is
// why it is an option for sanitizer runs and not the default.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <nvtx3/nvToolsExtMem.h>

namespace xlogrt::detail {

/// Thread-safe.
class NvtxMarks {
 public:
  explicit NvtxMarks(bool on) noexcept : on_(on) {
    if (on_) domain_ = nvtxDomainCreateA("xlogrt");
  }
  NvtxMarks(const NvtxMarks&) = delete;
  NvtxMarks& operator=(const NvtxMarks&) = delete;

  bool on() const noexcept { return on_; }

  /// A block the layer took from its upstream and hands to a user.
  void fresh(std::uint64_t ptr, std::size_t bytes) noexcept {
    nvtxMemVirtualRangeDesc_t range{bytes, as_ptr(ptr)};
    nvtxMemHeapDesc_t heap{};
    heap.extCompatID = NVTX_EXT_COMPATID_MEM;
    heap.structSize = sizeof heap;
    heap.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
    heap.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    heap.typeSpecificDescSize = sizeof range;
    heap.typeSpecificDesc = &range;
    nvtxMemHeapHandle_t h = nvtxMemHeapRegister(domain_, &heap);
    try {
      std::lock_guard lock(mu_);
      heaps_[ptr] = h;
    } catch (...) {
      nvtxMemHeapUnregister(domain_, h);  // no heap: the block is not watched, never wrongly
      return;
    }
    handed(ptr, bytes);
  }

  /// A cached block handed to a user again.
  void handed(std::uint64_t ptr, std::size_t bytes) noexcept {
    const nvtxMemHeapHandle_t h = heap_of(ptr);
    if (h == nullptr) return;
    nvtxMemVirtualRangeDesc_t range{bytes, as_ptr(ptr)};
    nvtxMemRegionsRegisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof batch;
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.heap = h;
    batch.regionCount = 1;
    batch.regionDescElementSize = sizeof range;
    batch.regionDescElements = &range;
    nvtxMemRegionsRegister(domain_, &batch);
  }

  /// A block back in the cache: no user may touch it.
  void cached(std::uint64_t ptr) noexcept {
    if (heap_of(ptr) == nullptr) return;
    nvtxMemRegionRef_t ref{};
    ref.pointer = as_ptr(ptr);
    nvtxMemRegionsUnregisterBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof batch;
    batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
    batch.refCount = 1;
    batch.refElementSize = sizeof ref;
    batch.refElements = &ref;
    nvtxMemRegionsUnregister(domain_, &batch);
  }

  /// A cached block about to go back to the upstream.
  void released(std::uint64_t ptr) noexcept {
    nvtxMemHeapHandle_t h = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = heaps_.find(ptr);
      if (it == heaps_.end()) return;
      h = it->second;
      heaps_.erase(it);
    }
    nvtxMemHeapUnregister(domain_, h);
  }

 private:
  static const void* as_ptr(std::uint64_t p) noexcept { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(p)); }
  nvtxMemHeapHandle_t heap_of(std::uint64_t ptr) noexcept {
    std::lock_guard lock(mu_);
    auto it = heaps_.find(ptr);
    return it == heaps_.end() ? nullptr : it->second;
  }

  bool on_;
  nvtxDomainHandle_t domain_ = nullptr;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, nvtxMemHeapHandle_t> heaps_;
};

}  // namespace xlogrt::detail
