// SPDX-License-Identifier: Apache-2.0
#pragma once

// DirectCuda<D>: synchronous cuMemAlloc / cuMemFree, no cross-stream tracking.

#include <cstdint>
#include <memory>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/device/stream_pool.hpp"
#include "xlogrt/resource/block_table.hpp"
#include "xlogrt/resource/concepts.hpp"
#include "xlogrt/resource/detail/request.hpp"

namespace xlogrt {

/// The simplest base resource: every allocate is a cuMemAlloc and every deallocate a
/// cuMemFree, so memory is back with the driver when deallocate returns and
/// bytes_outstanding() is exact at once (reap_pending has nothing to do). Blocks are usable
/// on any stream. It does not track cross-stream uses: a stack built on it has no
/// record_block_use (that is a compile error, see TrackingResource). Useful under
/// compute-sanitizer and for comparisons; AsyncCuda is the production base.
///
/// Thread-safe. Move-only; a moved-from DirectCuda may only be destroyed.
template <Driver D>
class DirectCuda {
 public:
  using driver_type = D;
  static constexpr bool supports_block_use_tracking = false;
  /// The memory is back with the driver when deallocate returns (Budget credits at once).
  static constexpr bool frees_synchronously = true;

  explicit DirectCuda(std::shared_ptr<StreamPool<D>> streams) noexcept
      : streams_(std::move(streams)),
        state_(std::make_unique<State>()) {}

  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    auto s = detail::check_request(*streams_, streams_->device()->info().total_bytes, bytes, stream);
    if (!s) return std::move(s).error();
    if (auto r = make_current(); !r) return std::move(r).error();
    auto& drv = driver();
    auto ptr = drv.mem_alloc(bytes);
    if (!ptr) return std::move(ptr).error();
    auto id = state_->table.insert(*ptr, bytes, tag, Entry{stream});
    if (!id) {
      (void)drv.mem_free(*ptr);
      return std::move(id).error();
    }
    return DeviceBlock{*ptr, bytes, stream, device_ordinal(), tag, *id};
  }

  /// Frees at once. On error the block is left with the caller, untouched.
  result<void> deallocate(DeviceBlock&& b) noexcept {
    if (auto r = detail::check_block(b, device_ordinal()); !r) return r;
    if (auto r = make_current(); !r) return r;
    auto r = state_->table.erase_if(b.id(), &b, [&](Entry&) { return driver().mem_free(b.ptr()); });
    if (!r) return r;
    DeviceBlock gone = std::move(b);
    return ok();
  }

  std::size_t bytes_outstanding() const noexcept {
    return state_->table.live_bytes();
  }
  result<void> reap_pending() noexcept { return ok(); }
  std::uint32_t device_ordinal() const noexcept { return streams_->device()->ordinal(); }

  D& driver() const noexcept { return streams_->driver(); }
  result<typename D::stream_t> stream_handle(StreamId s) const noexcept { return streams_->get(s); }
  result<void> make_current() const noexcept { return streams_->device()->make_current(); }
  const std::shared_ptr<StreamPool<D>>& streams() const noexcept { return streams_; }

 private:
  /// The table compares a freed block's alloc stream with this (and its pointer, size
  /// and tag with its own): a block rebuilt with other fields is refused.
  struct Entry {
    StreamId alloc_stream;
  };
  struct State {
    BlockTable<Entry> table;
  };
  std::shared_ptr<StreamPool<D>> streams_;
  std::unique_ptr<State> state_;
};

}  // namespace xlogrt
