// SPDX-License-Identifier: Apache-2.0
#pragma once

// ThrustAllocator<Resource>: an allocator for Thrust's execution policies, so that
// `thrust::cuda::par_nosync(alloc).on(stream)` takes CUB's temporary storage from an
// xlogrt stack.

#include <cstddef>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/interop/allocation_error.hpp"

namespace xlogrt {

/// Thrust's allocator requirements (value_type char, allocate(bytes), deallocate(ptr,
/// bytes)) over a pointer-level resource bound to one stream: PointerResource<Stack>, or
/// anything with its allocate(bytes, stream) and deallocate(ptr, bytes, stream).
///
/// The stream must be the one the algorithm runs on (`.on(stream)`): Thrust frees its
/// temporary storage right after enqueuing the kernels that use it, and the free is
/// queued on that stream, after them, so nothing waits on the host (par_nosync stays
/// non-blocking).
///
/// Errors: a refused allocation throws allocation_error (a std::bad_alloc, which Thrust
/// reports as it reports its own allocation failures). A refused free (not this
/// resource's pointer) cannot be reported through Thrust: the block stays live and the
/// resource's error is dropped (PointerResource keeps it filed, so nothing is lost).
///
/// Copyable (Thrust copies its allocator); copies share the resource, which must
/// outlive them. Thread-safe as the resource; one algorithm call uses one allocator.
template <class Resource>
class ThrustAllocator {
 public:
  using value_type = char;
  using stream_type = typename Resource::stream_t;

  ThrustAllocator(Resource& resource, stream_type stream) noexcept : res_(&resource), stream_(stream) {}

  /// 0 bytes (Thrust asks for an empty temporary buffer): a null pointer, no block.
  char* allocate(std::ptrdiff_t bytes) {
    if (bytes == 0) return nullptr;
    auto p = res_->allocate(static_cast<std::size_t>(bytes), stream_);
    if (!p) throw allocation_error(std::move(p).error());
    return static_cast<char*>(*p);
  }

  void deallocate(char* ptr, std::size_t bytes) noexcept {
    if (ptr != nullptr) (void)res_->deallocate(ptr, bytes, stream_);
  }

  Resource& resource() const noexcept { return *res_; }
  stream_type stream() const noexcept { return stream_; }

  friend bool operator==(const ThrustAllocator& a, const ThrustAllocator& b) noexcept {
    return a.res_ == b.res_ && a.stream_ == b.stream_;
  }

 private:
  Resource* res_;
  stream_type stream_;
};

}  // namespace xlogrt
