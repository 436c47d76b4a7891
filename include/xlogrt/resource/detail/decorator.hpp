// SPDX-License-Identifier: Apache-2.0
#pragma once

// What the shipped decorators share: the optional members they forward, and archetype
// upstreams that each decorator's header checks its concepts against, right after the
// class (the archetypes are declarations only: nothing here is ever called).

#include <cstddef>
#include <cstdint>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"

namespace xlogrt {

/// An upstream whose deallocate returns only once the memory is back with the driver
/// (cuMemFree, not cuMemFreeAsync) may say so with
/// `static constexpr bool frees_synchronously = true;`. Budget then credits a free at
/// once instead of at the next reap_pending. Decorators forward the flag.
template <class R>
concept SynchronousFree = requires { requires static_cast<bool>(R::frees_synchronously); };

namespace detail {

/// Base of a decorator over `Up`: declares `driver_type` exactly when Up has it, so a
/// decorator over a DriverResource is one too and one over a plain resource is not.
template <class Up, bool = DriverResource<Up>>
struct DriverTypeOf {};
template <class Up>
struct DriverTypeOf<Up, true> {
  using driver_type = typename Up::driver_type;
};

/// Base of a decorator `Derived` over `Up` that passes the optional capabilities through
/// unchanged: the tracking calls exist exactly when Up tracks, the DriverResource members
/// exactly when Up has them, each forwarded to `Derived::upstream()`. A decorator that
/// changes none of them derives from this and writes only what it adds.
template <class Derived, class Up>
struct Forwarding : DriverTypeOf<Up> {
  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept
    requires TrackingResource<Up>
  {
    return up().record_block_use(b, use);
  }
  result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up().prepare_block_use(id, use, a);
  }
  result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up().finish_block_use(id, use, a);
  }
  result<DeviceBlock> recycle_block(DeviceBlock& b, StreamId to) noexcept
    requires RecyclingResource<Up>
  {
    return up().recycle_block(b, to);
  }
  decltype(auto) driver() noexcept
    requires DriverResource<Up>
  {
    return up().driver();
  }
  auto stream_handle(StreamId s) noexcept
    requires DriverResource<Up>
  {
    return up().stream_handle(s);
  }
  result<void> make_current() noexcept
    requires DriverResource<Up>
  {
    return up().make_current();
  }

 private:
  Up& up() noexcept { return static_cast<Derived&>(*this).upstream(); }
};

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
