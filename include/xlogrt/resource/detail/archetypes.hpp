// SPDX-License-Identifier: Apache-2.0
#pragma once

// Archetype upstreams that each decorator's header checks its concepts against, right
// after the class (declarations only: nothing here is ever called).

#include <cstddef>
#include <cstdint>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"

namespace xlogrt {

namespace detail {

// ---- archetypes (compile-time checks only) --------------------------------------------

/// A resource with exactly the DeviceMemoryResource members.
struct PlainArchetype {
  static constexpr bool supports_block_use_tracking = false;
  result<DeviceBlock> allocate(std::size_t, StreamId, AllocTag) noexcept;
  result<void> deallocate(DeviceBlock&&) noexcept;
  std::size_t bytes_outstanding() const noexcept;
  result<void> reap_pending() noexcept;
  std::uint32_t device_ordinal() const noexcept;
};

/// A resource that tracks cross-stream uses.
struct TrackingArchetype : PlainArchetype {
  static constexpr bool supports_block_use_tracking = true;
  result<void> record_block_use(const DeviceBlock&, StreamId) noexcept;
  result<void> prepare_block_use(BlockId, StreamId, Access) noexcept;
  result<void> finish_block_use(BlockId, StreamId, Access) noexcept;
};

/// The driver operations DebugGuard uses, and nothing else.
struct ArchetypeDriver {
  struct stream_t {};
  result<void> memset_d8_async(std::uint64_t, std::uint8_t, std::size_t, stream_t) noexcept;
  result<void> memcpy_dtoh_async(void*, std::uint64_t, std::size_t, stream_t) noexcept;
  result<void> stream_synchronize(stream_t) noexcept;
};

/// A tracking resource that reaches a driver (the shape of AsyncCuda).
struct DriverArchetype : TrackingArchetype {
  using driver_type = ArchetypeDriver;
  ArchetypeDriver& driver() const noexcept;
  result<ArchetypeDriver::stream_t> stream_handle(StreamId) const noexcept;
  result<void> make_current() const noexcept;
};

}  // namespace detail
}  // namespace xlogrt
