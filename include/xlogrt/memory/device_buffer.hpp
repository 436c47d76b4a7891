// SPDX-License-Identifier: Apache-2.0
#pragma once

// device_buffer<T, Runtime>: a typed, move-only owner of one block of a runtime.

#include <cstddef>
#include <string>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"

namespace xlogrt {

/// `count` elements of T in one block of `Runtime` (a DeviceRuntime, or anything with its
/// allocate / deallocate members), freed through the runtime when the buffer is
/// destroyed. The buffer carries its BlockId, so launch(...) and the first-use helpers
/// can tell the runtime which streams touch it.
///
/// The destructor cannot report a failed free; call release() first where an error must
/// be seen. Not thread-safe: one owner at a time, like the block it holds (the runtime
/// itself is thread-safe).
template <class T, class Runtime>
class device_buffer {
 public:
  using value_type = T;

  /// Errors: those of Runtime::allocate; count 0 is zero_bytes, an overflowing count too_large.
  static result<device_buffer> create(Runtime& rt, std::size_t count, StreamId stream = StreamId::DEFAULT,
                                      AllocTag tag = AllocTag::UNTAGGED) noexcept {
    if (count > static_cast<std::size_t>(-1) / sizeof(T)) {
      return error{errc::too_large, "device_buffer of " + std::to_string(count) + " elements of " +
                                        std::to_string(sizeof(T)) + " bytes overflows size_t"};
    }
    auto b = rt.allocate(count * sizeof(T), stream, tag);
    if (!b) return std::move(b).error();
    return device_buffer(rt, std::move(*b), count);
  }

  device_buffer(device_buffer&& o) noexcept
      : rt_(o.rt_), block_(std::move(o.block_)), count_(std::exchange(o.count_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      (void)release();
      rt_ = o.rt_;
      block_ = std::move(o.block_);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { (void)release(); }

  /// Frees the block now (stream-ordered, after every tracked use). Idempotent.
  result<void> release() noexcept {
    if (block_.empty()) return ok();
    count_ = 0;
    return rt_->deallocate(std::move(block_));
  }

  T* data() const noexcept { return block_.template as<T>(); }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return block_.bytes(); }
  bool empty() const noexcept { return block_.empty(); }
  BlockId id() const noexcept { return block_.id(); }
  StreamId stream() const noexcept { return block_.alloc_stream(); }
  const DeviceBlock& block() const noexcept { return block_; }
  Runtime& runtime() const noexcept { return *rt_; }

  /// Before the first work on `use` that touches the buffer: `use` waits for whatever the
  /// access implies (at least the allocation on the buffer's stream).
  result<void> prepare_first_use(StreamId use, Access access) noexcept {
    return rt_->prepare_block_use(block_.id(), use, access);
  }
  /// After that work is enqueued: records it, so the free waits for it.
  result<void> finish_first_use(StreamId use, Access access) noexcept {
    return rt_->finish_block_use(block_.id(), use, access);
  }

 private:
  device_buffer(Runtime& rt, DeviceBlock&& b, std::size_t count) noexcept
      : rt_(&rt), block_(std::move(b)), count_(count) {}

  Runtime* rt_;
  DeviceBlock block_;
  std::size_t count_;
};

}  // namespace xlogrt
