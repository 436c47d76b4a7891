// SPDX-License-Identifier: Apache-2.0
#pragma once

// Adaptor<Up>: the base of a decorator. It stores the upstream by value and forwards
// every member of the upstream's concepts, so a decorator declares only what it changes:
//
//   template <class Up>
//   struct CountAllocations : xlogrt::Adaptor<Up> {
//     using xlogrt::Adaptor<Up>::Adaptor;
//     // Behind a unique_ptr: a layer must move, and an atomic cannot (see below).
//     std::unique_ptr<std::atomic<std::size_t>> calls = std::make_unique<std::atomic<std::size_t>>(0);
//     xlogrt::result<xlogrt::DeviceBlock> allocate(std::size_t n, xlogrt::StreamId s,
//                                                  xlogrt::AllocTag t) noexcept {
//       calls->fetch_add(1, std::memory_order_relaxed);
//       return this->upstream().allocate(n, s, t);
//     }
//   };
//
// (test/runtime/test_runtime.cpp runs this example inside a DeviceRuntime.)
//
// Every layer must be move-constructible: DeviceRuntime, Adaptor (its upstream),
// StackBuilder and AnyResource hold the stack by value and move it in. State that cannot
// move (std::atomic, std::mutex) lives behind a std::unique_ptr, as in Statistics and
// Cached; a layer that breaks the rule is refused by a static_assert whose message says
// so (detail::check_movable_layer, resource/concepts.hpp).
//
// A member the derived class declares hides the forwarded one (ordinary name hiding), so
// the derived class's own members are the ones a stack above it calls. What is forwarded:
// - always: allocate, deallocate, bytes_outstanding, reap_pending, device_ordinal,
//   supports_block_use_tracking and frees_synchronously (the DeviceMemoryResource
//   contract and the free flag);
// - exactly when Up has them: record/prepare/finish_block_use (TrackingResource),
//   recycle_block and unpark_block (RecyclingResource), driver_type, driver(), stream_handle() and
//   make_current() (DriverResource).
// So a decorator over a tracking stack tracks, one over AsyncCuda reaches the driver, and
// one over a plain resource claims neither.
//
// A decorator that changes what a block is (DebugGuard hands out an inner part of the
// upstream's block) must hide every forwarded member that takes a block, and declare a
// forwarded capability it cannot honour deleted (`recycle_block(...) = delete;`), which
// makes the capability's concept false for the decorated stack.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "xlogrt/core/block.hpp"
#include "xlogrt/core/ids.hpp"
#include "xlogrt/core/result.hpp"
#include "xlogrt/resource/concepts.hpp"

namespace xlogrt {

namespace detail {

/// Declares `driver_type` exactly when Up has it.
template <class Up, bool = DriverResource<Up>>
struct DriverTypeOf {};
template <class Up>
struct DriverTypeOf<Up, true> {
  using driver_type = typename Up::driver_type;
};

}  // namespace detail

template <class Up>
class Adaptor : public detail::DriverTypeOf<Up> {
  static_assert(detail::check_movable_layer<Up>());  // the upstream is held by value
 public:
  using upstream_type = Up;
  static constexpr bool supports_block_use_tracking = Up::supports_block_use_tracking;
  static constexpr bool frees_synchronously = SynchronousFree<Up>;

  explicit Adaptor(Up up) noexcept(std::is_nothrow_move_constructible_v<Up>) : up_(std::move(up)) {}

  /// The layer below, for a caller that bypasses this one on purpose.
  Up& upstream() noexcept { return up_; }
  const Up& upstream() const noexcept { return up_; }

  // ---- DeviceMemoryResource ----
  result<DeviceBlock> allocate(std::size_t bytes, StreamId stream, AllocTag tag) noexcept {
    return up_.allocate(bytes, stream, tag);
  }
  result<void> deallocate(DeviceBlock&& block) noexcept { return up_.deallocate(std::move(block)); }
  std::size_t bytes_outstanding() const noexcept { return up_.bytes_outstanding(); }
  result<void> reap_pending() noexcept { return up_.reap_pending(); }
  std::uint32_t device_ordinal() const noexcept { return up_.device_ordinal(); }

  // ---- TrackingResource ----
  result<void> record_block_use(const DeviceBlock& b, StreamId use) noexcept
    requires TrackingResource<Up>
  {
    return up_.record_block_use(b, use);
  }
  result<void> prepare_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up_.prepare_block_use(id, use, a);
  }
  result<void> finish_block_use(BlockId id, StreamId use, Access a) noexcept
    requires TrackingResource<Up>
  {
    return up_.finish_block_use(id, use, a);
  }

  // ---- RecyclingResource ----
  result<DeviceBlock> recycle_block(DeviceBlock& b, StreamId to, Recycle how = Recycle::live) noexcept
    requires RecyclingResource<Up>
  {
    return up_.recycle_block(b, to, how);
  }
  bool unpark_block(BlockId id, AllocTag tag) noexcept
    requires RecyclingResource<Up>
  {
    return up_.unpark_block(id, tag);
  }

  // ---- DriverResource ----
  decltype(auto) driver() noexcept
    requires DriverResource<Up>
  {
    return up_.driver();
  }
  auto stream_handle(StreamId s) noexcept
    requires DriverResource<Up>
  {
    return up_.stream_handle(s);
  }
  result<void> make_current() noexcept
    requires DriverResource<Up>
  {
    return up_.make_current();
  }

 private:
  [[no_unique_address]] Up up_;
};

}  // namespace xlogrt
