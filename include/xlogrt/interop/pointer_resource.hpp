// SPDX-License-Identifier: Apache-2.0
#pragma once

// PointerResource<Stack>: a runtime's stack behind a pointer-and-driver-stream interface,
// the common part of the bridges to engines that allocate with `void*` and a stream of
// their own (cuda::mr, Thrust, PyTorch).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/interop/block_map.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/runtime.hpp"

namespace xlogrt {

/// Options of a PointerResource. Not thread-safe: a value.
struct PointerResourceOptions {
  AllocTag tag = AllocTag::UNTAGGED;          ///< the tag of every allocation
  std::size_t map_capacity = std::size_t{1} << 14;  ///< BlockMap slots (see BlockMap)
};

/// Allocates from a DeviceRuntime<Stack>'s stack with a bare pointer as the handle.
///
/// Streams are the caller's driver streams: each is adopted into the runtime's
/// StreamPool on first sight (StreamPool::adopt, keyed by the driver's stream id, so a
/// reused handle is a new stream) and every later call finds it without a lock. A
/// block's free is queued on the stream it was allocated on, after the uses tracked on
/// other streams (record_use) and after the work on the stream `deallocate` is given.
///
/// Alignment: device pool allocations are 256-byte aligned (CUDA_ALLOCATION_ALIGNMENT);
/// a request for more, or for an alignment that is not a power of two, is refused with
/// invalid_argument.
///
/// Every error leaves the accounting unchanged: a refused free keeps the block filed
/// (the memory is not lost, and a corrected call frees it).
///
/// Thread-safe: any thread may call any member (the stack and the map are thread-safe).
/// Not copyable: bridges that must be copied (cuda::mr resources, Thrust allocators)
/// hold a pointer to one.
template <DriverResource Stack>
class PointerResource {
 public:
  using runtime_type = DeviceRuntime<Stack>;
  using driver_type = typename Stack::driver_type;
  using stream_t = typename driver_type::stream_t;
  static constexpr std::size_t ALIGNMENT = 256;
  static constexpr bool supports_block_use_tracking = Stack::supports_block_use_tracking;

  explicit PointerResource(runtime_type& rt, PointerResourceOptions options = {})
      : rt_(&rt), tag_(options.tag), map_(options.map_capacity) {}
  PointerResource(const PointerResource&) = delete;
  PointerResource& operator=(const PointerResource&) = delete;

  /// `bytes` (> 0) usable by work enqueued on `stream` after the call.
  /// Errors: the stack's (zero_bytes, out_of_memory, out_of_budget, ...),
  /// invalid_argument for an alignment the device pool does not give, the driver's for
  /// a stream it does not know.
  result<void*> allocate(std::size_t bytes, stream_t stream, std::size_t alignment = ALIGNMENT) noexcept {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > ALIGNMENT) [[unlikely]] {
      return error{errc::invalid_argument, "alignment " + std::to_string(alignment) +
                                               " is not a power of two of at most " +
                                               std::to_string(ALIGNMENT) + " bytes"};
    }
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    if (auto r = rt_->stack().make_current(); !r) [[unlikely]] return std::move(r).error();
    auto b = rt_->allocate(bytes, *id, tag_);
    if (!b) return std::move(b).error();
    void* p = b->template as<void>();
    if (!map_.insert(std::move(*b))) [[unlikely]] {
      // A pointer still live here (never expected from the device allocator) or no host
      // memory for the map's overflow: the block goes back, so nothing is lost.
      (void)rt_->deallocate(std::move(*b));
      return error{errc::out_of_memory, "could not file pointer " + hex(p) +
                                            " (already live in this bridge, or no host memory)"};
    }
    return p;
  }

  /// Queues the free of `ptr` (of `bytes`, as allocated; 0: not checked) after the work
  /// enqueued so far on `stream`. Errors: foreign_block for a pointer this resource did
  /// not hand out (or freed already), invalid_argument for a size that is not the
  /// block's; the stack's.
  result<void> deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
    auto b = map_.take(key(ptr));
    if (!b) return unknown(ptr, "deallocate");
    if (bytes != 0 && bytes != b->bytes()) [[unlikely]] {
      error e{errc::invalid_argument, "deallocate of " + hex(ptr) + " with " + std::to_string(bytes) +
                                          " bytes; it was allocated with " + std::to_string(b->bytes())};
      (void)map_.insert(std::move(*b));
      return e;
    }
    if (auto r = rt_->stack().make_current(); !r) [[unlikely]] {
      (void)map_.insert(std::move(*b));
      return r;
    }
    if constexpr (supports_block_use_tracking) {
      if (auto r = ordered_after(*b, stream); !r) [[unlikely]] {
        (void)map_.insert(std::move(*b));
        return r;
      }
    }
    auto r = rt_->deallocate(std::move(*b));
    if (!r) [[unlikely]] (void)map_.insert(std::move(*b));  // refused: the block is untouched
    return r;
  }

  /// The free of `ptr` waits for the work enqueued on `stream` up to now (PyTorch's
  /// record_stream). Errors: foreign_block, the stack's.
  result<void> record_use(const void* ptr, stream_t stream) noexcept
    requires TrackingResource<Stack>
  {
    const DeviceBlock* b = map_.find(key(ptr));
    if (b == nullptr) return unknown(ptr, "record_use");
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    if (auto r = rt_->stack().make_current(); !r) [[unlikely]] return r;
    return rt_->record_block_use(*b, *id);
  }

  /// The StreamId of a driver stream, adopting it on first sight.
  result<StreamId> stream_id(stream_t stream) noexcept { return rt_->streams()->adopt(stream); }

  /// The block of a live pointer, or null.
  const DeviceBlock* find(const void* ptr) noexcept { return map_.find(key(ptr)); }

  runtime_type& runtime() const noexcept { return *rt_; }
  AllocTag tag() const noexcept { return tag_; }

 private:
  static std::uint64_t key(const void* p) noexcept { return reinterpret_cast<std::uintptr_t>(p); }

  static std::string hex(const void* p) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%p", p);
    return buf;
  }

  [[gnu::cold]] static error unknown(const void* ptr, const char* what) {
    return error{errc::foreign_block, std::string(what) + " of " + hex(ptr) +
                                          ": not a live pointer of this bridge (never allocated "
                                          "here, or freed already)"};
  }

  /// A free on another stream than the block's own waits for that stream's work.
  result<void> ordered_after(const DeviceBlock& b, stream_t stream) noexcept {
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    if (*id == b.alloc_stream()) return ok();
    return rt_->record_block_use(b, *id);
  }

  runtime_type* rt_;
  AllocTag tag_;
  BlockMap map_;
};

}  // namespace xlogrt
