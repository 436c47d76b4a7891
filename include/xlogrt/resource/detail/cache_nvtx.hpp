// SPDX-License-Identifier: Apache-2.0
#pragma once

// NvtxMarks: what the caching layer tells compute-sanitizer about its blocks, through
// the NVTX memory API.
//
// A cached block is memory the device still holds for the process, so memcheck would
// let a kernel read it. With the marks on, each block the layer takes from its upstream
// is registered as a sub-allocator heap of its own, and the part a user holds as a
// region of that heap: memcheck then reports any access to a block while it sits in the
// cache (the heap without a region), as it reports an access to freed memory. The heap
// is unregistered before the block goes back to the upstream.
//
// The NVTX calls go through a table of five functions (NvtxMemApi) that
// <xlogrt/resource/nvtx_marks.hpp> installs when a program includes it. NVTX's headers
// compile its whole implementation into every translation unit that includes them,
// which would make every user of the caching layer pay for a tool only sanitizer runs
// use; so the layer's own headers do not include them, and a program that wants the
// marks includes that header once.
//
// Off (the default) it does nothing. On, each call is a host call that NVTX makes a no-op
// when no tool is attached; the heap handles are kept in a map under a mutex, which is
// why it is an option for sanitizer runs and not the default.
//
// What the tool takes. compute-sanitizer's memcheck (2025.3, CUDA 13.0) accepts a heap
// only over memory of cuMemAlloc: it refuses every heap inside memory of a stream-ordered
// pool (cuMemAllocFromPoolAsync, from the device's default pool or a created one, whether
// or not the allocation has run, whole or a sub-range, from any thread) with "One or more
// of the parameters is invalid", and then reports nothing for it
// (test/gpu_repro/nvtx_probe.sh). Over AsyncCuda, as in the default stack, the marks
// therefore watch nothing; they work over a base that allocates with cuMemAlloc
// (DirectCuda). To check pool-based code with memcheck, turn the cache off
// (XLOGRT_CACHE=0): every free is then a cuMemFreeAsync, which memcheck follows.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace xlogrt::detail {

/// The NVTX memory calls the marks make. Handles are NVTX's, passed through untouched.
struct NvtxMemApi {
  void* (*create_domain)(const char* name) noexcept;
  /// A heap of one virtual range; null when NVTX gave none.
  void* (*register_heap)(void* domain, std::uint64_t ptr, std::size_t bytes) noexcept;
  void (*unregister_heap)(void* domain, void* heap) noexcept;
  /// A region of `heap`, a user's part of the block.
  void (*register_region)(void* domain, void* heap, std::uint64_t ptr, std::size_t bytes) noexcept;
  void (*unregister_region)(void* domain, std::uint64_t ptr) noexcept;
};

/// The table marks made from now on call; null until a program installs one.
inline std::atomic<const NvtxMemApi*> nvtx_mem_api{nullptr};

/// Thread-safe.
class NvtxMarks {
 public:
  /// On only when asked and a table is installed (the caching layer's create() refuses
  /// the request without one). Callers make the other calls only when on().
  explicit NvtxMarks(bool on) noexcept : api_(on ? nvtx_mem_api.load(std::memory_order_acquire) : nullptr) {
    if (api_ != nullptr) domain_ = api_->create_domain("xlogrt");
  }
  NvtxMarks(const NvtxMarks&) = delete;
  NvtxMarks& operator=(const NvtxMarks&) = delete;

  bool on() const noexcept { return api_ != nullptr; }

  /// A block the layer took from its upstream and hands to a user.
  void fresh(std::uint64_t ptr, std::size_t bytes) noexcept {
    void* h = api_->register_heap(domain_, ptr, bytes);
    if (h == nullptr) return;
    try {
      std::lock_guard lock(mu_);
      heaps_[ptr] = h;
    } catch (...) {
      api_->unregister_heap(domain_, h);  // no heap: the block is not watched, never wrongly
      return;
    }
    handed(ptr, bytes);
  }

  /// A cached block handed to a user again.
  void handed(std::uint64_t ptr, std::size_t bytes) noexcept {
    void* h = heap_of(ptr);
    if (h != nullptr) api_->register_region(domain_, h, ptr, bytes);
  }

  /// A block back in the cache: no user may touch it.
  void cached(std::uint64_t ptr) noexcept {
    if (heap_of(ptr) != nullptr) api_->unregister_region(domain_, ptr);
  }

  /// A cached block about to go back to the upstream.
  void released(std::uint64_t ptr) noexcept {
    void* h = nullptr;
    {
      std::lock_guard lock(mu_);
      auto it = heaps_.find(ptr);
      if (it == heaps_.end()) return;
      h = it->second;
      heaps_.erase(it);
    }
    api_->unregister_heap(domain_, h);
  }

 private:
  void* heap_of(std::uint64_t ptr) noexcept {
    std::lock_guard lock(mu_);
    auto it = heaps_.find(ptr);
    return it == heaps_.end() ? nullptr : it->second;
  }

  const NvtxMemApi* api_;
  void* domain_ = nullptr;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, void*> heaps_;
};

}  // namespace xlogrt::detail
