// SPDX-License-Identifier: Apache-2.0
#pragma once

// ThrustAllocator<Resource>: an allocator for Thrust's execution policies, so that
// `thrust::cuda::par_nosync(alloc).on(stream)` takes CUB's temporary storage from an
// xlogrt stack.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
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
/// reports as it reports its own allocation failures). A refused free (a pointer that is
/// not the resource's, a second free, a size that does not match, a driver failure) is
/// counted in refused_frees(), and the first one of an allocator and its copies is
/// written to stderr, with the resource's error; the block, if there is one, stays
/// live (PointerResource keeps it filed, so nothing is lost). Why not throw: Thrust
/// frees its temporary storage from destructors (its temporary arrays'), where an
/// exception ends the program with std::terminate, and its interface has no other
/// channel; why not silence (as before): a free that goes wrong means a bug in the
/// caller's pointer handling, and it must show.
///
/// Copyable (Thrust copies its allocator); copies share the resource, which must
/// outlive them, and the count of refused frees. Thread-safe as the resource; one
/// algorithm call uses one allocator.
template <class Resource>
class ThrustAllocator {
 public:
  using value_type = char;
  using stream_type = typename Resource::stream_t;

  /// Throws std::bad_alloc (the shared count of refused frees is allocated here).
  ThrustAllocator(Resource& resource, stream_type stream)
      : res_(&resource), stream_(stream), refused_(std::make_shared<Refused>()) {}

  /// 0 bytes (Thrust asks for an empty temporary buffer): a null pointer, no block.
  char* allocate(std::ptrdiff_t bytes) {
    if (bytes == 0) return nullptr;
    auto p = res_->allocate(static_cast<std::size_t>(bytes), stream_);
    if (!p) throw allocation_error(std::move(p).error());
    return static_cast<char*>(*p);
  }

  /// A refused free is counted, and the first one written to stderr (see the class).
  void deallocate(char* ptr, std::size_t bytes) noexcept {
    if (ptr == nullptr) return;
    auto r = res_->deallocate(ptr, bytes, stream_);
    if (r) [[likely]] return;
    refused_->count.fetch_add(1, std::memory_order_relaxed);
    if (!refused_->reported.exchange(true, std::memory_order_relaxed)) {
      std::fprintf(stderr,
                   "xlogrt: ThrustAllocator: a free Thrust asked for was refused, and the block (if any) stays "
                   "live: %s (later refusals of this allocator are counted in refused_frees(), not written)\n",
                   r.error().what().c_str());
    }
  }

  /// Frees refused so far, by this allocator and its copies.
  std::uint64_t refused_frees() const noexcept { return refused_->count.load(std::memory_order_relaxed); }

  Resource& resource() const noexcept { return *res_; }
  stream_type stream() const noexcept { return stream_; }

  friend bool operator==(const ThrustAllocator& a, const ThrustAllocator& b) noexcept {
    return a.res_ == b.res_ && a.stream_ == b.stream_;
  }

 private:
  struct Refused {
    std::atomic<std::uint64_t> count{0};
    std::atomic<bool> reported{false};  // the first refusal is on stderr
  };
  Resource* res_;
  stream_type stream_;
  std::shared_ptr<Refused> refused_;
};

}  // namespace xlogrt
