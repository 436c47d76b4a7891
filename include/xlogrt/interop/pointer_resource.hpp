// SPDX-License-Identifier: Apache-2.0
#pragma once

// PointerResource<Stack>: a runtime's stack behind a pointer-and-driver-stream interface,
// the common part of the bridges to engines that allocate with `void*` and a stream of
// their own (cuda::mr, Thrust, PyTorch).

#include <atomic>
#include <bit>
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
#include "xlogrt/runtime/device_runtime.hpp"

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
/// block's free is queued on the stream it was allocated on, after the work enqueued up
/// to the free on every stream named by record_use, and on the stream `deallocate` is
/// given (PyTorch's record_stream semantics: the use is recorded when the block is freed,
/// so work enqueued after record_use is covered too).
///
/// Alignment: device pool allocations are 256-byte aligned (CUDA_ALLOCATION_ALIGNMENT);
/// a request for more, or for an alignment that is not a power of two, is refused with
/// invalid_argument.
///
/// Every error leaves the accounting unchanged: a refused free keeps the block filed
/// (the memory is not lost, and a corrected call frees it).
///
/// Contexts: no member makes a context current. The stack's hot paths name their stream
/// and need none, and its other paths make the device's current themselves.
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
    return allocate(bytes, stream, tag_, alignment);
  }

  /// As above, with `tag` in Statistics and the log instead of the resource's own (a
  /// bridge that serves several engines from one resource tells them apart by tag; the
  /// pointers share one map, so deallocate and record_use need no tag).
  result<void*> allocate(std::size_t bytes, stream_t stream, AllocTag tag, std::size_t alignment = ALIGNMENT) noexcept {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > ALIGNMENT) [[unlikely]] {
      return error{errc::invalid_argument, "alignment " + std::to_string(alignment) +
                                               " is not a power of two of at most " +
                                               std::to_string(ALIGNMENT) + " bytes"};
    }
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    auto b = rt_->allocate(bytes, *id, tag);
    if (!b) return std::move(b).error();
    void* p = b->template as<void>();
    if (!map_.insert(std::move(*b), bytes)) [[unlikely]] {
      // A pointer still live here (never expected from the device allocator) or no host
      // memory for the map's overflow: the block goes back, so nothing is lost.
      (void)rt_->deallocate(std::move(*b));
      return error{errc::out_of_memory, "could not file pointer " + hex(p) +
                                            " (already live in this bridge, or no host memory)"};
    }
    return p;
  }

  /// Queues the free of `ptr` (of `bytes`, as asked for at allocate; 0: not checked) after
  /// the work enqueued so far on `stream`. Errors: foreign_block for a pointer this
  /// resource did not hand out (or freed already), invalid_argument for a size that is not
  /// the one asked for; the stack's.
  result<void> deallocate(void* ptr, std::size_t bytes, stream_t stream) noexcept {
    auto e = map_.take(key(ptr));
    if (!e) return unknown(ptr, "deallocate");
    // Every refusal below files the entry again, as it was: nothing is lost.
    if (bytes != 0 && bytes != e->requested) [[unlikely]] {
      error err{errc::invalid_argument, "deallocate of " + hex(ptr) + " with " + std::to_string(bytes) +
                                            " bytes; it was allocated with " + std::to_string(e->requested)};
      (void)map_.insert(std::move(*e));
      return err;
    }
    if constexpr (supports_block_use_tracking) {
      if (auto r = order_free(*e, stream); !r) [[unlikely]] {
        (void)map_.insert(std::move(*e));
        return r;
      }
    }
    auto r = rt_->deallocate(std::move(e->block));
    if (!r) [[unlikely]] (void)map_.insert(std::move(*e));  // refused: the block is untouched
    return r;
  }

  /// The free of `ptr` waits for the work enqueued on `stream` up to the free (PyTorch's
  /// record_stream). The stream is noted in the block's entry and its use recorded when
  /// the block is freed; a stream with a StreamId of 64 or more (a process with that many
  /// streams) has its use recorded now instead, covering the work enqueued so far.
  /// record_use and deallocate of one pointer must not race (torch holds the GIL).
  /// Errors: foreign_block, the stack's.
  result<void> record_use(const void* ptr, stream_t stream) noexcept
    requires TrackingResource<Stack>
  {
    BlockMap::Entry* e = map_.find(key(ptr));
    if (e == nullptr) return unknown(ptr, "record_use");
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    if (id->value < DEFERRED_STREAMS) {
      std::atomic_ref<std::uint64_t>(e->uses).fetch_or(std::uint64_t{1} << id->value, std::memory_order_relaxed);
      return ok();
    }
    return rt_->record_block_use(e->block, *id);
  }

  /// The StreamId of a driver stream, adopting it on first sight.
  result<StreamId> stream_id(stream_t stream) noexcept { return rt_->streams()->adopt(stream); }

  /// The block of a live pointer, or null.
  const DeviceBlock* find(const void* ptr) noexcept {
    BlockMap::Entry* e = map_.find(key(ptr));
    return e == nullptr ? nullptr : &e->block;
  }

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

  /// Records the uses the free waits for: the streams noted by record_use, and the
  /// free's own stream when it is not the block's. A use recorded twice only costs an
  /// event; a failure part-way leaves uses recorded, which only delays the free.
  result<void> order_free(const BlockMap::Entry& e, stream_t stream) noexcept {
    // The common case: freed on its own stream's handle (the free is queued on that very
    // handle, so even a reused one is ordered right), with no use noted.
    if (e.uses == 0 && stream == rt_->streams()->at(e.block.alloc_stream())) return ok();
    auto id = stream_id(stream);
    if (!id) return std::move(id).error();
    std::uint64_t uses = e.uses;
    if (*id != e.block.alloc_stream() && id->value < DEFERRED_STREAMS) uses |= std::uint64_t{1} << id->value;
    if (e.block.alloc_stream().value < DEFERRED_STREAMS) uses &= ~(std::uint64_t{1} << e.block.alloc_stream().value);
    for (; uses != 0; uses &= uses - 1) {
      const StreamId use{static_cast<std::uint32_t>(std::countr_zero(uses))};
      if (auto r = rt_->record_block_use(e.block, use); !r) [[unlikely]] return r;
    }
    if (*id != e.block.alloc_stream() && id->value >= DEFERRED_STREAMS) return rt_->record_block_use(e.block, *id);
    return ok();
  }

  /// StreamIds whose record_use is deferred to the free (one bit each in the entry).
  static constexpr std::uint32_t DEFERRED_STREAMS = 64;

  runtime_type* rt_;
  AllocTag tag_;
  BlockMap map_;
};

}  // namespace xlogrt
