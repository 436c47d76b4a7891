// SPDX-License-Identifier: Apache-2.0
#pragma once

// CudaMrResource<Stack>: any xlogrt stack as a CCCL cuda::mr memory resource, so that
// libraries written against cuda::mr (RMM 26.x resources take one as upstream; CCCL's
// containers and algorithms) allocate through it.
//
// Two shapes of the cuda::mr API, chosen by CCCL_VERSION:
// - CCCL >= 3.1, stable and stream-first: allocate(stream_ref, bytes, align),
//   deallocate(stream_ref, ptr, bytes, align), allocate_sync(bytes, align),
//   deallocate_sync(ptr, bytes, align); concepts cuda::mr::resource_with<R, Props...>.
// - CCCL 3.0 (CUDA 13.0's toolkit), experimental and stream-last: allocate(bytes, align)
//   (synchronous), allocate_async(bytes, align, stream), and the matching frees; needs
//   LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE, which this header defines when that
//   CCCL is the one on the include path; concepts cuda::mr::async_resource_with.
// Either way the resource has the device_accessible property.
//
// Needs CCCL's headers on the include path: nvcc puts the toolkit's include/cccl there;
// a host compiler needs -I<toolkit>/include/cccl (or a newer CCCL before it).

#include <cuda/version>

#if CCCL_VERSION < 3001000 && !defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif
#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdio>
#include <memory>
#include <utility>

#include "xlogrt/core/result.hpp"
#include "xlogrt/interop/allocation_error.hpp"
#include "xlogrt/interop/pointer_resource.hpp"

namespace xlogrt {

/// Whether this translation unit sees CCCL's stable (stream-first) cuda::mr API.
inline constexpr bool cccl_stable_memory_resource = CCCL_VERSION >= 3001000;

/// A cuda::mr resource over a PointerResource<Stack> (which it shares: copies of the
/// resource are equal and allocate from the same stack).
///
/// Streams: the stream_ref's stream is adopted into the runtime's StreamPool on first
/// sight (keyed by the driver's stream id). The synchronous calls use the pool's
/// StreamId::DEFAULT stream: allocate_sync synchronises it, so the memory is usable from
/// any stream on return; deallocate_sync queues the free there (the synchronous contract:
/// no work still uses the memory).
///
/// Errors: an allocation the stack refuses throws allocation_error (a std::bad_alloc
/// naming the stack's error: out_of_memory, out_of_budget, an alignment above 256 bytes,
/// ...). cuda::mr's deallocate cannot fail, so a refused free (a pointer this resource did
/// not hand out, a size that is not the block's) is reported on stderr and loses nothing:
/// the block stays live and a corrected call frees it.
///
/// Drivers: CudaDriver, whose stream_t is cudaStream_t. A driver whose stream_t is
/// another pointer type (SimDriver) has its handles carried through cudaStream_t
/// unchanged, so the adapter runs on the simulator too.
///
/// Thread-safe, as the PointerResource.
template <DriverResource Stack>
class CudaMrResource {
 public:
  using pointer_resource = PointerResource<Stack>;
  using stream_t = typename pointer_resource::stream_t;
  static constexpr std::size_t default_alignment = pointer_resource::ALIGNMENT;
  static_assert(std::is_pointer_v<stream_t> && sizeof(stream_t) == sizeof(cudaStream_t),
                "CudaMrResource needs a driver whose stream handle is a pointer, as cudaStream_t is");

  /// Shares `resource`, which must not be null.
  explicit CudaMrResource(std::shared_ptr<pointer_resource> resource) noexcept : res_(std::move(resource)) {}

  /// A new PointerResource over `rt`, shared by every copy of the result.
  explicit CudaMrResource(DeviceRuntime<Stack>& rt, PointerResourceOptions options = {})
      : res_(std::make_shared<pointer_resource>(rt, options)) {}

#if CCCL_VERSION >= 3001000
  void* allocate(::cuda::stream_ref stream, std::size_t bytes, std::size_t alignment = default_alignment) {
    return value(res_->allocate(bytes, to_driver(stream), alignment));
  }
  void deallocate(::cuda::stream_ref stream, void* ptr, std::size_t bytes,
                  std::size_t alignment = default_alignment) noexcept {
    (void)alignment;
    report(res_->deallocate(ptr, bytes, to_driver(stream)), "deallocate");
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment = default_alignment) {
    return sync_allocate(bytes, alignment);
  }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    (void)alignment;
    report(res_->deallocate(ptr, bytes, default_stream()), "deallocate_sync");
  }
#else
  void* allocate_async(std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) {
    return value(res_->allocate(bytes, to_driver(stream), alignment));
  }
  void deallocate_async(void* ptr, std::size_t bytes, std::size_t alignment, ::cuda::stream_ref stream) noexcept {
    (void)alignment;
    report(res_->deallocate(ptr, bytes, to_driver(stream)), "deallocate_async");
  }
  void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    return sync_allocate(bytes, alignment);
  }
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    (void)alignment;
    report(res_->deallocate(ptr, bytes, default_stream()), "deallocate");
  }
#endif

  /// Equal when they share one PointerResource (memory from one frees through the other).
  friend bool operator==(const CudaMrResource& a, const CudaMrResource& b) noexcept { return a.res_ == b.res_; }
  friend bool operator!=(const CudaMrResource& a, const CudaMrResource& b) noexcept { return !(a == b); }

  friend void get_property(const CudaMrResource&, ::cuda::mr::device_accessible) noexcept {}

  pointer_resource& resource() const noexcept { return *res_; }
  DeviceRuntime<Stack>& runtime() const noexcept { return res_->runtime(); }

  /// cuda::stream_ref's stream as the driver's handle.
  static stream_t to_driver(::cuda::stream_ref s) noexcept { return reinterpret_cast<stream_t>(s.get()); }

 private:
  template <class T>
  static T value(result<T> r) {
    if (!r) [[unlikely]] throw allocation_error(std::move(r).error());
    return *r;
  }

  stream_t default_stream() const noexcept { return res_->runtime().streams()->at(StreamId::DEFAULT); }

  void* sync_allocate(std::size_t bytes, std::size_t alignment) {
    const stream_t s = default_stream();
    void* p = value(res_->allocate(bytes, s, alignment));
    if (auto r = res_->runtime().driver().stream_synchronize(s); !r) [[unlikely]] {
      (void)res_->deallocate(p, bytes, s);
      throw allocation_error(std::move(r).error());
    }
    return p;
  }

  [[gnu::cold]] static void report_failure(const error& e, const char* what) noexcept {
    std::fprintf(stderr, "xlogrt: cuda::mr %s refused, the block stays live: %s\n", what, e.what().c_str());
  }
  static void report(const result<void>& r, const char* what) noexcept {
    if (!r) [[unlikely]] report_failure(r.error(), what);
  }

  std::shared_ptr<pointer_resource> res_;
};

}  // namespace xlogrt
