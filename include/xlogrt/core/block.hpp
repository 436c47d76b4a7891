// SPDX-License-Identifier: Apache-2.0
#pragma once

// DeviceBlock: the move-only description of one allocation.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "xlogrt/core/ids.hpp"

namespace xlogrt {

/// One live allocation: device pointer, bytes, the stream it was allocated on, its
/// device ordinal, tag and BlockId. Move-only, so a block has one owner; a moved-from
/// block is empty and every resource refuses it with errc::empty_block.
/// `deallocate(DeviceBlock&&)` consumes it. Destroying a non-empty block does not free
/// the memory (a block does not know its resource): own memory with device_buffer<T>
/// for RAII, or hand the block back to its resource.
///
/// The constructor is public for resource implementers (a decorator may rewrap an
/// upstream block); a block forged from another block's fields is caught on free as
/// double_free or foreign_block.
///
/// Not thread-safe: a block is a value, owned by one thread at a time.
class DeviceBlock {
 public:
  DeviceBlock() noexcept = default;
  DeviceBlock(std::uint64_t ptr, std::size_t bytes, StreamId alloc_stream,
              std::uint32_t device_ordinal, AllocTag tag, BlockId id) noexcept
      : ptr_(ptr), bytes_(bytes), id_(id), alloc_stream_(alloc_stream), ordinal_(device_ordinal),
        tag_(tag) {}

  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  DeviceBlock(DeviceBlock&& o) noexcept { steal(o); }
  DeviceBlock& operator=(DeviceBlock&& o) noexcept {
    if (this != &o) steal(o);
    return *this;
  }
  ~DeviceBlock() = default;

  std::uint64_t ptr() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  StreamId alloc_stream() const noexcept { return alloc_stream_; }
  std::uint32_t device_ordinal() const noexcept { return ordinal_; }
  AllocTag tag() const noexcept { return tag_; }
  BlockId id() const noexcept { return id_; }
  bool empty() const noexcept { return !id_.valid(); }

  /// The device pointer as a typed pointer, for kernel arguments.
  template <class T>
  T* as() const noexcept {
    return reinterpret_cast<T*>(static_cast<std::uintptr_t>(ptr_));
  }

 private:
  void steal(DeviceBlock& o) noexcept {
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
    alloc_stream_ = o.alloc_stream_;
    ordinal_ = o.ordinal_;
    tag_ = o.tag_;
    id_ = std::exchange(o.id_, BlockId{});
  }

  std::uint64_t ptr_ = 0;
  std::size_t bytes_ = 0;
  // At offset 16, so that the id's first eight bytes are aligned: copies and reads of the
  // id then use the same widths at the same offsets, and a read is forwarded from the
  // store before it (a misaligned 8-byte read of two 4-byte stores stalled the pair).
  BlockId id_{};
  StreamId alloc_stream_{};
  std::uint32_t ordinal_ = 0;
  AllocTag tag_{};
};

}  // namespace xlogrt
